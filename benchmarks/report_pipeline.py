"""The pipeline part of benchmarks/report: zero-bench-pipeline's schedules (GPipe, 1F1B,
interleaved, ZB-H1) with sleeping stages, their measured bubble against the formulas; and the
GPT-2 of zero-bench-gpt2 trained by zero-train cut into 2 pipeline stages (1F1B, GPipe and
ZB-H1) against the same model data-parallel at ZeRO stage 0 on the same 2 ranks; their sections
of BENCHMARKS.md and their rows of the Targets table.

Like report_memory.py, it takes what it shares with the report (run(), mpirun_cmd(), table())
instead of importing the report, which is a script.
"""
import json
import os
import statistics
import struct
import time

STAGES = 4
SCHEDULES = "gpipe,1f1b,interleaved,zb-h1"
# "full": p 4, m 8, F = B = W = 10 ms, v 2 (docs/pipeline.md's figures); "quick" only proves
# the pipeline (its numbers mean nothing).
CONFIGS = {
    "full": ["--micro-batches", "8", "--forward-ms", "10", "--backward-ms", "10", "--weight-ms",
             "10", "--virtual-stages", "2", "--steps", "5"],
    "quick": ["--micro-batches", "4", "--forward-ms", "2", "--backward-ms", "2", "--weight-ms",
              "2", "--virtual-stages", "2", "--steps", "1"],
}


# The GPT-2 through the pipeline. "full": zero-bench-gpt2's model (6 layers x 384, 6 heads,
# T 256, vocab 50257) with a global batch of 16 sequences in 8 micro-batches: 2 sequences each
# through 2 stages, or 1 on each of 2 data-parallel ranks. "quick": a tiny GPT that only proves
# the pipeline.
GPT2_RANKS = 2
GPT2_MICRO_BATCHES = 8
GPT2_WARMUP_STEPS = 1
GPT2_ROUNDS = 2
GPT2_CONFIGS = {
    "full": {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab_size": 50257, "seq_len": 256,
             "global_batch": 16, "steps": 4},
    "quick": {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 512, "seq_len": 32,
              "global_batch": 16, "steps": 2},
}
# The target: pipeline tokens/s against data parallelism's, and its model state per rank
# against half of data parallelism's.
GPT2_SPEED_TARGET = 0.85
GPT2_STATE_TARGET = 0.5
TOKEN_FILE_MAGIC = 20240520
TOKEN_SEED = 0x5eed


def mix(x):
    """splitmix64, as benchmarks/synthetic_tokens.cpp draws zero-bench-gpt2's token ids."""
    mask = (1 << 64) - 1
    x = (x + 0x9e3779b97f4a7c15) & mask
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & mask
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & mask
    return x ^ (x >> 31)


def write_synthetic_tokens(path, count, vocab_size):
    """An llm.c token file (models/token_data.h) of `count` ids drawn uniformly from the
    vocabulary by a hash of the position, as zero-bench-gpt2 draws its batches: zero-train reads
    files, the benchmark makes its tokens in memory."""
    header = struct.pack("<3i", TOKEN_FILE_MAGIC, 1, count) + bytes(4 * 253)
    tokens = [mix(TOKEN_SEED ^ mix(i)) % vocab_size for i in range(count)]
    with open(path, "wb") as f:
        f.write(header)
        f.write(struct.pack(f"<{count}H", *tokens))


def gpt2_train_args(config, data, metrics):
    return ["--model", "gpt2", "--n-layer", str(config["n_layer"]), "--n-head",
            str(config["n_head"]), "--n-embd", str(config["n_embd"]), "--vocab-size",
            str(config["vocab_size"]), "--block-size", str(config["seq_len"]), "--seq-len",
            str(config["seq_len"]), "--global-batch", str(config["global_batch"]),
            "--micro-batches", str(GPT2_MICRO_BATCHES), "--steps", str(config["steps"]),
            "--stage", "0", "--data", data, "--metrics", metrics]


def step_records(metrics_path):
    """A run's step records after the warm-up."""
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    steps = [r for r in records if r.get("event") == "step"][GPT2_WARMUP_STEPS:]
    if not steps:
        raise ValueError(f"{metrics_path} has no step after the {GPT2_WARMUP_STEPS} warm-up step(s)")
    return steps


