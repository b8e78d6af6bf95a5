"""The LibTorch adapter's part of benchmarks/report (issue 20): zero-torch-gpt2 --bench (the
LibTorch GPT-2 through zero::TorchModel at 2 ranks, stage 3, against the same model trained by
LibTorch alone on each rank, and the adapter's communication overlap) and
benchmarks/torch_ddp_zero_gpt2.py (the same model, sizes and ranks under PyTorch DDP with
ZeroRedundancyOptimizer), alternating; their section of BENCHMARKS.md and their rows of its
Targets table.

zero-torch-gpt2 exists only in a build with LibTorch; without it, or without a python3 that has
torch.distributed, the section says which comparison was skipped and why.
"""
import json
import os
import statistics
import time

import report_gpt2

HERE = os.path.dirname(os.path.abspath(__file__))
DDP_SCRIPT = os.path.join(HERE, "torch_ddp_zero_gpt2.py")
PROGRAM = "zero-torch-gpt2"
RANKS = 2
STAGE = 3

# Issue 20's targets: adapter / LibTorch alone (tokens/s per rank), and adapter / DDP + ZeRO.
ALONE_RATIO_TARGET = 0.8
DDP_RATIO_TARGET = 1.0

# The model flags both programs take. The DDP model's position embedding has seq-len rows, so
# ours gets --block-size equal to --seq-len: the same parameters on both sides.
CONFIGS = {
    "full": {"model": ["--n-layer", "4", "--n-embd", "128", "--n-head", "4", "--vocab-size",
                       "256", "--seq-len", "128", "--global-batch", "8"],
             "block_size": "128", "timing": ["--steps", "5", "--rounds", "3"], "pairs": 2},
    "quick": {"model": ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--vocab-size",
                        "64", "--seq-len", "16", "--global-batch", "4"],
              "block_size": "16", "timing": ["--steps", "1", "--rounds", "1"], "pairs": 1},
}


def built(build_dir):
    return os.access(os.path.join(build_dir, "bin", PROGRAM), os.X_OK)


def run_torch_adapter(build_dir, quick, out, logs, run, mpirun_cmd):
    """DDP, ours, DDP, ours, ...: the two alternate, so load that changes during the report
    lands on both sides of the ratio. Returns the records and the seconds taken."""
    config = CONFIGS["quick" if quick else "full"]
    start = time.monotonic()
    result = {"adapter": [], "ddp": [], "python": report_gpt2.torch_python(), "headers": []}
    if not built(build_dir):
        result["skipped"] = (f"{PROGRAM} is not built: the build has no LibTorch adapter "
                             "(configure with -DZERO_TORCH=ON and libtorch-dev installed)")
        return result, time.monotonic() - start
    for pair in range(config["pairs"]):
        path = os.path.join(out, f"torch_ddp_zero_{pair}.json")
        cmd = mpirun_cmd(build_dir, result["python"],
                         [DDP_SCRIPT, *config["model"], *config["timing"], "--json", path],
                         ranks=RANKS)
        run(cmd, os.path.join(logs, f"torch_ddp_zero_{pair}.txt"))
        with open(path) as f:
            result["ddp"].append(json.load(f))
        path = os.path.join(out, f"torch_adapter_{pair}.json")
        text, _ = run(mpirun_cmd(build_dir, PROGRAM,
                                 ["--bench", "--stage", str(STAGE), *config["model"],
                                  "--block-size", config["block_size"], *config["timing"],
                                  "--json", path], ranks=RANKS),
                      os.path.join(logs, f"torch_adapter_{pair}.txt"))
        with open(path) as f:
            result["adapter"] += json.load(f)
        result["headers"] += [line for line in text.splitlines() if line.strip()]
    return result, time.monotonic() - start


def summary(torch_adapter):
    """Medians over the runs: adapter, LibTorch alone and DDP tokens/s per rank (DDP None with
    the reason it skipped), the adapter's overlap, and the first adapter record."""
    adapter = torch_adapter["adapter"]
    if not adapter:
        return None
    skipped = next((r["skipped"] for r in torch_adapter["ddp"] if "skipped" in r), None)
    ddp = None if skipped else statistics.median(
        r["tokens_per_s_per_rank"] for r in torch_adapter["ddp"])
    return {
        "adapter": statistics.median(r["adapter_tokens_per_s_per_rank"] for r in adapter),
        "alone": statistics.median(r["alone_tokens_per_s_per_rank"] for r in adapter),
        "overlap": statistics.median(r["overlap_fraction"] for r in adapter),
        "comm_ms": statistics.median(r["comm_ms"] for r in adapter),
        "exposed_ms": statistics.median(r["exposed_comm_ms"] for r in adapter),
        "ddp": ddp, "ddp_skipped": skipped, "record": adapter[0],
        "ddp_record": None if skipped else torch_adapter["ddp"][0],
    }


