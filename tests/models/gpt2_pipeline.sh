#!/usr/bin/env bash
# The reference GPT-2 (tests/data/gpt2) trained by zero-train cut into a pipeline: at every ZeRO
# stage and each schedule GPT-2 runs (gpipe, 1f1b, zb-h1; at stages 2-3 also 1f1b reducing, and
# at stage 3 gathering, per micro-batch: --pp-regather), each run checked against PyTorch's
# float64 run (every step's loss and gradient norm within 1e-5 relative) and against the same job
# without a pipeline (the same micro-batches on the same data-parallel ranks): every step's loss
# and norm within 1e-6 relative, and so is the validation loss after every step (forward only
# through the pipeline, on the training batch: the reference's next loss); zb-h1 bitwise 1f1b,
# and at stages 1 and 3 zb-h1 with selective and full activation checkpointing bitwise without.
# With 2 data-parallel ranks per stage, stage 3 also with hybrid sharding, bitwise without.
# Checkpoints in the contiguous buffer, and with --tp partitioned, bitwise kept whole.
# Not bitwise against the job without a pipeline: the pipeline sums the tied wte's two uses after
# reducing each over its stage, where one model adds them in one buffer before reducing, and adds
# the stages' parts of the gradient norm in stage order.
# With --interleaved: Megatron's interleaved schedule (2 model chunks per stage) at every ZeRO
# stage (and stage 3 with --pp-regather), bitwise 1F1B on the same 4-layer GPT-2 (the reference's blocks twice over: its 2 layers
# cannot fill 4 virtual stages).
# With --spill-dir DIR (a directory on a disk: O_DIRECT): activation checkpoints spilled to NVMe
# through the pipeline, bitwise the same pipeline keeping them in memory.
#   gpt2_pipeline.sh BIN_DIR NP PP [--tp T] [--micro-batches M] [--interleaved]
#                    [--spill-dir DIR] -- MPIEXEC [MPIEXEC_FLAGS...]
set -euo pipefail
bin="$1"; np="$2"; pp="$3"; shift 3
tp=1; micro_batches=2; interleaved=0; spill_dir=
while [ "$1" != "--" ]; do
  case "$1" in
    --tp) tp="$2"; shift ;;
    --micro-batches) micro_batches="$2"; shift ;;
    --interleaved) interleaved=1 ;;
    --spill-dir) spill_dir="$2"; shift ;;
    *) echo "gpt2_pipeline.sh: unknown option $1"; exit 2 ;;
  esac
  shift
done
shift
source "$(dirname "${BASH_SOURCE[0]}")/gpt2_reference.sh"
if [ -n "$spill_dir" ]; then
  # This run's own folder there, removed with the work folder whatever happens.
  spill_dir="$(mktemp -d "$spill_dir/run.XXXXXX")"
  trap 'rm -rf "$work" "$spill_dir"' EXIT
fi

# check_flops_profile METRICS LAYERS: flops_profiler's one record is the whole model's, gathered
# from every stage: its FLOPs flops_per_token times the step's 4 x 32 tokens, its parameters the
# model's (wte counted once), its blocks h.0 to h.LAYERS-1 in order.
check_flops_profile() {
  python3 - "$1" "$2" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
init = next(r for r in records if r["event"] == "init")
profiles = [r for r in records if r["event"] == "flops_profile"]
assert len(profiles) == 1, len(profiles)
profile, layers = profiles[0], int(sys.argv[2])
assert profile["total_flops"] == init["flops_per_token"] * 4 * 32, (profile, init)
params = sum(m["params"] for m in profile["modules"])
c = {k: init[k] for k in ("n_embd", "vocab_size", "block_size")}
# wte, wpe, each block's 12 C^2 + 13 C, ln_f.
expected = (c["vocab_size"] + c["block_size"]) * c["n_embd"] + layers * (12 * c["n_embd"] ** 2 + 13 * c["n_embd"]) + 2 * c["n_embd"]
assert params == expected, (params, expected)
blocks = [m["name"] for m in profile["modules"] if m["name"].startswith("h.")]
assert blocks == ["h.%d" % i for i in range(layers)], blocks
print("flops profile of step", profile["step"], "over every stage:", profile["total_flops"], "FLOPs,", params, "parameters")
PY
}

