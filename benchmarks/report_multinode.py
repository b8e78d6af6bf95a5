"""The multi-node part of benchmarks/report (issue 23): the GPT-2 at stage 3 over every rank
against hybrid sharding with one shard group per node (MiCS, mics_shard_size = ranks per node),
on two network-namespace nodes of two ranks joined by links shaped to 1 Gbit/s
(scripts/netns_cluster.sh), alternating in one zero-bench-gpt2 run, with and without gradient
accumulation; the bytes that crossed between the nodes per step against the formulas. Its section
of BENCHMARKS.md and its rows of the Targets table.

The cluster needs root and network namespaces; without them the section says why it was
skipped. The report brings the cluster up and takes it down again.
"""
import json
import os
import shlex
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLUSTER = os.path.join(ROOT, "scripts", "netns_cluster.sh")
NODES = 2
RANKS_PER_NODE = 2
RATE = "1gbit"
MICS_TARGET = 1.5  # issue 23: hybrid sharding inside the node against stage 3 across nodes
FORMULA_TOLERANCE = 0.02  # link counters include frame headers and the barriers' bytes

# (micro-batches, global batch): one micro-batch of 2 sequences per rank, then gradient
# accumulation over micro-batches of 1 sequence per rank.
CONFIGS = {
    "full": {"model": [], "steps": ["--steps", "4", "--rounds", "2"],
             "accumulation": [(1, 8), (2, 8), (4, 16)]},
    "quick": {"model": ["--n-layer", "1", "--n-embd", "64", "--n-head", "2", "--vocab-size", "512",
                        "--seq-len", "32"],
              "steps": ["--steps", "1", "--rounds", "1", "--warmup", "0"],
              "accumulation": [(1, 8), (2, 8)]},
}


def cluster_env():
    """The environment netns_cluster.sh's `env` prints, applied to ours."""
    text = subprocess.run([CLUSTER, "env"], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ)
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    # zerorun does not set the BLAS core for ranks on other hosts (docs/cli.md, "OpenBLAS kernels").
    env["OPENBLAS_CORETYPE"] = env.get("OPENBLAS_CORETYPE", "SkylakeX")
    return env


def run_multinode(build_dir, quick, out, logs, run, binary):
    """zero-bench-gpt2 --stages 3 --mics-shard-size RANKS_PER_NODE per micro-batch setting.
    Returns {"runs": [records of each setting], "skipped": reason} and the seconds taken."""
    start = time.monotonic()
    result = {"runs": []}
    up = subprocess.run([CLUSTER, "up", str(NODES), "--rate", RATE, "--slots",
                         str(RANKS_PER_NODE)], capture_output=True, text=True)
    if up.returncode != 0:
        result["skipped"] = (up.stderr.strip() or up.stdout.strip()).splitlines()[-1]
        return result, time.monotonic() - start
    try:
        env = cluster_env()
        hostfile = os.path.join(env["ZERO_NETNS_STATE"], "hostfile")
        config = CONFIGS["quick" if quick else "full"]
        for m, global_batch in config["accumulation"]:
            path = os.path.join(out, f"multinode_gpt2_m{m}.json")
            cmd = [binary(build_dir, "zerorun"), "--hostfile", hostfile, "--",
                   binary(build_dir, "zero-bench-gpt2"), "--stages", "3", "--mics-shard-size",
                   str(RANKS_PER_NODE), "--link-counters", "zero-node", "--micro-batches", str(m),
                   "--global-batch", str(global_batch), *config["model"], *config["steps"],
                   "--json", path]
            run(cmd, os.path.join(logs, f"multinode_gpt2_m{m}.txt"), env=env)
            with open(path) as f:
                result["runs"].append(json.load(f))
    finally:
        subprocess.run([CLUSTER, "down"], capture_output=True)
    return result, time.monotonic() - start


def pairs(multinode):
    """(stage 3 record, MiCS record) per micro-batch setting."""
    out = []
    for records in multinode["runs"]:
        plain = next(r for r in records if not r.get("mics_shard_size"))
        mics = next(r for r in records if r.get("mics_shard_size"))
        out.append((plain, mics))
    return out


