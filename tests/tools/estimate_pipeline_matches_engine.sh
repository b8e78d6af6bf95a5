#!/usr/bin/env bash
# zero-estimate --pp plans each pipeline stage as zero-train --pp then holds it: a 4-layer GPT-2
# cut into 2 stages on 4 ranks (2 data-parallel ranks per stage), at ZeRO stages 1-3, with gpipe,
# 1f1b, zb-h1 and interleaved (2 model chunks per stage) and no, selective and full activation
# checkpointing; at stage 3 with hybrid sharding (shard groups of 1, 2 replicas); and with tensor
# parallelism of 2 (one data-parallel rank per stage) and partitioned checkpoints; and with the
# checkpoints in the contiguous buffer under zb-h1 and interleaved. Per pipeline
# stage, the
# estimate's model state and buffer bytes must equal the run's stage_model_state_bytes and
# stage_buffer_bytes, and its activation
# bytes (the row of the run's checkpointing) the run's stage_activation_bytes_planned and every
# step's measured stage_peak_activation_bytes. With SPILL_DIR (a directory on a disk: O_DIRECT)
# also interleaved full and zb-h1 selective with the checkpoints spilled to NVMe there, and
# stage 2 with the optimizer state on NVMe there, and stage 3 with its parameters there too.
#   estimate_pipeline_matches_engine.sh BIN_DIR TOKENS [SPILL_DIR] -- MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
bin="$1" tokens="$2"
shift 2
# STAGE SCHEDULE RECOMPUTE [SETTING]: SETTING is spill, hybrid, nvme (the optimizer state),
# params (the optimizer state and stage 3's parameters on NVMe), partitioned (--tp 2) or
# contiguous (contiguous_memory_optimization).
runs=("1 1f1b none" "3 gpipe full" "3 1f1b selective" "2 zb-h1 none" "3 zb-h1 none" "3 zb-h1 full"
  "3 interleaved selective" "3 1f1b none hybrid" "2 1f1b full partitioned" "3 zb-h1 selective partitioned" "1 zb-h1 full contiguous"
  "2 interleaved selective contiguous")
spill_dir=
if [ "$1" != "--" ]; then
  spill_dir="$1"
  runs+=("3 interleaved full spill" "2 zb-h1 selective spill" "2 1f1b none nvme"
    "3 1f1b none params")
  shift
fi
[ "$1" = "--" ] || { echo "estimate_pipeline_matches_engine.sh: expected -- before the launcher"; exit 2; }
shift
mpiexec=("$@")
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ -n "$spill_dir" ]; then
  # This run's own folder there, removed with the work folder whatever happens.
  spill_dir="$(mktemp -d "$spill_dir/run.XXXXXX")"
  trap 'rm -rf "$work" "$spill_dir"' EXIT
fi
size=(--model gpt2 --n-layer 4 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64)