# check_pp_bytes METRICS SLICES: every step moved each micro-batch's activation forward and its
# gradient back between the stages, [micro-batch, 32, 64] fp32 each, in each of the np / pp
# pipelines, each of those tensors in SLICES slices.
check_pp_bytes() {
  python3 -c 'import json, sys
np, pp, m, tp, slices = map(int, sys.argv[2:7])
dp = np // pp // tp
expected = (np // pp) * 2 * m * (4 // (m * dp)) * 32 * 64 * 4 // slices
for r in map(json.loads, open(sys.argv[1])):
    if r.get("event") == "step":
        assert r["pp_comm_bytes"] == expected, (r["step"], r["pp_comm_bytes"], expected)
print("bytes between stages per step:", expected, "(tensors in %d slices)" % slices)' \
    "$1" "$np" "$pp" "$micro_batches" "$tp" "$2"
}

# train STAGE NAME [FLAGS...]: one zero-train run of the reference (its config: $train_config, else
# the reference's).
train() {
  local stage="$1" run="$work/$2"
  shift 2
  run_logged "$run.log" "zero-train failed: stage $stage, $np rank(s), $*" \
    "${mpiexec[@]}" -np "$np" "$bin/zero-train" "${reference_model[@]}" \
    --config "${train_config:-$data/adamw.json}" --init-from "$data/model.safetensors" \
    --stage "$stage" --tp "$tp" --micro-batches "$micro_batches" --steps 3 --metrics "$run.jsonl" \
    --val-data "$data/tokens.bin" --val-every 1 "$@"
}

# The job without a pipeline: the ranks of one stage, the same micro-batches.
plain_np=$((np / pp))
for stage in 0 1 2 3; do
  np_saved="$np"; np="$plain_np"
  train "$stage" "plain$stage"
  np="$np_saved"
  variants=(gpipe 1f1b zb-h1)
  # Stages 2-3 reduce once per step and stage 3 keeps units gathered through the step;
  # --pp-regather reduces (and gathers) per micro-batch.
  if [ "$stage" -ge 2 ]; then variants+=(1f1b:--pp-regather); fi
  for variant in "${variants[@]}"; do
    schedule="${variant%%:*}"
    extra=()
    if [ "$variant" != "$schedule" ]; then extra=("${variant#*:}"); fi
    run="pp$stage$schedule${#extra[@]}"
    # One run writes the trace: one file with every rank of every stage. At stage 2 the whole
    # backward's and the split one's schedules dump their timelines.
    if [ "$stage$schedule" = 11f1b ]; then extra+=(--trace "$work/trace.json"); fi
    if [ "$stage" = 2 ] && [ "${#extra[@]}" = 0 ] && [ "$schedule" != gpipe ]; then
      extra+=(--pp-schedule-dump "$work/dump-$schedule")
    fi
    train "$stage" "$run" --pp "$pp" --pp-schedule "$schedule" "${extra[@]}"
    echo "ZeRO stage $stage, pipeline of $pp on $np rank(s) (tp $tp), $schedule ${extra[*]}, $micro_batches micro-batches:"
    grep -E "^pipeline stage|^step" "$work/$run.log"
    "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/$run.jsonl" \
      --reference-tolerance 1e-5 --expect-val 1 --same-metrics-as "$work/plain$stage.jsonl" \
      --metrics-tolerance 1e-6
    # Between the stages each step moves every micro-batch's activation forward and its
    # gradient back, [micro-batch, 32, 64] fp32 each, in each of the np / pp pipelines; with
    # tensor parallelism each of a group's tp pipelines carries a 1/tp slice (pipe_partitioned
    # and grad_partitioned, DeepSpeed's defaults).
    check_pp_bytes "$work/$run.jsonl" "$tp"
  done
done

# The activation checkpoints spilled to NVMe: each micro-batch a stage holds in flight (1F1B
# p - s, GPipe all m) has regions of its own in the stage's file, so every step's loss, gradient
# norm and validation loss (a forward that no backward follows) are bitwise those of the same
# pipeline keeping its checkpoints in memory: full and selective, 1F1B and GPipe, ZeRO stages 1
# to 3, fp32 and bf16. The file is unlinked once open: nothing stays behind.
if [ -n "$spill_dir" ]; then
  for variant in 1:1f1b:full 1:gpipe:selective 3:1f1b:full 2:gpipe:selective:bf16; do
    IFS=: read -r stage schedule mode dtype <<<"$variant"
    flags=(--pp "$pp" --pp-schedule "$schedule" --activation-checkpointing "$mode")
    tolerance=1e-5
    if [ -n "$dtype" ]; then flags+=(--dtype "$dtype"); tolerance=4e-3; fi
    run="${variant//:/_}"
    train "$stage" "kept_$run" "${flags[@]}"
    nvme="$(mktemp -d "$spill_dir/$run.XXXXXX")"
    train "$stage" "spilled_$run" "${flags[@]}" --checkpoint-nvme-path "$nvme"
    echo "ZeRO stage $stage, pipeline of $pp, $schedule, $mode ${dtype:-fp32} checkpoints spilled to NVMe against kept, bitwise:"
    "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
      --metrics "$work/spilled_$run.jsonl" --reference-tolerance "$tolerance" --expect-val 1 \
      --same-metrics-as "$work/kept_$run.jsonl" --metrics-tolerance 0
    [ -z "$(ls -A "$nvme")" ] || { ls -la "$nvme"; exit 1; }
    rmdir "$nvme"
  done
fi

# Checkpoints in the contiguous buffer (contiguous_memory_optimization: a slot per checkpointed
# block and micro-batch in flight, forward k in set k mod the stage's micro-batches in flight)
# and, with tensor parallelism, partitioned (partition_activations: a rank's piece travels with
# its micro-batch), both and each alone: every step's loss, gradient norm and validation loss
# bitwise the same pipeline keeping whole checkpoints block by block, GPipe (all m in flight),
# 1F1B (p - s) and ZB-H1 (the input half copies the input for the weight half), full and
# selective. (Interleaved: below, bitwise 1F1B.)
python3 - "$data/adamw.json" "$work" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
for name, keys in {"contiguous": {"contiguous_memory_optimization": True},
                   "partitioned": {"partition_activations": True},
                   "both": {"contiguous_memory_optimization": True, "partition_activations": True}}.items():
    json.dump(dict(base, activation_checkpointing=keys), open("%s/%s.json" % (sys.argv[2], name), "w"))
PY
slot_variants=(1:1f1b:full:contiguous 3:gpipe:selective:contiguous 2:zb-h1:full:contiguous)
if [ "$tp" -gt 1 ]; then
  slot_variants+=(1:gpipe:full:partitioned 3:1f1b:selective:partitioned 2:1f1b:full:both
    3:zb-h1:full:partitioned)
fi
for variant in "${slot_variants[@]}"; do
  IFS=: read -r stage schedule mode setting <<<"$variant"
  flags=(--pp "$pp" --pp-schedule "$schedule" --activation-checkpointing "$mode")
  run="${variant//:/_}"
  train "$stage" "whole_$run" "${flags[@]}"
  train_config="$work/$setting.json" train "$stage" "slots_$run" "${flags[@]}"
  echo "ZeRO stage $stage, pipeline of $pp, $schedule, $mode checkpoints $setting against kept whole, bitwise:"
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
    --metrics "$work/slots_$run.jsonl" --reference-tolerance 1e-5 --expect-val 1 \
    --same-metrics-as "$work/whole_$run.jsonl" --metrics-tolerance 0
done

# ZB-H1 splits each backward into its input and weight halves and runs the weight halves later,
# in micro-batch order: bitwise 1F1B's numbers at every stage.
for stage in 0 1 2 3; do
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
    --metrics "$work/pp${stage}zb-h10.jsonl" --same-metrics-as "$work/pp${stage}1f1b0.jsonl" \
    --metrics-tolerance 0
done
# In bf16 the head makes the loss's gradient with the loss, in the logits' memory, and both
# halves scale it inside their products (the weight half by the scale the input half was given,
# which travels with its micro-batch): ZB-H1 bitwise 1F1B there too.
for schedule in 1f1b zb-h1; do
  train 1 "bf16$schedule" --pp "$pp" --pp-schedule "$schedule" --dtype bf16
done
echo "ZeRO stage 1, pipeline of $pp, bf16, zb-h1 against 1f1b, bitwise:"
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
  --metrics "$work/bf16zb-h1.jsonl" --reference-tolerance 4e-3 --expect-val 1 \
  --same-metrics-as "$work/bf161f1b.jsonl" --metrics-tolerance 0
# With activation checkpointing a block recomputes once, in its input half, and keeps what its
# weight half reads until then: bitwise ZB-H1 without checkpointing (and so 1F1B), every step's
# loss, gradient norm and validation loss, at ZeRO stages 1 and 3 (gathering for the
# recomputation).
for stage in 1 3; do
  for mode in selective full; do
    train "$stage" "zb$stage$mode" --pp "$pp" --pp-schedule zb-h1 --activation-checkpointing "$mode"
    echo "ZeRO stage $stage, pipeline of $pp, zb-h1 with $mode checkpointing against without, bitwise:"
    "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
      --metrics "$work/zb$stage$mode.jsonl" --reference-tolerance 1e-5 --expect-val 1 \
      --same-metrics-as "$work/pp${stage}zb-h10.jsonl" --metrics-tolerance 0
  done
done
# And with the checkpoints spilled to NVMe (the input half reads a block's back and copies it
# out of the spill's buffer for the weight half): bitwise the run keeping them.
if [ -n "$spill_dir" ]; then
  nvme="$(mktemp -d "$spill_dir/zb-h1.XXXXXX")"
  train 1 zb1full_spilled --pp "$pp" --pp-schedule zb-h1 --activation-checkpointing full \
    --checkpoint-nvme-path "$nvme"
  echo "ZeRO stage 1, pipeline of $pp, zb-h1, full checkpoints spilled to NVMe against kept, bitwise:"
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" \
    --metrics "$work/zb1full_spilled.jsonl" --reference-tolerance 1e-5 --expect-val 1 \
    --same-metrics-as "$work/zb1full.jsonl" --metrics-tolerance 0
  [ -z "$(ls -A "$nvme")" ] || { ls -la "$nvme"; exit 1; }
  rmdir "$nvme"
fi

# --pp-schedule-dump: the last step of the leader's pipeline, every rank's actions measured and
# every compute action planned (F and B, or F, B and W under zb-h1) with the measured mean times,
# none zero; the step records' bubble fractions are fractions.
for schedule in 1f1b zb-h1; do
  python3 - "$work/dump-$schedule.json" "$schedule" "$pp" "$micro_batches" "$work/pp2${schedule}0.jsonl" <<'PY'
import json, sys
from collections import Counter
dump, schedule, pp, m = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kinds = ["forward", "backward_input", "backward_weight"] if schedule == "zb-h1" else ["forward", "backward"]
planned = Counter((a["rank"], a["action"]) for a in dump["actions"] if a["timeline"] == "planned")
measured = Counter((a["rank"], a["action"]) for a in dump["actions"] if a["timeline"] == "measured")
for rank in range(pp):
    for kind in kinds:
        assert planned[(rank, kind)] == m and measured[(rank, kind)] == m, (schedule, rank, kind, planned, measured)
durations = dump["planned_durations"]
used = ["forward", "backward"] + (["weight"] if schedule == "zb-h1" else [])
assert all(durations[k] > 0 for k in used), (schedule, durations)
assert 0 <= dump["planned_bubble_fraction"] < 1, dump["planned_bubble_fraction"]
for r in map(json.loads, open(sys.argv[5])):
    if r.get("event") == "step":
        assert 0 <= r["bubble_fraction"] < 1 and r["pp_wait_ms"] >= 0, r
print(schedule, "timeline dump: every rank's actions measured and planned, planned times", durations)
PY
done

python3 -c 'import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
ranks = {e["pid"] for e in events if e["ph"] == "X" and e["name"].startswith("forward")}
assert ranks == set(range(int(sys.argv[2]))), (sorted(ranks), sys.argv[2])
print("trace: forward spans from ranks", sorted(ranks))' "$work/trace.json" "$np"

# Reduced once per step, stages 2 and 3 send what stage 1 sends in its data-parallel groups (a
# reduce-scatter and an all-gather of every unit per step, with stage 3's units held gathered),
# in as many collectives; reducing per micro-batch sends more.
python3 -c 'import json, sys
def figures(run):
    steps = [r for r in map(json.loads, open(sys.argv[1] + "/" + run + ".jsonl")) if r.get("event") == "step"]
    # The first step also counts what the engine issued before it.
    return [(r["stage_collectives"], r["stage_data_parallel_bytes"]) for r in steps[1:]]
once = figures("pp11f1b0")
for run in ("pp21f1b0", "pp31f1b0"):
    assert figures(run) == once, (run, figures(run), once)
for run in ("pp21f1b1", "pp31f1b1"):
    more = figures(run)
    for (calls_once, bytes_once), (calls_more, bytes_more) in zip(once, more):
        assert all(m > o for o, m in zip(calls_once, calls_more)), (run, more, once)
        # One rank per data-parallel group sends nothing.
        assert all(m > o for o, m in zip(bytes_once, bytes_more) if o > 0), (run, more, once)
print("data-parallel collectives and bytes per stage and step, reduced once:", once[-1])' "$work"

# Interleaved runs each micro-batch through the same computations as 1F1B, chunk after chunk:
# every block's gradient sums the micro-batches in the same order (each chunk's backwards run in
# micro-batch order, and a unit never spans two chunks), and so does each stage's tied wte (on
# the first stage in chunk 0, on the last in its last chunk): every step's loss, gradient norm
# and validation loss bitwise 1F1B's at every ZeRO stage. Stage 3 keeps its units gathered
# through the step and stages 2-3 reduce once; with --pp-regather stage 3 gathers and reduces
# per micro-batch, bitwise 1F1B's with --pp-regather.
if [ "$interleaved" = 1 ]; then
  python3 - "$data/model.safetensors" "$work/model4.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
size = struct.unpack("<Q", raw[:8])[0]
header, body = json.loads(raw[8:8 + size]), raw[8 + size:]
tensors, data = {}, bytearray()
for name, info in header.items():
    if name == "__metadata__":
        continue
    names = [name]
    if name.startswith("h."):
        layer, rest = name[2:].split(".", 1)
        names.append(f"h.{int(layer) + 2}.{rest}")
    begin, end = info["data_offsets"]
    for n in names:
        tensors[n] = dict(info, data_offsets=[len(data), len(data) + end - begin])
        data += body[begin:end]
text = json.dumps(tensors).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))
PY
  deep_model=("${reference_model[@]}" --n-layer 4)
  # One run profiles its FLOPs: the stages' chunks gathered in the model's order.
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["flops_profiler"] = {"enabled": True, "profile_step": 3}
json.dump(c, open(sys.argv[2], "w"))' "$data/adamw.json" "$work/flops.json"
  # STAGE[:SETTING]: at stage 3 also gathering each unit and reducing per micro-batch
  # (regather: --pp-regather), each chunk's units gathered and released within its own forward
  # and backward; at stage 1 full checkpoints in the contiguous buffer (G sets, G the most
  # micro-batches one chunk holds in flight).
  for variant in 0 1 2 3 3:regather 1:contiguous; do
    stage="${variant%%:*}" extra=() name="$variant" setting_config=
    case "$variant" in
      *:regather) extra=(--pp-regather) ;;
      *:contiguous)
        extra=(--activation-checkpointing full) setting_config="$work/contiguous.json" ;;
    esac
    name="${name//:/}"
    for schedule in 1f1b interleaved; do
      run="$work/deep$name$schedule"
      config="${setting_config:-$data/adamw.json}"
      if [ "$stage$schedule" = 0interleaved ] && [ "$tp" = 1 ]; then config="$work/flops.json"; fi
      run_logged "$run.log" "zero-train failed: 4 layers, stage $stage, $schedule ${extra[*]}" \
        "${mpiexec[@]}" -np "$np" "$bin/zero-train" "${deep_model[@]}" \
        --config "$config" --init-from "$work/model4.safetensors" --stage "$stage" \
        --tp "$tp" --micro-batches "$micro_batches" --steps 3 --metrics "$run.jsonl" \
        --val-data "$data/tokens.bin" --val-every 1 --pp "$pp" --pp-schedule "$schedule" \
        "${extra[@]}"
    done
    echo "ZeRO stage $stage, 4 layers, pipeline of $pp, interleaved (2 chunks per stage) ${extra[*]}:"
    grep -E "^pipeline stage" "$work/deep${name}interleaved.log"
    # Each micro-batch's activation and its gradient cross the 2 pp - 1 boundaries between the
    # virtual stages, where 1F1B's cross pp - 1.
    python3 - "$work/deep${name}1f1b.jsonl" "$work/deep${name}interleaved.jsonl" "$pp" <<'PY'
