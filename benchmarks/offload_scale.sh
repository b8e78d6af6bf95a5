#!/usr/bin/env bash
# A GPT-2-shaped model whose state is larger than this machine's memory trains with
# ZeRO-Infinity's offloads (issue 16): stage 3 at 2 ranks, the optimizer state (offload_optimizer)
# and the parameter shards (offload_param) on NVMe, 3 steps on one repeated batch. It reports the
# peak resident memory of all ranks together, the bytes on NVMe, each step's time split into
# compute, communication and I/O, and the losses, which must be finite and fall. Not part of CI:
# run it by hand (it writes tens of GB and takes minutes).
#
#   benchmarks/offload_scale.sh [--build DIR] [--nvme-path DIR] [--layers L] [--embd C]
#                               [--heads H] [--vocab V] [--seq-len T] [--dtype fp32|bf16]
#                               [--steps N] [--lr X] [--dry-run]
#
# Before anything is written it plans the run with zero-estimate (the engine's own plan) and
# refuses, with the numbers, when the NVMe files do not fit the free space of --nvme-path (with
# 4 GiB to spare) or the ranks' planned memory does not fit MemAvailable. --dry-run stops there.
#
# What stays in memory: each rank's gradient shard (in bf16, accumulated in bf16, DeepSpeed's
# data_types.grad_accum_dtype: 2 bytes per parameter over all ranks; in fp32, 4), the engine's
# fixed-size buffers and, in bf16, the GPT-2 modules' fp32 working copies (the embedding's and
# the head's, and one block's, which the blocks share: gpt2_module_copy_bytes); everything else
# (the 16-bit parameters, fp32 master and Adam's moments) is on NVMe. The plan is zero-estimate's,
# with what zero-train's budget holds beside the engine (tensors between modules, the copies)
# and the activations of one sequence per rank.
set -euo pipefail

build=build
nvme_path=""
layers=16
embd=3072
heads=24
vocab=50257
seq_len=16
dtype=bf16
steps=3
lr=5e-6
dry_run=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --nvme-path) nvme_path="$2"; shift 2 ;;
    --layers) layers="$2"; shift 2 ;;
    --embd) embd="$2"; shift 2 ;;
    --heads) heads="$2"; shift 2 ;;
    --vocab) vocab="$2"; shift 2 ;;
    --seq-len) seq_len="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --lr) lr="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    *) echo "offload_scale.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ "$dtype" == fp32 || "$dtype" == bf16 ]] || { echo "--dtype must be fp32 or bf16" >&2; exit 2; }
ranks=2
sub_group=20000000     # elements per optimizer sub-group: 3 staging records of 160 MB in fp32
opt_buffers=3          # read ahead, step, write behind
param_buffers=2        # the shard being gathered or stepped, and the next one
param_buffer_size=100000000
[[ -z "$nvme_path" ]] && nvme_path="$build/offload_scale"
for tool in zero-train zero-estimate zerorun; do
  [[ -x "$build/bin/$tool" ]] || { echo "offload_scale.sh: $build/bin/$tool not built" >&2; exit 2; }
done
mkdir -p "$nvme_path"
work="$(mktemp -d "$nvme_path/run.XXXXXX")"
trap 'rm -rf "$work"' EXIT

model=(--model gpt2 --n-layer "$layers" --n-head "$heads" --n-embd "$embd" --vocab-size "$vocab"
  --block-size 1024)
# The engine's plan per rank: model state and buffers in memory, the NVMe files, and beside them
# what zero-train's budget holds and the activations (no recomputation, one sequence).
accum="$dtype"  # the gradient shard in the working dtype
plan="$("$build/bin/zero-estimate" "${model[@]}" --dtype "$dtype" --ranks "$ranks" --stage 3 \
  --offload-optimizer nvme --offload-param nvme --sub-group-size "$sub_group" \
  --buffer-count "$opt_buffers" --param-buffer-count "$param_buffers" \
  --param-buffer-size "$param_buffer_size" --grad-accum-dtype "$accum" \
  --micro-batch 1 --seq-len "$seq_len" --memory-limit 1024G)"
echo "$plan"
params="$(awk 'NR == 1 { print $2 }' <<<"$plan")"
read -r _ state buffers _ nvme < <(awk '$1 == 3 && NF == 5' <<<"$plan")
beside="$(sed -nE 's/^beside them: ([0-9]+) bytes.*/\1/p' <<<"$plan")"
activations="$(awk '$1 == "none" { print $2 }' <<<"$plan")"
memory_all=$(((state + buffers + beside + activations) * ranks))
nvme_all=$((nvme * ranks))
model_state=$((params * 16))  # 16-bit params and grads, fp32 master and moments (or fp32's 16)
free_disk=$(($(df -B1 --output=avail "$nvme_path" | tail -1)))
available=$(($(awk '/MemAvailable/ { print $2 }' /proc/meminfo) * 1024))
machine=$(($(awk '/MemTotal/ { print $2 }' /proc/meminfo) * 1024))
gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 2^30 }'; }
echo "model: $params parameters ($layers layers x $embd, $heads heads, vocab $vocab), $dtype"
echo "model state (16 bytes per parameter): $(gib $model_state) = $(awk -v a=$model_state \
  -v m=$machine 'BEGIN { printf "%.2f", a / m }') x this machine's memory ($(gib $machine))"
