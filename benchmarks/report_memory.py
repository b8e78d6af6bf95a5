"""The memory-tier part of benchmarks/report: activation checkpointing (zero-bench-checkpointing,
issue 15) and the NVMe optimizer pass against the disk (zero-bench-offload, issue 16), their
section of BENCHMARKS.md and their rows of its Targets table.

Like report_gpt2.py, it takes what it shares with the report (run(), mpirun_cmd(), table())
instead of importing the report, which is a script.
"""
import json
import os
import time

# Issue 15's targets: peak activation bytes cut at least this much, at no more step time.
CHECKPOINT_TARGETS = {"selective": (2.5, 1.15), "full": (6.0, 1.4),
                      # full recomputation with the checkpoints spilled to NVMe (ours)
                      "full+nvme": (6.0, 1.4)}
# Issue 16's: the optimizer pass at least this share of the raw disk's GB/s, and its time at
# most this many times the raw I/O time of the same bytes.
OFFLOAD_SHARE_TARGET = 0.8
OFFLOAD_TIME_TARGET = 1.1

# "full": the issues' configurations (checkpointing: 12 x 384, T 1024, vocab 256; offload: 64 Mi
# bf16 parameters, 768 MiB of state, in sub-groups of 16 Mi). "quick" only proves the pipeline.
CONFIGS = {
    "full": {"checkpointing": ["--rounds", "5"],
             "offload": ["--sizes", "64M", "--reps", "3", "--sub-group-size", "16M"]},
    "quick": {"checkpointing": ["--n-layer", "2", "--n-head", "2", "--n-embd", "32",
                                "--seq-len", "32", "--rounds", "1"],
              "offload": ["--sizes", "1M", "--reps", "1", "--sub-group-size", "256K",
                          "--block-size", "64K"]},
}


def run_memory_tiers(build_dir, quick, out, logs, run, mpirun_cmd):
    """Both benchmarks' JSON records, and the seconds they took. The offload state goes to a
    directory of the output (the disk the report writes to)."""
    config = CONFIGS["quick" if quick else "full"]
    start = time.monotonic()
    result = {}
    path = os.path.join(out, "checkpointing.json")
    # The fourth setting, full recomputation with the checkpoints spilled to a directory of the
    # output (O_DIRECT: the disk the report writes to).
    spill = os.path.join(out, "checkpoint_spill")
    os.makedirs(spill, exist_ok=True)
    run(mpirun_cmd(build_dir, "zero-bench-checkpointing",
                   [*config["checkpointing"], "--checkpoint-nvme-path", spill, "--json", path],
                   ranks=1),
        os.path.join(logs, "checkpointing.txt"))
    with open(path) as f:
        result["checkpointing"] = json.load(f)
    path = os.path.join(out, "offload.json")
    nvme = os.path.join(out, "nvme")
    os.makedirs(nvme, exist_ok=True)
    run(mpirun_cmd(build_dir, "zero-bench-offload",
                   [*config["offload"], "--path", nvme, "--json", path], ranks=1),
        os.path.join(logs, "offload.txt"))
    with open(path) as f:
        result["offload"] = json.load(f)
    return result, time.monotonic() - start


def verdict(met):
    return "met" if met else "**missed**"


def target_rows(memory):
    rows = []
    for r in memory["checkpointing"]:
        if r["recompute"] not in CHECKPOINT_TARGETS:
            continue
        cut, slower = CHECKPOINT_TARGETS[r["recompute"]]
        rows.append([f"{r['recompute']} recomputation: peak activation bytes cut (T {r['seq_len']})",
                     f">= {cut}x", f"{r['activation_ratio_to_none']:.2f}x",
                     verdict(r["activation_ratio_to_none"] >= cut)])
        rows.append([f"{r['recompute']} recomputation: step time against none",
                     f"<= {slower}x", f"{r['time_ratio_to_none']:.2f}x",
                     verdict(r["time_ratio_to_none"] <= slower)])
    for r in memory["offload"]:
        rows.append([f"NVMe optimizer pass against raw O_DIRECT ({r['bytes'] >> 20} MiB of state)",
                     f">= {OFFLOAD_SHARE_TARGET:.0%}", f"{r['ours_over_raw']:.0%}",
                     verdict(r["ours_over_raw"] >= OFFLOAD_SHARE_TARGET)])
        rows.append(["NVMe optimizer time against the time its disk was busy with its transfers",
                     f"<= {OFFLOAD_TIME_TARGET}x", f"{r['optimizer_over_busy']:.2f}x",
                     verdict(r["optimizer_over_busy"] <= OFFLOAD_TIME_TARGET)])
    return rows


