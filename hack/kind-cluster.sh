#!/usr/bin/env bash
# A kind cluster for the e2e tier, and the host left as it was found afterwards.
#
#   hack/kind-cluster.sh up NAME KUBECONFIG    create cluster NAME (kubeconfig written to KUBECONFIG)
#   hack/kind-cluster.sh load NAME IMAGE...    kind load docker-image
#   hack/kind-cluster.sh down NAME             delete it; restore the host's sysctls; remove the
#                                              kind network and volumes if this script made them
#
# What is detected, never assumed:
# - the node image: $KIND_NODE_IMAGE if set (e.g. kindest/node:v1.35.4 on a workstation), else
#   kind's own default if it is present or can be pulled, else the node image assembled offline
#   (hack/kind-node-image.sh, cached);
# - --privileged: kind runs every node with it. Docker 20.10 grants a privileged container every
#   capability the kernel knows; on a host whose bounding set lacks one (CAP_SYS_RESOURCE in some
#   VMs) that fails ("unable to apply caps"). Then kind gets a `docker` first in its PATH that
#   replaces --privileged by every capability but the missing ones, unconfined system paths and
#   all devices, and the node's containerd is told not to raise oom_score_adj (which needs
#   CAP_SYS_RESOURCE). Where --privileged works (a workstation), kind runs as it is;
# - cgroup v1: kubelet 1.35 refuses it unless failCgroupV1 is false; set only on such hosts.
#
# kubelet writes non-namespaced sysctls of the HOST kernel at start (vm.overcommit_memory,
# kernel.panic, kernel.panic_on_oops, ... ; stock kind does the same): `up` records every sysctl
# first, `down` writes back each one that changed. The record lives in $ENCODERPOOL_CACHE/kind/.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${ENCODERPOOL_CACHE:-$HOME/.cache/encoderpool}"
export ENCODERPOOL_CACHE="$CACHE"
STATE="$CACHE/kind"
mkdir -p "$STATE"

say() { echo ">> kind: $*" >&2; }
die() { echo "!! kind: $*" >&2; exit 1; }

kind_bin() {
  # shellcheck disable=SC1091
  [ -f "$CACHE/bin/kind.env" ] && . "$CACHE/bin/kind.env"
  echo "${KIND:-$(command -v kind || true)}"
}

# --- host state ----------------------------------------------------------------------------------
# Counters and per-boot values that change by themselves; never restored, never compared.
VOLATILE='^(fs\.(dentry-state|inode-nr|inode-state|file-nr|quota\.)|kernel\.(random\.|ns_last_pid|pty\.nr|tainted|sched_domain)|net\.netfilter\.nf_conntrack_count|net\.ipv[46]\.(conf|neigh)\.(veth|br-|cni|docker|vxlan|flannel))'

sysctl_snapshot() { sysctl -a 2>/dev/null | grep -v -E "$VOLATILE" | sort; }

restore_sysctls() {
  local before="$1" now changed=0
  [ -f "$before" ] || return 0
  now="$(mktemp)"
  sysctl_snapshot >"$now"
  # Lines only in the record: keys whose value changed (or that went away with an interface).
  while IFS= read -r line; do
    local key="${line%% = *}" value="${line#* = }"
    [ -e "/proc/sys/${key//.//}" ] || continue
    if sysctl -q -w "$key=$value" >/dev/null 2>&1; then
      say "restored $key = $value"
      changed=$((changed + 1))
    fi
  done < <(comm -23 "$before" "$now")
  rm -f "$now"
  [ "$changed" -eq 0 ] || say "restored $changed host sysctl(s) changed by the cluster"
}

# --- detection -----------------------------------------------------------------------------------
# A one-file image (kind's pause binary, built by hack/build-kind.sh) to try `docker run` flags with.
probe_image() {
  # shellcheck disable=SC1091
  . "$CACHE/bin/kind.env"
  local image=encoderpool/probe:pause dir
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    dir="$(mktemp -d)"
    cp "$PAUSE" "$dir/pause"
    printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$dir/Dockerfile"
    docker build -q -t "$image" "$dir" >/dev/null
    rm -rf "$dir"
  fi
  echo "$image"
}

