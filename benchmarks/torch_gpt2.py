#!/usr/bin/env python3
"""The GPT-2 of zero-bench-gpt2 in PyTorch eager, on the CPU, fp32: the yardstick of issue 14's
target (at 1 rank, fp32, at least 1.5x PyTorch's tokens/s).

The same model as models/gpt2.h (token and position embeddings, pre-LN blocks with one fused QKV
matrix, causal attention, GELU with the tanh approximation, a 4x MLP, final LayerNorm, LM head
tied to the token embedding, mean cross-entropy), the same sizes and data (synthetic token ids,
uniform over the vocabulary), the same threads (torch.set_num_threads for PyTorch's own kernels,
OPENBLAS_NUM_THREADS for the OpenBLAS its matrix products call: torch.set_num_threads leaves
OpenBLAS's pthreads pool at one thread per core), and a whole training
step: forward, backward, torch.optim.AdamW step (weight decay on the matrices only, as
zero-train's default), zero_grad. Timed as zero-bench-gpt2 times: the median step after warm-up.

  torch_gpt2.py [--n-layer 6] [--n-embd 384] [--n-head 6] [--vocab-size 50257] [--seq-len 256]
                [--batch 8] [--threads 1] [--steps 2] [--warmup 1] [--bf16-autocast]
                [--json PATH]

--bf16-autocast runs the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16),
PyTorch's mixed precision on the CPU (its matrix products in bf16; weights, gradients and the
optimizer in fp32): the yardstick of our bf16 step.

Prints "torch_gpt2: tokens_per_s X" and, with --json, writes a record with the same keys. When
this python3 has no torch it prints "torch_gpt2: skipped: ..." and writes {"skipped": reason}:
exit status 0 either way, so a report can say why there is no comparison.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--n-head", type=int, default=6)
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bf16-autocast", action="store_true",
                   help='forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)')
    p.add_argument("--json")
    return p.parse_args()


def write_json(path, record):
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=1)


def openblas_threads():
    """Threads of the OpenBLAS loaded in this process (torch's matrix products), or None when
    torch runs another BLAS."""
    try:
        return ctypes.CDLL("libopenblas.so.0").openblas_get_num_threads()
    except (OSError, AttributeError):
        return None


def build_model(torch, args):
    nn = torch.nn
    F = torch.nn.functional
    C, H, T = args.n_embd, args.n_head, args.seq_len
    # torch 2.0 has a fused attention; 1.x gets the explicit one, as nanoGPT falls back to.
    fused_attention = hasattr(F, "scaled_dot_product_attention")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=1e-5)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C, eps=1e-5)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)
            # A constant, not a buffer: DDP (torch_ddp_zero_gpt2.py) broadcasts buffers, and
            # gloo cannot broadcast bool tensors.
            self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

        def attention(self, x):
            B = x.shape[0]
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if fused_attention:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
                att = att.masked_fill(~self.mask, float("-inf")).softmax(dim=-1)
                y = att @ v
            return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

        def forward(self, x):
            x = x + self.attention(self.ln_1(x))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab_size, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(args.n_layer))
            self.ln_f = nn.LayerNorm(C, eps=1e-5)
            for p in self.parameters():
                if p.dim() >= 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # the head tied to the embedding
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    return Gpt2(), fused_attention


def main():
    args = parse_args()
    # OpenBLAS sizes its thread pool when it loads, from this variable; set before torch loads it.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    try:
        import torch
    except ImportError as e:
        reason = f"{sys.executable} has no torch ({e})"
        print(f"torch_gpt2: skipped: {reason}")
        write_json(args.json, {"skipped": reason})
        return 0
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    blas_threads = openblas_threads()
    if blas_threads not in (None, args.threads):
        print(f"torch_gpt2: error: OpenBLAS runs {blas_threads} threads, not {args.threads}",
              file=sys.stderr)
        return 1
    model, fused_attention = build_model(torch, args)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=1e-4)
    gen = torch.Generator().manual_seed(args.seed)
    times, loss = [], float("nan")
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(args.vocab_size, (args.batch, args.seq_len + 1), generator=gen)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16_autocast):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed)
    step_s = statistics.median(times)
    params = sum(p.numel() for p in model.parameters())
    record = {
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "autocast": "bf16" if args.bf16_autocast else None,
        "openblas_threads": blas_threads,
        "fused_attention": fused_attention, "params": params, "n_layer": args.n_layer,
        "n_embd": args.n_embd, "n_head": args.n_head, "vocab_size": args.vocab_size,
        "seq_len": args.seq_len, "batch": args.batch, "steps": len(times),
        "step_ms": [round(t * 1000, 3) for t in times], "median_step_ms": round(step_s * 1000, 3),
        "tokens_per_s": round(args.batch * args.seq_len / step_s, 2), "final_loss": loss.item(),
    }
    print(f"torch_gpt2: torch {torch.__version__}, {params} params, {record['threads']} "
          f"thread(s), {'bf16 autocast' if args.bf16_autocast else 'fp32'}, median step {record['median_step_ms']:.1f} ms")
    print(f"torch_gpt2: tokens_per_s {record['tokens_per_s']}")
    write_json(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
