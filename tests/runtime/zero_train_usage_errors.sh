#!/usr/bin/env bash
# zero-train's bad command lines and input files: each exits 2 with its exact message, before
# training starts, and within 30 seconds (a file that blocks or never ends must not hang it).
#   zero_train_usage_errors.sh ZERO_TRAIN
set -uo pipefail
zero_train="$1"
failures=0
expect() {
  local message="$1"
  shift
  local output
  output="$(timeout 30 "$zero_train" "$@" 2>&1)"
  local rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "zero-train: $message" <<<"$output"; then
    echo "FAIL: zero-train $* -> exit $rc, expected 2 and 'zero-train: $message'; got:"
    echo "$output" | head -3
    failures=$((failures + 1))
  fi
}
expect "unknown flag --bogus" --bogus 1
expect "missing value after --steps" --steps
expect "--steps expects an integer, got 'ten'" --steps ten
expect "--steps must be at least 1" --steps 0
expect "--stage must be 0, 1, 2 or 3" --stage 7
expect "--dtype must be fp32, bf16 or fp16" --dtype fp64
expect "--device must be cpu or cuda, got 'tpu'" --device tpu
expect "--lr expects a number, got '1e-3x'" --lr 1e-3x
expect "--lr must be at least 0" --lr -1
expect "unknown schedule 'exp' (constant, warmup, linear, cosine)" --schedule exp
expect "--inject-fault expects inf-grad|kill|stop|skip-step@STEP, got 'nan-grad@3'" \
  --inject-fault nan-grad@3
expect "--inject-fault expects an integer, got 'x'" --inject-fault kill@x
expect "--memory-limit expects an integer, got '12Q'" --memory-limit 12Q
expect "--nonfinite must be error or skip" --nonfinite warn
expect "--save-every needs --save-dir" --save-every 5
expect "--resume latest needs --save-dir" --resume latest
expect "unknown model 'gpt' (available: mlp, gpt2)" --model gpt
expect "--pp must be at least 1" --pp 0
expect "--pp is 2 and the job has 1 rank(s): they must divide into pipeline stages of equal size" \
  --pp 2
expect "--pp-partition must be parameters, uniform, flops or type:REGEX, got 'blocks'" --pp-partition blocks
expect "--pp-schedule: unknown pipeline schedule 'fifo'" --pp-schedule fifo
expect "--tp must be at least 1" --tp 0
expect "--tp is 2 and the job has 1 rank(s): they must divide into tensor-parallel groups of \
that size" --tp 2
# The GPT-2's flags, and each model's flags only with that model.
tokens="$(dirname "${BASH_SOURCE[0]}")/../data/gpt2/tokens.bin"
expect "--model gpt2 needs --data FILES (token files; see zero-tokenize)" --model gpt2
expect "--hidden is a flag of --model mlp, and this run trains --model gpt2" \
  --model gpt2 --data "$tokens" --hidden 8
expect "--n-layer is a flag of --model gpt2, and this run trains --model mlp" --n-layer 2
expect "unknown --preset 'gpt3' (tiny, gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1.5B)" \
  --model gpt2 --data "$tokens" --preset gpt3
expect "--preset sets every size: give it before --n-layer" \
  --model gpt2 --data "$tokens" --n-layer 2 --preset tiny
expect "--seq-len 65 is longer than the block size 64 (the position embedding's rows)" \
  --model gpt2 --data "$tokens" --block-size 64 --seq-len 65
expect "GPT-2 n_embd (64) must be a multiple of n_head (5)" \
  --model gpt2 --data "$tokens" --n-embd 64 --n-head 5
expect "--val-every needs --val-data" --model gpt2 --data "$tokens" --val-every 10
# Validation that would never run, or repeat its data.
expect "--val-data needs --val-every K (validate every K steps)" \
  --model gpt2 --data "$tokens" --val-data "$tokens"
expect "--val-every 50 is more than --steps 20: no step would validate" \
  --model gpt2 --data "$tokens" --val-data "$tokens" --val-every 50 --steps 20
small=(--n-layer 2 --n-head 4 --n-embd 64 --vocab-size 256 --block-size 64 --seq-len 32
  --global-batch 4)
expect "--val-batches 2 is more than the 1 batch of 4 x 32 tokens that --val-data $tokens \
holds: validation would repeat them" \
  --model gpt2 "${small[@]}" --data "$tokens" --val-data "$tokens" --val-every 1 --val-batches 2
expect "--init-from and --resume both give the weights: the checkpoint has them" \
  --model gpt2 --data "$tokens" --init-from x.safetensors --resume ckpt
# Input files that are not regular files, or too large for what they are: refused before they
# are read (a named pipe would block in open(), /dev/zero fill the memory).
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkfifo "$work/fifo"
head -c 2097152 /dev/zero | tr '\0' ' ' >"$work/huge.json"
expect "config file \"$work/fifo\" is not a regular file" --config "$work/fifo"
expect "config file \"/dev/zero\" is not a regular file" --config /dev/zero
expect "config file \"$work/huge.json\" is larger than 1 MiB (1048576 bytes), the most a config \
may hold" --config "$work/huge.json"
expect "$work/fifo is not a regular file" --model gpt2 --data "$work/fifo"
expect "$work/fifo is not a regular file" --model gpt2 --data "$tokens" --val-data "$work/fifo" \
  --val-every 1