privileged_works() {
  local image="$1" out
  out="$(docker run --rm --privileged "$image" -v 2>&1)" && return 0
  echo "$out" | grep -q -i 'unable to apply caps\|operation not permitted' ||
    die "docker run --privileged failed for another reason: $out"
  return 1
}

missing_caps() {
  # Capabilities the kernel knows (cap_last_cap) that this host's bounding set lacks.
  local last bnd names=() i
  last="$(cat /proc/sys/kernel/cap_last_cap)"
  bnd=$((16#$(awk '/^CapBnd/ {print $2}' /proc/self/status)))
  local all=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE
    NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT
    SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE
    AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ
    PERFMON BPF CHECKPOINT_RESTORE)
  for i in $(seq 0 "$last"); do
    if (( (bnd >> i & 1) == 0 )) && [ -n "${all[$i]:-}" ]; then names+=("${all[$i]}"); fi
  done
  echo "${names[*]:-}"
}

write_docker_shim() {
  local shim="$STATE/shim" real caps="$1" drops=""
  real="$(command -v docker)"
  local c
  for c in $caps; do drops="$drops --cap-drop=$c"; done
  mkdir -p "$shim"
  cat >"$shim/docker.tmp" <<EOF
#!/usr/bin/env bash
# Written by hack/kind-cluster.sh: this host cannot run --privileged containers (its capability
# bounding set lacks: $caps). kind passes --privileged to every docker run and exec. A container
# gets every other capability, unconfined /proc and /sys, and every device instead; an exec gets
# the container's own capabilities (docker exec has no --cap-add).
sub=""
for a in "\$@"; do case "\$a" in -*) ;; *) sub="\$a"; break ;; esac; done
args=()
for a in "\$@"; do
  if [ "\$a" = --privileged ]; then
    [ "\$sub" = exec ] && continue
    args+=(--cap-add=ALL$drops --security-opt systempaths=unconfined --security-opt apparmor=unconfined --device-cgroup-rule='a *:* rwm')
  else
    args+=("\$a")
  fi
done
exec "$real" "\${args[@]}"
EOF
  chmod +x "$shim/docker.tmp"
  mv "$shim/docker.tmp" "$shim/docker"
  echo "$shim"
}