def summarize_gpt2_runs(name, runs, tokens_per_step):
    """One configuration's figures over its runs' measured steps: the median step, its tokens/s,
    the model state per rank (the maximum over ranks), and for a pipeline the median bubble and
    wait."""
    steps = [r for run in runs for r in run]
    step_ms = statistics.median(r["step_ms"] for r in steps)
    summary = {"run": name, "steps": len(steps), "step_ms": step_ms,
               "run_step_ms": [statistics.median(r["step_ms"] for r in run) for run in runs],
               "tokens_per_s": tokens_per_step / (step_ms / 1000.0)}
    if "stage_model_state_bytes" in steps[-1]:
        summary["stage_model_state_bytes"] = steps[-1]["stage_model_state_bytes"]
        summary["model_state_bytes"] = max(summary["stage_model_state_bytes"])
        summary["bubble_fraction"] = statistics.median(r["bubble_fraction"] for r in steps)
        summary["pp_wait_ms"] = statistics.median(r["pp_wait_ms"] for r in steps)
        summary["pp_comm_bytes"] = steps[-1]["pp_comm_bytes"]
        summary["stage_busy_ms"] = [statistics.median(r["stage_busy_ms"][s] for r in steps)
                                    for s in range(len(steps[-1]["stage_busy_ms"]))]
        summary["balance_bubble_fraction"] = balance_bubble(summary["stage_busy_ms"],
                                                            GPT2_MICRO_BATCHES)
    else:
        summary["model_state_bytes"] = max(r["model_state_bytes"] for r in steps)
        summary["comm_wait_ms"] = statistics.median(r["comm_wait_ms"] for r in steps)
    return summary


def balance_bubble(stage_busy_ms, micro_batches):
    """The bubble two stages of these busy times leave when every micro-batch takes alike: the
    busier stage works throughout, and before its first micro-batch or after its last one the
    other stage runs one micro-batch's forward and backward, so a step takes
    max(b0 + b1 / m, b1 + b0 / m). Equal stages give the formula, 1 / (m + 1)."""
    b0, b1 = stage_busy_ms
    step = max(b0 + b1 / micro_batches, b1 + b0 / micro_batches)
    return 1 - (b0 + b1) / (2 * step)


def run_gpt2_pipeline(build_dir, quick, out, logs, run, mpirun_cmd):
    """zero-train's GPT-2 data-parallel at ZeRO stage 0 and at --pp 2 with 1F1B, GPipe and
    ZB-H1, and 1F1B cut by FLOPs, in GPT2_ROUNDS rounds of the five: load that changes during the report (the machine
    may be shared) lands on every configuration alike."""
    config = GPT2_CONFIGS["quick" if quick else "full"]
    tokens_per_step = config["global_batch"] * config["seq_len"]
    data = os.path.join(out, "data", "pipeline_gpt2_tokens.bin")
    os.makedirs(os.path.dirname(data), exist_ok=True)
    # A batch per step, none read twice.
    write_synthetic_tokens(data, config["steps"] * tokens_per_step + 1, config["vocab_size"])
    configurations = [("dp", []), ("1f1b", ["--pp", "2", "--pp-schedule", "1f1b"]),
                      ("gpipe", ["--pp", "2", "--pp-schedule", "gpipe"]),
                      ("zb-h1", ["--pp", "2", "--pp-schedule", "zb-h1"]),
                      ("1f1b, flops partition",
                       ["--pp", "2", "--pp-schedule", "1f1b", "--pp-partition", "flops"])]
    steps = {name: [] for name, _ in configurations}
    load = [os.getloadavg()[0]]
    for round_ in range(1, GPT2_ROUNDS + 1):
        for name, extra in configurations:
            file_name = name.replace(", ", "_").replace(" ", "_")
            metrics = os.path.join(out, f"pipeline_gpt2_{file_name}_{round_}.jsonl")
            run(mpirun_cmd(build_dir, "zero-train",
                           [*gpt2_train_args(config, data, metrics), *extra], ranks=GPT2_RANKS),
                os.path.join(logs, f"pipeline_gpt2_{file_name}_{round_}.txt"))
            steps[name].append(step_records(metrics))
    load.append(os.getloadavg()[0])
    dp = summarize_gpt2_runs("dp", steps["dp"], tokens_per_step)
    pipelines = []
    for name, _ in configurations[1:]:
        s = summarize_gpt2_runs(name, steps[name], tokens_per_step)
        s["speed_ratio"] = s["tokens_per_s"] / dp["tokens_per_s"]
        s["state_ratio"] = s["model_state_bytes"] / dp["model_state_bytes"]
        # (p-1)/(m+p-1), for stages of equal time.
        s["formula_bubble_fraction"] = (GPT2_RANKS - 1) / (GPT2_MICRO_BATCHES + GPT2_RANKS - 1)
        pipelines.append(s)
    return {"config": config, "dp": dp, "pipelines": pipelines, "load_average": load}


