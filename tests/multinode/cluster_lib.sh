# shellcheck shell=bash
# Helpers for the multi-node tests, sourced by them (bash, set -euo pipefail).
# start_cluster N [SLOTS]: brings up N nodes of SLOTS (2) slots with links shaped to 1 Gbit/s (the shaping is
# part of what is tested) and tears them down when the test exits, however it ends. Where the
# cluster cannot be made (not root, no namespaces) the test ends here with exit 0 and
# "skipping (REASON)", which CTest reports as skipped. Sets `hostfile`, and `work`, a scratch
# directory removed at exit too; `on_cluster` runs a command with OpenMPI's settings for the
# nodes.
cluster="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../scripts" && pwd)/netns_cluster.sh"

start_cluster() {
  local reason
  if ! reason="$(bash "$cluster" check 2>&1)"; then
    echo "multi-node test: skipping (${reason#netns_cluster.sh: })"
    exit 0
  fi
  work="$(mktemp -d)"
  trap 'bash "$cluster" down; rm -rf "$work"' EXIT
  bash "$cluster" up "$1" --rate 1gbit --slots "${2:-2}"
  # shellcheck disable=SC2034  # read by the test that sources this file
  hostfile="${ZERO_NETNS_STATE:-/run/zero-netns}/hostfile"
}

# run_job NAME COMMAND...: COMMAND with its output in $work/NAME.log; when it fails, the log is
# shown and the test fails naming NAME.
run_job() {
  local name="$1"
  shift
  "$@" > "$work/$name.log" 2>&1 || {
    cat "$work/$name.log"
    echo "FAIL: $name: the job failed"
    exit 1
  }
}

on_cluster() {
  (
    eval "$(bash "$cluster" env)"
    "$@"
  )
}

# link_bytes NODE: bytes NODE has received over its link so far (the host end's transmit
# counter: everything the bridge delivered to the node).
link_bytes() {
  cat "/sys/class/net/zero-$1/statistics/tx_bytes"
}

# expect_received NODE BEFORE AT_LEAST: NODE's link carried at least AT_LEAST bytes to it since
# link_bytes gave BEFORE; fails the test otherwise.
expect_received() {
  local node="$1" before="$2" at_least="$3" received
  received=$(($(link_bytes "$node") - before))
  if [[ $received -lt $at_least ]]; then
    echo "FAIL: $node received $received bytes over its link, expected at least $at_least"
    exit 1
  fi
  echo "$node received $received bytes over its link (at least $at_least expected)"
}
