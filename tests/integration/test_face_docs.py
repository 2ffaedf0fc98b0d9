"""Every command docs/grpc.md and docs/vllm.md show is run here, or cut to a check of what it names.

The commands are read from the files themselves, so a command added to a page, or changed, is
tested (or fails the inventory) without editing this module:

- every fenced block says its language, and the pages' ``bash`` and ``python`` blocks are the ones
  this module (or the face's own test file) runs or checks: a new one fails the inventory;
- an inline command (``pip ...``, ``python -m ...``, ``vllm serve ...``, ...) must be one of
  :data:`NOT_RUN`, each with what stands in for it, which the page says too;
- grpc.md's ``encoder-pod serve`` block runs as written (the model path and the port the only
  things changed), in both forms it shows;
- vllm.md's ``vllm serve`` blocks cannot run here (vLLM's engine, a GPU, a 7B checkpoint): their
  shape, flag and JSON are checked with the vllm 0.34.0 wheel's own sources;
- every ``ENCODER_*=value`` either page shows is a setting the pod parses.

grpc.md's Python client is run as written by tests/integration/test_grpc_face.py (it needs that
module's pod and receiver).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from encoder_pod.settings import SettingsError, all_settings, load_settings
from tests.support.grpc_client import GrpcClient
from tests.support.sglang_harness import install_releases
from tests.support.vllm_harness import install_release, vllm_release
from testkit.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
GRPC_MD = REPO / "docs/grpc.md"
VLLM_MD = REPO / "docs/vllm.md"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
LANGUAGES = {"bash", "python", "json", "yaml", "text"}
RUN_BLOCKS = {  # (page, language): how many blocks, and which test takes them
    (GRPC_MD, "bash"): 1,  # test_the_serve_command_of_docs_grpc_md_runs_as_written
    (GRPC_MD, "python"): 1,  # test_grpc_face.py::test_the_python_client_of_docs_grpc_md_runs_as_written
    (VLLM_MD, "bash"): 2,  # test_the_vllm_serve_blocks_of_docs_vllm_md_are_what_vllm_0_34_0_takes
    (VLLM_MD, "python"): 0,
}
COMMAND_WORDS = ("pip ", "uv ", "python ", "encoder-pod ", "vllm ", "disagg_epd_proxy.py", "kubectl ", "make ",
                 "curl ", "helm ", "bash ", "docker ")
NOT_RUN = {  # inline commands the pages show and no test runs, and what is checked instead
    (GRPC_MD, "pip install 'encoderpool[grpc]'"): "test_the_install_commands_name_the_grpc_extras_pins",
    (GRPC_MD, "pip install smg-grpc-proto==0.4.28 grpcio"): "test_the_install_commands_name_the_grpc_extras_pins",
    (GRPC_MD, "python -m bench.grpc_bench"): "test_the_numbers_of_docs_grpc_md_are_the_benchmarks_results",
    (VLLM_MD, "disagg_epd_proxy.py --encode-servers-urls http://pool-0:30000,http://pool-1:30000 "
              "--prefill-servers-urls none --decode-servers-urls http://pd:8000"): "test_vllm_epd.py drives the pod as it does",
}
DOC_MODEL, DOC_PORT = "/models/qwen2-vl", "50051"


def blocks(page: Path) -> list[tuple[str, str]]:
    """The page's fenced blocks: (language, body)."""
    return [(lang.strip(), body) for lang, body in FENCE.findall(page.read_text())]


def inline_spans(page: Path) -> list[str]:
    """The page's inline code spans outside fenced blocks (a span may wrap a line: joined by a space)."""
    prose = FENCE.sub("", page.read_text())
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def test_every_command_of_the_face_docs_is_one_a_test_runs_or_checks() -> None:
    for page in (GRPC_MD, VLLM_MD):
        found = blocks(page)
        assert all(lang in LANGUAGES for lang, _ in found), (page.name, [lang for lang, _ in found])
        for (where, lang), count in RUN_BLOCKS.items():
            if where == page:
                assert sum(1 for got, _ in found if got == lang) == count, f"{page.name}: a {lang} block no test runs"
        commands = {span for span in inline_spans(page) if span.startswith(COMMAND_WORDS)}
        assert commands == {shown for where, shown in NOT_RUN if where == page}, (page.name, commands)