echo '{"zero_optimization": {"mics_shard_size": 1}}' > "$work/hybrid.json"
for run in "${runs[@]}"; do
  read -r stage schedule recompute setting <<<"$run"
  name="$work/$stage-$schedule-$recompute${setting:+-$setting}"
  # What zero-train is given (flags or a config) and the flags that plan it for zero-estimate.
  # 8 sequences over 4 micro-batches and 2 data-parallel ranks: 1 per rank and micro-batch.
  given=() plan=() folder= micro_batch=1
  case "$setting" in
    partitioned)
      # One data-parallel rank per stage: 2 sequences per micro-batch.
      given=(--tp 2 --partition-activations) plan=("${given[@]}") micro_batch=2 ;;
    contiguous)
      echo '{"activation_checkpointing": {"contiguous_memory_optimization": true}}' \
        > "$work/contiguous.json"
      given=(--config "$work/contiguous.json") plan=(--contiguous-memory-optimization) ;;
    spill)
      folder="$(mktemp -d "$spill_dir/XXXXXX")"
      given=(--checkpoint-nvme-path "$folder") plan=("${given[@]}") ;;
    hybrid) given=(--config "$work/hybrid.json") plan=(--mics-shard-size 1) ;;
    nvme)
      folder="$(mktemp -d "$spill_dir/XXXXXX")"
      echo '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
        "nvme_path": "'"$folder"'"}}}' > "$work/nvme.json"
      given=(--config "$work/nvme.json") plan=(--offload-optimizer nvme) ;;
    params)
      folder="$(mktemp -d "$spill_dir/XXXXXX")"
      echo '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
        "nvme_path": "'"$folder"'"}, "offload_param": {"device": "nvme",
        "nvme_path": "'"$folder"'"}}}' > "$work/params.json"
      given=(--config "$work/params.json") plan=(--offload-optimizer nvme --offload-param nvme) ;;
  esac
  "${mpiexec[@]}" -np 4 "$bin/zero-train" "${size[@]}" --seq-len 16 --global-batch 8 \
    --micro-batches 4 --steps 2 --data "$tokens" --stage "$stage" --dtype fp32 --pp 2 \
    --pp-schedule "$schedule" --activation-checkpointing "$recompute" "${given[@]}" \
    --metrics "$name.jsonl" > "$name.log" 2>&1 || {
    cat "$name.log"; echo "zero-train failed: $run"; exit 1; }
  "$bin/zero-estimate" "${size[@]}" --ranks 4 --stage "$stage" --dtype fp32 --micro-batch "$micro_batch" \
    --seq-len 16 --pp 2 --pp-schedule "$schedule" --micro-batches 4 "${plan[@]}" \
    > "$name.estimate" || { cat "$name.estimate"; echo "zero-estimate failed: $run"; exit 1; }
  if [ -n "$folder" ]; then rm -rf "$folder"; fi
  python3 - "$name.jsonl" "$name.estimate" "$stage" "$recompute" "$run" <<'PY'
import json, sys
metrics, estimate, zero_stage, recompute, run = sys.argv[1:6]
records = [json.loads(line) for line in open(metrics)]
planned = next(r for r in records if r["event"] == "init")["stage_activation_bytes_planned"]
steps = [r for r in records if r["event"] == "step"]
# Per pipeline stage: the model state of the ZeRO stage's row and the activations of the row of
# this checkpointing.
state, buffers, activations = [], [], []
for line in open(estimate):
    words = line.split()
    if line.startswith("pipeline stage "):
        state.append(None)
        buffers.append(None)
        activations.append(None)
    elif words and words[0] == zero_stage and len(words) == 5 and state:
        state[-1] = int(words[1])
        buffers[-1] = int(words[2])
    elif words and words[0] == recompute and activations:
        activations[-1] = int(words[1])
if len(state) != 2 or None in state or None in activations:
    sys.exit(f"{run}: no per-stage rows in the estimate:\n" + open(estimate).read())
for r in steps:
    if r["stage_model_state_bytes"] != state:
        sys.exit(f"{run}: step {r['step']}: model state per stage {r['stage_model_state_bytes']} "
                 f"B, the estimate's {state} B")
    # Buffers: the pools, the fusion buffer and, on both end stages, the tied wte's sum.
    if r["stage_buffer_bytes"] != buffers:
        sys.exit(f"{run}: step {r['step']}: buffers per stage {r['stage_buffer_bytes']} B, "
                 f"the estimate's {buffers} B")
    if r["stage_peak_activation_bytes"] != activations:
        sys.exit(f"{run}: step {r['step']}: peak activations per stage "
                 f"{r['stage_peak_activation_bytes']} B, the estimate's {activations} B")
if planned != activations:
    sys.exit(f"{run}: zero-train planned {planned} B of activations per stage, the estimate "
             f"{activations} B")
print(f"{run}: per stage, model state {state} B, buffers {buffers} B and activations "
      f"{activations} B, as estimated")
PY
done