import json, sys
def steps(path):
    return [r for r in map(json.loads, open(path)) if r.get("event") == "step"]
one, inter, pp = steps(sys.argv[1]), steps(sys.argv[2]), int(sys.argv[3])
figures = lambda runs: [(r["loss"], r["grad_norm"], r["val_loss"]) for r in runs]
assert figures(inter) == figures(one), (figures(inter), figures(one))
for a, b in zip(inter, one):
    assert a["pp_comm_bytes"] * (pp - 1) == b["pp_comm_bytes"] * (2 * pp - 1), (a, b)
print("interleaved: every step bitwise 1f1b's:", figures(inter)[-1])
PY
  done
  if [ "$tp" = 1 ]; then check_flops_profile "$work/deep0interleaved.jsonl" 4; fi
  # Regathering per micro-batch: more data-parallel collectives on every stage than holding the
  # units through the step.
  python3 -c 'import json, sys
def calls(path):
    return [r["stage_collectives"] for r in map(json.loads, open(path)) if r.get("event") == "step"][1:]
held, regathered = calls(sys.argv[1]), calls(sys.argv[2])
for h, r in zip(held, regathered):
    assert all(b > a for a, b in zip(h, r)), (held, regathered)
print("interleaved, stage 3: collectives per stage and step", held[-1], "held,", regathered[-1], "regathered")' \
    "$work/deep3interleaved.jsonl" "$work/deep3regatherinterleaved.jsonl"