echo "planned: memory of all ranks $(gib $memory_all) (MemAvailable $(gib $available)), NVMe" \
  "$(gib $nvme_all) under $nvme_path (free $(gib $free_disk))"
spare=$((4 << 30))
if ((nvme_all + spare > free_disk)); then
  echo "offload_scale.sh: refused: the NVMe files need $nvme_all bytes ($(gib $nvme_all)) plus" \
    "$(gib $spare) to spare, but $nvme_path has $free_disk bytes ($(gib $free_disk)) free;" \
    "use fewer --layers or another --nvme-path" >&2
  exit 1
fi
if ((memory_all > available)); then
  echo "offload_scale.sh: refused: the ranks plan $memory_all bytes ($(gib $memory_all)) of" \
    "memory, but only $available bytes ($(gib $available)) are available; use fewer --layers" >&2
  exit 1
fi
((dry_run)) && exit 0

# One batch of 2 sequences (one per rank) of seq_len + 1 tokens: the file holds exactly one
# batch, so every step trains on the same tokens (llm.c's token format).
tokens="$work/one_batch.bin"
python3 - "$tokens" $((ranks * seq_len + 1)) <<'EOF'
import struct, sys
path, count = sys.argv[1], int(sys.argv[2])
header = [20240520, 1, count] + [0] * 253
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%dH" % count, *[(7 * i + 3) % 256 for i in range(count)]))
EOF
cat >"$work/config.json" <<EOF
{
  "train_batch_size": $ranks,
  "gradient_accumulation_steps": 1,
  "bf16": {"enabled": $([[ $dtype == bf16 ]] && echo true || echo false)},
  "data_types": {"grad_accum_dtype": "$accum"},
  "wall_clock_breakdown": true,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": $sub_group,
    "offload_optimizer": {"device": "nvme", "nvme_path": "$work", "buffer_count": $opt_buffers,
                          "pipeline_read": true, "pipeline_write": true},
    "offload_param": {"device": "nvme", "nvme_path": "$work", "buffer_count": $param_buffers,
                      "buffer_size": $param_buffer_size}
  },
  "optimizer": {"type": "AdamW", "params": {"lr": $lr, "weight_decay": 0.0}}
}
EOF
metrics="$work/metrics.jsonl"
start=$(date +%s)
"$build/bin/zerorun" -np "$ranks" -- "$build/bin/zero-train" --config "$work/config.json" \
  "${model[@]}" --seq-len "$seq_len" --data "$tokens" --steps "$steps" --metrics "$metrics"
echo "wall time: $(($(date +%s) - start)) s"

python3 - "$metrics" "$ranks" "$machine" "$model_state" <<'EOF'
import json, math, sys
path, ranks, machine, model_state = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
records = [json.loads(line) for line in open(path)]
init = next(r for r in records if r.get("event") == "init")
steps = [r for r in records if r.get("event") == "step"]
nvme = init["nvme_bytes"] * ranks
print(f"on NVMe: {nvme} bytes ({nvme / 2**30:.2f} GiB) in {ranks} ranks' files; in memory per "
      f"rank (plan): model state {init['model_state_bytes']}, buffers {init['buffer_bytes']}")
print("step  loss      step s  compute s  comm s  io s   (comm busy s, read+written GB per rank)")
for s in steps:
    io = (s["nvme_wait_ms"] + s["nvme_param_read_wait_ms"]) / 1e3
    comm = max(0.0, s["comm_wait_ms"] - s["nvme_param_read_wait_ms"]) / 1e3
    total = s["step_ms"] / 1e3
    compute = total - comm - io
    moved = (s["nvme_read_bytes"] + s["nvme_write_bytes"]) / 1e9
    print(f"{s['step']:4d}  {s['loss']:.6f}  {total:6.1f}  {compute:9.1f}  {comm:6.1f}  {io:5.1f}"
          f"   ({s['comm_busy_ms'] / 1e3:.1f}, {moved:.1f})")
peak = max(s["peak_resident_bytes_all_ranks"] for s in steps)
print(f"peak resident memory of all ranks together: {peak} bytes ({peak / 2**30:.2f} GiB), "
      f"{peak / machine:.2f} of this machine's {machine / 2**30:.2f} GiB")
print(f"model state {model_state / 2**30:.2f} GiB = {model_state / peak:.2f} x the peak resident "
      f"memory, {model_state / machine:.2f} x the machine's")
losses = [s["loss"] for s in steps]
ok = all(math.isfinite(l) for l in losses) and all(b < a for a, b in zip(losses, losses[1:]))
print("losses finite and falling:", "yes" if ok else "NO")
sys.exit(0 if ok and peak < machine else 1)
EOF
