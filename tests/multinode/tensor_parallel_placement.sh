#!/usr/bin/env bash
# zerorun --tp places each tensor-parallel group on one node. On 2 nodes of 3 slots, 4 ranks at
# --tp 2 fill node0 with ranks 0-2 by slot, so the group of ranks 2-3 spans both nodes and
# zero-train warns that its all-reduces cross the network; with zerorun --tp 2 each node takes
# one whole group (2 slots of its 3) and there is no warning. Both jobs train the reference
# GPT-2 to the same losses (placement changes where ranks run, not what they compute).
#   tensor_parallel_placement.sh BIN_DIR
set -euo pipefail
bin="$1"
data="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/gpt2" && pwd)"
# shellcheck source=SCRIPTDIR/cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"

start_cluster 2 3

# train NAME ZERORUN_FLAGS...: a 3-step tensor-parallel job; output in $work/NAME.log.
train() {
  local name="$1"
  shift
  run_job "$name" on_cluster "$bin/zerorun" --hostfile "$hostfile" -np 4 "$@" -- \
    "$bin/zero-train" --model gpt2 --config "$data/adamw.json" --tp 2 --stage 3 --n-layer 2 \
    --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64 --seq-len 32 --global-batch 4 \
    --steps 3 --data "$data/tokens.bin" --init-from "$data/model.safetensors" \
    --metrics "$work/$name.jsonl"
}
warning="spans several nodes, so its all-reduces (two per layer each way) cross the network"

train by_slot
if ! grep -qF "the tensor-parallel group of ranks 2-3 $warning" "$work/by_slot.log"; then
  cat "$work/by_slot.log"; echo "FAIL: a group across the nodes went unnoticed"; exit 1
fi
train placed --tp 2
if grep -qF "$warning" "$work/placed.log"; then
  cat "$work/placed.log"; echo "FAIL: zerorun --tp 2 left a group across the nodes"; exit 1
fi
losses() { python3 -c 'import json, sys; print([r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["event"] == "step"])' "$1"; }
if [ "$(losses "$work/by_slot.jsonl")" != "$(losses "$work/placed.jsonl")" ]; then
  echo "FAIL: the losses differ: $(losses "$work/by_slot.jsonl") and $(losses "$work/placed.jsonl")"
  exit 1
fi
echo "zerorun --tp 2 kept each group on one node; losses $(losses "$work/placed.jsonl")"
