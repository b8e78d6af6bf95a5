#!/usr/bin/env bash
# netns_cluster.sh end to end: refused without root; two nodes with their own hostnames, links
# and shaping; `up` again changes nothing; zerorun --hostfile places two ranks on each node;
# `up 1` removes the second node; `down` ends a process left on a node and leaves no namespace,
# link or state behind.
#   cluster_test.sh BIN_DIR
set -euo pipefail
bin="$1"
# shellcheck source=SCRIPTDIR/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"

fail() {
  echo "FAIL: $*"
  exit 1
}

start_cluster 2

if refusal="$(setpriv --reuid=65534 --regid=65534 --clear-groups bash "$cluster" up 2 2>&1)"; then
  fail "up succeeded without root"
fi
[[ "$refusal" == *"needs root"* ]] || fail "up without root said: $refusal"

for node in node0 node1; do
  name="$(bash "$cluster" exec "$node" hostname)"
  [[ "$name" == "$node" ]] || fail "$node's hostname is '$name'"
  tc qdisc show dev "zero-$node" | grep -q "tbf .*rate 1Gbit" || fail "$node's link is not shaped"
  tc -n "$node" qdisc show dev eth0 | grep -q "tbf .*rate 1Gbit" || fail "$node's eth0 is not shaped"
done
[[ "$(hostname)" != node0 ]] || fail "the host's own hostname changed"

links_before="$(ip -o link show | awk '/zero-/ { print $1, $2 }')"
bash "$cluster" up 2 --rate 1gbit
[[ "$(ip -o link show | awk '/zero-/ { print $1, $2 }')" == "$links_before" ]] \
  || fail "a second 'up 2' remade the links"
[[ "$(cat "$hostfile")" == $'node0 slots=2\nnode1 slots=2' ]] || fail "hostfile: $(cat "$hostfile")"

shaped_before="$(tc -s qdisc show dev zero-node1 | awk '/Sent/ { print $2 }')"
# shellcheck disable=SC2016  # expanded by each rank's shell
placement="$(on_cluster "$bin/zerorun" --hostfile "$hostfile" -- \
  sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname)"' | grep '^rank' | sort)"
expected=$'rank 0 on node0\nrank 1 on node0\nrank 2 on node1\nrank 3 on node1'
[[ "$placement" == "$expected" ]] || fail "ranks placed as: $placement"
shaped_after="$(tc -s qdisc show dev zero-node1 | awk '/Sent/ { print $2 }')"
[[ $shaped_after -gt $shaped_before ]] || fail "the job's traffic did not pass node1's shaper"

bash "$cluster" up 1
if [[ -e /run/netns/node1 ]] || ip link show zero-node1 > /dev/null 2>&1; then
  fail "'up 1' left node1"
fi
[[ "$(cat "$hostfile")" == "node0 slots=2" ]] || fail "hostfile after 'up 1': $(cat "$hostfile")"

bash "$cluster" exec node0 sleep 600 &
left=$!
sleep 0.5
bash "$cluster" down
wait "$left" 2> /dev/null && fail "the process left on node0 survived 'down'"
leftovers="$(ip netns list | grep -E '^node[0-9]+' || true)$(ip -o link show | grep zero- || true)"
[[ -z "$leftovers" ]] || fail "left after down: $leftovers"
[[ ! -e "${ZERO_NETNS_STATE:-/run/zero-netns}" ]] || fail "the state directory is left"
bash "$cluster" down
echo "cluster: up, placement, shaping, idempotence and down as expected"
