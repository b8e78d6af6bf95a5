"""The collectives' path in the step benchmarks, part of benchmarks/report (issue 19): the MLP
(zero-bench-step) and the GPT-2 (zero-bench-gpt2) at 2 ranks on one node, stages 0-3, fp32, with
the shared-memory path and with MPI alone (ZERO_COLLECTIVES=mpi), alternating in one run of each
(--collectives shm,mpi), so that both see the same load. Its section of BENCHMARKS.md and its
rows of the Targets table.

The report passes in what it shares (its run(), mpirun_cmd() and table()) instead of this module
importing the report, which is a script.
"""
import json
import os
import time

import report_gpt2

STEP_TARGET = 1.3  # issue 19: step time over MPI alone / over shared memory, every stage
RANKS = 2

# The MLP is zero-bench-step's default; the GPT-2 is the report's (report_gpt2), fewer steps.
CONFIGS = {
    "full": {"step": [],
             "gpt2": [*report_gpt2.CONFIGS["full"]["model"], "--steps", "2", "--rounds", "2",
                      "--warmup", "1"]},
    "quick": {"step": ["--input-dim", "16", "--hidden", "64", "--output-dim", "8", "--layers", "3",
                       "--global-batch", "8", "--steps", "2", "--warmup", "1", "--rounds", "1"],
              "gpt2": [*report_gpt2.CONFIGS["quick"]["model"],
                       *report_gpt2.CONFIGS["quick"]["bench"]]},
}
BENCHES = (("MLP", "zero-bench-step", "step"), ("GPT-2", "zero-bench-gpt2", "gpt2"))


def run_paths(build_dir, quick, out, logs, run, mpirun_cmd):
    """Both benchmarks with --collectives shm,mpi. Returns {model: records} and the seconds."""
    config = CONFIGS["quick" if quick else "full"]
    start = time.monotonic()
    result = {}
    for model, program, key in BENCHES:
        path = os.path.join(out, f"paths_{key}.json")
        args = [*config[key], "--dtype", "fp32", "--collectives", "shm,mpi", "--json", path]
        run(mpirun_cmd(build_dir, program, args, ranks=RANKS),
            os.path.join(logs, f"paths_{key}.txt"))
        with open(path) as f:
            result[model] = json.load(f)
    return result, time.monotonic() - start


def pairs(records):
    """(stage, shm record, mpi record) per stage both paths measured."""
    by = {(r["stage"], r["collectives"]): r for r in records}
    return [(stage, by[(stage, "shm")], by[(stage, "mpi")])
            for stage in sorted({r["stage"] for r in records})
            if (stage, "shm") in by and (stage, "mpi") in by]


def target_rows(paths):
    rows = []
    for model, records in paths.items():
        for stage, shm, mpi in pairs(records):
            ratio = mpi["median_step_ms"] / shm["median_step_ms"]
            rows.append([f"{model} step time, MPI alone / shared memory (stage {stage}, fp32, "
                         f"{RANKS} ranks)", f">= {STEP_TARGET}x",
                         f"{mpi['median_step_ms']:.1f} / {shm['median_step_ms']:.1f} ms = "
                         f"{ratio:.2f}x", "met" if ratio >= STEP_TARGET else "**missed**"])
    return rows


def markdown(paths, table):
    md = [f"\n## Shared memory against MPI alone in the step (stages 0-3, {RANKS} ranks, fp32)\n"]
    md.append("`zero-bench-step` (its default MLP) and `zero-bench-gpt2` (the GPT-2 above, 2 "
              "measured steps per round) with `--collectives shm,mpi`: each stage on the "
              "shared-memory path (the engine's buffers in node-shared memory, so its "
              "collectives run straight on them) and on MPI alone, alternating round by round. "
              "Step, compute, comm (`comm_busy_ms`) and exposed comm (`comm_wait_ms`) as in the "
              "step table above; MPI / shm is the step time over MPI alone over the "
              "shared-memory path's. Where compute dominates the step and the collectives are "
              "overlapped, the path can only win what MPI's collectives cost the compute "
              "threads (it busy-polls a core that compute needs) and what they leave exposed.\n\n")
    rows = []
    for model, records in paths.items():
        for stage, shm, mpi in pairs(records):
            rows.append([model, stage,
                         f"{shm['median_step_ms']:.1f}", f"{mpi['median_step_ms']:.1f}",
                         f"{shm['compute_ms']:.1f}", f"{mpi['compute_ms']:.1f}",
                         f"{shm['comm_ms']:.1f}", f"{mpi['comm_ms']:.1f}",
                         f"{shm['exposed_comm_ms']:.1f}", f"{mpi['exposed_comm_ms']:.1f}",
                         f"{mpi['median_step_ms'] / shm['median_step_ms']:.2f}x"])
    md.append(table(["model", "stage", "shm step ms", "MPI step ms", "shm compute ms",
                     "MPI compute ms", "shm comm ms", "MPI comm ms", "shm exposed ms",
                     "MPI exposed ms", "MPI / shm"], rows))
    return md