def run_pipeline(build_dir, quick, out, logs, run, mpirun_cmd):
    """The schedule benchmark's JSON records and the GPT-2's figures, and the seconds they took."""
    start = time.monotonic()
    path = os.path.join(out, "pipeline.json")
    run(mpirun_cmd(build_dir, "zero-bench-pipeline",
                   ["--stages", str(STAGES), "--schedule", SCHEDULES,
                    *CONFIGS["quick" if quick else "full"], "--json", path],
                   ranks=STAGES),
        os.path.join(logs, "pipeline.txt"))
    with open(path) as f:
        schedules = json.load(f)
    gpt2 = run_gpt2_pipeline(build_dir, quick, out, logs, run, mpirun_cmd)
    return {"schedules": schedules, "gpt2": gpt2}, time.monotonic() - start


def verdict(met):
    return "met" if met else "**missed**"


def target_rows(pipeline):
    by_name = {r["schedule"]: r for r in pipeline["schedules"]}
    rows = []
    for name in ["gpipe", "1f1b"]:
        r = by_name[name]
        off = abs(r["bubble_fraction"] / r["formula_bubble_fraction"] - 1)
        rows.append([f"{name} bubble against (p-1)/(m+p-1) (p {r['stages']}, m "
                     f"{r['micro_batches']})", "within 10 %",
                     f"{r['bubble_fraction']:.3f} vs {r['formula_bubble_fraction']:.3f}",
                     verdict(off <= 0.1)])
    base = by_name["1f1b"]["idle_ms"]
    for name, bound in [("zb-h1", 0.4), ("interleaved", 0.6)]:
        ratio = by_name[name]["idle_ms"] / base
        rows.append([f"{name} idle time per rank / 1f1b's", f"<= {bound}", f"{ratio:.2f}",
                     verdict(ratio <= bound)])
    gpt2 = pipeline["gpt2"]
    # The default partition (by parameters) and the one by FLOPs: each trades one target for
    # the other on this model, whose head outweighs its blocks.
    for run in ["1f1b", "1f1b, flops partition"]:
        s = next(s for s in gpt2["pipelines"] if s["run"] == run)
        rows.append([f"GPT-2 tokens/s at pp {GPT2_RANKS} ({run}, m {GPT2_MICRO_BATCHES}) / dp "
                     f"{GPT2_RANKS} stage 0", f">= {GPT2_SPEED_TARGET}",
                     f"{s['speed_ratio']:.2f}", verdict(s["speed_ratio"] >= GPT2_SPEED_TARGET)])
        rows.append([f"GPT-2 model state per rank at pp {GPT2_RANKS} ({run}) / dp {GPT2_RANKS} "
                     "stage 0", f"<= {GPT2_STATE_TARGET}", f"{s['state_ratio']:.2f}",
                     verdict(s["state_ratio"] <= GPT2_STATE_TARGET)])
    return rows


def mib(b):
    return f"{b / (1 << 20):.1f}"


