#!/usr/bin/env bash
# zero-train on 2 nodes x 2 ranks against the same job on one node with 4 ranks, at stages 0-3:
# the same losses within 1e-6 relative, the engine's tolerance for 3-4 ranks (on one node the
# reductions go through shared memory, summing in rank order; across nodes hierarchically, each
# node's pair first, then the nodes over TCP: another order), and checkpoints of the same files.
# Each node must also have received, over its link, what any reduction needs from the other
# node: its contribution to the half of the gradients this node's ranks reduce, every step (a
# job that stayed on one node moves only a few KB of control messages there). And the
# collectives each job chose by itself, as its init record names them: shared memory on one
# node, the hierarchical path (shared memory inside a node, MPI between) on two. Last, the
# stage-3 checkpoint of the two nodes resumes on one node with 2 ranks.
#   train_across_nodes.sh BIN_DIR STEPS [ZERO_TRAIN_ARGS...]
set -euo pipefail
bin="$1"
steps="$2"
shift 2
# shellcheck source=SCRIPTDIR/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"

start_cluster 2

# train NAME LAUNCHER...: the job, its output kept in $work/NAME.log and shown if it fails.
train() {
  local name="$1"
  shift
  run_job "$name" "$@" "$bin/zero-train" --stage "$stage" --steps "$steps" "${train_args[@]}" \
    --metrics "$work/$name.jsonl" --save-dir "$work/$name"
}

# expect_collectives METRICS TRANSPORT: the job's init record names TRANSPORT.
expect_collectives() {
  grep -q "\"collectives\":\"$2\"" "$1" || {
    echo "FAIL: $1 does not name collectives '$2': $(head -1 "$1")"
    exit 1
  }
  echo "$(basename "$1" .jsonl): collectives $2"
}

train_args=("$@")
for stage in 0 1 2 3; do
  echo "stage $stage:"
  train "one_node$stage" "$bin/zerorun" -np 4 --
  before0="$(link_bytes node0)"
  before1="$(link_bytes node1)"
  train "two_nodes$stage" on_cluster "$bin/zerorun" --hostfile "$hostfile" --
  expect_collectives "$work/one_node$stage.jsonl" "shm"
  expect_collectives "$work/two_nodes$stage.jsonl" "hierarchical (2 nodes x 2 ranks)"
  params="$(grep -o '"params":[0-9]*' "$work/two_nodes$stage.jsonl" | cut -d: -f2)"
  at_least=$((steps * params * 4 / 2))
  expect_received node0 "$before0" "$at_least"
  expect_received node1 "$before1" "$at_least"
  "$bin/metrics_check" --steps "$steps" same-losses 1e-6 "$work/one_node$stage.jsonl" \
    "$work/two_nodes$stage.jsonl"
  diff <(cd "$work/one_node$stage" && find . -type f | sort) \
    <(cd "$work/two_nodes$stage" && find . -type f | sort) \
    || { echo "FAIL: the checkpoints of stage $stage hold different files"; exit 1; }
  echo "checkpoints of step $steps hold the same files"
done

# The stage-3 checkpoint saved on two nodes resumes on one node, with another world size (2
# ranks, the shards re-cut): the resumed steps match a one-node run that never stopped, within
# the same tolerance (the gradients of 2 ranks are summed in another order than those of 4).
total=$((steps + 2))
resume_from="$work/two_nodes3/$(printf 'step_%08d' "$steps")"
[ -d "$resume_from" ] || { echo "FAIL: no checkpoint $resume_from"; exit 1; }
# The checkpoint has the weights: the resumed run takes no --init-from.
resume_args=()
for ((i = 0; i < ${#train_args[@]}; i++)); do
  if [ "${train_args[i]}" = --init-from ]; then
    i=$((i + 1))
  else
    resume_args+=("${train_args[i]}")
  fi
done
# one_node NAME ZERO_TRAIN_ARGS...: stage 3 on 2 ranks of this machine for $total steps.
one_node() {
  local name="$1"
  shift
  run_job "$name" "$bin/zerorun" -np 2 -- "$bin/zero-train" --stage 3 --steps "$total" "$@" \
    --metrics "$work/$name.jsonl"
}
one_node unbroken "${train_args[@]}"
one_node resumed "${resume_args[@]}" --resume "$resume_from"
"$bin/metrics_check" --steps "$total" --from $((steps + 1)) same-losses 1e-6 \
  "$work/unbroken.jsonl" "$work/resumed.jsonl"
echo "the checkpoint of 2 nodes x 2 ranks resumed on 1 node x 2 ranks"