fi

# fp16 with its dynamic loss scale (on the pipeline of one rank per stage): the loss's gradient
# is scaled once, on the last stage, and every stage's backward carries that scale on; each step
# within the fp16 golden run's tolerance of float64 PyTorch, and of the same job without a
# pipeline, with no step skipped for an overflow that was not there.
if [ "$np" = "$pp" ]; then
  np_saved="$np"; np=1
  train 1 plain_fp16 --dtype fp16
  np="$np_saved"
  train 1 pp_fp16 --dtype fp16 --pp "$pp" --pp-schedule 1f1b
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/pp_fp16.jsonl" \
    --reference-tolerance 1e-3 --same-metrics-as "$work/plain_fp16.jsonl" --metrics-tolerance 1e-3
  python3 -c 'import json, sys
skipped = [r["step"] for r in map(json.loads, open(sys.argv[1])) if r.get("skipped")]
assert not skipped, ("fp16 steps skipped", skipped)
print("fp16 through the pipeline: no step skipped")' "$work/pp_fp16.jsonl"
fi

# The optimizer state on NVMe (and at stage 3 the parameters too) with 2 data-parallel ranks per
# stage: bitwise the run that keeps them in memory (the tied wte's summed gradient is what the
# offloaded update reads).
if [ $((np / pp / tp)) -ge 2 ]; then
  mkdir -p "$work/nvme"
  for stage in 2 3; do
    offload='"offload_optimizer": {"device": "nvme", "nvme_path": "'"$work/nvme"'"}'
    if [ "$stage" = 3 ]; then
      offload+=', "offload_param": {"device": "nvme", "nvme_path": "'"$work/nvme"'"}'
    fi
    python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = dict(json.loads("{" + sys.argv[3] + "}"), stage=int(sys.argv[4]))
