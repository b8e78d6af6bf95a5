#!/usr/bin/env bash
# The reference GPT-2 (tests/data/gpt2) trained by zero-train at each ZeRO stage on NP ranks,
# each run checked by gpt2_golden_check against PyTorch's float64 run of the same weights, and
# stages 1-3 against stage 0: bit for bit on 1 or 2 ranks, within 1e-6 on more (a reduction
# over 3 ranks sums in another order in an all-reduce than in a reduce-scatter). Each run validates on the training batch after every
# step: a forward without backward, whose loss is the reference's next one.
#   gpt2_golden.sh BIN_DIR NP [--device cuda] [--dtype D --reference-tolerance R]
#                  [--activation-checkpointing M [--number-checkpoints K]]
#                  [--cpu-checkpointing true] [--synchronize-checkpoint-boundary true]
#                  [--nvme-spill STAGE:MODE ...]
#                  -- [MPIEXEC [MPIEXEC_FLAGS...]]
# --nvme-spill adds a run of STAGE with checkpointing MODE (and --number-checkpoints, if given)
# whose checkpoints are spilled to a directory (--checkpoint-nvme-path), checked against PyTorch
# and bitwise against the stage without checkpointing, its step records counting the spill's
# file once each way per micro-batch (and one more write for the validation forward).
# Without MPIEXEC (NP 1 only) zero-train starts as a singleton MPI process.
# --device cuda skips (exit 0, "skipping" in the output) where no GPU is listed.
set -euo pipefail
bin="$1"; np="$2"; shift 2
device=cpu; dtype=fp32; reference_tolerance=1e-5
checkpointing=none; checkpoints=(); cpu_checkpointing=false; synchronize=false; spills=()
while [ "$1" != "--" ]; do
  case "$1" in
    --activation-checkpointing) checkpointing="$2" ;;
    --number-checkpoints) checkpoints=(--number-checkpoints "$2") ;;
    --cpu-checkpointing) cpu_checkpointing="$2" ;;
    --synchronize-checkpoint-boundary) synchronize="$2" ;;
    --nvme-spill) spills+=("$2") ;;
    --device) device="$2" ;;
    --dtype) dtype="$2" ;;
    --reference-tolerance) reference_tolerance="$2" ;;
    *) echo "gpt2_golden.sh: unknown option $1"; exit 2 ;;
  esac
  shift 2
done
shift
if [ "$device" = cuda ] && ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "no CUDA device: skipping (nvidia-smi lists no GPU)"
  exit 0
fi
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_reference.sh"
# The reference's optimizer config, with DeepSpeed's activation_checkpointing.cpu_checkpointing
# (on CUDA: checkpoints in pinned host memory, fetched back ahead of backward) and
# synchronize_checkpoint_boundary (a device synchronization as each checkpointed block's forward
# and backward start) when asked.
config="$data/adamw.json"
if [ "$cpu_checkpointing" = true ] || [ "$synchronize" = true ]; then
  config="$work/adamw_checkpointing.json"
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
section = c.setdefault("activation_checkpointing", {})
section["cpu_checkpointing"] = sys.argv[3] == "true"
section["synchronize_checkpoint_boundary"] = sys.argv[4] == "true"
json.dump(c, open(sys.argv[2], "w"))' "$data/adamw.json" "$config" "$cpu_checkpointing" "$synchronize"
fi
parity=0
if [ "$np" -gt 2 ]; then parity=1e-6; fi

# train STAGE NAME [FLAGS...]: one zero-train run of the reference, its weights exported.
train() {
  local stage="$1" run="$work/$2"
  shift 2
  local launch=()
  if [ ${#mpiexec[@]} -gt 0 ]; then launch=("${mpiexec[@]}" -np "$np"); fi
  run_logged "$run.log" "zero-train failed at stage $stage on $np rank(s)" \
    "${launch[@]}" "$bin/zero-train" "${reference_model[@]}" --config "$config" \
    --init-from "$data/model.safetensors" --stage "$stage" --device "$device" --dtype "$dtype" \
    --steps 3 --val-data "$data/tokens.bin" --val-every 1 --val-batches 1 \
    --metrics "$run.jsonl" --save-dir "$run.ckpt" "$@"
  "$bin/zero-checkpoint" export "$run.ckpt" --to "$run.safetensors" > /dev/null
}

for stage in 0 1 2 3; do
  run="$work/stage$stage"
  recompute=()
  spill_modes=()
  for spill in "${spills[@]}"; do
    if [ "${spill%%:*}" = "$stage" ]; then spill_modes+=("${spill#*:}"); fi
  done
  if [ "$checkpointing" != none ] || [ ${#spill_modes[@]} -gt 0 ]; then
    train "$stage" "plain$stage"
    recompute=(--activation-checkpointing "$checkpointing" "${checkpoints[@]}")
  fi
  train "$stage" "stage$stage" "${recompute[@]}"
  same=()
  if [ "$stage" -gt 0 ]; then same=(--same-as "$work/stage0.safetensors" --tolerance "$parity"); fi
  echo "stage $stage, $np rank(s), $device, $dtype, activation checkpointing $checkpointing:"
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$run.jsonl" \
    --final "$run.safetensors" --reference-tolerance "$reference_tolerance" --expect-val 1 \
    "${same[@]}"
  if [ "$checkpointing" != none ]; then
    echo "stage $stage with activation checkpointing $checkpointing against without, bitwise:"
    "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$run.jsonl" \
      --final "$run.safetensors" --reference-tolerance "$reference_tolerance" \
      --same-as "$work/plain$stage.safetensors" --tolerance 0 \
      --same-metrics-as "$work/plain$stage.jsonl"
  fi
  for mode in "${spill_modes[@]}"; do
    spill="spill$stage$mode"
    mkdir -p "$work/$spill.nvme"
    train "$stage" "$spill" --activation-checkpointing "$mode" "${checkpoints[@]}" \
      --checkpoint-nvme-path "$work/$spill.nvme"
    echo "stage $stage with $mode checkpoints spilled to NVMe against without checkpointing, bitwise:"
    "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/$spill.jsonl" \
      --final "$work/$spill.safetensors" --reference-tolerance "$reference_tolerance" \
      --same-as "$work/plain$stage.safetensors" --tolerance 0 \
      --same-metrics-as "$work/plain$stage.jsonl"
    # One micro-batch a step (the global batch of 4 over the ranks) and one validation forward.
    python3 -c 'import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "step"]
assert len(steps) == 3, steps
for r in steps:
    f = r["checkpoint_nvme_file_bytes"]
    assert f > 0 and r["checkpoint_nvme_read_bytes"] == f and r["checkpoint_nvme_write_bytes"] == 2 * f, r
print("spill traffic per step: read", f, "written", 2 * f, "bytes")' "$work/$spill.jsonl"
    # The file is unlinked once open: nothing stays behind.
    [ -z "$(ls -A "$work/$spill.nvme")" ] || { ls -la "$work/$spill.nvme"; exit 1; }
  done
done
