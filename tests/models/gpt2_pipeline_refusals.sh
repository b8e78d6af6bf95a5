#!/usr/bin/env bash
# zero-train --pp's bad settings on 2 ranks: each exits 2 with its message before step 1, within
# 60 seconds (every rank stops; none is left waiting for a peer), including ranks started with
# different pipeline settings; and what was refused once and now runs.
#   gpt2_pipeline_refusals.sh BIN_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -uo pipefail
bin="$1"; shift
mpiexec=("$@")
data="$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/gpt2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
model=(--model gpt2 --n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64
       --seq-len 32 --global-batch 4 --micro-batches 2 --steps 1 --data "$data/tokens.bin")
failures=0
# expect MESSAGE MPIEXEC_ARGS...: the job exits 2 and prints MESSAGE.
expect() {
  local message="$1"
  shift
  local output rc
  output="$(timeout 60 "${mpiexec[@]}" "$@" 2>&1)"
  rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "$message" <<<"$output"; then
    echo "FAIL: $* -> exit $rc, expected 2 and '$message'; got:"
    echo "$output" | grep -v "^--\|^ *$" | head -5
    failures=$((failures + 1))
  fi
}
run=(-np 2 "$bin/zero-train")
expect "--pp is 2: only --model gpt2 is cut into pipeline stages" \
  "${run[@]}" --model mlp --pp 2
expect "--pp-partition uniform: 2 pipeline stages do not divide the 3 layers (n_layer)" \
  "${run[@]}" "${model[@]}" --n-layer 3 --pp 2 --pp-partition uniform
expect "a GPT-2 of 2 layers cannot be cut into 4 pipeline stages" \
  -np 4 "$bin/zero-train" "${model[@]}" --micro-batches 1 --pp 4
# Once refused, now run: --memory-timeline writes the first stage's timeline (rank 0's: the
# embeddings and h.0, not h.1's or the head's phases), saying so in the file, the plot and the
# message.
output="$(timeout 60 "${mpiexec[@]}" "${run[@]}" "${model[@]}" --pp 2 --memory-timeline \
  "$work/timeline" 2>&1)"
rc=$?
phases="$(awk -F'\t' 'NR > 1 && !/^#/ { print $8 }' "$work/timeline" 2>/dev/null | sort -u)"
if [[ $rc -ne 0 ]] ||
  ! grep -qF "memory timeline of pipeline stage 0 (rank 0) written to $work/timeline," <<<"$output" ||
  ! grep -qx "# the memory of rank 0, pipeline stage 0 of 2" "$work/timeline" ||
  ! grep -qF "memory of rank 0, pipeline stage 0 of 2 in step 1" "$work/timeline.gp" ||
  [[ ! -s "$work/timeline.png" ]] || ! grep -qx "forward h.0" <<<"$phases" ||
  grep -q "h[.]1\|ln_f" <<<"$phases"; then
  echo "FAIL: --pp 2 --memory-timeline -> exit $rc, phases $(echo $phases); got:"
  echo "$output" | tail -5
  failures=$((failures + 1))
fi
# --inject-fault skip-step, refused once, now fails as without a pipeline:
# tests/faults' faults_pipeline_rank_skips_step_np2.
# CPU checkpointing, refused once, has no effect on the CPU path (checkpoints live in host
# memory already): the pipeline runs and says so, as without a pipeline. (The NVMe spill,
# refused once, runs: gpt2_pipeline.sh holds it bitwise the pipeline keeping its checkpoints; so
# does ZB-H1 with activation checkpointing, and the contiguous buffer and partitioned
# checkpoints under every schedule.)
echo '{"activation_checkpointing": {"mode": "full", "cpu_checkpointing": true}}' \
  > "$work/cpu_checkpointing.json"
output="$(timeout 60 "${mpiexec[@]}" "${run[@]}" "${model[@]}" --pp 2 \
  --config "$work/cpu_checkpointing.json" 2>&1)"
rc=$?
if [[ $rc -ne 0 ]] || ! grep -qF "activation_checkpointing.cpu_checkpointing has no effect here" <<<"$output"; then
  echo "FAIL: --pp with cpu_checkpointing -> exit $rc, expected 0 and the notice; got:"
  echo "$output" | grep -v "^--\|^ *$" | head -5
  failures=$((failures + 1))
fi
expect "--pp: the global batch of 3 does not cut into 2 micro-batches x 1 data-parallel ranks" \
  "${run[@]}" "${model[@]}" --pp 2 --global-batch 3
expect "--pp-schedule: unknown pipeline schedule 'fifo'" \
  "${run[@]}" "${model[@]}" --pp 2 --pp-schedule fifo
# Interleaved: every virtual stage (pp x chunks per stage) needs a block of its own. (Its other
# refusals are tests/examples/train_flags_test.cpp's.)
expect "--pp 2 x --pp-virtual-stages 2 = 4 virtual stages: a GPT-2 of 2 layers cannot be cut into 4 pipeline stages" \
  "${run[@]}" "${model[@]}" --pp 2 --pp-schedule interleaved
# Ranks started with different pipelines (MPMD: one rank each) name both settings.
expect "the pipeline (--pp, --pp-schedule, --pp-virtual-stages, --pp-partition, pipeline.pipe_partitioned and grad_partitioned)" \
  -np 1 "$bin/zero-train" "${model[@]}" --pp 2 --pp-schedule 1f1b : \
  -np 1 "$bin/zero-train" "${model[@]}" --pp 2 --pp-schedule gpipe
echo '{"pipeline": {"pipe_partitioned": false}}' > "$work/whole.json"
expect "the pipeline (--pp, --pp-schedule, --pp-virtual-stages, --pp-partition, pipeline.pipe_partitioned and grad_partitioned)" \
  -np 1 "$bin/zero-train" "${model[@]}" --pp 2 --stage 1 : \
  -np 1 "$bin/zero-train" "${model[@]}" --pp 2 --stage 1 --config "$work/whole.json"
if [[ $failures -gt 0 ]]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all pipeline refusals exit 2 with their message"
