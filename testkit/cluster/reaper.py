"""Last-resort cleanup: a tiny watchdog process that kills registered process groups when its
parent goes away, whatever the reason (a test failing, Ctrl-C, SIGTERM, SIGKILL, a crash).

Normal teardown stops every process itself; this exists because a SIGKILLed pytest runs no
``finally`` or ``atexit`` and would otherwise leave etcd and kube-apiserver running forever.

Protocol on stdin, one line each: ``+PGID`` (watch this group), ``-PGID`` (forget it),
``C+["argv", ...]`` (run this command at the end), ``C-[...]`` (do not). When stdin reaches EOF
(the parent closed it or died: the kernel closes its end either way), every group still watched
gets SIGTERM, then SIGKILL after a grace period, then the registered commands run (the local
node's pod-IP route is removed that way).

This file is run by path (``python reaper.py``), so it imports nothing from the package.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

GRACE_SECONDS = 3.0


def _alive(pgid: int) -> bool:
    """True while any process of the group exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_groups(pgids: set[int], signum: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def kill_groups(pgids: set[int], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every group, wait up to ``grace`` seconds, SIGKILL what is left."""
    _signal_groups(pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pgids):
        time.sleep(0.05)
    _signal_groups({p for p in pgids if _alive(p)}, signal.SIGKILL)


def main() -> None:
    """Track groups and commands from stdin until EOF, then clean up."""
    # A terminal hangup or Ctrl-C must not kill the watchdog before it has cleaned up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pgids: set[int] = set()
    commands: list[list[str]] = []
    for line in sys.stdin:
        line = line.strip()
        if line[:1] == "+" and line[1:].isdigit():
            pgids.add(int(line[1:]))
        elif line[:1] == "-" and line[1:].isdigit():
            pgids.discard(int(line[1:]))
        elif line.startswith("C+"):
            commands.append(json.loads(line[2:]))
        elif line.startswith("C-") and json.loads(line[2:]) in commands:
            commands.remove(json.loads(line[2:]))
    if pgids:
        kill_groups(pgids)
    for argv in commands:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


if __name__ == "__main__":
    main()
