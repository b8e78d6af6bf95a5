#!/usr/bin/env python3
"""The GPT-2 of zero-torch-gpt2 --bench trained by PyTorch's own data parallelism: DDP over gloo
with torch.distributed.optim.ZeroRedundancyOptimizer(AdamW) sharding the optimizer state (ZeRO
stage 1 in PyTorch): issue 20's yardstick (the LibTorch GPT through our adapter at 2 ranks,
stage 3, must be faster per rank).

The model is torch_gpt2.py's (the same GPT-2 as examples/torch_gpt2 and models/gpt2.h; its
position embedding has seq-len rows, so run zero-torch-gpt2 with --block-size equal to
--seq-len for the same parameters), the sizes and flags zero-torch-gpt2's: a global batch of
--global-batch sequences split over the ranks, each rank's loss the mean over its rows (DDP
averages the gradients), AdamW with betas (0.9, 0.95), weight decay on the matrices only. Threads
are pinned as ours are (OPENBLAS_NUM_THREADS before torch loads OpenBLAS, torch.set_num_threads).
Timed as zero-torch-gpt2 --bench times: a warm-up round, then --rounds rounds of --steps steps,
each round started together (a barrier), and the median round's mean step.

Launched under mpirun or zerorun, one process per rank (OMPI_COMM_WORLD_RANK and _SIZE; without
them one rank); the gloo rendezvous is MASTER_ADDR:MASTER_PORT, by default 127.0.0.1 and a port
derived from Open MPI's job id, so that concurrent jobs do not collide.

  zerorun -np 2 -- python3 torch_ddp_zero_gpt2.py [--n-layer 2] [--n-embd 64] [--n-head 4]
      [--vocab-size 256] [--seq-len 32] [--global-batch 4] [--threads 1] [--steps 10]
      [--rounds 5] [--lr 1e-3] [--weight-decay 0.1] [--json PATH]

Rank 0 prints "torch_ddp_zero_gpt2: {record}" (tokens/s per rank, rank 0's and every rank's) and
writes it with --json. When this python3 has no torch, or torch has no torch.distributed with
gloo, it prints "torch_ddp_zero_gpt2: skipped: ..." and writes {"skipped": reason}: exit status
0 either way, so a report can say why there is no comparison.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import build_model, openblas_threads, write_json  # noqa: E402

PREFIX = "torch_ddp_zero_gpt2"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # zero-torch-gpt2's defaults.
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--global-batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--json")
    return p.parse_args()


def rendezvous_port():
    """A port from Open MPI's job id, the same on every rank of the job; MASTER_PORT wins."""
    job = os.environ.get("OMPI_MCA_ess_base_jobid", "0")
    return str(20000 + int(job) % 20000) if job.isdigit() else "29500"


def skip(rank, path, reason):
    if rank == 0:
        print(f"{PREFIX}: skipped: {reason}")
        write_json(path, {"skipped": reason})
    return 0


def main():
    args = parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if args.global_batch % world != 0:
        print(f"{PREFIX}: error: --global-batch {args.global_batch} is not divisible by "
              f"{world} ranks", file=sys.stderr)
        return 2
    # OpenBLAS sizes its thread pool when it loads, from this variable; set before torch loads it.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    try:
        import torch
    except ImportError as e:
        return skip(rank, args.json, f"{sys.executable} has no torch ({e})")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        return skip(rank, args.json, f"torch {torch.__version__} in {sys.executable} has no "
                    "torch.distributed with the gloo backend")
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(args.threads)
    blas_threads = openblas_threads()
    if blas_threads not in (None, args.threads):
        print(f"{PREFIX}: error: OpenBLAS runs {blas_threads} threads, not {args.threads}",
              file=sys.stderr)
        return 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", rendezvous_port())
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        record = train(torch, dist, DistributedDataParallel, ZeroRedundancyOptimizer, args, rank,
                       world, blas_threads)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(f"{PREFIX}: torch {record['torch']}, {record['params']} params, {world} rank(s), "
              f"median step {record['step_ms']:.1f} ms")
        print(f"{PREFIX}: tokens_per_s_per_rank {record['tokens_per_s_per_rank']}")
        write_json(args.json, record)
    return 0


def train(torch, dist, ddp_class, zero_class, args, rank, world, blas_threads):
    torch.manual_seed(1)
    model, fused_attention = build_model(torch, args)
    ddp = ddp_class(model)  # broadcasts rank 0's parameters
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = zero_class([{"params": decay, "weight_decay": args.weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}],
                     optimizer_class=torch.optim.AdamW, lr=args.lr, betas=(0.9, 0.95))
    per_rank = args.global_batch // world
    first = rank * per_rank
    step_s, loss, step = [], float("nan"), 0
    for round_index in range(args.rounds + 1):  # round 0 warms up, unmeasured
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            gen = torch.Generator().manual_seed(step)
            step += 1
            tokens = torch.randint(args.vocab_size, (args.global_batch, args.seq_len + 1),
                                   generator=gen)[first:first + per_rank]
            loss = ddp(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if round_index > 0:
            step_s.append((time.perf_counter() - start) / args.steps)
    median_s = statistics.median(step_s)
    tokens_per_s = per_rank * args.seq_len / median_s
    every_rank = [None] * world
    dist.all_gather_object(every_rank, round(tokens_per_s, 2))
    return {
        "torch": torch.__version__, "world_size": world, "backend": "gloo",
        "optimizer": "ZeroRedundancyOptimizer(AdamW)", "threads": torch.get_num_threads(),
        "openblas_threads": blas_threads, "fused_attention": fused_attention,
        "params": sum(p.numel() for p in model.parameters()), "n_layer": args.n_layer,
        "n_embd": args.n_embd, "n_head": args.n_head, "vocab_size": args.vocab_size,
        "seq_len": args.seq_len, "global_batch": args.global_batch, "rounds": args.rounds,
        "steps": args.steps, "step_ms": round(median_s * 1000, 3),
        "tokens_per_s_per_rank": round(tokens_per_s, 2), "tokens_per_s_by_rank": every_rank,
        "final_loss": loss.item(),
    }


if __name__ == "__main__":
    sys.exit(main())