json.dump(c, open(sys.argv[2], "w"))' "$data/adamw.json" "$work/offload$stage.json" "$offload" "$stage"
    run_logged "$work/offload$stage.log" "zero-train failed with NVMe offload at stage $stage" \
      "${mpiexec[@]}" -np "$np" "$bin/zero-train" "${reference_model[@]}" \
      --config "$work/offload$stage.json" --init-from "$data/model.safetensors" --stage "$stage" \
      --tp "$tp" --micro-batches "$micro_batches" --steps 3 --pp "$pp" --pp-schedule 1f1b \
      --metrics "$work/offload$stage.jsonl"
    python3 -c 'import json, sys
def steps(path):
    return [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(path)) if r.get("event") == "step"]
assert steps(sys.argv[1]) == steps(sys.argv[2]), (steps(sys.argv[1]), steps(sys.argv[2]))
print("stage", sys.argv[3], "with NVMe offload: bitwise the run in memory")' \
      "$work/offload$stage.jsonl" "$work/pp${stage}1f1b0.jsonl" "$stage"
  done
fi

# Hybrid sharding inside each stage (mics_shard_size 1: every data-parallel rank its own shard
# group, 2 replicas) at stage 3: the replicas' all-reduce adds the same two gradients in the
# same order as the reduce-scatter over 2 ranks, and the tied wte is summed over the stages from
# one replica's shards: bitwise the pipeline without hybrid sharding, every step's loss, norm and
# validation loss.
if [ $((np / pp / tp)) = 2 ]; then
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": 3, "mics_shard_size": 1}
json.dump(c, open(sys.argv[2], "w"))' "$data/adamw.json" "$work/hybrid.json"
  train_config="$work/hybrid.json" train 3 hybrid --pp "$pp" --pp-schedule 1f1b
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/hybrid.jsonl" \
    --reference-tolerance 1e-5 --expect-val 1 --same-metrics-as "$work/pp31f1b0.jsonl" \
    --metrics-tolerance 0
  echo "stage 3 with hybrid sharding (2 replicas) in each pipeline stage: bitwise without"
  # Saved after step 2 (each shard once) and resumed: step 3 bitwise the run without a stop.
  hybrid=("${mpiexec[@]}" -np "$np" "$bin/zero-train" "${reference_model[@]}" --config
    "$work/hybrid.json" --stage 3 --micro-batches "$micro_batches" --pp "$pp" --pp-schedule 1f1b)
  run_logged "$work/hybrid_saved.log" "zero-train failed: hybrid sharding, saving" \
    "${hybrid[@]}" --init-from "$data/model.safetensors" --steps 2 --save-dir "$work/hybrid.ckpt"
  run_logged "$work/hybrid_resumed.log" "zero-train failed: hybrid sharding, resuming" \
    "${hybrid[@]}" --resume "$work/hybrid.ckpt" --steps 3 --metrics "$work/hybrid_resumed.jsonl"
  python3 -c 'import json, sys
