"""Teardown leaves no process behind: after an orderly stop, and after the test runner itself is
SIGKILLed (where only the reaper can clean up). Each test starts its own small cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from testkit.cluster import Cluster, ClusterOptions, load_binaries
from testkit.cluster.procs import pid_alive

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

# Runs in a child interpreter: a cluster, then print the PIDs and wait to be killed.
_CHILD = textwrap.dedent("""
    import json, time
    from testkit.cluster import Cluster, ClusterOptions
    cluster = Cluster(options=ClusterOptions(fake_gpu_nodes=())).start()
    print(json.dumps({"pids": cluster.pids(), "workdir": str(cluster.workdir)}), flush=True)
    time.sleep(600)
""")


def _wait_all_gone(pids: dict[str, int], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    alive = dict(pids)
    while alive and time.monotonic() < deadline:
        alive = {name: pid for name, pid in alive.items() if pid_alive(pid)}
        time.sleep(0.1)
    return alive


def test_stop_leaves_no_process_and_no_temp_dir() -> None:
    cluster = Cluster(load_binaries(), ClusterOptions(fake_gpu_nodes=())).start()
    pids = cluster.pids()
    assert set(pids) >= {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "reaper"}
    assert all(pid_alive(pid) for pid in pids.values())
    cluster.stop()
    assert _wait_all_gone(pids, 5) == {}
    assert not cluster.workdir.exists()


def test_sigkilled_test_runner_leaves_no_process_behind() -> None:
    load_binaries()  # fail with the build command, not with a child's traceback
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=REPO, env=env)
    try:
        line = child.stdout.readline()
        assert line, f"child cluster did not start:\n{child.stderr.read()}"
        info = json.loads(line)
    finally:
        child.send_signal(signal.SIGKILL)  # no finally, no atexit: only the reaper is left to clean up
        child.wait()
        child.stdout.close()
        child.stderr.close()
    pids = info["pids"]
    assert set(pids) >= {"etcd", "kube-apiserver", "kwok", "reaper"}
    assert _wait_all_gone(pids, 15) == {}
    # The reaper kills processes; the temp dir stays (nothing ran to remove it). Clean it up here.
    subprocess.run(["rm", "-rf", info["workdir"]], check=True)


def test_interrupted_make_cluster_stops_cleanly() -> None:
    """``python -m testkit.cluster`` (make cluster): SIGINT (Ctrl-C) stops everything in order,
    even when it was started with SIGINT ignored (as a background job of a script is)."""
    load_binaries()
    proc = subprocess.Popen([sys.executable, "-m", "testkit.cluster"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        kubeconfig = next((ln.split("KUBECONFIG=", 1)[1].strip() for ln in lines if "KUBECONFIG=" in ln), None)
        pids = next((json.loads(ln.split("pids:", 1)[1]) for ln in lines if "pids:" in ln), None)
        assert kubeconfig is not None and pids, "".join(lines)
        assert all(pid_alive(pid) for pid in pids.values())
        proc.send_signal(signal.SIGINT)
        # Each component gets its own graceful stop; on a loaded machine that adds up.
        try:
            rest = proc.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # every thread's stack to its stderr (faulthandler)
            time.sleep(2)
            proc.kill()
            rest = proc.communicate()[0]
            # Kept where a later look finds it (the cluster's own log and its threads' stacks).
            report = Path(tempfile.gettempdir()) / f"encoderpool-cluster-stop-{proc.pid}.log"
            report.write_text("".join(lines) + rest)
            pytest.fail(f"the stop took over 120 s; its log and stacks are in {report}")
    finally:
        if proc.poll() is None:  # a failed test must not leave the cluster (and its pipe) behind
            proc.kill()
            proc.communicate()
        elif proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0, "".join(lines) + rest
    assert _wait_all_gone(pids, 5) == {}
    assert not Path(kubeconfig).exists()
