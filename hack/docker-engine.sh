#!/usr/bin/env bash
# The Docker engine the image builds and the kind tier use, started by the project when none runs.
#
#   hack/docker-engine.sh up      a Docker engine answers afterwards (exit 0), or says why not (exit 1)
#   hack/docker-engine.sh down    stops the engine if, and only if, `up` started it
#   hack/docker-engine.sh can     exit 0 if an engine answers or could be started here (no side effects)
#
# `up` uses a running engine as it is (a workstation's Docker Desktop or systemd docker), and only
# when none answers: installs Debian's docker.io if dockerd is missing (apt-get, as root or with
# `sudo -n`), then starts `dockerd` by hand (no systemd needed) with its data root OUTSIDE the repo,
# $ENCODERPOOL_CACHE/docker/data, so images survive between runs. That dockerd is told to leave the
# host's firewall and sysctls alone (--iptables=false --ip-forward=false --ip-masq=false): nothing
# here needs containers to reach the outside (no registry; images are built from local wheels), and
# the host is left as found. `down` stops it again and removes the docker0 bridge it made.
#
# `up` prints one word on stdout: `started` (this call started dockerd) or `running` (it was
# already up). A caller that got `started` calls `down` when it is done, so nested callers
# (make test -> the kind tier -> the image builds) stop only what they started.
set -euo pipefail

CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
STATE="$CACHE/docker"
DATA_ROOT="${ENCODERPOOL_DOCKER_DATA_ROOT:-$STATE/data}"
PIDFILE="$STATE/dockerd.pid"      # written only for an engine this script started
LOG="$STATE/dockerd.log"
START_SECONDS=60

say() { echo ">> docker engine: $*" >&2; }
die() { echo "!! docker engine: $*" >&2; exit 1; }

answers() { command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; return; fi
  command -v sudo >/dev/null && sudo -n true 2>/dev/null || return 1
  sudo -n "$@"
}

can_start() {
  [ "$(id -u)" -eq 0 ] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; } || return 1
  command -v dockerd >/dev/null || command -v apt-get >/dev/null
}

install_engine() {
  command -v dockerd >/dev/null && command -v docker >/dev/null && return 0
  command -v apt-get >/dev/null || die "dockerd is not installed and there is no apt-get to install docker.io"
  say "installing Debian's docker.io (dockerd, containerd, runc)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || true
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >&2 \
    || die "apt-get install docker.io failed"
}

start_engine() {
  install_engine
  mkdir -p "$DATA_ROOT"
  say "starting dockerd (data root $DATA_ROOT, log $LOG)"
  # setsid: the engine outlives this shell (make runs each recipe line in its own shell) and a
  # Ctrl-C of the test run does not reach it; `down` stops it.
  as_root setsid dockerd --data-root "$DATA_ROOT" --iptables=false --ip-forward=false --ip-masq=false \
    --log-level=warn >"$LOG" 2>&1 </dev/null &
  local pid=$!
  local began=$SECONDS
  until answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$LOG" >&2 || true
      die "dockerd exited during start (log above)"
    fi
    [ $((SECONDS - began)) -lt "$START_SECONDS" ] || die "dockerd did not answer within ${START_SECONDS}s (see $LOG)"
    sleep 0.5
  done
  # setsid may fork: the engine's own pid file names dockerd itself.
  if [ -s /var/run/docker.pid ]; then pid="$(cat /var/run/docker.pid)"; fi
  echo "$pid" >"$PIDFILE"
  say "dockerd $(docker version --format '{{.Server.Version}}' 2>/dev/null) answers after $((SECONDS - began))s (pid $pid)"
}

up() {
  mkdir -p "$STATE"
  if answers; then
    say "using the running engine ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    echo running
    return 0
  fi
  command -v docker >/dev/null || install_engine
  # A pid file left by a killed run whose dockerd is gone: the engine is not ours any more.
  [ -f "$PIDFILE" ] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null && rm -f "$PIDFILE"
  can_start || die "no Docker engine answers, and starting one needs root (or passwordless sudo)"
  start_engine
  echo started
}

down() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid="$(cat "$PIDFILE")"
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping the dockerd this project started (pid $pid)"
    as_root kill -TERM "$pid" || true
    local began=$SECONDS
    while kill -0 "$pid" 2>/dev/null; do
      if [ $((SECONDS - began)) -ge 30 ]; then as_root kill -KILL "$pid" || true; fi
      sleep 0.2
    done
  fi
  rm -f "$PIDFILE"
  # dockerd leaves its default bridge behind when it stops; it was not there before.
  if ip link show docker0 >/dev/null 2>&1; then as_root ip link delete docker0 || true; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  can) answers || can_start ;;
  *) echo "usage: $0 up|down|can" >&2; exit 2 ;;
esac