steps = lambda path: [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(path)) if r.get("event") == "step"]
whole, resumed = steps(sys.argv[1]), steps(sys.argv[2])
assert resumed == whole[2:], (resumed, whole)
print("hybrid sharding in a pipeline, saved and resumed: step 3 bitwise")' \
    "$work/hybrid.jsonl" "$work/hybrid_resumed.jsonl"
  # Shard groups of 2 with 2 replicas (4 data-parallel ranks per stage, 8 ranks, one sequence
  # per rank): the shards are cut within each group and the first replica's added over the tie;
  # within 1e-6 of the same pipeline sharded over all 4 (the sums are grouped otherwise).
  python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["zero_optimization"] = {"stage": 3, "mics_shard_size": 2}
json.dump(c, open(sys.argv[2], "w"))' "$data/adamw.json" "$work/hybrid2.json"
  wide=("${mpiexec[@]}" -np 8 "$bin/zero-train" "${reference_model[@]}" --stage 3
    --micro-batches 1 --pp "$pp" --pp-schedule 1f1b --init-from "$data/model.safetensors"
    --steps 3)
  run_logged "$work/sharded4.log" "zero-train failed: pp 2 x dp 4" "${wide[@]}" \
    --config "$data/adamw.json" --metrics "$work/sharded4.jsonl"
  run_logged "$work/hybrid2.log" "zero-train failed: pp 2 x dp 4, shard groups of 2" \
    "${wide[@]}" --config "$work/hybrid2.json" --metrics "$work/hybrid2.jsonl"
  "$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/hybrid2.jsonl" \
    --reference-tolerance 1e-5 --same-metrics-as "$work/sharded4.jsonl" --metrics-tolerance 1e-6
  echo "stage 3, shard groups of 2 x 2 replicas in each pipeline stage: within 1e-6 of dp 4"
