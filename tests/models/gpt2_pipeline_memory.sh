#!/usr/bin/env bash
# The activations each pipeline stage holds, planned against measured: zero-train --pp at each
# schedule the GPT-2 runs (gpipe, 1f1b, zb-h1) and each activation checkpointing (none,
# selective, full, and full on one block only, which leaves a stage without a checkpointed block
# and so without recompute buffers), 4 micro-batches a step. Every step's stage_peak_activation_bytes
# (the engine allocator's peak, the largest of each stage's ranks) must equal the init record's
# stage_activation_bytes_planned (gpt2_stage_activation_formula), and that plan must be the
# formula written out here: k micro-batches in flight on stage s (gpipe m, 1f1b min(p - s, m))
# each keeping the stage's blocks, the embedding's token ids on the first stage and the head's
# tensors (its logits among them) on the last, plus the stage's one set of recompute buffers.
# With --tp T each rank holds its slices (gpt2_memory.h's tensor-parallel figures).
# With --interleaved also the interleaved schedule (2 model chunks per stage, 2 pp virtual stages
# of L / 2 pp blocks; no checkpointing, and full on one block): each chunk keeps a set of its
# tensors per (micro-batch, chunk) in flight, and one more from a backward of the chunk until its
# next forward reuses it (its modules keep the tensors of their last backward); the plan is the
# largest sum over the stage's list.
# With --spill-dir DIR (a directory on a disk: O_DIRECT) also checkpoints spilled to NVMe (gpipe
# and zb-h1 selective, 1f1b and interleaved full): a checkpointed block keeps no checkpoint
# (zb-h1's input half copies it back out of the spill's buffer for its weight half), and the
# stage holds the spill's buffer once beside its recompute buffers, min(2, its checkpointed
# blocks) regions (a checkpoint rounded up to 4096 bytes) and 4032 bytes to align them; every
# step bitwise the run that keeps its checkpoints.
#   gpt2_pipeline_memory.sh BIN_DIR NP PP [--tp T] [--interleaved] [--spill-dir DIR]
#                           -- MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
bin="$1"; np="$2"; pp="$3"; shift 3
tp=1 spill_dir=
schedules=(gpipe 1f1b zb-h1)
while [ "$1" != "--" ]; do
  case "$1" in
    --tp) tp="$2"; shift 2 ;;
    --interleaved) schedules+=(interleaved); shift ;;
    --spill-dir) spill_dir="$2"; shift 2 ;;
    *) echo "gpt2_pipeline_memory.sh: unknown option $1"; exit 2 ;;
  esac
done
shift
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_reference.sh"
if [ -n "$spill_dir" ]; then
  # This run's own folder there, removed with the work folder whatever happens.
  spill_dir="$(mktemp -d "$spill_dir/run.XXXXXX")"
  trap 'rm -rf "$work" "$spill_dir"' EXIT
fi
layers=4 heads=4 embd=64 vocab=256 seq=16 micro_batches=4 global_batch=8

for schedule in "${schedules[@]}"; do
  # RECOMPUTE[:NUMBER_CHECKPOINTS[:spill|contiguous|partitioned]]
  checkpointings=(none selective full full:1)
  # The contiguous buffer (the stage's, G sets of its checkpoints: G the most micro-batches one
  # chunk holds from its forward to its backward or input half) and, with tensor parallelism,
  # partitioned checkpoints (each rank keeps ceil(N C / t) of a checkpoint, its recompute
  # buffers t of those more).
  checkpointings+=(full:0:contiguous)
  if [ "$tp" -gt 1 ] && [ "$schedule" != interleaved ]; then
    checkpointings+=(selective:0:partitioned)
  fi
  if [ -n "$spill_dir" ] && [ "$schedule" = gpipe ]; then checkpointings+=(selective:0:spill); fi
  if [ -n "$spill_dir" ] && [ "$schedule" = 1f1b ]; then checkpointings+=(full:0:spill); fi
  if [ -n "$spill_dir" ] && [ "$schedule" = zb-h1 ]; then checkpointings+=(selective:0:spill); fi
  # Interleaved: without recomputation, and with it on the first stage only (its chunk 0).
  if [ "$schedule" = interleaved ]; then
    checkpointings=(none full:1 selective:0:contiguous)
    if [ -n "$spill_dir" ]; then checkpointings+=(full full:0:spill); fi
  fi
  for checkpointing in "${checkpointings[@]}"; do
    IFS=: read -r recompute number spill <<<"$checkpointing"
    number="${number:-0}" number_flag=() spill_flag=()
    if [ "$number" != 0 ]; then number_flag=(--number-checkpoints "$number"); fi
    if [ "$spill" = spill ]; then
      spill_flag=(--checkpoint-nvme-path "$(mktemp -d "$spill_dir/$schedule.XXXXXX")")
    elif [ "$spill" = contiguous ]; then
      echo '{"activation_checkpointing": {"contiguous_memory_optimization": true}}' > "$work/contiguous.json"
      spill_flag=(--config "$work/contiguous.json")
    elif [ "$spill" = partitioned ]; then
      spill_flag=(--partition-activations)
    fi
    run="$work/$schedule-$recompute-$number$spill"
    run_logged "$run.log" "zero-train failed: $schedule, $checkpointing" \
      "${mpiexec[@]}" -np "$np" "$bin/zero-train" --model gpt2 --n-layer "$layers" \
      --n-head "$heads" --n-embd "$embd" --vocab-size "$vocab" --block-size 64 --seq-len "$seq" \
      --global-batch "$global_batch" --micro-batches "$micro_batches" --steps 2 \
      --data "$data/tokens.bin" --pp "$pp" --tp "$tp" --pp-schedule "$schedule" --pp-partition uniform \
      --activation-checkpointing "$recompute" "${number_flag[@]}" "${spill_flag[@]}" \
      --metrics "$run.jsonl"
    if [ "$spill" = spill ]; then rmdir "${spill_flag[1]}"; fi
    python3 - "$run.jsonl" "$np" "$pp" "$tp" "$schedule" "$recompute" "${spill:-kept}" "$number" \
      "$layers" "$heads" "$embd" "$vocab" "$seq" "$micro_batches" "$global_batch" <<'PY'
