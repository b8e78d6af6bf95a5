#!/usr/bin/env bash
# The reference GPT-2 (tests/data/gpt2) at stage 3 with every parameter in the persistent unit
# (stage3_param_persistence_threshold above the largest, so the leading embedding has no unit of
# its own) and hybrid sharding (mics_shard_size 2 of 4 ranks), on a communication stream slowed
# by 2 ms an item: the loss is summed over the world, not the shard group's stream, so nothing
# drains the post-step all-gathers before the next forward reads the persistent parameters.
# Checked against PyTorch's float64 run as gpt2_golden.sh checks every stage.
#   gpt2_persistent_hybrid.sh BIN_DIR -- MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
bin="$1"; shift 2
data="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/gpt2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": 3, "mics_shard_size": 2,
                          "stage3_param_persistence_threshold": 100000000}
json.dump(c, open(sys.argv[2], "w"))' "$data/adamw.json" "$work/config.json"
"$@" -np 4 "$bin/zero-train" --model gpt2 --config "$work/config.json" \
  --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64 --seq-len 32 \
  --global-batch 4 --steps 3 --data "$data/tokens.bin" --init-from "$data/model.safetensors" \
  --val-data "$data/tokens.bin" --val-every 1 --val-batches 1 --test-comm-delay-us 2000 \
  --metrics "$work/run.jsonl" --save-dir "$work/run.ckpt" > "$work/run.log" 2>&1 || {
  cat "$work/run.log"; echo "zero-train failed"; exit 1; }
"$bin/zero-checkpoint" export "$work/run.ckpt" --to "$work/run.safetensors" > /dev/null
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/run.jsonl" \
  --final "$work/run.safetensors" --reference-tolerance 1e-5 --expect-val 1
