#!/usr/bin/env python3
"""zero-bench-pipeline at 4 stages, 8 micro-batches, F = B = W = 10 ms: the measured bubbles
against the formulas, and the usage errors.

  pipeline_bubble_check.py OUT_DIR MPIEXEC [MPIEXEC_FLAGS...] -- BENCH

Checks: GPipe's and 1F1B's measured bubble fractions within 10 % of (p-1)/(m+p-1); ZB-H1's idle
time per rank at most 0.4 of 1F1B's (the formula: a third) and interleaved v 2's at most 0.6 (the
formula: a half); the bytes sent are every transfer of the lists; a timeline JSON per schedule
(and PNG when gnuplot is here); a world that is not one rank per stage, and a bad schedule name,
exit 2 with a message. The idle time is compared, not the fraction: ZB-H1's formula fraction is
0.111 against 1F1B's 0.273, a ratio of 0.41 even on an exact run, because its step is shorter.
"""

import json
import os
import shutil
import subprocess
import sys


def fail(message):
    print("pipeline_bubble_check: " + message, file=sys.stderr)
    sys.exit(1)


def main():
    out = sys.argv[1]
    split = sys.argv.index("--")
    mpiexec = sys.argv[2:split]
    bench = sys.argv[split + 1]
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    json_path = os.path.join(out, "pipeline.json")
    prefix = os.path.join(out, "timeline")
    sizes = ["--stages", "4", "--micro-batches", "8", "--forward-ms", "10", "--backward-ms", "10",
             "--weight-ms", "10", "--virtual-stages", "2"]
    run = subprocess.run(mpiexec + ["-np", "4", bench] + sizes +
                         ["--schedule", "gpipe,1f1b,interleaved,zb-h1", "--steps", "3",
                          "--json", json_path, "--timeline-dump", prefix],
                         capture_output=True, text=True, timeout=120)
    print(run.stdout)
    if run.returncode != 0:
        fail(f"the benchmark exited {run.returncode}:\n{run.stderr}")
    with open(json_path) as f:
        records = {r["schedule"]: r for r in json.load(f)}
    if sorted(records) != ["1f1b", "gpipe", "interleaved", "zb-h1"]:
        fail(f"expected a record per schedule, got {sorted(records)}")

    problems = []
    for name in ["gpipe", "1f1b"]:
        r = records[name]
        if abs(r["bubble_fraction"] - r["formula_bubble_fraction"]) > 0.1 * r["formula_bubble_fraction"]:
            problems.append(f"{name}: measured bubble {r['bubble_fraction']:.4f} is not within 10 % "
                            f"of the formula's {r['formula_bubble_fraction']:.4f}")
    base = records["1f1b"]["idle_ms"]
    for name, bound in [("zb-h1", 0.4), ("interleaved", 0.6)]:
        idle = records[name]["idle_ms"]
        if idle > bound * base:
            problems.append(f"{name}: idle {idle:.1f} ms per rank is more than {bound} of 1f1b's "
                            f"{base:.1f} ms")
    # Every (micro-batch, virtual stage boundary) carries one activation and one gradient of
    # 1024 floats: 2 * m * (p v - 1) messages of 4096 bytes.
    for name, v in [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)]:
        expected = 2 * 8 * (4 * v - 1) * 4096
        if records[name]["bytes_sent"] != expected:
            problems.append(f"{name}: {records[name]['bytes_sent']} bytes sent, expected {expected}")
    for name in records:
        if not os.path.isfile(f"{prefix}_{name}.json"):
            problems.append(f"no timeline {prefix}_{name}.json")
        if shutil.which("gnuplot") and not os.path.isfile(f"{prefix}_{name}.png"):
            problems.append(f"no picture {prefix}_{name}.png")

    # Usage errors: every rank stops with exit 2 and rank 0 says why.
    for args, message in [
        (["-np", "2", bench] + sizes + ["--schedule", "1f1b", "--json", json_path],
         "--stages 4 needs one rank per stage, and the job has 2 ranks"),
        (["-np", "1", bench] + sizes + ["--schedule", "1f1b,zb-h2", "--json", json_path],
         "unknown pipeline schedule 'zb-h2': expected gpipe, 1f1b, interleaved or zb-h1"),
        (["-np", "1", bench, "--stages", "4", "--micro-batches", "6", "--forward-ms", "1",
          "--backward-ms", "1", "--schedule", "interleaved", "--json", json_path],
         "got 6 micro-batches for 4 stages"),
    ]:
        bad = subprocess.run(mpiexec + args, capture_output=True, text=True, timeout=60)
        if bad.returncode != 2 or message not in bad.stderr:
            problems.append(f"{' '.join(args[2:])}: exit {bad.returncode}, expected 2 with "
                            f"'{message}'; stderr:\n{bad.stderr}")
    if problems:
        fail("\n".join(problems))
    print("pipeline_bubble_check: all checks passed")


if __name__ == "__main__":
    main()
