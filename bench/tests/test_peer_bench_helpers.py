"""The peer benchmark's pure helpers: /proc parsing, process trees, round order and summaries, pins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.peers.procs import ProcStat, all_stats, descendants, parse_stat, tree_cpu_seconds
from bench.peers.rounds import ratio_table, rotated, summarize
from bench.peers.venvs import peer_envs, project_pin

pytestmark = pytest.mark.unit


def test_parse_stat_handles_spaces_and_parentheses_in_the_command_name() -> None:
    line = "4242 (ray::Serve (x) y) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 9 0 1 2 3"
    assert parse_stat(line) == ProcStat(pid=4242, ppid=17, session=4242, cpu_ticks=280)


def test_parse_stat_reads_this_process() -> None:
    me = parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert me.pid == os.getpid()
    assert me.ppid == os.getppid()
    assert me.session == os.getsid(0)


def test_descendants_walks_the_whole_tree_and_nothing_else() -> None:
    stats = [ProcStat(1, 0, 1, 5), ProcStat(10, 1, 10, 1), ProcStat(11, 10, 10, 2), ProcStat(12, 11, 10, 3),
             ProcStat(20, 1, 20, 7)]
    assert sorted(s.pid for s in descendants(10, stats)) == [10, 11, 12]
    assert descendants(99, stats) == []


def test_tree_cpu_seconds_counts_this_process() -> None:
    # Burn a little CPU, then the tree of this process must show at least that much.
    before = tree_cpu_seconds(os.getpid(), all_stats())
    x = 0
    for i in range(2_000_000):
        x += i * i
    assert tree_cpu_seconds(os.getpid()) > before


def test_rotated_gives_every_stack_the_first_slot_in_turn() -> None:
    order = ["pod", "inf", "ray", "ceiling"]
    firsts = [rotated(order, k)[0] for k in range(4)]
    assert firsts == order
    assert sorted(rotated(order, 7)) == sorted(order)
    assert rotated([], 3) == []


def test_summarize_takes_each_metric_median_and_range_on_its_own() -> None:
    runs = [{"concurrency": 4, "images_per_s": 30.0, "p50_ms": 120.0, "p99_ms": 300.0, "errors": 0},
            {"concurrency": 4, "images_per_s": 10.0, "p50_ms": 100.0, "p99_ms": 200.0, "errors": 1},
            {"concurrency": 4, "images_per_s": 20.0, "p50_ms": 400.0, "p99_ms": 900.0, "errors": 0}]
    out = summarize(runs)
    assert out["images_per_s"] == 20.0 and out["images_per_s_range"] == [10.0, 30.0]
    assert out["p50_ms"] == 120.0 and out["p50_ms_range"] == [100.0, 400.0]
    assert out["errors"] == 1 and out["rounds"] == runs
    with pytest.raises(ValueError):
        summarize([])


def test_ratio_table_is_relative_to_the_base_stack() -> None:
    points = {"pod": {1: {"images_per_s": 20.0}, 4: {"images_per_s": 40.0}},
              "inf": {1: {"images_per_s": 10.0}, 4: {"images_per_s": 50.0}}}
    assert ratio_table(points, "pod") == {"inf": {1: 0.5, 4: 1.25}}


def test_peer_envs_reuse_the_project_torch_and_leave_torchvision_out(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["torch==9.1.0", "transformers == 7.0.0", "numpy"]\n')
    assert project_pin("torch", pyproject) == "torch==9.1.0"
    assert project_pin("transformers", pyproject) == "transformers==7.0.0"
    with pytest.raises(LookupError):
        project_pin("numpy", pyproject)
    envs = peer_envs(pyproject)
    for env in envs.values():
        assert "torch==9.1.0" in env.requirements
        assert not any(r.startswith("torchvision") or "[vision" in r for r in env.requirements)
    assert "transformers==7.0.0" in envs["ray"].requirements


def test_compare_reports_a_difference_and_a_shape_mismatch() -> None:
    import numpy as np

    from bench.peers.reference import compare

    want = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    assert compare("s", "rows", want.copy(), want, 1e-4)["equal"]
    off = compare("s", "rows", want + np.float32(0.01), want, 1e-4)
    assert not off["equal"] and abs(off["max_abs_diff"] - 0.01) < 1e-6
    wrong = compare("s", "rows", want[:2], want, 1e-4)
    assert not wrong["equal"] and wrong["max_abs_diff"] == float("inf")