fi

# The same pipeline from DeepSpeed's config section instead of --pp (ZeRO stage 1, 1F1B), its
# tensors between stages whole (pipe_partitioned and grad_partitioned false: bitwise the sliced
# run's numbers, tp times its bytes with tensor parallelism), with DeepSpeed's monitors, which hold the metrics file's losses and lrs, its comms logger (the
# collectives of rank 0's engine, its data-parallel group's and the tied wte's all-reduce, in
# every step record, as many as the step's collectives, and the table at the end) and, without
# tensor parallelism, its flops profiler.
python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["pipeline"] = {"stages": int(sys.argv[3]), "partition": "uniform", "pipe_partitioned": False,
                 "grad_partitioned": False}
for monitor in ("tensorboard", "csv_monitor"):
    c[monitor] = {"enabled": True, "output_path": sys.argv[4] + "/" + monitor, "job_name": "run"}
c["wall_clock_breakdown"] = True
c["comms_logger"] = {"enabled": True, "verbose": True}
if sys.argv[5] == "1":
    c["flops_profiler"] = {"enabled": True, "profile_step": 2, "detailed": True}
json.dump(c, open(sys.argv[2], "w"))' "$data/adamw.json" "$work/pipeline.json" "$pp" "$work" "$tp"
run_logged "$work/config.log" "zero-train failed with the pipeline section" \
  "${mpiexec[@]}" -np "$np" "$bin/zero-train" "${reference_model[@]}" \
  --config "$work/pipeline.json" --init-from "$data/model.safetensors" --stage 1 --tp "$tp" \
  --micro-batches "$micro_batches" --steps 3 --metrics "$work/config.jsonl" \
  --val-data "$data/tokens.bin" --val-every 1
