"""The local node: a Node whose pods the test harness runs as real host processes.

See harness.py (node registration, heartbeat, pod watch), runner.py (one pod: processes, probes,
restarts, status), podspec.py (env and command resolution), probes.py and status.py.
"""

from .harness import LocalNode

__all__ = ["LocalNode"]
