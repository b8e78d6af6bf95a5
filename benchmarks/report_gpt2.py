"""The GPT-2 part of benchmarks/report: the matrix products fp32 against bf16 (zero-bench-products:
the CPU's flags, the sgemm and bf16 GEMM peaks), zero-bench-gpt2 at 1 and 2 ranks, PyTorch eager
on the same model (benchmarks/torch_gpt2.py, fp32 and bf16 autocast) when a python3 here has
torch, their section of BENCHMARKS.md and their rows of its Targets table (issues 14 and 36).

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
# Issue 36's: our bf16 step against our fp32 one (1 rank, stage 0), on a CPU with bf16
# arithmetic (avx512_bf16 or AMX-BF16) and without; and against PyTorch's bf16 autocast.
BF16_RATIO_TARGET = 1.6
BF16_RATIO_TARGET_WITHOUT_ARITHMETIC = 0.95
TORCH_BF16_RATIO_TARGET = 2.0

# "full": issue 14's model (6 layers x 384, 6 heads, T 256, vocab 50257, batch 8); a step takes
# seconds on one core, so 2 measured steps per stage after 1 warm-up. "quick": a tiny GPT that
# only proves the pipeline.
CONFIGS = {
    "full": {"model": [], "bench": ["--steps", "2", "--rounds", "2", "--warmup", "1"],
             "torch": ["--steps", "2", "--warmup", "1"], "products": []},
    "quick": {"model": ["--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--vocab-size", "512",
                        "--seq-len", "32", "--global-batch", "4"],
              "bench": ["--steps", "1", "--rounds", "1", "--warmup", "1", "--peak-size", "256"],
              "torch": ["--steps", "1", "--warmup", "1"], "products": ["--quick"]},
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
    """Runs the products' benchmark, then PyTorch (fp32 and bf16 autocast), ours at 1 rank,
    PyTorch again, ours at 2 ranks: PyTorch's runs bracket ours at 1 rank, so load that changes
    during the report lands on both sides of the ratio."""
    config = CONFIGS["quick" if quick else "full"]
    start = time.monotonic()
    python = torch_python()
    result = {"records": [], "torch": [], "python": python, "headers": []}
    products_path = os.path.join(out, "products.json")
    run(mpirun_cmd(build_dir, "zero-bench-products", [*config["products"], "--json", products_path],
                   ranks=1), os.path.join(logs, "products.txt"))
    with open(products_path) as f:
        result["products"] = json.load(f)
    for step in ("torch_a", "torch_bf16_a", 1, "torch_b", "torch_bf16_b", 2):
        if isinstance(step, str):
            path = os.path.join(out, f"{step}.json")
            autocast = ["--bf16-autocast"] if "bf16" in step else []
            args = [TORCH_SCRIPT, *torch_args(config["model"], config["torch"]), *autocast,
                    "--json", path]
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


def product_peaks(gpt2):
    """The square product's fp32 and bf16 GFLOP/s from zero-bench-products (1 rank, its
    threads): the peaks MFU is measured against for each dtype, or (None, None)."""
    rows = gpt2.get("products", {}).get("rows", [])
    square = next((r for r in rows if r["product"].startswith("square")), None)
    if square is None:
        return None, None
    return square["fp32_gflops"], square["bf16_gflops"]


def find(records, world, stage, dtype):
    return next((r for r in records if r["world_size"] == world and r["stage"] == stage
                 and r["dtype"] == dtype), None)


def torch_summary(gpt2, autocast=None):
    """PyTorch's tokens/s (the median of both runs' steps, fp32 or with autocast "bf16") and its
    record, or the skip reason."""
    runs = [r for r in gpt2["torch"] if "skipped" in r or r.get("autocast") == autocast]
    skipped = next((r["skipped"] for r in runs if "skipped" in r), None)
    if skipped:
        return None, skipped
    if not runs:
        return None, "not run"
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
    rows += bf16_target_rows(gpt2)
    return rows


def bf16_target_rows(gpt2):
    """Issue 36's rows: bf16 against fp32 (the target depends on the CPU's bf16 arithmetic),
    against PyTorch's bf16 autocast, and the bf16 step's MFU against the bf16 GEMM peak."""
    records = gpt2["records"]
    fp32, bf16 = find(records, 1, 0, "fp32"), find(records, 1, 0, "bf16")
    if fp32 is None or bf16 is None:
        return []
    products = gpt2.get("products", {})
    in_bf16 = products.get("bf16_products_in_bf16", False)
    target = BF16_RATIO_TARGET if in_bf16 else BF16_RATIO_TARGET_WITHOUT_ARITHMETIC
    ratio = bf16["tokens_per_s"] / fp32["tokens_per_s"]
    where = "bf16 products in bf16" if in_bf16 else "no bf16 arithmetic: bf16 products in fp32"
    rows = [[f"GPT-2 bf16 tokens/s / fp32 (1 rank, stage 0; {where})", f">= {target}x",
             f"{bf16['tokens_per_s']:.0f} / {fp32['tokens_per_s']:.0f} = {ratio:.2f}x",
             "met" if ratio >= target else "**missed**"]]
    torch, skipped = torch_summary(gpt2, "bf16")
    label = "GPT-2 bf16 tokens/s against PyTorch eager bf16 autocast (1 rank, stage 0)"
    if torch is None:
        rows.append([label, f">= {TORCH_BF16_RATIO_TARGET}x",
                     f"{bf16['tokens_per_s']:.0f} tokens/s; PyTorch skipped: {skipped}",
                     "not checked"])
    else:
        torch_ratio = bf16["tokens_per_s"] / torch["tokens_per_s"]
        rows.append([label, f">= {TORCH_BF16_RATIO_TARGET}x",
                     f"{bf16['tokens_per_s']:.0f} vs {torch['tokens_per_s']:.0f} tokens/s: "
                     f"{torch_ratio:.2f}x",
                     "met" if torch_ratio >= TORCH_BF16_RATIO_TARGET else "**missed**"])
    _, bf16_peak = product_peaks(gpt2)
    if bf16_peak and in_bf16:
        rows.append(["GPT-2 model FLOPs utilisation (1 rank, bf16, stage 0) against the bf16 "
                     "GEMM peak", "reported",
                     f"{100 * bf16['model_gflops_per_s'] / bf16_peak:.0f} % of {bf16_peak:.0f} "
                     "GFLOP/s", "-"])
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
    md += products_markdown(gpt2, table)

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
    rows = [
        ["zero-bench-gpt2, 1 rank, stage 0, fp32", f"{ours['tokens_per_s']:.0f}" if ours else "-",
         f"{ours['median_step_ms']:.0f}" if ours else "-"],
        [f"PyTorch {run['torch']} eager, fp32", f"{torch['tokens_per_s']:.0f}",
         f"{run['batch'] * run['seq_len'] / torch['tokens_per_s'] * 1000:.0f}"],
        ["ours / PyTorch, fp32", f"{ratio:.2f}x" if ratio else "-", ""]]
    ours_bf16 = find(records, 1, 0, "bf16")
    torch_bf16, _ = torch_summary(gpt2, "bf16")
    if torch_bf16 is not None:
        ratio_bf16 = (ours_bf16["tokens_per_s"] / torch_bf16["tokens_per_s"] if ours_bf16
                      else None)
        rows += [
            ["zero-bench-gpt2, 1 rank, stage 0, bf16",
             f"{ours_bf16['tokens_per_s']:.0f}" if ours_bf16 else "-",
             f"{ours_bf16['median_step_ms']:.0f}" if ours_bf16 else "-"],
            [f"PyTorch {run['torch']} eager, bf16 autocast", f"{torch_bf16['tokens_per_s']:.0f}",
             f"{run['batch'] * run['seq_len'] / torch_bf16['tokens_per_s'] * 1000:.0f}"],
            ["ours / PyTorch, bf16", f"{ratio_bf16:.2f}x" if ratio_bf16 else "-", ""]]
    md.append("PyTorch's bf16 runs wrap the forward and the loss in `torch.autocast(\"cpu\", "
              "dtype=torch.bfloat16)` (weights, gradients and AdamW stay fp32); ours is "
              "`--dtype bf16` (bf16 working copies, fp32 master weights and optimizer).\n\n")
    md.append(table(["", "tokens/s", "step ms"], rows))
    return md


def products_markdown(gpt2, table):
    """The CPU's flags and the products fp32 against bf16 (zero-bench-products)."""
    products = gpt2.get("products")
    if not products:
        return []
    md = ["\n### Matrix products, fp32 against bf16 (zero-bench-products)\n"]
    md.append(
        f"CPU `{products['cpu_model']}`, flags read by cpuid: `{products['cpu_flags']}`. "
        f"Kernels chosen: `{products['kernels']}`. Each product runs through `matmul_forward` "
        "(and `matmul_backward` for fwd+bwd) as the GPT-2 calls it, "
        f"{products['threads']} thread, the best of 5 runs; bf16 includes rounding the operands "
        "to bf16. The square product's rates are the sgemm and bf16 GEMM peaks the bf16 MFU "
        "row of the Targets table uses."
        + ("" if products["bf16_products_in_bf16"] else
           " This CPU has no bf16 arithmetic (neither avx512_bf16 nor amx_bf16), or the build "
           "has no oneDNN: the bf16 column runs fp32 products.") + "\n\n")
    md.append(table(["product", "fp32 GFLOP/s", "bf16 GFLOP/s", "bf16 / fp32"],
                    [[r["product"], f"{r['fp32_gflops']:.1f}", f"{r['bf16_gflops']:.1f}",
                      f"{r['bf16_gflops'] / r['fp32_gflops']:.2f}x"] for r in products["rows"]]))
    return md
