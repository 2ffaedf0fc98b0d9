#!/usr/bin/env bash
# A Docker base image made from Debian's packages, for machines where no registry can be pulled from:
#
#   hack/debian-image.sh NAME PACKAGE...     prints the image reference (encoderpool/debian-NAME:<hash>)
#
# `debootstrap --variant=minbase` of Debian $DEBIAN_SUITE (default bookworm) from the host's
# configured Debian mirror (or $DEBIAN_MIRROR) with the packages named, apt's lists and caches
# removed, then `tar | docker import`. The tag is a hash of the suite, mirror and package list, so
# a rebuild happens only when those change. The rootfs is made under $ENCODERPOOL_CACHE/rootfs and
# removed after the import. Needs root (debootstrap), a running Docker engine, and debootstrap
# (installed from Debian's packages when missing).
#
# Environment: DEBIAN_SUITE, DEBIAN_MIRROR, DEBIAN_IMAGE_PRUNE (extra paths to delete from the rootfs,
# relative, space separated), DEBIAN_IMAGE_CHANGES (extra `docker import --change` lines, one per line).
set -euo pipefail

NAME="$1"; shift
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
SUITE="${DEBIAN_SUITE:-bookworm}"

host_mirror() {
  # The first deb822 URIs line of the host's Debian sources, or the classic sources.list form.
  local uri
  uri="$(sed -n 's/^URIs:[[:space:]]*\(http[^[:space:]]*\/debian\)[[:space:]]*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)"
  [ -n "$uri" ] || uri="$(sed -n 's/^deb[[:space:]]\+\(http[^[:space:]]*\/debian\)[[:space:]].*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n1 || true)"
  echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR="${DEBIAN_MIRROR:-$(host_mirror)}"
PACKAGES="$(printf '%s\n' "$@" | sort -u | paste -sd, -)"
KEY="$(printf '%s\n' "$SUITE" "$MIRROR" "$PACKAGES" "${DEBIAN_IMAGE_PRUNE:-}" "${DEBIAN_IMAGE_CHANGES:-}" | sha256sum | cut -c1-12)"
IMAGE="encoderpool/debian-$NAME:$SUITE-$KEY"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo ">> $IMAGE: cached" >&2
  echo "$IMAGE"
  exit 0
fi

if ! command -v debootstrap >/dev/null; then
  echo ">> installing debootstrap (Debian's package)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2; }
fi

ROOT="$CACHE/rootfs/$NAME-$KEY"
began=$SECONDS
# A rootfs whose debootstrap finished (marker) is reused when only the import failed.
if [ ! -f "$ROOT.done" ]; then
  rm -rf "$ROOT"
  mkdir -p "$ROOT"
  echo ">> debootstrap $SUITE ($MIRROR) for $IMAGE: $PACKAGES (cold: a few minutes)" >&2
  nice -n 10 debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 \
    || { tail -n 30 "$ROOT.log" >&2; echo "!! debootstrap failed (log above)" >&2; exit 1; }
  rm -f "$ROOT.log"
  touch "$ROOT.done"
fi
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/var/log/*.log "$ROOT"/var/cache/ldconfig/aux-cache
for path in ${DEBIAN_IMAGE_PRUNE:-}; do rm -rf "${ROOT:?}/$path"; done
changes=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'CMD ["/bin/bash"]'
         --change "LABEL org.opencontainers.image.description=\"Debian $SUITE ($MIRROR): $PACKAGES\"")
while IFS= read -r line; do [ -n "$line" ] && changes+=(--change "$line"); done <<<"${DEBIAN_IMAGE_CHANGES:-}"
tar -C "$ROOT" --numeric-owner -c . | docker import "${changes[@]}" - "$IMAGE" >/dev/null
rm -rf "$ROOT" "$ROOT.done"
echo ">> $IMAGE imported in $((SECONDS - began))s ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))" >&2
echo "$IMAGE"
