#!/usr/bin/env bash
# Runs the whole suite (`make test` runs `make lint` before it); pytest's exit 5 ("no tests
# collected") is a failure here too: a suite that runs nothing must not pass silently.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$rc"
