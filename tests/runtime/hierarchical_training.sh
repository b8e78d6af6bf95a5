#!/usr/bin/env bash
# zero-train at 4 ranks on nodes declared by ZERO_NODE_SIZE=2 (the hierarchical collectives:
# shared memory inside each pair of ranks, MPI between the pairs) against the same job over MPI
# alone (ZERO_COLLECTIVES=mpi), at stages 0-3: the init record names each path, and the losses
# agree within 1e-6 relative, the tolerance of the multi-node tests (the two paths add the ranks
# in different orders).
#   hierarchical_training.sh MPIEXEC_AND_FLAGS... -- ZERO_TRAIN METRICS_CHECK WORK_DIR
set -euo pipefail
launcher=()
while [[ "$1" != "--" ]]; do
  launcher+=("$1")
  shift
done
shift
train="$1"
check="$2"
work="$3"
mkdir -p "$work"
args=(--steps 6 --seed 3 --global-batch 24 --lr 0.003 --hidden 96 --layers 3)

run() {
  local name="$1" stage="$2"
  shift 2
  env "$@" "${launcher[@]}" -np 4 "$train" "${args[@]}" --stage "$stage" \
    --metrics "$work/$name.jsonl" > "$work/$name.log" 2>&1 || {
    cat "$work/$name.log"
    echo "FAIL: $name: zero-train failed"
    exit 1
  }
}

expect_collectives() {
  local file="$1" expected="$2"
  grep -q "\"collectives\":\"$expected\"" "$file" || {
    echo "FAIL: $file does not name collectives '$expected':"
    head -1 "$file"
    exit 1
  }
}

for stage in 0 1 2 3; do
  run "hier$stage" "$stage" ZERO_NODE_SIZE=2 ZERO_COLLECTIVES=auto
  run "flat$stage" "$stage" ZERO_COLLECTIVES=mpi
  expect_collectives "$work/hier$stage.jsonl" "hierarchical (2 nodes x 2 ranks)"
  expect_collectives "$work/flat$stage.jsonl" "mpi"
  "$check" --steps 6 same-losses 1e-6 "$work/flat$stage.jsonl" "$work/hier$stage.jsonl"
  echo "stage $stage: hierarchical and flat MPI agree"
done
