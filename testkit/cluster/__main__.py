"""``python -m testkit.cluster``: start a local cluster, print how to use it, stop on Ctrl-C.

SIGTERM and SIGHUP are turned into the same orderly stop as Ctrl-C (the reaper would clean up
anyway, but an orderly stop also removes the temp dir). Ctrl-C works even when this was started
with SIGINT ignored (a background job of a non-interactive shell inherits that). SIGUSR1 prints
every thread's stack to stderr (a stop that seems stuck can be asked where it is).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import signal
import sys
import time

from . import Cluster, ClusterOptions, MissingBinaries


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m testkit.cluster", description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep logs and etcd data after stopping")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request is noise here
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited as ignored
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_keyboard_interrupt)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        cluster = Cluster(options=ClusterOptions(keep_workdir=args.keep))
    except MissingBinaries as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    began = time.monotonic()
    try:
        # Ctrl-C can come at any point, even during start or the banner: the context manager
        # stops whatever is running, and the interrupt is an ordinary, successful way out.
        with cluster:
            print(f"\nlocal cluster ready in {time.monotonic() - began:.1f}s ({cluster.binaries.k8s_version})\n"
                  f"  export KUBECONFIG={cluster.kubeconfig}\n"
                  f"  kubectl: {cluster.binaries.kubectl}\n"
                  f"  helm:    {cluster.binaries.helm}\n"
                  f"  API server {cluster.server}, admin token in the kubeconfig\n"
                  f"  logs: {cluster.workdir / 'logs'}\n"
                  f"  pids: {json.dumps(cluster.pids())}\n"
                  "Ctrl-C stops it.", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopped.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
