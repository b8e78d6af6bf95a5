"""The multi-node part of benchmarks/report (issues 23 and 38): the GPT-2 at stage 3 over every
rank against hybrid sharding with one shard group per node (MiCS, mics_shard_size = ranks per
node) and against ZeRO++ (qwZ, hpZ and qgZ, each alone and all three), on two network-namespace
nodes of two ranks joined by links shaped to 1 Gbit/s (scripts/netns_cluster.sh), alternating in
one zero-bench-gpt2 run, with and without gradient accumulation; the bytes that crossed between
the nodes per step against the formulas; and zero-train's GPT-2 on the `fortunes` text for 300
steps at stage 3, with hpZ and with all of ZeRO++, for the losses. Its section of BENCHMARKS.md
and its rows of the Targets table.

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
# Issue 38, ZeRO++ (all three) at one micro-batch: against stage 3 and against MiCS, and its
# bytes across nodes against stage 3's; its loss over the last 100 of 300 steps against stage 3's
# (DeepSpeed's nightly criterion).
ZEROPP_SPEEDUP_TARGET = 2.0
ZEROPP_MICS_TARGET = 1.3
ZEROPP_BYTES_TARGET = 0.3
ZEROPP_LOSS_TARGET = 1.1
ZEROPP_ALL = "qwz+hpz+qgz"
ZEROPP_SETTINGS = "qwz,hpz,qgz," + ZEROPP_ALL

# (micro-batches, global batch, ZeRO++ variants): one micro-batch of 2 sequences per rank, then
# gradient accumulation over micro-batches of 1 sequence per rank; and one micro-batch of 1
# sequence per rank, where the step holds half the compute and the same traffic.
# convergence: zero-train's steps and learning-rate warm-up.
CONFIGS = {
    "full": {"model": [], "steps": ["--steps", "4", "--rounds", "2"],
             "accumulation": [(1, 8, ZEROPP_SETTINGS), (2, 8, None), (4, 16, None),
                              (1, 4, ZEROPP_ALL)],
             "convergence": ["--steps", "300", "--warmup", "20"]},
    "quick": {"model": ["--n-layer", "1", "--n-embd", "64", "--n-head", "2", "--vocab-size", "512",
                        "--seq-len", "32"],
              "steps": ["--steps", "1", "--rounds", "1", "--warmup", "0"],
              "accumulation": [(1, 8, ZEROPP_SETTINGS), (2, 8, None)],
              "convergence": ["--steps", "4", "--warmup", "1"]},
}
CONVERGENCE_LAST = 100  # the steps whose mean loss is compared
# scripts/train.sh's GPT-2 and batch, on 2 nodes x 2 ranks at stage 3.
CONVERGENCE_TRAIN = ["--model", "gpt2", "--preset", "tiny", "--seq-len", "64", "--global-batch",
                     "16", "--lr", "1e-3", "--weight-decay", "0.1", "--schedule", "cosine",
                     "--clip", "1.0", "--steps-per-print", "50"]
# DeepSpeed's keys, per run of the convergence check.
CONVERGENCE_RUNS = {
    "stage 3": {},
    "hpZ": {"zero_hpz_partition_size": RANKS_PER_NODE},
    "qwZ + hpZ + qgZ": {"zero_quantized_weights": True,
                        "zero_hpz_partition_size": RANKS_PER_NODE,
                        "zero_quantized_gradients": True},
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


def fortunes_tokens(build_dir, out, logs, run, binary):
    """The `fortunes` text tokenized byte by byte as scripts/train.sh does: (train, validation)."""
    data = os.path.join(out, "data")
    train, val = os.path.join(data, "fortunes_train.bin"), os.path.join(data, "fortunes_val.bin")
    if not os.path.exists(train):
        root = "/usr/share/games/fortunes"
        texts = sorted(os.path.join(root, name) for name in os.listdir(root)
                       if not name.endswith((".dat", ".u8"))
                       and os.path.isfile(os.path.join(root, name)))
        run([binary(build_dir, "zero-tokenize"), *texts, "--out", train, "--val-out", val,
             "--val-fraction", "0.05"], os.path.join(logs, "fortunes_tokenize.txt"))
    return train, val


def read_losses(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r["loss"] for r in records if r.get("event") == "step"]


def run_convergence(build_dir, config, out, logs, run, binary, env, hostfile):
    """zero-train's GPT-2 on `fortunes` at stage 3, with hpZ, and with all of ZeRO++: the losses
    of each run, by name."""
    train, _ = fortunes_tokens(build_dir, out, logs, run, binary)
    losses = {}
    for name, keys in CONVERGENCE_RUNS.items():
        slug = name.replace(" + ", "_").replace(" ", "_").lower()
        config_path = os.path.join(out, f"multinode_convergence_{slug}.json")
        with open(config_path, "w") as f:
            json.dump({"zero_optimization": {"stage": 3, **keys}}, f)
        metrics = os.path.join(out, f"multinode_convergence_{slug}.jsonl")
        run([binary(build_dir, "zerorun"), "--hostfile", hostfile, "--",
             binary(build_dir, "zero-train"), "--config", config_path, *CONVERGENCE_TRAIN,
             *config["convergence"], "--data", train, "--metrics", metrics],
            os.path.join(logs, f"multinode_convergence_{slug}.txt"), env=env)
        losses[name] = read_losses(metrics)
    return losses


def run_multinode(build_dir, quick, out, logs, run, binary):
    """zero-bench-gpt2 --stages 3 --mics-shard-size RANKS_PER_NODE [--zeropp ...] per micro-batch
    setting, then the convergence runs. Returns {"runs": [records of each setting], "losses":
    {run: [loss per step]}, "skipped": reason} and the seconds taken."""
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
        for m, global_batch, zeropp in config["accumulation"]:
            name = f"multinode_gpt2_m{m}_b{global_batch}"
            path = os.path.join(out, name + ".json")
            cmd = [binary(build_dir, "zerorun"), "--hostfile", hostfile, "--",
                   binary(build_dir, "zero-bench-gpt2"), "--stages", "3", "--mics-shard-size",
                   str(RANKS_PER_NODE), *(["--zeropp", zeropp] if zeropp else []),
                   "--link-counters", "zero-node", "--micro-batches", str(m),
                   "--global-batch", str(global_batch), *config["model"], *config["steps"],
                   "--json", path]
            run(cmd, os.path.join(logs, name + ".txt"), env=env)
            with open(path) as f:
                result["runs"].append(json.load(f))
        result["losses"] = run_convergence(build_dir, config, out, logs, run, binary, env,
                                           hostfile)
        result["convergence"] = config["convergence"]
    finally:
        subprocess.run([CLUSTER, "down"], capture_output=True)
    return result, time.monotonic() - start


def plain_record(records):
    return next(r for r in records if not r.get("mics_shard_size") and not r.get("zeropp"))


def mics_record(records):
    return next(r for r in records if r.get("mics_shard_size"))


def zeropp_records(records):
    return [r for r in records if r.get("zeropp")]


def sharding_name(r):
    if r.get("zeropp"):
        return "ZeRO++ " + r["zeropp"]
    if r.get("mics_shard_size"):
        return f"MiCS k={r['mics_shard_size']}"
    return "stage 3"


def setting(r):
    return f"{r['micro_batches']} micro-batch(es) of global batch {r['global_batch']}"


def mean_last(losses):
    last = losses[-CONVERGENCE_LAST:]
    return sum(last) / len(last)


def verdict(met):
    return "met" if met else "**missed**"


def ratio_row(label, target, slower, faster):
    ratio = slower["median_step_ms"] / faster["median_step_ms"]
    return [label, f">= {target}", f"{slower['median_step_ms']:.0f} / "
            f"{faster['median_step_ms']:.0f} ms = {ratio:.2f}x", verdict(ratio >= target)]


def formula_row(r):
    measured, formula = r["link_bytes_per_step"], r["link_formula_bytes_per_step"]
    close = formula and abs(measured / formula - 1) <= FORMULA_TOLERANCE
    return [f"bytes across nodes per step = formula ({sharding_name(r)}, {setting(r)})",
            f"within {100 * FORMULA_TOLERANCE:.0f} %",
            f"{measured / 1e6:.1f} MB vs {formula / 1e6:.1f} MB", verdict(close)]


def zeropp_target_rows(records):
    """ZeRO++ (all three) against stage 3 and MiCS in one run, and its bytes across nodes."""
    plain, mics = plain_record(records), mics_record(records)
    rows = []
    for r in zeropp_records(records):
        if r["zeropp"] != ZEROPP_ALL:
            continue
        where = f"{NODES} nodes x {RANKS_PER_NODE} ranks, links {RATE}, {setting(r)}"
        rows.append(ratio_row(f"GPT-2 stage 3 step time / ZeRO++'s ({ZEROPP_ALL}), {where}",
                              ZEROPP_SPEEDUP_TARGET, plain, r))
        rows.append(ratio_row(f"GPT-2 MiCS step time / ZeRO++'s ({ZEROPP_ALL}), {where}",
                              ZEROPP_MICS_TARGET, mics, r))
        bytes_ratio = r["link_bytes_per_step"] / plain["link_bytes_per_step"]
        rows.append([f"GPT-2 bytes across nodes, ZeRO++ ({ZEROPP_ALL}) / stage 3, {where}",
                     f"<= {ZEROPP_BYTES_TARGET}", f"{r['link_bytes_per_step'] / 1e6:.1f} / "
                     f"{plain['link_bytes_per_step'] / 1e6:.1f} MB = {bytes_ratio:.2f}",
                     verdict(bytes_ratio <= ZEROPP_BYTES_TARGET)])
    return rows


def convergence_target_rows(losses):
    plain = losses["stage 3"]
    all_three = losses["qwZ + hpZ + qgZ"]
    ratio = mean_last(all_three) / mean_last(plain)
    last = min(CONVERGENCE_LAST, len(plain))
    return [[f"GPT-2 on fortunes, {len(plain)} steps, {NODES} nodes x {RANKS_PER_NODE} ranks: mean "
             f"loss of the last {last} steps, ZeRO++ ({ZEROPP_ALL}) / stage 3",
             f"<= {ZEROPP_LOSS_TARGET}",
             f"{mean_last(all_three):.4f} / {mean_last(plain):.4f} = {ratio:.4f}",
             verdict(ratio <= ZEROPP_LOSS_TARGET)],
            [f"GPT-2 on fortunes, {len(plain)} steps: hpZ's losses bitwise stage 3's",
             "every step equal", f"{sum(a == b for a, b in zip(losses['hpZ'], plain))} of "
             f"{len(plain)} steps equal", verdict(losses["hpZ"] == plain)]]


def target_rows(multinode):
    label = (f"GPT-2 stage 3 step time / hybrid sharding's (MiCS, a shard group per node), "
             f"{NODES} nodes x {RANKS_PER_NODE} ranks, links {RATE}")
    if "skipped" in multinode:
        return [[label, f">= {MICS_TARGET}", "not measured: " + multinode["skipped"],
                 "not checked"]]
    rows = []
    for records in multinode["runs"]:
        plain, mics = plain_record(records), mics_record(records)
        rows.append(ratio_row(f"{label}, {setting(plain)}", MICS_TARGET, plain, mics))
        rows += zeropp_target_rows(records)
        rows += [formula_row(r) for r in records]
    rows += convergence_target_rows(multinode["losses"])
    return rows


def markdown(multinode, table):
    md = [f"\n## Several nodes: stage 3 against hybrid sharding and ZeRO++ (zero-bench-gpt2, "
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
        "with it, and once more one micro-batch of 1 sequence per rank: half the compute, the "
        "same traffic. Stage 3 over all "
        f"{r0['world_size']} ranks (hierarchical collectives), hybrid sharding with "
        f"mics_shard_size {RANKS_PER_NODE} (all-gathers and reduce-scatters inside the node, "
        "each gradient shard summed with its replica on the other node) and ZeRO++ (`--zeropp`: "
        "qwZ, int8 parameter all-gathers with an fp32 scale per 4,096 values; hpZ, a secondary "
        "shard per node made from the forward's gather, so that later gathers of the step stay "
        "inside the node; qgZ, int8 gradient reduction in two all-to-all hops, within the node "
        "then across) alternate round by round in one run. With gradient accumulation stage 3 "
        "gathers and reduces across the nodes every micro-batch, while hybrid sharding sums "
        "across replicas once per step, as MiCS does at the accumulation boundary. link MB is "
        "what the links carried per step (transmit counters); the formula is what should cross: "
        "(nodes - 1) x each all-gather's and each exact reduction's buffer over all ranks, as "
        "the engine counted them (qwZ's int8 regions; hpZ's gathers inside the node are not "
        "among them), plus qgZ's second hop from every rank, or for MiCS the sums across "
        "replicas.\n\n")
    rows = []
    for records in multinode["runs"]:
        plain = plain_record(records)
        for r in [plain, mics_record(records)] + zeropp_records(records):
            rows.append([f"{r['micro_batches']} (global batch {r['global_batch']})",
                         sharding_name(r), f"{r['median_step_ms']:.0f}",
                         f"{r['compute_ms']:.0f}", f"{r['exposed_comm_ms']:.0f}",
                         f"{r['link_bytes_per_step'] / 1e6:.1f}",
                         f"{r['link_formula_bytes_per_step'] / 1e6:.1f}",
                         f"{plain['median_step_ms'] / r['median_step_ms']:.2f}"])
    md.append(table(["micro-batches", "sharding", "step ms", "compute ms", "exposed comm ms",
                     "link MB/step", "formula MB/step", "stage 3 / this"], rows))
    md.append(
        "\ncompute ms is the step less the engine's communication wait, mean over ranks. "
        "The 4 ranks share the machine's cores, so compute bounds what removing bytes can give: "
        "stage 3's step over its compute is the most any sharding can gain on it here.\n")
    losses = multinode["losses"]
    plain = losses["stage 3"]
    md.append(
        f"\nConvergence: `zero-train {' '.join(CONVERGENCE_TRAIN)} "
        f"{' '.join(multinode['convergence'])}` on "
        f"the `fortunes` text tokenized byte by byte (scripts/train.sh's job) at stage 3 on the "
        f"same {NODES} nodes, with DeepSpeed's keys in `zero_optimization`; the mean loss of the "
        f"last {min(CONVERGENCE_LAST, len(plain))} steps, as DeepSpeed's nightly ZeRO++ test "
        "compares it.\n\n")
    rows = []
    for name, run_losses in losses.items():
        equal = sum(a == b for a, b in zip(run_losses, plain))
        rows.append([name, f"{run_losses[0]:.4f}", f"{run_losses[-1]:.4f}",
                     f"{mean_last(run_losses):.4f}",
                     f"{mean_last(run_losses) / mean_last(plain):.4f}",
                     f"{equal} of {len(plain)}"])
    md.append(table(["run", "loss, step 1", "loss, last step", "mean loss, last steps",
                     "/ stage 3", "steps bitwise stage 3's"], rows))
    return md