def verdict(met):
    return "met" if met else "**missed**"


def target_rows(multinode):
    label = (f"GPT-2 stage 3 step time / hybrid sharding's (MiCS, a shard group per node), "
             f"{NODES} nodes x {RANKS_PER_NODE} ranks, links {RATE}")
    if "skipped" in multinode:
        return [[label, f">= {MICS_TARGET}", "not measured: " + multinode["skipped"],
                 "not checked"]]
    rows = []
    for plain, mics in pairs(multinode):
        ratio = plain["median_step_ms"] / mics["median_step_ms"]
        rows.append([f"{label}, {plain['micro_batches']} micro-batch(es)", f">= {MICS_TARGET}",
                     f"{plain['median_step_ms']:.0f} / {mics['median_step_ms']:.0f} ms = "
                     f"{ratio:.2f}x", verdict(ratio >= MICS_TARGET)])
        for r, what in ((plain, "stage 3, hierarchical"), (mics, "MiCS")):
            measured, formula = r["link_bytes_per_step"], r["link_formula_bytes_per_step"]
            close = formula and abs(measured / formula - 1) <= FORMULA_TOLERANCE
            rows.append([f"bytes across nodes per step = formula ({what}, "
                         f"{r['micro_batches']} micro-batch(es))",
                         f"within {100 * FORMULA_TOLERANCE:.0f} %",
                         f"{measured / 1e6:.1f} MB vs {formula / 1e6:.1f} MB", verdict(close)])
    return rows


def markdown(multinode, table):
    md = [f"\n## Several nodes: stage 3 against hybrid sharding (zero-bench-gpt2, "
          f"{NODES} netns nodes)\n"]
    if "skipped" in multinode:
        md.append(f"Skipped: {multinode['skipped']}.\n")
        return md
    r0 = multinode["runs"][0][0]
    md.append(
        f"`scripts/netns_cluster.sh up {NODES} --rate {RATE}`: {NODES} network namespaces as "
        f"nodes of {RANKS_PER_NODE} ranks, their links shaped to {RATE} each way; "
        f"`zerorun --hostfile` starts zero-bench-gpt2 on them. The GPT-2 is {r0['n_layer']} "
        f"layers x {r0['n_embd']} wide, vocabulary {r0['vocab_size']}, T = {r0['seq_len']}, "
        "fp32, micro-batches of 2 sequences per rank without gradient accumulation and of 1 "
        "with it. Stage 3 over all "
        f"{r0['world_size']} ranks (hierarchical collectives) and hybrid sharding with "
        f"mics_shard_size {RANKS_PER_NODE} (all-gathers and reduce-scatters inside the node, "
        "each gradient shard summed with its replica on the other node) alternate round by "
        "round in one run. With gradient accumulation stage 3 gathers and reduces across the "
        "nodes every micro-batch, while hybrid sharding sums across replicas once per step, as "
        "MiCS does at the accumulation boundary. link MB is what the links carried per step "
        "(transmit counters); the formula is what should cross.\n\n")
    rows = []
    for plain, mics in pairs(multinode):
        for r, what in ((plain, "stage 3"), (mics, f"MiCS k={RANKS_PER_NODE}")):
            rows.append([f"{r['micro_batches']} (global batch {r['global_batch']})", what,
                         f"{r['median_step_ms']:.0f}",
                         f"{r['compute_ms']:.0f}", f"{r['exposed_comm_ms']:.0f}",
                         f"{r['link_bytes_per_step'] / 1e6:.1f}",
                         f"{r['link_formula_bytes_per_step'] / 1e6:.1f}",
                         f"{plain['median_step_ms'] / r['median_step_ms']:.2f}"])
    md.append(table(["micro-batches", "sharding", "step ms", "compute ms", "exposed comm ms",
                     "link MB/step", "formula MB/step", "stage 3 / this"], rows))
    return md