def _settled(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def _wait_serving(proc: subprocess.Popen[bytes], client: GrpcClient, log: Path, timeout: float = 400) -> None:
    """Until gRPC health says SERVING; fails at once, with the log, if the command exits first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.health(timeout=2) == "SERVING":
                return
        except grpc.RpcError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"exit {proc.returncode}, gRPC health never SERVING:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def test_the_serve_command_of_docs_grpc_md_runs_as_written(tiny_model, tmp_path: Path) -> None:
    """Both forms (``ENCODER_GRPC_PORT=...`` and the comment's ``--grpc-port``), side by side."""
    [(_, block)] = [b for b in blocks(GRPC_MD) if b[0] == "bash"]
    [line] = [each for each in block.splitlines() if each.strip()]
    command, _, comment = line.partition("  #")
    env_form = command.strip()
    assert env_form.startswith(f"ENCODER_GRPC_PORT={DOC_PORT} encoder-pod serve") and DOC_MODEL in env_form, env_form
    flag = comment.strip().removeprefix("or ")
    assert flag == f"--grpc-port {DOC_PORT}", comment
    flag_form = env_form.removeprefix(f"ENCODER_GRPC_PORT={DOC_PORT} ") + " " + flag
    model = str(tiny_model("qwen2_vl"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "ENCODER_NUM_THREADS": "1"}
    started = []
    for i, shown in enumerate((env_form, flag_form)):
        grpc_port, http_port = free_port(), free_port()
        script = shown.replace(DOC_MODEL, model).replace(DOC_PORT, str(grpc_port))
        log = tmp_path / f"serve-{i}.log"
        with log.open("wb") as out:  # bash runs the one command in its own process (no fork): signals reach the server
            proc = subprocess.Popen(["bash", "-c", script], env={**env, "ENCODER_PORT": str(http_port)},  # the page leaves
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # HTTP's port at its default
        started.append((proc, GrpcClient(grpc_port), http_port, log))
    try:
        for proc, client, http_port, log in started:
            _wait_serving(proc, client, log)
            assert httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=10).status_code == 200
    finally:
        for proc, client, _, _ in started:
            client.close()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        codes = [_settled(proc) for proc, *_ in started]
    assert codes == [0, 0], [log.read_text(errors="replace")[-2000:] for *_, log in started]


def _grpc_extra() -> dict[str, str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = [re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", each) for each in pyproject["project"]["optional-dependencies"]["grpc"]]
    assert all(pins), pins
    return {pin.group(1): pin.group(2) for pin in pins if pin}


def test_the_install_commands_name_the_grpc_extras_pins() -> None:
    """Not run (they download from the index): what they and the page name is what the tests run with."""
    extra = _grpc_extra()
    assert {name: metadata.version(name) for name in extra} == extra  # the environment of these tests
    text = GRPC_MD.read_text()
    [sentence] = re.findall(r"\(`pip install 'encoderpool\[grpc\]'`: ([^)]*)\)", text)
    for name, version in extra.items():
        assert re.search(rf"\b{re.escape(name)}\b", sentence) and version in sentence, (name, version, sentence)
    [client] = [span for span in inline_spans(GRPC_MD) if span.startswith("pip install smg-grpc-proto")]
    for word in client.split()[2:]:
        name, _, version = word.partition("==")
        assert name in extra and version in ("", extra[name]), word


def test_the_sglang_settings_of_docs_grpc_md_are_read_by_sglang_0_5_23() -> None:
    """Not run (an SGLang prefill server needs its language model): its sources read both names."""
    spans = inline_spans(GRPC_MD)
    assert "SGLANG_ENCODER_MM_RECEIVER_MODE=grpc" in spans and "--encoder-urls grpc://encoders:50051" in spans
    site = install_releases(("0.5.23",))["0.5.23"] / "sglang/srt"
    assert re.search(r"^\s+SGLANG_ENCODER_MM_RECEIVER_MODE = EnvStr\(", (site / "environ.py").read_text(), re.M)
    receiver = (site / "disaggregation/encoder/receiver.py").read_text()
    assert re.search(r'"grpc": MMReceiverGrpc', receiver) and "grpc mode requires grpc:// encoder URLs" in receiver
    assert '"encoder_urls"' in (site / "arg_groups/field_order.py").read_text()  # the field --encoder-urls sets


def test_the_numbers_of_docs_grpc_md_are_the_benchmarks_results() -> None:
    """``python -m bench.grpc_bench`` is not run (a benchmark, minutes, rewrites its results): the page quotes them."""
    summary = json.loads((REPO / "bench/results/grpc_cpu.json").read_text())["summary"]
    numbers = GRPC_MD.read_text().split("## Numbers", 1)[1]
    one, sixteen = summary["1"], summary["16"]
    shown = re.search(r"concurrency 1 HTTP ([\d.]+) ms, gRPC ([\d.]+) ms\s+\(paired per round: gRPC ([\d.]+) ms\s+faster\)",
                      numbers)
    assert shown, numbers
    assert [float(g) for g in shown.groups()] == [round(one["http"]["p50_ms"], 1), round(one["grpc"]["p50_ms"], 1),
                                                  round(-one["grpc_minus_http_p50_ms"]["median"], 1)]
    shown = re.search(r"concurrency 16 HTTP ([\d.]+), gRPC ([\d.]+) images/s \(x([\d.]+)\)", numbers)
    assert shown, numbers
    assert [float(g) for g in shown.groups()] == [round(sixteen["http"]["images_per_s"], 1),
                                                  round(sixteen["grpc"]["images_per_s"], 1),
                                                  round(sixteen["grpc_over_http_throughput"]["median"], 2)]


def _argv(block: str) -> list[str]:
    return shlex.split(block.replace("\\\n", " "))


def test_the_vllm_serve_blocks_of_docs_vllm_md_are_what_vllm_0_34_0_takes() -> None:
    """Not run (vLLM's engine, a GPU, the checkpoint): shape, flag and JSON, with the wheel's own sources."""
    release = vllm_release()
    arg_utils = (install_release() / "vllm/engine/arg_utils.py").read_text()
    [model_id] = [span.split("=", 1)[1] for span in inline_spans(VLLM_MD) if span.startswith("ENCODER_VLLM_MODEL_ID=")]
    serves = [_argv(body) for lang, body in blocks(VLLM_MD) if lang == "bash"]
    assert len(serves) == 2
    for argv in serves:
        assert argv[:2] == ["vllm", "serve"] and argv[2] == model_id and argv[3] == "--ec-transfer-config" and len(argv) == 5, argv
        assert f'"{argv[3]}"' in arg_utils  # a flag EngineArgs.add_cli_args declares
        ec: dict[str, Any] = json.loads(argv[4])
        config = release.ec_transfer_config(**ec)
        assert config.is_ec_consumer and not config.is_ec_producer
        assert release.factory.ECConnectorFactory.get_connector_class(config).__name__ == ec["ec_connector"]


def test_every_setting_the_face_docs_show_with_a_value_is_one_the_pod_parses() -> None:
    known = {env: name for name, setting in all_settings().items() for env in setting.env_names}
    shown = {span for page in (GRPC_MD, VLLM_MD) for span in inline_spans(page) if re.fullmatch(r"ENCODER_[A-Z0-9_]+=\S+", span)}
    assert len(shown) >= 5, shown
    for span in sorted(shown):
        env, _, value = span.partition("=")
        assert env in known, span
        try:
            settings = load_settings(env={env: value})
        except SettingsError as exc:
            pytest.fail(f"{span}: {exc}")
        parsed = [getattr(group, known[env]) for group in vars(settings).values() if hasattr(group, known[env])]
        assert [str(p) for p in parsed] == [value], (span, parsed)