import json, sys
path, schedule, recompute, setting = sys.argv[1], sys.argv[5], sys.argv[6], sys.argv[7]
spill = setting == "spill"
np, p, t, number, L, H, C, V, T, m, batch = map(int, sys.argv[2:5] + sys.argv[8:])
records = [json.loads(line) for line in open(path)]
init = next(r for r in records if r["event"] == "init")
planned = init["stage_activation_bytes_planned"]
dp = np // (p * t)
Cl, Hl = C // t, H // t  # a rank's slices of the attention and the MLP
N = batch // (m * dp) * T
n = number or L
checkpointed = {j * L // n for j in range(n)} if recompute != "none" else set()
block = {"none": N * (4 * C + 12 * Cl + 4 + Hl), "selective": N * (C + 4 * Cl + Hl),
         "full": N * C}
if spill or setting == "contiguous":
    block[recompute] -= N * C  # the checkpoint goes to the file, or to the stage's buffer
piece = -(-N * C // t)  # a rank's piece of a partitioned checkpoint
if setting == "partitioned":
    block[recompute] += piece - N * C
def spill_buffer(layers):
    """Bytes of the stage's spill buffer: two regions (one with one checkpointed block) of a
    checkpoint rounded up to 4096 bytes, and the slack that aligns them."""
    checkpointed_here = len(checkpointed & set(layers))
    if not spill or not checkpointed_here:
        return 0
    return min(2, checkpointed_here) * -(-4 * N * C // 4096) * 4096 + 4096 - 64
recompute_buffers = {"none": 0, "selective": N * (3 * C + 8 * Cl + 4),
                     "full": N * (3 * C + 12 * Cl + 4 + Hl)}
if setting == "partitioned":
    recompute_buffers[recompute] += t * piece  # the whole input, all-gathered
# What a checkpointed block recomputes in its backward_input and keeps for its weight half: all
# it recomputes but qkv and the log-sum-exp (which selective keeps, and full rebuilds in the
# recompute buffers).
rebuilt_for_weights = {"none": 0, "selective": N * (3 * C + 8 * Cl + 4),
                       "full": N * (3 * C + 9 * Cl + 4)}
def zero_bubble_peak(s, kept, layers):
    """ZB-H1 on stage s: 1F1B's forwards and input gradients, each weight gradient deferred
    until more than s wait. A micro-batch awaiting its weight gradient keeps its activations and
    the output gradients the weight half reads (per block those of the MLP's projection, fc
    (4 Cl wide), ln_2, the attention's projection and ln_1; the head's of ln_f, the embedding's
    of its output) and, per checkpointed block, the tensors it recomputed that the weight half
    reads (with the spill or partitioned also a copy of its input, N C); inside a backward_input a block's attention output gradient (N x Cl) too, outweighed
    on the first stage by the embedding's own, made after it."""
    waiting = len(layers) * N * (4 * C + 4 * Cl) + (N * C if s == 0 else 0)
    waiting += N * C if s == p - 1 else 0
    waiting += len(checkpointed & set(layers)) * (rebuilt_for_weights[recompute] +
                                                  (N * C if setting != "kept" else 0))
    scratch = N * Cl if layers and s > 0 else 0
    forwarded = awaiting = backward = weight = peak = 0
    def point(extra=0):
        return forwarded * kept + awaiting * (kept + waiting) + extra
    def backward_input():
        nonlocal forwarded, awaiting, backward, weight, peak
        forwarded, awaiting, backward = forwarded - 1, awaiting + 1, backward + 1
        peak = max(peak, point(scratch))
        if backward - weight > s:
            awaiting, weight = awaiting - 1, weight + 1
    for mb in range(m):
        forwarded += 1
        peak = max(peak, point())
        if mb >= min(p - s - 1, m):
            backward_input()
    while backward < m:
        backward_input()
    return peak

def interleaved_peak(s, kept, shared, v=2):
    """Megatron's interleaved list on stage s (its k-th forward runs chunk (k mod pv) div p of
    micro-batch (k div pv) p + k mod p, its k-th backward the same micro-batch on chunk
    v - 1 - that; 2(p - s - 1) + (v - 1) p warm-up forwards, all of them when m = p), walked:
    per chunk its sets in flight, plus the one its modules keep from a backward to its next
    forward."""
    total, group = m * v, p * v
    forward_chunk = lambda k: (k % group) // p
    backward_chunk = lambda k: v - 1 - (k % group) // p
    warmup = total if m == p else min(2 * (p - s - 1) + (v - 1) * p, total)
    actions = [("F", forward_chunk(k)) for k in range(warmup)]
    for k in range(warmup, total):
        actions += [("F", forward_chunk(k)), ("B", backward_chunk(k - warmup))]
    actions += [("B", backward_chunk(k)) for k in range(total - warmup, total)]
    forwarded, left, peak, most = [0] * v, [0] * v, 0, 0
    for kind, c in actions:
        left[c] = 0  # reused by the forward; replaced by the micro-batch's own in the backward
        forwarded[c] += kind == "F"
        most = max(most, forwarded[c])
        peak = max(peak, sum(kept[c] * (forwarded[c] + left[c]) for c in range(v)))
        if kind == "B":
            forwarded[c], left[c] = forwarded[c] - 1, 1
    return peak + shared, most

def checkpoint_buffer(layers, sets):
    """Floats of the contiguous buffer: `sets` sets of the stage's checkpoints."""
    return sets * len(checkpointed & set(layers)) * N * C if setting == "contiguous" else 0

expected = []
for s in range(p):
    if schedule == "interleaved":
        # Virtual stage c p + s of 2 p, uniform: chunk c of stage s.
        chunks = [range((c * p + s) * L // (2 * p), (c * p + s + 1) * L // (2 * p)) for c in (0, 1)]
        kept = [sum(block[recompute] if l in checkpointed else block["none"] for l in layers)
                for layers in chunks]
        kept[0] += N if s == 0 else 0
        kept[1] += N * (2 * C + -(-V // t) + 4) if s == p - 1 else 0
        layers = set(chunks[0]) | set(chunks[1])
        shared = recompute_buffers[recompute] if checkpointed & layers else 0
        peak, sets = interleaved_peak(s, kept, shared)
        expected.append(4 * (peak + checkpoint_buffer(layers, sets)) + spill_buffer(layers))
        continue
    layers = range(s * L // p, (s + 1) * L // p)
    k = m if schedule == "gpipe" else min(p - s, m)
    kept = sum(block[recompute] if l in checkpointed else block["none"] for l in layers)
    kept += N if s == 0 else 0
    kept += N * (2 * C + -(-V // t) + 4) if s == p - 1 else 0
    shared = recompute_buffers[recompute] if checkpointed & set(layers) else 0
    shared += checkpoint_buffer(layers, min(p - s, m) if schedule == "zb-h1" else k)
    if schedule == "zb-h1":
        expected.append(4 * (zero_bubble_peak(s, kept, layers) + shared) + spill_buffer(layers))
    else:
        expected.append(4 * (k * kept + shared) + spill_buffer(layers))
label = f"{schedule}, {recompute}" + (f" on {number} block(s)" if number else "")
label += {"spill": ", spilled to NVMe", "contiguous": ", in the contiguous buffer",
          "partitioned": ", partitioned"}.get(setting, "")
if planned != expected:
    sys.exit(f"{label}: planned per stage {planned} B, the formula gives {expected} B")
steps = [r for r in records if r["event"] == "step"]
if len(steps) != 2:
    sys.exit(f"{label}: {len(steps)} step records, expected 2")
for r in steps:
    if r["stage_peak_activation_bytes"] != planned:
        sys.exit(f"{label}: step {r['step']}: peak activations per stage "
                 f"{r['stage_peak_activation_bytes']} B, planned {planned} B")
print(f"{label}: every step's peak activations per stage equal the plan, {planned} B")
PY
  done
done
# The checkpoints spilled (2 checkpointed blocks per stage: the backward of one reads the
# other's ahead; interleaved, one per chunk, across the chunks of a stage): every step bitwise
# the run keeping them.
for spilled in "$work"/*spill.jsonl; do
  [ -e "$spilled" ] || continue
  python3 - "${spilled%spill.jsonl}.jsonl" "$spilled" <<'PY'
import json, os, sys
kept, spilled = ([(r["loss"], r["grad_norm"]) for r in map(json.loads, open(path))
                  if r["event"] == "step"] for path in sys.argv[1:])
assert spilled == kept, (sys.argv[2], spilled, kept)
print(os.path.basename(sys.argv[2]), "spilled to NVMe: every step bitwise the run keeping its "
      "checkpoints:", spilled[-1])
PY
done