echo "ZeRO stage 1, pipeline.stages $pp from the config:"
grep -E "^pipeline stage" "$work/config.log"
"$bin/gpt2_golden_check" --expected "$data/expected_fp64.json" --metrics "$work/config.jsonl" \
  --reference-tolerance 1e-5 --same-metrics-as "$work/pp11f1b0.jsonl" --metrics-tolerance 0
check_pp_bytes "$work/config.jsonl" 1
"$bin/monitor_check" "$work/config.jsonl" "$work/tensorboard/run" "$work/csv_monitor/run" 4
[ "$(grep -c "^Comm. Op  " "$work/config.log")" = 1 ] && grep -q "^comm op: all_reduce | " "$work/config.log" ||
  { cat "$work/config.log"; echo "comms_logger: no table, or no line per collective"; exit 1; }
python3 -c 'import json, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "step"]
# The first step also counts what the engine issued before it.
for r in steps[1:]:
    ops = r["comm_ops"]
    calls = sum(op["count"] for op in ops.values())
    assert calls == r["stage_collectives"][0], (r["step"], ops, r["stage_collectives"])
    # The gradient norm and the tied wte, summed over its two stages.
    assert ops["all_reduce"]["count"] == 2 and ops["all_reduce"]["sent_bytes"] > 0, (r["step"], ops)
print("comm_ops of rank 0 per step:", steps[-1]["comm_ops"])' "$work/config.jsonl"
if [ "$tp" = 1 ]; then
  [ "$(grep -c "^Profile Summary at step 2:" "$work/config.log")" = 1 ] &&
    grep -q "^fwd latency (every pipeline stage's first rank, added): " "$work/config.log" ||
    { cat "$work/config.log"; echo "flops_profiler: no profile of every stage"; exit 1; }
  check_flops_profile "$work/config.jsonl" 2
fi
