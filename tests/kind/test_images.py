"""The images from docker/ (``make images``) run as they would in a restricted pod: a numeric
non-root user, a read-only root filesystem, every capability dropped, writable space only on
tmpfs mounts where the operator puts emptyDirs (/tmp, /cache). The encoder image serves its baked
tiny checkpoint and answers /encode; the operator image starts its CLI.

Real containers of the Docker engine hack/kind-e2e.sh started; nothing here is mocked.
"""

from __future__ import annotations

import base64
import json
import math
import subprocess
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.kind.images import ENCODER_CPU_IMAGE, OPERATOR_IMAGE

pytestmark = pytest.mark.kind

BAKED_MODEL = "/opt/encoderpool/models/qwen2_vl-tiny"  # the path examples/encoderpool-cpu.yaml names
UID = 10001
# What the operator's pods get (operator/encoderpool_operator/podparts.py), as docker run flags.
RESTRICTED = ["--read-only", "--user", f"{UID}:{UID}", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
              "--tmpfs", "/tmp:rw,mode=1777", "--tmpfs", f"/cache:rw,uid={UID},gid={UID}",
              "--env", "HOME=/cache", "--env", "HF_HOME=/cache/huggingface", "--env", "XDG_CACHE_HOME=/cache"]
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAAKklEQVR42u3NMQEAAAQAMATRP4pYSvBtBZbTHZ8q"
           "ngkEAoFAIBAIBIIrC+AFAUQz669uAAAAAElFTkSuQmCC")
READY_SECONDS = 240.0


def docker(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="module")
def encoder_container() -> Iterator[tuple[str, str]]:
    """``encoder-pod serve`` of the baked checkpoint in a restricted container: (name, base URL)."""
    name = f"encoderpool-image-test-{uuid.uuid4().hex[:6]}"
    docker("run", "-d", "--name", name, *RESTRICTED, "--memory", "3g", ENCODER_CPU_IMAGE,
           "encoder-pod", "serve", "--model-path", BAKED_MODEL, "--host", "0.0.0.0", "--port", "30000",
           "--device", "cpu")
    try:
        address = docker("inspect", "-f", "{{.NetworkSettings.IPAddress}}", name).stdout.strip()
        base = f"http://{address}:30000"
        deadline = time.monotonic() + READY_SECONDS
        while True:
            state = json.loads(docker("inspect", "-f", "{{json .State}}", name).stdout)
            assert state["Running"], f"the encoder exited {state.get('ExitCode')}:\n{docker('logs', name).stderr[-3000:]}"
            try:
                if httpx.get(base + "/health", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not healthy after {READY_SECONDS:.0f}s:\n{docker('logs', name).stderr[-3000:]}"
            time.sleep(1)
        yield name, base
    finally:
        docker("rm", "-f", "-v", name, check=False)


def test_the_encoder_image_serves_its_baked_model_as_a_restricted_non_root_user(
        encoder_container: tuple[str, str]) -> None:
    name, base = encoder_container
    body = {"req_id": "image-1", "modality": "IMAGE", "mm_items": [f"data:image/png;base64,{PNG_B64}"]}
    response = httpx.post(base + "/encode", json=body, timeout=120)
    assert response.status_code == 200, response.text
    embedding = response.json()["embedding"]
    assert embedding["dtype"] == "float32"
    assert len(base64.b64decode(embedding["data"])) == math.prod(embedding["shape"]) * 4
    # The server process is PID 1 of the container (what the kubelet signals) and runs as 10001.
    status = docker("exec", name, "cat", "/proc/1/status").stdout
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    assert set(uids) == {str(UID)}, uids
    assert "encoder-pod" in docker("exec", name, "cat", "/proc/1/cmdline").stdout


def test_the_encoder_container_cannot_write_its_root_filesystem(encoder_container: tuple[str, str]) -> None:
    name, _ = encoder_container
    for path in ("/opt/encoderpool/x", "/x", f"{BAKED_MODEL}/x"):
        refused = docker("exec", name, "touch", path, check=False)
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr, (path, refused.stderr)
    # Its caches are where the operator mounts emptyDirs, and writable there.
    assert docker("exec", name, "touch", "/cache/x", "/tmp/x", check=False).returncode == 0


def test_the_encoder_image_declares_a_numeric_non_root_user_and_bakes_the_example_model() -> None:
    config = json.loads(docker("image", "inspect", "-f", "{{json .Config}}", ENCODER_CPU_IMAGE).stdout)
    assert config["User"] == f"{UID}:{UID}"  # numeric: runAsNonRoot can verify it without /etc/passwd
    listed = docker("run", "--rm", *RESTRICTED, ENCODER_CPU_IMAGE, "ls", BAKED_MODEL).stdout.split()
    assert "config.json" in listed and any(f.endswith(".safetensors") for f in listed), listed


def test_the_cpu_image_has_torch_without_the_gpu_kernel_compiler() -> None:
    probe = ("import importlib.util, torch; "
             "print(torch.__version__, torch.cuda.is_available(), importlib.util.find_spec('triton') is None)")
    out = docker("run", "--rm", *RESTRICTED, ENCODER_CPU_IMAGE, "python", "-c", probe).stdout.split()
    assert out[0].startswith("2.15.0") and out[1:] == ["False", "True"], out


def test_the_operator_image_runs_as_a_restricted_non_root_user() -> None:
    config = json.loads(docker("image", "inspect", "-f", "{{json .Config}}", OPERATOR_IMAGE).stdout)
    assert config["User"] == f"{UID}:{UID}"
    helped = docker("run", "--rm", *RESTRICTED, OPERATOR_IMAGE, "--help")
    assert "usage" in helped.stdout.lower(), helped.stdout
    # No torch in the operator image: it installs only the operator's dependencies.
    probe = docker("run", "--rm", *RESTRICTED, "--entrypoint", "python", OPERATOR_IMAGE, "-c",
                   "import importlib.util; print(importlib.util.find_spec('torch') is None)")
    assert probe.stdout.strip() == "True"
