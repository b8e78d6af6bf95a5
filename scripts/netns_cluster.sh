#!/usr/bin/env bash
# Several hosts on one machine: each node is a network namespace with its own hostname (a UTS
# namespace), joined to the others by a veth pair on a bridge, so OpenMPI sees separate nodes
# that talk over TCP, as on a cluster. The mount and PID namespaces stay shared: every node sees
# the same files, as over a shared file system. Needs root.
#   netns_cluster.sh up N [--rate R] [--slots S]  nodes node0..node(N-1), each with S slots in
#                                                 the hostfile (default 2); R shapes every node's
#                                                 link both ways (tc rate, e.g. 1gbit)
#   netns_cluster.sh down                         remove the nodes, their processes, the bridge
#   netns_cluster.sh env                          shell lines exporting the OpenMPI settings
#                                                 that launch on the nodes: eval "$(... env)"
#   netns_cluster.sh exec NODE COMMAND...         run COMMAND on NODE
#   netns_cluster.sh check                        exit 1 with the reason where `up` cannot work
# `up` is idempotent: it creates what is missing, removes nodes beyond N and resets the shaping.
# It writes the DeepSpeed hostfile $ZERO_NETNS_STATE/hostfile. Node k has address
# $ZERO_NETNS_NET.(k+1)/24, the bridge (this host, where mpirun runs) $ZERO_NETNS_NET.254.
set -euo pipefail

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
state="${ZERO_NETNS_STATE:-/run/zero-netns}"
net="${ZERO_NETNS_NET:-10.213.0}"
bridge=zero-br
max_nodes=200

die() {
  echo "netns_cluster.sh: $*" >&2
  exit 1
}