cgroup_v1() { [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; }

node_image() {
  if [ -n "${KIND_NODE_IMAGE:-}" ]; then echo "$KIND_NODE_IMAGE"; return; fi
  local default
  default="$("$(kind_bin)" version >/dev/null 2>&1 && sed -n 's/^const Image = "\(.*\)"$/\1/p' \
    "$CACHE"/go/mod/sigs.k8s.io/kind@"${KIND_VERSION:-v0.33.0}"/pkg/apis/config/defaults/image.go 2>/dev/null || true)"
  if [ -n "$default" ] && { docker image inspect "$default" >/dev/null 2>&1 ||
      timeout 300 docker pull -q "$default" >/dev/null 2>&1; }; then
    echo "$default"; return
  fi
  say "kind's node image ${default:-(unknown)} cannot be pulled here: assembling one offline" >&2
  bash hack/kind-node-image.sh
}

# --- commands ------------------------------------------------------------------------------------
up() {
  local name="$1" kubeconfig="$2" kind
  kind="$(kind_bin)"
  [ -x "$kind" ] || die "no kind binary (hack/build-kind.sh builds it)"
  docker network inspect kind >/dev/null 2>&1 && echo existed >"$STATE/$name.network" || echo created >"$STATE/$name.network"
  docker volume ls -q | sort >"$STATE/$name.volumes"
  [ -f "$STATE/$name.sysctls" ] || sysctl_snapshot >"$STATE/$name.sysctls"

  local offline=0 path_prefix="" caps=""
  if ! privileged_works "$(probe_image)"; then
    caps="$(missing_caps)"
    say "--privileged fails on this host (its capability bounding set lacks: ${caps:-?}): kind runs through a docker shim"
    path_prefix="$(write_docker_shim "$caps")"
  fi
  local image
  image="$(PATH="${path_prefix:+$path_prefix:}$PATH" node_image)"
  case "$image" in encoderpool/kind-node:*) offline=1 ;; esac

  local config="$STATE/$name-config.yaml"
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "networking:"
    # The offline node image carries a bridge CNI config (kind's kindnetd image cannot be had).
    [ "$offline" = 1 ] && echo "  disableDefaultCNI: true"
    echo "  apiServerAddress: 127.0.0.1"
    if [ -n "$caps" ] && [[ " $caps " == *" SYS_RESOURCE "* ]]; then
      echo "containerdConfigPatches:"
      echo "- |-"
      echo "  [plugins.\"io.containerd.grpc.v1.cri\"]"
      echo "    restrict_oom_score_adj = true"
    fi
    echo "kubeadmConfigPatches:"
    if cgroup_v1; then
      echo "- |"
      echo "  kind: KubeletConfiguration"
      echo "  failCgroupV1: false"
    fi
    if [ "$offline" = 1 ]; then
      # shellcheck disable=SC1091
      . "$CACHE/bin/kind.env"; . "$CACHE/bin/control-plane.env"
      echo "- |"
      echo "  kind: ClusterConfiguration"
      echo "  etcd:"
      echo "    local:"
      echo "      imageTag: ${ETCD_VERSION#v}-0"
      echo "  dns:"
      echo "    imageTag: $COREDNS_VERSION"
    fi
    # The HPA loop every 2 s (15 s by default), so that autoscaling tests take seconds.
    echo "- |"
    echo "  kind: ClusterConfiguration"
    echo "  controllerManager:"
    echo "    extraArgs:"
    echo "      horizontal-pod-autoscaler-sync-period: 2s"
  } >"$config"

  say "creating cluster $name from $image"
  local began=$SECONDS
  PATH="${path_prefix:+$path_prefix:}$PATH" "$kind" create cluster --name "$name" --image "$image" \
    --config "$config" --kubeconfig "$kubeconfig" --wait 180s >&2
  say "cluster $name created in $((SECONDS - began))s"
  echo "$path_prefix" >"$STATE/$name.path"
  # One node on a small host: kubeadm's two CoreDNS replicas request 200m of its CPU; one is
  # enough for one node, and leaves room for a pool requesting a whole CPU (examples/encoderpool-cpu.yaml)
  # beside the control plane and the operator on 2 cores.
  if [ "$(nproc)" -lt 4 ]; then
    . "$CACHE/bin/control-plane.env"
    "$KUBECTL" --kubeconfig "$kubeconfig" -n kube-system scale deployment coredns --replicas=1 >&2
  fi
}

load() {
  local name="$1"; shift
  local prefix
  prefix="$(cat "$STATE/$name.path" 2>/dev/null || true)"
  local began=$SECONDS
  PATH="${prefix:+$prefix:}$PATH" "$(kind_bin)" load docker-image --name "$name" "$@" >&2
  say "loaded $* in $((SECONDS - began))s"
}

down() {
  local name="$1" kind prefix
  kind="$(kind_bin)"
  prefix="$(cat "$STATE/$name.path" 2>/dev/null || true)"
  if [ -x "$kind" ] && PATH="${prefix:+$prefix:}$PATH" "$kind" get clusters 2>/dev/null | grep -qx "$name"; then
    say "deleting cluster $name"
    PATH="${prefix:+$prefix:}$PATH" "$kind" delete cluster --name "$name" >&2
  fi
  if [ "$(cat "$STATE/$name.network" 2>/dev/null)" = created ] && docker network inspect kind >/dev/null 2>&1; then
    [ -z "$(docker network inspect -f '{{range .Containers}}x{{end}}' kind)" ] && docker network rm kind >/dev/null && say "removed the kind network"
  fi
  if [ -f "$STATE/$name.volumes" ]; then
    local v
    for v in $(comm -13 "$STATE/$name.volumes" <(docker volume ls -q | sort)); do
      docker volume rm "$v" >/dev/null 2>&1 && say "removed volume $v"
    done
  fi
  restore_sysctls "$STATE/$name.sysctls"
  rm -f "$STATE/$name.sysctls" "$STATE/$name.network" "$STATE/$name.volumes" "$STATE/$name.path" "$STATE/$name-config.yaml"
}

case "${1:-}" in
  up) up "$2" "$3" ;;
  load) shift; load "$@" ;;
  down) down "$2" ;;
  *) echo "usage: $0 up NAME KUBECONFIG | load NAME IMAGE... | down NAME" >&2; exit 2 ;;
esac
