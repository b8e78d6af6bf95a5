#!/usr/bin/env bash
# Checkpoints of a pipelined run: the reference GPT-2 at pp 2 (ZeRO stage STAGE) trained 3 steps
# and saved; the same run stopped after step 2 and resumed from its save is equal to it bit for
# bit (every step's loss and norm, and the exported weights); the export merges the stages (wte
# once) and holds PyTorch's weights after 3 steps within 1e-5; a resume on twice the ranks (the
# save resharded over 2 data-parallel ranks per stage) continues within 1e-6, as do the save
# resumed without a pipeline and a save without one resumed at pp 2, and at ZeRO stage 3 a save
# resumed at the same pp cut otherwise and a pp 2 x tp 2 save resumed at tp 1; a save of another
# model is refused, naming a parameter no stage holds, and one whose stages are of different
# steps is refused by the resume and by the export.
#   gpt2_pipeline_resume.sh BIN_DIR STAGE -- MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
bin="$1"; stage="$2"; shift 2
[ "$1" = "--" ] && shift
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_reference.sh"
# The reference at ZeRO stage STAGE cut into 2 pipeline stages: every run below but the last.
pipelined=("${reference_model[@]}" --config "$data/adamw.json" --stage "$stage" --pp 2
  --micro-batches 2)

# train NP NAME [FLAGS...]: a pipelined zero-train run of the reference from its weights.
train() {
  local np="$1" run="$work/$2"
  shift 2
  run_logged "$run.log" "zero-train failed: $np rank(s), $*" "${mpiexec[@]}" -np "$np" \
    "$bin/zero-train" "${pipelined[@]}" --init-from "$data/model.safetensors" "$@"
}

train 2 whole --steps 3 --save-dir "$work/whole.ckpt" --metrics "$work/whole.jsonl"
"$bin/zero-checkpoint" export "$work/whole.ckpt" --to "$work/whole.safetensors"
echo "ZeRO stage $stage, pp 2, 3 steps, exported from both stages, against PyTorch:"
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/whole.jsonl" \
  --final "$work/whole.safetensors" --reference-tolerance 1e-5

train 2 first --steps 2 --save-dir "$work/split.ckpt" --metrics "$work/split.jsonl"
# The save of step 2 and its metrics, kept for the resumes on 4 ranks and without a pipeline.
for copy in wide unpiped; do
  cp -r "$work/split.ckpt" "$work/$copy.ckpt"
  cp "$work/split.jsonl" "$work/$copy.jsonl"
done
# --init-from is the starting point of a fresh run only: the resume takes the checkpoint's.
resume() {
  local np="$1" dir="$2" metrics="$3" log="$4"
  run_logged "$log" "the resume on $np ranks failed" "${mpiexec[@]}" -np "$np" \
    "$bin/zero-train" "${pipelined[@]}" --steps 3 --save-dir "$dir" --resume latest \
    --metrics "$metrics"
  grep -q "resumed from $dir at step 2" "$log" ||
    { cat "$log"; echo "the resume did not say where it resumed"; exit 1; }
}
resume 2 "$work/split.ckpt" "$work/split.jsonl" "$work/resumed.log"
"$bin/zero-checkpoint" export "$work/split.ckpt" --to "$work/split.safetensors"
echo "stopped after step 2 and resumed, against the run without a stop (bitwise):"
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/split.jsonl" \
  --final "$work/split.safetensors" --same-as "$work/whole.safetensors" --tolerance 0 \
  --same-metrics-as "$work/whole.jsonl"

# The 2-rank save resumed on 4 ranks: each stage's shards re-cut for 2 data-parallel ranks.
resume 4 "$work/wide.ckpt" "$work/wide.jsonl" "$work/wide.log"
echo "resumed on 4 ranks (2 data-parallel per stage), against the run on 2:"
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/wide.jsonl" \
  --same-metrics-as "$work/whole.jsonl" --metrics-tolerance 1e-6

# Another number of stages: the save resharded by parameter name. The 2-stage save resumed
# without a pipeline (one engine takes both stages' parameters, wte once), and a save without a
# pipeline resumed at pp 2; each continues as the uninterrupted run does.
run_logged "$work/unpiped.log" "the resume without a pipeline failed" "${mpiexec[@]}" -np 1 \
  "$bin/zero-train" "${reference_model[@]}" --config "$data/adamw.json" --stage "$stage" \
  --micro-batches 2 --steps 3 --resume "$work/unpiped.ckpt" --metrics "$work/unpiped.jsonl"
grep -q "saved by 2 pipeline stage(s), resharded over 1" "$work/unpiped.log" ||
  { cat "$work/unpiped.log"; echo "the resume did not say it resharded the stages"; exit 1; }
echo "the pp 2 save resumed without a pipeline, against the pipelined run:"
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/unpiped.jsonl" \
  --same-metrics-as "$work/whole.jsonl" --metrics-tolerance 1e-6

run_logged "$work/plain.log" "zero-train failed: 1 rank without a pipeline" "${mpiexec[@]}" -np 1 \
  "$bin/zero-train" "${reference_model[@]}" --config "$data/adamw.json" --stage "$stage" \
  --micro-batches 2 --steps 2 --init-from "$data/model.safetensors" --save-dir "$work/plain.ckpt" \
  --metrics "$work/piped.jsonl"