usage() {
  echo "usage:" >&2
  sed -n '6,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# Why `up` cannot work here, or nothing.
missing_prerequisite() {
  if [[ $EUID -ne 0 ]]; then
    echo "needs root to create network namespaces; running as uid $EUID"
    return
  fi
  local tool
  for tool in ip tc nsenter unshare mountpoint; do
    if ! command -v "$tool" > /dev/null; then
      echo "needs '$tool' (iproute2 / util-linux), which is not on PATH"
      return
    fi
  done
  if ! unshare --net --uts true 2> /dev/null; then
    echo "cannot create network and UTS namespaces here (unshare --net --uts fails)"
  fi
}

require_prerequisites() {
  local reason
  reason="$(missing_prerequisite)"
  [[ -z "$reason" ]] || die "$reason"
}

# The nodes that exist now, from their UTS files (the last thing `up` makes of a node is the
# hostfile entry; the UTS file is the first thing it checks, so partial nodes are listed too).
existing_nodes() {
  local file
  for file in "$state"/node*.uts; do
    [[ -e "$file" ]] || continue
    basename "$file" .uts
  done | sort -V
}

# Enter NODE's network and UTS namespaces and run the rest of the arguments.
node_exec() {
  local node="$1"
  shift
  [[ -e "/run/netns/$node" && -e "$state/$node.uts" ]] || die "no node '$node' (not up)"
  exec nsenter --net="/run/netns/$node" --uts="$state/$node.uts" -- "$@"
}

# Ends the processes still inside NODE (a rank or daemon left by a killed job), so the namespace
# really goes away.
kill_node_processes() {
  local node="$1" pids
  [[ -e "/run/netns/$node" ]] || return 0
  pids="$(ip netns pids "$node")"
  [[ -z "$pids" ]] && return 0
  # shellcheck disable=SC2086  # one pid per word
  kill -KILL $pids 2> /dev/null || true
}

remove_node() {
  local node="$1"
  kill_node_processes "$node"
  # Deleting the host end removes the pair at once; the namespace itself is freed lazily.
  if ip link show "zero-$node" > /dev/null 2>&1; then ip link del "zero-$node"; fi
  if mountpoint -q "$state/$node.uts"; then umount "$state/$node.uts"; fi
  rm -f "$state/$node.uts"
  if [[ -e "/run/netns/$node" ]]; then ip netns del "$node"; fi
}

shape() {
  local rate="$1" dev="$2"
  shift 2
  # "$@" is empty for the host end, "-n NODE" for the node's end.
  if [[ -z "$rate" ]]; then
    tc "$@" qdisc del dev "$dev" root 2> /dev/null || true
    return
  fi
  # A token bucket: `rate` on average, bursts of 256 KiB (a 1 Gbit/s link at 1 kHz ticks needs
  # 125 KB), packets queued up to 50 ms before they drop, as a switch port would.
  tc "$@" qdisc replace dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms \
    || die "tc cannot shape $dev to '$rate' (a rate is e.g. 1gbit or 100mbit)"
}

add_node() {
  local k="$1" rate="$2" node="node$1"
  [[ -e "/run/netns/$node" ]] || ip netns add "$node"
  if ! mountpoint -q "$state/$node.uts"; then
    touch "$state/$node.uts"
    # A UTS namespace kept alive by a bind mount on the file, holding the node's hostname:
    # OpenMPI tells nodes apart by their daemons, and ranks print and compare hostnames.
    nsenter --net="/run/netns/$node" unshare --uts="$state/$node.uts" hostname "$node"
  fi
  if ! ip link show "zero-$node" > /dev/null 2>&1; then
    ip link add "zero-$node" type veth peer name eth0 netns "$node"
  fi
  ip link set "zero-$node" master "$bridge" up
  ip -n "$node" addr replace "$net.$((k + 1))/24" dev eth0
  ip -n "$node" link set eth0 up
  ip -n "$node" link set lo up
  shape "$rate" "zero-$node"
  shape "$rate" eth0 -n "$node"
}

cluster_up() {
  local nodes="" rate="" slots=2
  [[ $# -ge 1 ]] || usage
  nodes="$1"
  shift
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --rate) [[ $# -ge 2 ]] || usage; rate="$2"; shift 2 ;;
      --slots) [[ $# -ge 2 ]] || usage; slots="$2"; shift 2 ;;
      *) usage ;;
    esac
  done
  [[ "$nodes" =~ ^[0-9]+$ && "$nodes" -ge 1 && "$nodes" -le $max_nodes ]] \
    || die "the number of nodes must be 1..$max_nodes, got '$nodes'"
  [[ "$slots" =~ ^[0-9]+$ && "$slots" -ge 1 ]] || die "--slots must be at least 1, got '$slots'"
  require_prerequisites

  # Whatever fails part way (a command, or die), nothing half-made stays behind.
  trap 'if [[ $? -ne 0 ]]; then
          echo "netns_cluster.sh: up failed; removing the cluster" >&2
          cluster_down
        fi' EXIT
  mkdir -p "$state"
  if ! ip link show "$bridge" > /dev/null 2>&1; then ip link add "$bridge" type bridge; fi
  ip addr replace "$net.254/24" dev "$bridge"
  ip link set "$bridge" up
  local k node
  for node in $(existing_nodes); do
    if [[ "${node#node}" -ge "$nodes" ]]; then remove_node "$node"; fi
  done
  : > "$state/hostfile"
  for ((k = 0; k < nodes; k++)); do
    add_node "$k" "$rate"
    echo "node$k slots=$slots" >> "$state/hostfile"
  done
  trap - EXIT
  echo "netns_cluster.sh: $nodes node(s) up on $net.0/24${rate:+, links shaped to $rate};" \
    "hostfile $state/hostfile"
}

cluster_down() {
  local node
  for node in $(existing_nodes); do remove_node "$node"; done
  # A node whose UTS file is gone but whose namespace or link is not (an interrupted `down`).
  for node in $(ip netns list | awk '$1 ~ /^node[0-9]+$/ { print $1 }'); do
    if ip link show "zero-$node" > /dev/null 2>&1; then remove_node "$node"; fi
  done
  if ip link show "$bridge" > /dev/null 2>&1; then ip link del "$bridge"; fi
  rm -rf "$state"
}

# OpenMPI's settings for a job on the nodes, as environment variables (OMPI_MCA_*), which mpirun
# reads and passes to its daemons and ranks: launch daemons through the namespace agent, each
# on its own (no tree spawn: a daemon would launch others from inside a node); daemons and ranks
# reach each other only over the bridge's subnet; ranks use shared memory within a node and TCP
# between nodes (ob1 and its BTLs, not UCX, which would pick its own transports).
cluster_env() {
  local subnet="$net.0/24"
  printf 'export %s=%q\n' \
    OMPI_MCA_plm_rsh_agent "$script_dir/netns_rsh.sh" \
    OMPI_MCA_plm_rsh_no_tree_spawn 1 \
    OMPI_MCA_oob_tcp_if_include "$subnet" \
    OMPI_MCA_btl_tcp_if_include "$subnet" \
    OMPI_MCA_pml ob1 \
    OMPI_MCA_btl self,vader,tcp \
    OMPI_MCA_mpi_yield_when_idle 1 \
    ZERO_NETNS_STATE "$state"
}

[[ $# -ge 1 ]] || usage
command="$1"
shift
case "$command" in
  up) cluster_up "$@" ;;
  down)
    [[ $# -eq 0 ]] || usage
    require_prerequisites
    cluster_down
    ;;
  env)
    [[ $# -eq 0 ]] || usage
    cluster_env
    ;;
  exec)
    [[ $# -ge 2 ]] || usage
    node_exec "$@"
    ;;
  check)
    [[ $# -eq 0 ]] || usage
    reason="$(missing_prerequisite)"
    [[ -z "$reason" ]] || die "$reason"
    ;;
  *) usage ;;
esac
