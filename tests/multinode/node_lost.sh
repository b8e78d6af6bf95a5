#!/usr/bin/env bash
# A node lost mid-training: every rank on node1 is killed while zero-train runs on 2 nodes x 2
# ranks. The job must end soon after (not hang in a collective until the watchdog), with a
# non-zero exit code and a message naming node1.
#   node_lost.sh BIN_DIR
set -euo pipefail
bin="$1"
# shellcheck source=SCRIPTDIR/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"

fail() {
  cat "$work/job.log"
  echo "FAIL: $*"
  exit 1
}

start_cluster 2
on_cluster "$bin/zerorun" --hostfile "$hostfile" -- "$bin/zero-train" --steps 1000000 \
  --steps-per-print 100 > "$work/job.log" 2>&1 &
job=$!
for _ in $(seq 300); do
  grep -q '^step' "$work/job.log" && break
  sleep 0.1
done
grep -q '^step' "$work/job.log" || fail "the job did not start training within 30 s"

ranks=()
for pid in $(ip netns pids node1); do
  if [[ "$(cat "/proc/$pid/comm" 2> /dev/null)" == zero-train ]]; then ranks+=("$pid"); fi
done
[[ ${#ranks[@]} -eq 2 ]] || fail "expected 2 ranks on node1, found ${#ranks[@]}"
killed_at=$SECONDS
kill -KILL "${ranks[@]}"

rc=0
wait "$job" || rc=$?
elapsed=$((SECONDS - killed_at))
[[ $rc -ne 0 ]] || fail "the job ended with exit code 0"
[[ $elapsed -le 30 ]] || fail "the job took ${elapsed}s to end after node1's ranks died"
grep -q 'on node node1' "$work/job.log" || fail "no message names node1"
grep 'on node node1' "$work/job.log"
echo "the job ended ${elapsed}s after node1's ranks were killed, with exit code $rc"