resume 2 "$work/plain.ckpt" "$work/piped.jsonl" "$work/piped.log"
grep -q "saved by 1 pipeline stage(s), resharded over 2" "$work/piped.log" ||
  { cat "$work/piped.log"; echo "the resume did not say it resharded the save"; exit 1; }
echo "a save without a pipeline resumed at pp 2, against the pipelined run:"
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/piped.jsonl" \
  --same-metrics-as "$work/whole.jsonl" --metrics-tolerance 1e-6

# The same number of stages cut otherwise (at ZeRO stage 3 only, the script's other run): a
# 4-layer GPT-2 saved at pp 2 by 1F1B (blocks 0-1 on the first stage) resumed by the interleaved
# schedule (blocks 0 and 2 on the first stage) is resharded by parameter name, and continues as
# the uninterrupted 1F1B run does (interleaved is bitwise 1F1B).
if [ "$stage" = 3 ]; then
  deep=("${reference_model[@]}" --n-layer 4 --config "$data/adamw.json" --stage 3 --pp 2
    --micro-batches 2)
  run_logged "$work/deep_whole.log" "zero-train failed: 4 layers, pp 2" "${mpiexec[@]}" -np 2 \
    "$bin/zero-train" "${deep[@]}" --steps 3 --metrics "$work/deep_whole.jsonl"
  run_logged "$work/deep_first.log" "zero-train failed: 4 layers, pp 2, 2 steps" \
    "${mpiexec[@]}" -np 2 "$bin/zero-train" "${deep[@]}" --steps 2 \
    --save-dir "$work/deep.ckpt" --metrics "$work/deep.jsonl"
  run_logged "$work/deep_resumed.log" "the interleaved resume of a 1F1B save failed" \
    "${mpiexec[@]}" -np 2 "$bin/zero-train" "${deep[@]}" --steps 3 --resume "$work/deep.ckpt" \
    --pp-schedule interleaved --metrics "$work/deep.jsonl"
  grep -q "saved by 2 pipeline stages cut otherwise, resharded" "$work/deep_resumed.log" ||
    { cat "$work/deep_resumed.log"; echo "the resume did not say it resharded the cut"; exit 1; }
  python3 -c 'import json, sys
def steps(path):
    return [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(path)) if r.get("event") == "step"]
whole, resumed = steps(sys.argv[1]), steps(sys.argv[2])
assert len(whole) == len(resumed) == 3, (whole, resumed)
for w, r in zip(whole, resumed):
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(r, w)), (resumed, whole)
print("a 1F1B save resumed by interleaved (another cut): within 1e-6 of the run without a stop")' \
    "$work/deep_whole.jsonl" "$work/deep.jsonl"

  # Another tensor-parallel size within the stages: a save at pp 2 x tp 2 (4 ranks) resumed at
  # pp 2 alone, each stage's slices merged, continues as the uninterrupted run does.
  train 4 tp_first --tp 2 --steps 2 --save-dir "$work/tp.ckpt" --metrics "$work/tp.jsonl"
  run_logged "$work/tp_resumed.log" "the tp 2 save resumed at tp 1 failed" "${mpiexec[@]}" \
    -np 2 "$bin/zero-train" "${pipelined[@]}" --steps 3 --resume "$work/tp.ckpt" \
    --metrics "$work/tp.jsonl"
  echo "a pp 2 x tp 2 save resumed at pp 2 x tp 1, against the run without a stop:"
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/tp.jsonl" \
    --same-metrics-as "$work/whole.jsonl" --metrics-tolerance 1e-6
fi

# A save whose stages are of different steps (the first stage's latest moved back a step, as a
# save interrupted on some stages leaves it): the resume refuses it (exit 2) and the export too,
# each naming both steps.
cp -r "$work/split.ckpt" "$work/mixed.ckpt"
echo step_00000002 > "$work/mixed.ckpt/pp_stage_00/latest"
set +e
"${mpiexec[@]}" -np 2 "$bin/zero-train" "${pipelined[@]}" --steps 4 --resume "$work/mixed.ckpt" \
  > "$work/mixed.log" 2>&1
rc=$?
"$bin/zero-checkpoint" export "$work/mixed.ckpt" --to "$work/mixed.safetensors" \
  > "$work/mixed_export.log" 2>&1
export_rc=$?
set -e
[ "$rc" = 2 ] && grep -q "the stages' checkpoints are of different steps (2 and 3)" \
  "$work/mixed.log" ||
  { cat "$work/mixed.log"; echo "a resume of stages at different steps: exit $rc"; exit 1; }
[ "$export_rc" != 0 ] && grep -q "the pipeline stages' checkpoints are of different steps" \
  "$work/mixed_export.log" && [ ! -e "$work/mixed.safetensors" ] ||
  { cat "$work/mixed_export.log"; echo "an export of stages at different steps: exit $export_rc"
    exit 1; }
echo "stages saved at different steps: the resume and the export refuse them"

# A save of another model: a saved parameter that no stage holds is refused (exit 2), naming it.
set +e
"${mpiexec[@]}" -np 1 "$bin/zero-train" "${reference_model[@]}" --n-layer 1 \
  --config "$data/adamw.json" --stage "$stage" --micro-batches 2 --steps 4 \
  --resume "$work/whole.ckpt" > "$work/other.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "the saved parameter 'h.1.* is in no stage of this run's model" \
  "$work/other.log" ||
  { cat "$work/other.log"; echo "a resume of another model: exit $rc"; exit 1; }
echo "a save of another model is refused (exit 2)"
