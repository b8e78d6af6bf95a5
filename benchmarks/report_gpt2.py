"""The GPT-2 part of benchmarks/report: zero-bench-gpt2 at 1 and 2 ranks, PyTorch eager on the
same model (benchmarks/torch_gpt2.py) when a python3 here has torch, their section of
BENCHMARKS.md and their rows of its Targets table (issue 14).

The report passes in what it shares (its run(), mpirun_cmd(), table() and error type) instead of
this module importing the report, which is a script.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_SCRIPT = os.path.join(HERE, "torch_gpt2.py")

# Issue 14's targets.
TORCH_RATIO_TARGET = 1.5   # ours / PyTorch tokens/s, 1 rank, fp32
STAGE3_RATIO_TARGET = 0.9  # stage 3 / stage 0 tokens/s, 2 ranks

# "full": issue 14's model (6 layers x 384, 6 heads, T 256, vocab 50257, batch 8); a step takes
# seconds on one core, so 2 measured steps per stage after 1 warm-up. "quick": a tiny GPT that
# only proves the pipeline.
CONFIGS = {
    "full": {"model": [], "bench": ["--steps", "2", "--rounds", "2", "--warmup", "1"],
             "torch": ["--steps", "2", "--warmup", "1"]},
    "quick": {"model": ["--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--vocab-size", "512",
                        "--seq-len", "32", "--global-batch", "4"],
              "bench": ["--steps", "1", "--rounds", "1", "--warmup", "1", "--peak-size", "256"],
              "torch": ["--steps", "1", "--warmup", "1"]},
}


def torch_python():
    """The first python3 here that imports torch (this one, the one on PATH, Debian's), else
    this one, which then reports why it skips."""
    candidates = [sys.executable, shutil.which("python3"), "/usr/bin/python3"]
    for python in dict.fromkeys(c for c in candidates if c):
        # Not from the repository root, where our LibTorch adapter's folder torch/ imports as an
        # empty namespace package; PyTorch has torch.tensor.
        probe = subprocess.run([python, "-c", "import torch; torch.tensor"], capture_output=True,
                               cwd=HERE)
        if probe.returncode == 0:
            return python
    return sys.executable


def torch_args(model_args, torch_config):
    """zero-bench-gpt2's model flags as torch_gpt2.py's (its --batch is the global batch)."""
    names = {"--global-batch": "--batch"}
    return [names.get(a, a) for a in model_args] + torch_config


def run_gpt2(build_dir, quick, out, logs, run, mpirun_cmd):
    """Runs PyTorch, ours at 1 rank, PyTorch again, ours at 2 ranks: PyTorch's runs bracket ours
    at 1 rank, so load that changes during the report lands on both sides of the ratio."""
    config = CONFIGS["quick" if quick else "full"]
    start = time.monotonic()
    python = torch_python()
    result = {"records": [], "torch": [], "python": python, "headers": []}
    for step in ("torch_a", 1, "torch_b", 2):
        if isinstance(step, str):
            path = os.path.join(out, f"{step}.json")
            args = [TORCH_SCRIPT, *torch_args(config["model"], config["torch"]), "--json", path]
            # Through zerorun, so that PyTorch's OpenBLAS gets the same core type as ours.
            cmd = mpirun_cmd(build_dir, python, args, ranks=1)
            run(cmd, os.path.join(logs, f"{step}.txt"))
            with open(path) as f:
                result["torch"].append(json.load(f))
            continue
        path = os.path.join(out, f"gpt2_{step}rank.json")
        text, _ = run(mpirun_cmd(build_dir, "zero-bench-gpt2",
                                 [*config["model"], *config["bench"], "--dtype", "fp32,bf16",
                                  "--json", path], ranks=step),
                      os.path.join(logs, f"gpt2_{step}rank.txt"))
        with open(path) as f:
            result["records"] += json.load(f)
        result["headers"] += [line for line in text.splitlines()
                              if line.startswith("# zero-bench-gpt2")]
    return result, time.monotonic() - start


def find(records, world, stage, dtype):
    return next((r for r in records if r["world_size"] == world and r["stage"] == stage
                 and r["dtype"] == dtype), None)


def torch_summary(gpt2):
    """PyTorch's tokens/s (the median of both runs' steps) and its record, or the skip reason."""
    runs = gpt2["torch"]
    skipped = next((r["skipped"] for r in runs if "skipped" in r), None)
    if skipped:
        return None, skipped
    steps = [ms for r in runs for ms in r["step_ms"]]
    tokens = runs[0]["batch"] * runs[0]["seq_len"]
    return {"tokens_per_s": tokens / (statistics.median(steps) / 1000), "run": runs[0],
            "steps": len(steps)}, None


def vs_stage0(r):
    return None if r["ratio_to_stage0"] is None else 1.0 / r["ratio_to_stage0"]


def target_rows(gpt2):
    records = gpt2["records"]
    rows = []
    ours = find(records, 1, 0, "fp32")
    torch, skipped = torch_summary(gpt2)
    label = "GPT-2 tokens/s against PyTorch eager (1 rank, fp32, stage 0)"
    if ours is None:
        rows.append([label, f">= {TORCH_RATIO_TARGET}x", "not measured", "**missed**"])
    elif torch is None:
        rows.append([label, f">= {TORCH_RATIO_TARGET}x",
                     f"{ours['tokens_per_s']:.0f} tokens/s; PyTorch skipped: {skipped}",
                     "not checked"])
    else:
        ratio = ours["tokens_per_s"] / torch["tokens_per_s"]
        rows.append([label, f">= {TORCH_RATIO_TARGET}x",
                     f"{ours['tokens_per_s']:.0f} vs {torch['tokens_per_s']:.0f} tokens/s: "
                     f"{ratio:.2f}x", "met" if ratio >= TORCH_RATIO_TARGET else "**missed**"])
    for dtype in ("fp32", "bf16"):
        r = find(records, 2, 3, dtype)
        if r is None or vs_stage0(r) is None:
            continue
        s0 = find(records, 2, 0, dtype)
        ratio = vs_stage0(r)
        rows.append([f"GPT-2 stage 3 tokens/s / stage 0 (2 ranks, {dtype})",
                     f">= {STAGE3_RATIO_TARGET}",
                     f"{r['tokens_per_s']:.0f} / {s0['tokens_per_s']:.0f} = {ratio:.3f}",
                     "met" if ratio >= STAGE3_RATIO_TARGET else "**missed**"])
    if ours is not None:
        rows.append(["GPT-2 model FLOPs utilisation (1 rank, fp32, stage 0)", "reported",
                     f"{100 * ours['mfu']:.0f} % of {ours['sgemm_peak_gflops']:.0f} GFLOP/s", "-"])
    return rows


def markdown(gpt2, table):
    records = gpt2["records"]
    first = records[0]
    md = ["\n## GPT-2 training step per ZeRO stage (zero-bench-gpt2)\n"]
    md.append(
        "The GPT-2 of `models/gpt2.h` (issue 14's size in the full report): "
        f"{first['n_layer']} layers x {first['n_embd']} wide, {first['n_head']} heads, "
        f"T = {first['seq_len']}, vocabulary "
        f"{first['vocab_size']} ({first['params'] / 1e6:.1f}M parameters), a global batch of "
        f"{first['global_batch']} sequences ({first['global_batch'] * first['seq_len']} tokens "
        f"per step) split over the ranks, {first['threads']} kernel thread per rank. The token "
        "ids are synthetic (uniform over the vocabulary, a hash of seed, step, sequence and "
        "position): a throughput benchmark needs no text, and the loss stays near ln(vocab). "
        "Steps are measured as zero-bench-step measures them (every stage's engine alive at "
        "once, interleaved rounds, the slowest rank's step, the median). Tokens/s is the "
        "global batch's tokens over that step time; model GFLOP/s counts "
        f"`gpt2_flops_per_token()` = {first['flops_per_token'] / 1e6:.1f} MFLOP per token "
        "(6 per matrix parameter plus the attention's 12 x layers x width x T, as llm.c and "
        "PaLM count); MFU is that over the sgemm peak of the same job: every rank times a "
        "large `cblas_sgemm` on its thread at the same moment, before and after the steps, and "
        "the ranks' best GFLOP/s add up. OpenBLAS ran its "
        f"`{first['blas_core']}` kernels (`zerorun` chooses them on a CPU OpenBLAS does not "
        "recognise; see docs/cli.md). vs stage 0 is tokens/s over stage 0's at the same ranks "
        "and dtype.\n\n")
    rows = []
    for r in sorted(records, key=lambda x: (x["world_size"], x["dtype"] != "fp32", x["stage"])):
        ratio = vs_stage0(r)
        rows.append([r["world_size"], r["stage"], r["dtype"], f"{r['median_step_ms']:.0f}",
                     f"{r['min_step_ms']:.0f}-{r['max_step_ms']:.0f}", f"{r['tokens_per_s']:.0f}",
                     f"{r['model_gflops_per_s']:.1f}", f"{r['sgemm_peak_gflops']:.0f}",
                     f"{100 * r['mfu']:.0f} %", "-" if ratio is None else f"{ratio:.3f}",
                     f"{r['exposed_comm_ms']:.1f}", f"{r['model_state_bytes'] / (1 << 20):.1f}",
                     f"{r['peak_bytes'] / (1 << 20):.1f}"])
    md.append(table(["ranks", "stage", "dtype", "step ms", "min-max", "tokens/s",
                     "model GFLOP/s", "sgemm peak GFLOP/s", "MFU", "vs stage 0",
                     "exposed comm ms", "state MiB", "peak MiB"], rows))
    md.append("\n```\n" + "\n".join(gpt2["headers"]) + "\n```\n")

    md.append("\n### Against PyTorch eager (benchmarks/torch_gpt2.py)\n")
    torch, skipped = torch_summary(gpt2)
    if torch is None:
        md.append(f"Skipped: {skipped}. On Debian, `apt-get install python3-torch` provides "
                  "it; the report looks for torch in its own python3, the one on PATH and "
                  "/usr/bin/python3.\n")
        return md
    run = torch["run"]
    ours = find(records, 1, 0, "fp32")
    ratio = ours["tokens_per_s"] / torch["tokens_per_s"] if ours else None
    attention = ("fused (scaled_dot_product_attention)" if run["fused_attention"] else
                 "explicit (this torch has no fused attention)")
    md.append(
        f"The same model, sizes, batch and threads in PyTorch {run['torch']} eager on the CPU "
        f"(`{gpt2['python']}`), fp32, a whole step (forward, backward, AdamW, zero_grad), "
        f"attention {attention}. "
        "It ran twice, before and after our 1-rank run, through zerorun (so its OpenBLAS got "
        f"the same core type); its tokens/s is over the median of those {torch['steps']} "
        "steps.\n\n")
    md.append(table(["", "tokens/s", "step ms"], [
        ["zero-bench-gpt2, 1 rank, stage 0, fp32", f"{ours['tokens_per_s']:.0f}" if ours else "-",
         f"{ours['median_step_ms']:.0f}" if ours else "-"],
        [f"PyTorch {run['torch']} eager, fp32", f"{torch['tokens_per_s']:.0f}",
         f"{run['batch'] * run['seq_len'] / torch['tokens_per_s'] * 1000:.0f}"],
        ["ours / PyTorch", f"{ratio:.2f}x" if ratio else "-", ""]]))
    return md