def gpt2_markdown(gpt2, table):
    c = gpt2["config"]
    dp = gpt2["dp"]
    md = [f"\n## GPT-2 through the pipeline against data parallelism (zero-train, {GPT2_RANKS} "
          "ranks)\n"]
    md.append(f"zero-bench-gpt2's model ({c['n_layer']} layers x {c['n_embd']}, {c['n_head']} "
              f"heads, T {c['seq_len']}, vocab {c['vocab_size']}, fp32) trained by `zero-train` "
              f"on {GPT2_RANKS} ranks with a global batch of {c['global_batch']} sequences in "
              f"{GPT2_MICRO_BATCHES} micro-batches: `--pp {GPT2_RANKS}` (1F1B, GPipe and ZB-H1 "
              "with the default partition by parameters, which cuts the blocks 3 + 3, and 1F1B "
              "with `--pp-partition flops`, which weighs the head's product over the vocabulary "
              "and cuts them 5 + 1; a micro-batch of "
              f"{c['global_batch'] // GPT2_MICRO_BATCHES} sequences) against data parallelism "
              "at ZeRO stage 0 (a micro-batch of "
              f"{c['global_batch'] // (GPT2_MICRO_BATCHES * GPT2_RANKS)} sequence(s) per rank). "
              "Token ids are synthetic (uniform over the vocabulary, a hash of the position, "
              f"written as a token file). {GPT2_ROUNDS} rounds of the five runs, "
              f"{c['steps'] - GPT2_WARMUP_STEPS} measured steps each after "
              f"{GPT2_WARMUP_STEPS} warm-up; step: the median over all measured steps (each "
              "round's median in brackets); load average "
              f"{gpt2['load_average'][0]:.1f} before and {gpt2['load_average'][1]:.1f} after. "
              "Model state: the maximum over ranks. Bubble: 1 - busy / (ranks x step time) of "
              "the pipeline's executor; pp wait: the longest time a rank waited for a "
              "transfer. The formula (p-1)/(m+p-1) holds for stages of equal time; the last "
              "stage also runs the head (a GEMM over the vocabulary) and the loss, so the stages "
              "are not: busy ms is each stage's compute in a step, and the bubble of that "
              "balance what two such stages leave when every micro-batch takes alike, 1 - (b0 + "
              "b1) / (2 max(b0 + b1/m, b1 + b0/m)). What the measured bubble has above it is the "
              "executor's and the transfers' own cost (and the micro-batches' spread).\n\n")
    rows = [["dp 2, stage 0", step_text(dp), f"{dp['tokens_per_s']:.0f}", "1.00",
             mib(dp["model_state_bytes"]), "1.00", "-", "-", "-", "-", "-"]]
    for s in gpt2["pipelines"]:
        rows.append([f"pp 2, {s['run']}", step_text(s), f"{s['tokens_per_s']:.0f}",
                     f"{s['speed_ratio']:.2f}",
                     " / ".join(mib(b) for b in s["stage_model_state_bytes"]),
                     f"{s['state_ratio']:.2f}", f"{s['bubble_fraction']:.3f}",
                     f"{s['formula_bubble_fraction']:.3f}",
                     " / ".join(f"{ms:.0f}" for ms in s["stage_busy_ms"]),
                     f"{s['balance_bubble_fraction']:.3f}", f"{s['pp_wait_ms']:.0f}"])
    md.append(table(["run", "step ms", "tokens/s", "vs dp", "state MiB per rank", "vs dp",
                     "bubble", "formula", "busy ms per stage", "bubble of that balance",
                     "pp wait ms"], rows))
    return md


def step_text(summary):
    rounds = ", ".join(f"{ms:.0f}" for ms in summary["run_step_ms"])
    return f"{summary['step_ms']:.0f} ({rounds})"


def markdown(pipeline, table):
    records = pipeline["schedules"]
    first = records[0]
    md = ["\n## Pipeline schedules (zero-bench-pipeline)\n"]
    md.append(f"{first['stages']} stages (one rank each), {first['micro_batches']} micro-batches, "
              f"stages that sleep F {first['forward_ms']:g}, B {first['backward_ms']:g}, W "
              f"{first['weight_ms']:g} ms (interleaved: each of its chunks 1/v of that), "
              f"{first['activation_elements']} floats per activation; median of "
              f"{first['steps']} step(s). Bubble: 1 - busy / (stages x step time); idle: step "
              "time - busy per rank. The formulas are docs/pipeline.md's.\n\n")
    md.append(table(["schedule", "v", "step ms", "bubble", "formula", "idle ms", "formula ms",
                     "wait ms", "bytes sent"],
                    [[r["schedule"], r["virtual_stages"], f"{r['step_ms']:.1f}",
                      f"{r['bubble_fraction']:.4f}", f"{r['formula_bubble_fraction']:.4f}",
                      f"{r['idle_ms']:.1f}", f"{r['formula_idle_ms']:.1f}", f"{r['wait_ms']:.1f}",
                      r["bytes_sent"]] for r in records]))
    md += gpt2_markdown(pipeline["gpt2"], table)
    return md