def markdown(memory, table):
    md = ["\n## Activation checkpointing (zero-bench-checkpointing)\n"]
    first = memory["checkpointing"][0]
    md.append(f"The GPT-2 with {first['n_layer']} layers x {first['n_embd']}, {first['n_head']} "
              f"heads, T {first['seq_len']}, vocabulary {first['vocab_size']}, "
              f"{first['micro_batch']} sequence per rank on {first['world']} rank(s), stage "
              f"{first['stage']}, fp32; the settings alternate (full+nvme: full recomputation with "
              "the checkpoints spilled to NVMe, at most two in memory), and each ratio is the "
              "median of the per-round ratios. Peak activation bytes are the engine "
              "allocator's (activations and checkpoints), beside the formula "
              "(models/gpt2_memory.h).\n\n")
    md.append(table(["recompute", "peak activation bytes", "formula", "none / this", "step ms",
                     "this / none"],
                    [[r["recompute"], r["peak_activation_bytes"], r["formula_bytes"],
                      f"{r['activation_ratio_to_none']:.2f}x", f"{r['median_step_ms']:.1f}",
                      f"{r['time_ratio_to_none']:.2f}"] for r in memory["checkpointing"]]))
    md.append("\n## NVMe optimizer offload against the disk (zero-bench-offload)\n")
    md.append("One rank's optimizer step with its state on NVMe (bf16 parameters: fp32 master, "
              "m and v, 12 bytes per parameter), alternating with raw io_uring O_DIRECT passes "
              "over a file of the same bytes on the same path (a sequential write, then a "
              "sequential read, same block size and requests in flight). The raw pass that "
              "ours is divided by moves its blocks through as much memory as the engine's "
              "staging buffers; the ring pass moves them through the requests in flight only "
              "(8 MiB, always cache-hot), the disk's best case, which no optimizer pass can "
              "land its state in: on this virtual machine it is about 1.4x faster than the same "
              "bytes through the staging's memory. The pass is "
              "pipelined (`pipeline_read` and `pipeline_write`: sub-group k+1 read and k-1 "
              "written while k is stepped), the overlap the targets measure. GB/s count the state "
              "read plus written; the engine's figures are its StepStats (`optimizer_ms`, "
              "`nvme_wait_ms`: the time the pass was blocked on the disk, `nvme_busy_ms`: the "
              "time some transfer of its file was outstanding). Whether compute hides under the "
              "I/O is the pass's time over its disk's busy time, per step (1.00: the disk "
              "worked the whole pass; with pipelining off it is the compute's share more); "
              "against the raw pass's time it would only restate ours / raw.\n\n")
    md.append(table(["state MiB", "ours ms", "blocked on I/O ms", "disk busy ms", "ours / busy",
                     "raw ms", "ours GB/s",
                     "raw GB/s (read, write)", "ours / raw", "ring raw ms", "ring raw GB/s",
                     "ours / ring"],
                    [[r["bytes"] >> 20, f"{r['ours_ms']:.0f}", f"{r['nvme_wait_ms']:.0f}",
                      f"{r['nvme_busy_ms']:.0f}", f"{r['optimizer_over_busy']:.2f}",
                      f"{r['raw_ms']:.0f}", f"{r['ours_GBps']:.2f}",
                      f"{r['raw_GBps']:.2f} ({r['raw_read_GBps']:.2f}, "
                      f"{r['raw_write_GBps']:.2f})", f"{r['ours_over_raw']:.2f}",
                      f"{r['raw_ring_ms']:.0f}", f"{r['raw_ring_GBps']:.2f}",
                      f"{r['ours_GBps'] / r['raw_ring_GBps']:.2f}"]
                     for r in memory["offload"]]))
    return md
