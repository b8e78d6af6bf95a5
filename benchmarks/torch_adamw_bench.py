#!/usr/bin/env python3
"""torch.optim.AdamW(fused=True) on one fp32 parameter of N elements, timed like
zero-bench-optimizer-gpu: median of CUDA-event-timed steps after warm-up, GB/s at 28 bytes per
parameter (param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written).

usage: torch_adamw_bench.py [--sizes 16,64,256] [--reps 20] [--json PATH]   (sizes in Mi params)
"""
import argparse
import json
import statistics

import torch


def median_ms(step, reps):
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="16,64,256")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device")
    results = []
    for mi in (int(s) for s in args.sizes.split(",")):
        n = mi << 20
        param = torch.nn.Parameter(torch.rand(n, device="cuda") * 2 - 1)
        param.grad = torch.rand(n, device="cuda") * 2 - 1
        opt = torch.optim.AdamW([param], lr=1e-4, weight_decay=0.01, fused=True)
        ms = median_ms(opt.step, args.reps)
        results.append({"variant": "torch_adamw_fused_fp32", "params": n, "ms": ms,
                        "GBps": 28.0 * n / (ms * 1e6)})
        del opt, param
        torch.cuda.empty_cache()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print(f"{'variant':26s} {'params':>12s} {'ms':>10s} {'GB/s':>10s}")
    for r in results:
        print(f"{r['variant']:26s} {r['params']:12d} {r['ms']:10.3f} {r['GBps']:10.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                       "bytes_per_param": 28, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
