#!/usr/bin/env bash
# The reference GPT-2 (tests/data/gpt2) trained by zero-train with Megatron-style tensor
# parallelism over TP ranks at each ZeRO stage, on NP ranks (NP / TP data-parallel), against
# PyTorch's expected_fp64.json and against the same run at --tp 1 on NP / TP ranks: every step's
# loss, gradient norm and validation loss within TOLERANCE relative (the split matrices sum their
# products in another order, so the runs are not bit for bit). At stages 1 and 2 also with full
# and selective recomputation and partition_activations (each checkpoint split over the TP ranks,
# all-gathered before its block recomputes): bit for bit the split run without checkpointing,
# with 1/TP of the checkpoint bytes. And flops_profiler with tensor parallelism is refused.
#   gpt2_tensor_parallel.sh BIN_DIR NP TP TOLERANCE [zero-train flags...] -- MPIEXEC [FLAGS...]
set -euo pipefail
bin="$1"; np="$2"; tp="$3"; tolerance="$4"; shift 4
extra=()
while [ "$1" != "--" ]; do extra+=("$1"); shift; done
shift
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_reference.sh"

# train STAGE RANKS TP NAME [FLAGS...]: one zero-train run of the reference, its metrics in
# NAME.jsonl.
train() {
  local stage="$1" ranks="$2" split="$3" run="$work/$4"
  shift 4
  run_logged "$run.log" "zero-train failed at stage $stage on $ranks rank(s), --tp $split $*" \
    "${mpiexec[@]}" -np "$ranks" "$bin/zero-train" "${reference_model[@]}" \
    --config "$data/adamw.json" --init-from "$data/model.safetensors" --stage "$stage" \
    --tp "$split" --steps 3 --val-data "$data/tokens.bin" --val-every 1 --val-batches 1 \
    --metrics "$run.jsonl" "${extra[@]}" "$@"
}

# check_formulas NAME [RECOMPUTE]: the run's peak activations and tensor-parallel traffic against
# the formulas. Each rank's activations are its slices: the measured peak is the formula's,
# exactly. Its tensor-parallel traffic per step is Megatron's: per layer two all-reduces of the
# B x T x C activations in forward and two in backward, plus the validation forward's two (B
# sequences of this rank's data-parallel slice, T = 32, C = 64 fp32); the vocabulary-parallel
# embedding's all-reduce of B x T x C in each forward and the head's of its input gradient in
# backward; the parallel cross-entropy's all-gather and all-reduce of B x T floats in each
# forward; and the engine's all-reduce of its 4 units' squared-gradient sums. An all-reduce
# counts 2 (t - 1) / t of its bytes, an all-gather (t - 1) / t of the gathered buffer. With
# RECOMPUTE (full or selective, every block, partition_activations): backward all-gathers each
# block's B x T x C input from its pieces, recomputation reruns each layer's first forward
# all-reduce (the attention's, which x2 needs; the block's output, after the second, is not
# rebuilt), and the
# measured peak of the checkpoints is 1/t of the layers' inputs.
check_formulas() {
  python3 - "$work/$1.jsonl" "$tp" "$((4 / (np / tp)))" "${2:-none}" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
t, batch, recompute = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
planned = next(r for r in records if r["event"] == "init")["activation_bytes_counted_planned"]
layers, T, C = 2, 32, 64
share = lambda size: size * 2 * (t - 1) // t
N = batch * T
reruns = layers if recompute != "none" else 0
activations = share(N * C * 4) * ((4 + 2) * layers + reruns + 2 + 1)
cross_entropy = 2 * (share(N * 4) + (t - 1) * N * 4)
gathers = layers * ((t - 1) * N * C * 4 // t) if recompute != "none" else 0
expected = activations + cross_entropy + share(4 * 4) + gathers
checkpoints = layers * N * C * 4 // t if recompute != "none" else 0
for r in records:
    if r["event"] != "step":
        continue
    if r["peak_activation_bytes"] != planned:
        sys.exit(f"step {r['step']}: peak activations {r['peak_activation_bytes']} B, formula {planned} B")
    if r["peak_checkpoint_bytes"] != checkpoints:
        sys.exit(f"step {r['step']}: peak checkpoints {r['peak_checkpoint_bytes']} B, "
                 f"1/{t} of the layers' inputs {checkpoints} B")
    if r["tensor_parallel_comm_bytes"] != expected:
        sys.exit(f"step {r['step']}: tensor-parallel traffic {r['tensor_parallel_comm_bytes']} B, "
                 f"Megatron's formula {expected} B")
print(f"per rank: peak activations {planned} B (checkpoints {checkpoints} B) and tensor-parallel "
      f"traffic {expected} B per step, as the formulas say")
PY
}

for stage in 0 1 2 3; do
  train "$stage" $((np / tp)) 1 "plain$stage"
  train "$stage" "$np" "$tp" "split$stage"
  grep -q "tensor-parallel $tp x data-parallel $((np / tp))" "$work/split$stage.log" || {
    cat "$work/split$stage.log"; echo "the run did not report its grid"; exit 1; }
  check_formulas "split$stage"
  echo "stage $stage, tensor-parallel $tp x data-parallel $((np / tp)) against --tp 1:"
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
    --metrics "$work/split$stage.jsonl" --reference-tolerance "$tolerance" --expect-val 1 \
    --same-metrics-as "$work/plain$stage.jsonl" --metrics-tolerance "$tolerance"
  # partition_activations: recomputing from all-gathered pieces gives the split run's bits.
  case "$stage" in
    1) recompute=full ;;
    2) recompute=selective ;;
    *) continue ;;
  esac
  train "$stage" "$np" "$tp" "partitioned$stage" --activation-checkpointing "$recompute" \
    --partition-activations
  check_formulas "partitioned$stage" "$recompute"
  echo "stage $stage, $recompute recomputation from partitioned checkpoints against none:"
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
    --metrics "$work/partitioned$stage.jsonl" --reference-tolerance "$tolerance" --expect-val 1 \
    --same-metrics-as "$work/split$stage.jsonl"
done

# flops_profiler counts the whole model's parameters on one rank, which tensor parallelism
# splits: refused before step 1 (exit 2), naming the config, on every rank at once.
echo '{"train_batch_size": 4, "flops_profiler": {"enabled": true, "profile_step": 2}}' \
  > "$work/flops.json"
set +e
"${mpiexec[@]}" -np "$np" "$bin/zero-train" "${reference_model[@]}" --config "$work/flops.json" \
  --tp "$tp" --steps 3 > "$work/flops.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "flops_profiler in $work/flops.json with tensor parallelism is not built" \
  "$work/flops.log" ||
  { cat "$work/flops.log"; echo "flops_profiler with --tp $tp: exit $rc"; exit 1; }
echo "flops_profiler with tensor parallelism is refused (exit 2)"
