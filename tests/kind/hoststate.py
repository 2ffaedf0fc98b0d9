"""What of the host a kind run could change, recorded so that a test can compare before and after:
the kernel's sysctls (kubelet writes some non-namespaced ones of the HOST), the Docker engine's
containers, networks and volumes, kind's clusters, and whether the engine runs at all.

    python -m tests.kind.hoststate DIR     record the host into DIR/host.json (hack/kind-e2e.sh, first)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# Counters and per-boot values that change by themselves (the same list as hack/kind-cluster.sh).
VOLATILE = re.compile(r"^(fs\.(dentry-state|inode-nr|inode-state|file-nr|quota\.)|kernel\.(random\.|ns_last_pid|pty\.nr"
                      r"|tainted|sched_domain)|net\.netfilter\.nf_conntrack_count|net\.ipv[46]\.(conf|neigh)\."
                      r"(veth|br-|cni|docker|vxlan|flannel))")


def sysctls() -> dict[str, str]:
    out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, check=False).stdout
    pairs = (line.split(" = ", 1) for line in out.splitlines() if " = " in line)
    return {k: v for k, v in pairs if not VOLATILE.match(k)}


def docker_lines(*args: str) -> list[str] | None:
    """Output lines of a docker command, None when no engine answers."""
    if shutil.which("docker") is None:
        return None
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False, timeout=60)
    return sorted(done.stdout.split()) if done.returncode == 0 else None


def links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line)


def record() -> dict[str, Any]:
    return {"sysctls": sysctls(), "containers": docker_lines("ps", "-aq"),
            "networks": docker_lines("network", "ls", "-q"), "volumes": docker_lines("volume", "ls", "-q"),
            "links": links()}


if __name__ == "__main__":
    Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
    (Path(sys.argv[1]) / "host.json").write_text(json.dumps(record(), indent=1, sort_keys=True))