expect "--memory-timeline: " --memory-timeline "$work/missing_dir/timeline.tsv"
# DeepSpeed's monitors: a directory that cannot be made, a job name that is not one directory,
# a key the section lacks, and wandb (a network service) are refused before training.
touch "$work/plain_file"
echo '{"train_batch_size": 8, "csv_monitor": {"enabled": true, "output_path": "'"$work"'/plain_file"}}' \
  >"$work/csv_blocked.json"
expect "csv_monitor.output_path and job_name in $work/csv_blocked.json: " \
  --config "$work/csv_blocked.json"
echo '{"train_batch_size": 8, "tensorboard": {"enabled": true, "job_name": "a/b"}}' \
  >"$work/tb_job.json"
expect "\"tensorboard.job_name\" in $work/tb_job.json must be one directory name (not empty, no \
'/'), got \"a/b\"" --config "$work/tb_job.json"
echo '{"train_batch_size": 8, "tensorboard": {"enabled": true, "outpt_path": "runs"}}' \
  >"$work/tb_key.json"
expect "unknown key \"tensorboard.outpt_path\" in $work/tb_key.json" --config "$work/tb_key.json"
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 2, "zero_quantized_weights": true}}' \
  >"$work/qwz_stage2.json"
expect "\"zero_optimization.zero_quantized_weights\" in $work/qwz_stage2.json is true, which needs \
zero_optimization.stage 3 (it is 2): only stage 3 all-gathers parameters" --config "$work/qwz_stage2.json"
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}}' \
  >"$work/hpz_one_rank.json"
expect "\"zero_optimization.zero_hpz_partition_size\" in $work/hpz_one_rank.json must be 1 (off) \
or a divisor of the 1 data-parallel rank(s) (the ranks of one node), got 2" \
  --config "$work/hpz_one_rank.json"
echo '{"train_batch_size": 8, "zero_optimization": {"stage": 2, "zero_hpz_partition_size": 2}}' \
  >"$work/hpz_stage2.json"
expect "\"zero_optimization.zero_hpz_partition_size\" in $work/hpz_stage2.json is 2, which needs \
zero_optimization.stage 3 (it is 2): only stage 3 partitions the parameters" \
  --config "$work/hpz_stage2.json"
echo '{"train_batch_size": 8, "wandb": {"enabled": true}}' >"$work/wandb.json"
expect "\"wandb\" in $work/wandb.json is a DeepSpeed option this runtime does not support: \
Weights & Biases logs to a network service" --config "$work/wandb.json"
echo '{"train_batch_size": 8, "comms_logger": {"enabled": true, "prof_ops": ["all_to_all"]}}' \
  >"$work/comms_ops.json"
expect "\"comms_logger.prof_ops\" in $work/comms_ops.json must be names of collectives \
(all_gather, reduce_scatter, all_reduce, broadcast, barrier), got \"all_to_all\"" \
  --config "$work/comms_ops.json"
echo '{"train_batch_size": 8, "comms_logger": {"enabled": true, "debug": true}}' \
  >"$work/comms_debug.json"
expect "\"comms_logger.debug\" in $work/comms_debug.json is not built" --config "$work/comms_debug.json"
echo '{"train_batch_size": 8, "flops_profiler": {"enabled": true, "profile_step": 50}}' \
  >"$work/flops_step.json"
expect "flops_profiler.profile_step 50 in $work/flops_step.json is beyond the run's last step 20 \
(--steps)" --config "$work/flops_step.json"
echo '{"train_batch_size": 8, "flops_profiler": {"enabled": true, "top_modules": 0}}' \
  >"$work/flops_top.json"
expect "\"flops_profiler.top_modules\" in $work/flops_top.json must be at least 1, got 0" \
  --config "$work/flops_top.json"
# The kernels' environment variables, read when zero-train first asks for the kernel summary.
expect_env() {
  local variable="$1" value="$2" message="$3"
  local output
  output="$(env "$variable=$value" timeout 30 "$zero_train" --steps 1 2>&1)"
  local rc=$?
  if [[ $rc -ne 2 ]] || ! grep -qF -- "zero-train: $message" <<<"$output"; then
    echo "FAIL: $variable=$value zero-train -> exit $rc, expected 2 and 'zero-train: $message'"
    echo "$output" | head -3
    failures=$((failures + 1))
  fi
}
expect_env ZERO_BF16_PRODUCTS fp8 "ZERO_BF16_PRODUCTS='fp8' is neither bf16 nor fp32"
expect_env ZERO_BF16_ATTENTION yes "ZERO_BF16_ATTENTION='yes' is neither bf16 nor fp32"
if [[ $failures -ne 0 ]]; then
  echo "$failures usage error(s) not reported as expected"
  exit 1
fi
echo "every usage error exited 2 with its message"