def verdict(met):
    return "met" if met else "**missed**"


def target_rows(torch_adapter):
    label = f"LibTorch GPT-2 through the adapter ({RANKS} ranks, stage {STAGE})"
    s = summary(torch_adapter)
    if s is None:
        return [[f"{label}: tokens/s per rank / LibTorch alone", f">= {ALONE_RATIO_TARGET}",
                 "not measured: " + torch_adapter.get("skipped", "no record"), "not checked"]]
    alone = s["adapter"] / s["alone"]
    rows = [[f"{label}: tokens/s per rank / LibTorch alone", f">= {ALONE_RATIO_TARGET}",
             f"{s['adapter']:.0f} / {s['alone']:.0f} = {alone:.3f}",
             verdict(alone >= ALONE_RATIO_TARGET)]]
    if s["ddp"] is None:
        rows.append([f"{label}: tokens/s per rank / PyTorch DDP + ZeroRedundancyOptimizer",
                     f"> {DDP_RATIO_TARGET}", f"DDP skipped: {s['ddp_skipped']}", "not checked"])
    else:
        ratio = s["adapter"] / s["ddp"]
        rows.append([f"{label}: tokens/s per rank / PyTorch DDP + ZeroRedundancyOptimizer",
                     f"> {DDP_RATIO_TARGET}", f"{s['adapter']:.0f} / {s['ddp']:.0f} = {ratio:.2f}x",
                     verdict(ratio > DDP_RATIO_TARGET)])
    rows.append([f"{label}: communication overlap, 1 - comm_wait / comm_busy", "reported",
                 f"{100 * s['overlap']:.0f} %", "-"])
    return rows


def markdown(torch_adapter, table):
    md = [f"\n## LibTorch models through the adapter ({PROGRAM} --bench)\n"]
    s = summary(torch_adapter)
    if s is None:
        md.append(f"Skipped: {torch_adapter.get('skipped', 'no record')}.\n")
        return md
    r = s["record"]
    md.append(
        f"The GPT-2 written with `torch::nn` (`examples/torch_gpt2`): {r['n_layer']} layers x "
        f"{r['n_embd']} wide, {r['n_head']} heads, T = {r['seq_len']}, vocabulary "
        f"{r['vocab_size']}, a global batch of {r['global_batch']} sequences split over "
        f"{r['world_size']} ranks, {r['threads']} torch thread per rank, fp32. `{PROGRAM} "
        f"--bench --stage {r['stage']}` trains it through `zero::TorchModel` on every rank, then "
        "LibTorch alone (`torch::optim::AdamW`, no communication) on one rank's share of the "
        "batch on every rank, alternating round by round; tokens/s per rank is the median "
        f"round's ({r['rounds']} rounds of {r['steps']} steps). Its communication figures are "
        "the engine's `StepStats` as in zero-bench-step: comm ms busy, exposed ms waited for, "
        "overlap 1 - wait / busy over the measured steps and ranks. PyTorch DDP + "
        "ZeroRedundancyOptimizer(AdamW) over gloo (`benchmarks/torch_ddp_zero_gpt2.py`, "
        f"`{torch_adapter['python']}`) trains the same model, sizes, batch, threads and ranks "
        "under zerorun, timed the same way; the two programs alternate, "
        f"{len(torch_adapter['adapter'])} run(s) each, and the table shows the medians.\n\n")
    rows = [
        [f"adapter, stage {r['stage']}, {r['world_size']} ranks", f"{s['adapter']:.0f}", "1.00",
         f"{s['comm_ms']:.2f}", f"{s['exposed_ms']:.2f}", f"{100 * s['overlap']:.0f} %"],
        ["LibTorch alone, each rank", f"{s['alone']:.0f}", f"{s['adapter'] / s['alone']:.3f}",
         "-", "-", "-"],
    ]
    if s["ddp"] is None:
        rows.append(["PyTorch DDP + ZeroRedundancyOptimizer", "skipped", "-", "-", "-", "-"])
    else:
        d = s["ddp_record"]
        rows.append([f"PyTorch {d['torch']} DDP + ZeroRedundancyOptimizer, {d['world_size']} "
                     "ranks", f"{s['ddp']:.0f}", f"{s['adapter'] / s['ddp']:.2f}", "-", "-", "-"])
    md.append(table(["", "tokens/s per rank", "adapter / this", "comm ms", "exposed ms",
                     "overlap"], rows))
    if s["ddp"] is None:
        md.append(f"\nDDP skipped: {s['ddp_skipped']}.\n")
    md.append("\n```\n" + "\n".join(torch_adapter["headers"]) + "\n```\n")
    return md
