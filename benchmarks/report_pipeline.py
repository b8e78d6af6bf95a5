"""The pipeline part of benchmarks/report: zero-bench-pipeline's schedules (GPipe, 1F1B,
interleaved, ZB-H1) with sleeping stages, their measured bubble against the formulas, the section
of BENCHMARKS.md and its rows of the Targets table.

Like report_memory.py, it takes what it shares with the report (run(), mpirun_cmd(), table())
instead of importing the report, which is a script.
"""
import json
import os
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


def run_pipeline(build_dir, quick, out, logs, run, mpirun_cmd):
    """The benchmark's JSON records, and the seconds it took."""
    start = time.monotonic()
    path = os.path.join(out, "pipeline.json")
    run(mpirun_cmd(build_dir, "zero-bench-pipeline",
                   ["--stages", str(STAGES), "--schedule", SCHEDULES,
                    *CONFIGS["quick" if quick else "full"], "--json", path],
                   ranks=STAGES),
        os.path.join(logs, "pipeline.txt"))
    with open(path) as f:
        return json.load(f), time.monotonic() - start


def verdict(met):
    return "met" if met else "**missed**"


def target_rows(records):
    by_name = {r["schedule"]: r for r in records}
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
    return rows


def markdown(records, table):
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
    return md
