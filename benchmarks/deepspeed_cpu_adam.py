#!/usr/bin/env python3
"""Our fused AdamW against DeepSpeed's CPUAdam, side by side in one process.

DeepSpeed's CPUAdam is built from the deepspeed package's own sources (csrc/adam/cpu_adam*.cpp
and csrc/includes, as its op_builder compiles them: -O3 -march=native -fopenmp and the SIMD
width the CPU has) with torch.utils.cpp_extension; ours is benchmarks/deepspeed/zero_adamw_ext.cpp
linked against the build's libzero_kernels.a. Both update the same fp32 tensors (AdamW, decoupled
weight decay 0.01, bias correction), alternating step by step, at each thread count; a STREAM
triad moving the same 28 bytes per parameter runs in the same rotation as the yardstick, and so
does AdamW's own traffic without its arithmetic (read p, g, m, v, write p, m, v, an add each): the
most any fp32 AdamW can reach here, so traffic / DeepSpeed bounds the ratio ours / DeepSpeed.

  benchmarks/deepspeed_cpu_adam.py --deepspeed-src DIR   DIR holds csrc/ (an unpacked sdist, or
                                                        an installed deepspeed/ops)
  benchmarks/deepspeed_cpu_adam.py --deepspeed-src deepspeed-X.tar.gz
  benchmarks/deepspeed_cpu_adam.py [--params 64] [--threads 1,2] [--reps 8] [--json PATH]
                                   [--no-fetch]

Without --deepspeed-src it looks for an installed deepspeed package's csrc, then for DeepSpeed
DEEPSPEED_VERSION's sdist in $XDG_CACHE_HOME/zero (~/.cache/zero), which it downloads there on
first use (pip download deepspeed==DEEPSPEED_VERSION --no-deps --no-binary :all:) unless
--no-fetch (benchmarks/report --quick: the test suite's path reaches no network). Exits 0 with a
line starting "skipped:" when torch, pybind11's headers or the DeepSpeed sources are missing
(offline, with nothing cached).
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BYTES_PER_PARAM = 28  # read param, grad, m, v; write param, m, v (fp32)
# The DeepSpeed whose CPUAdam BENCHMARKS.md reports, fetched when none is given or installed.
DEEPSPEED_VERSION = "0.19.8"


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(0)


def cache_dir():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "zero")


def unpacked_csrc(sdist):
    """The sdist's csrc/ unpacked once into the cache, by the archive's name: the same paths on
    every run, so that torch's extension build (ninja) reuses its objects instead of compiling
    DeepSpeed's CPUAdam again (about a minute)."""
    unpacked = os.path.join(cache_dir(), "unpacked", os.path.basename(sdist))
    if not os.path.isdir(unpacked):
        os.makedirs(os.path.dirname(unpacked), exist_ok=True)
        partial = tempfile.mkdtemp(prefix="partial-", dir=os.path.dirname(unpacked))
        with tarfile.open(sdist) as tar:
            tar.extractall(partial, members=[m for m in tar.getmembers() if "/csrc/" in m.name])
        os.replace(partial, unpacked)
    return [os.path.join(unpacked, d) for d in os.listdir(unpacked)]


def find_deepspeed_csrc(given):
    """The directory holding csrc/adam and csrc/includes, or None."""
    candidates = []
    if given:
        if os.path.isfile(given) and tarfile.is_tarfile(given):
            candidates += unpacked_csrc(given)
        candidates += [given, os.path.join(given, "deepspeed", "ops")]
    else:
        spec = importlib.util.find_spec("deepspeed")
        if spec and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                candidates += [os.path.join(location, "ops"), os.path.dirname(location)]
    for candidate in candidates:
        if os.path.isfile(os.path.join(candidate, "csrc", "adam", "cpu_adam_impl.cpp")):
            return os.path.join(candidate, "csrc")
    return None


def cached_deepspeed_sdist(fetch):
    """DeepSpeed DEEPSPEED_VERSION's sdist in the cache, downloaded by pip when missing and
    `fetch`; skips with the reason when it cannot be had (no network, or not to fetch)."""
    cache = cache_dir()
    sdist = os.path.join(cache, f"deepspeed-{DEEPSPEED_VERSION}.tar.gz")
    if os.path.isfile(sdist):
        return sdist
    if not fetch:
        skip(f"DeepSpeed {DEEPSPEED_VERSION}'s sources are not in {cache} and --no-fetch was "
             "given: run benchmarks/deepspeed_cpu_adam.py once online, or pass --deepspeed-src")
    os.makedirs(cache, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"deepspeed=={DEEPSPEED_VERSION}", "--no-deps",
           "--no-binary", ":all:", "--disable-pip-version-check", "-d", cache]
    print(f"fetching DeepSpeed {DEEPSPEED_VERSION}'s sources into {cache}: {' '.join(cmd)}",
          flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        skip(f"could not download DeepSpeed {DEEPSPEED_VERSION}'s sources ({e}); pass "
             "--deepspeed-src with its sdist")
    if done.returncode != 0 or not os.path.isfile(sdist):
        lines = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        skip(f"could not download DeepSpeed {DEEPSPEED_VERSION}'s sources (offline?): pip said "
             f"'{lines[-1]}'; pass --deepspeed-src with its sdist")
    return sdist


def pybind11_headers_found(torch):
    """Whether torch's extension build will find pybind11.h (Debian's torch does not ship it)."""
    from torch.utils.cpp_extension import include_paths
    for directory in include_paths() + ["/usr/include", "/usr/local/include"]:
        if os.path.isfile(os.path.join(directory, "pybind11", "pybind11.h")):
            return True
    return False


def simd_flag():
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return "-D__AVX512__" if "avx512" in flags else "-D__AVX256__"


def build_extensions(csrc, build_dir, verbose):
    from torch.utils.cpp_extension import load
    library = os.path.join(build_dir, "lib", "libzero_kernels.a")
    if not os.path.exists(library):
        raise SystemExit(f"{library} is missing: build the zero_kernels target first")
    ds = load(name="ds_cpu_adam_bench",
              sources=[os.path.join(csrc, "adam", "cpu_adam.cpp"),
                       os.path.join(csrc, "adam", "cpu_adam_impl.cpp")],
              extra_include_paths=[os.path.join(csrc, "includes")],
              # C++17: DeepSpeed's simd.h uses std::is_same_v, and torch 1.13's load() would
              # otherwise add -std=c++14 (DeepSpeed's own builders ask for C++17 on torch < 2.12).
              extra_cflags=["-O3", "-g", "-Wno-reorder", "-march=native", "-fopenmp", "-std=c++17",
                            simd_flag()],
              extra_ldflags=["-fopenmp"], verbose=verbose)
    # ninja relinks when its command lines change, not when a library named in them does: the
    # library's size and time in a define make a rebuilt libzero_kernels.a a new command line.
    library_stamp = os.stat(library)
    ours = load(name="zero_adamw_bench",
                sources=[os.path.join(ROOT, "benchmarks", "deepspeed", "zero_adamw_ext.cpp")],
                extra_include_paths=[os.path.join(ROOT, "kernels", "include"),
                                     os.path.join(ROOT, "core", "include")],
                extra_cflags=["-O3", "-std=c++17", f"-DZERO_KERNELS_LIBRARY_STAMP="
                              f"{library_stamp.st_size}_{library_stamp.st_mtime_ns}"],
                extra_ldflags=[library, "-lpthread"], verbose=verbose)
    return ds, ours


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed-src")
    parser.add_argument("--build-dir", default=os.environ.get("ZERO_BUILD_DIR",
                                                              os.path.join(ROOT, "build")))
    parser.add_argument("--params", type=int, default=64, help="Mi parameters")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--json")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--no-fetch", action="store_true",
                        help="use DeepSpeed's sdist only if cached, never download it")
    args = parser.parse_args()
    # DeepSpeed's loop is an OpenMP parallel for, and GNU OpenMP's idle threads spin for a while
    # after it returns, on the cores the next kernel in the rotation needs: at 2 threads that
    # cost ours 15 % here (1235 against 1453 Mparam/s right after DeepSpeed's call) and left
    # DeepSpeed's own speed as it was (1263 and 1245). Idle threads that sleep (read by libgomp
    # when torch loads it) make the rotation measure each kernel alone, as the triad already is.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch
    except ImportError:
        skip("python3 has no torch (pip install torch), so DeepSpeed's CPUAdam cannot be built")
    if not pybind11_headers_found(torch):
        skip("pybind11's headers are missing (apt-get install pybind11-dev): torch's C++ "
             "extensions, DeepSpeed's CPUAdam among them, include them")
    csrc = find_deepspeed_csrc(args.deepspeed_src)
    if csrc is None and not args.deepspeed_src:
        csrc = find_deepspeed_csrc(cached_deepspeed_sdist(fetch=not args.no_fetch))
    if csrc is None:
        where = args.deepspeed_src or "the cached sdist"
        skip(f"no DeepSpeed sources (csrc/adam/cpu_adam_impl.cpp) in {where}: pass "
             "--deepspeed-src with the deepspeed sdist (pip download deepspeed --no-deps "
             "--no-binary :all:) or its unpacked directory")
    ds, ours = build_extensions(csrc, args.build_dir, args.verbose)

    n = args.params << 20
    lr, beta1, beta2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.01
    ds.create_adam(0, lr, beta1, beta2, eps, wd, True, False)
    state = {}
    for who in ("deepspeed", "zero"):
        state[who] = [torch.rand(n) * 2 - 1, torch.rand(n) * 2 - 1, torch.zeros(n), torch.zeros(n)]
    triad_n = n * BYTES_PER_PARAM // 12
    triad_arrays = [torch.zeros(triad_n), torch.ones(triad_n), torch.full((triad_n,), 2.0)]
    traffic_arrays = [torch.zeros(n), torch.full((n,), 1e-3), torch.zeros(n), torch.zeros(n)]
    step = {"deepspeed": 0, "zero": 0}

    def run(who, threads):
        if who == "triad":
            ours.triad(*triad_arrays, 3.0, threads)
            return
        if who == "traffic":
            ours.adamw_traffic(*traffic_arrays, threads)
            return
        step[who] += 1
        p, g, m, v = state[who]
        if who == "deepspeed":
            ds.adam_update(0, step[who], lr, beta1, beta2, eps, wd, True, p, g, m, v)
        else:
            ours.adamw(p, g, m, v, step[who], lr, beta1, beta2, eps, wd, threads)

    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)  # DeepSpeed's OpenMP loop follows torch's thread count
        times = {"deepspeed": [], "zero": [], "triad": [], "traffic": []}
        for who in times:
            run(who, threads)  # warm-up
        for _ in range(args.reps):
            for who in times:
                start = time.perf_counter()
                run(who, threads)
                times[who].append(time.perf_counter() - start)
        ratios = [d / z for d, z in zip(times["deepspeed"], times["zero"])]
        row = {"params": n, "threads": threads,
               "zero_over_deepspeed_median": statistics.median(ratios),
               "zero_over_deepspeed_best": min(times["deepspeed"]) / min(times["zero"])}
        for who, t in times.items():
            row[who] = {"best_mparams": n / min(t) / 1e6,
                        "median_mparams": n / statistics.median(t) / 1e6,
                        "best_GBps": BYTES_PER_PARAM * n / min(t) / 1e9,
                        "median_GBps": BYTES_PER_PARAM * n / statistics.median(t) / 1e9}
        for who in ("deepspeed", "zero", "traffic"):
            row[who]["vs_triad_best"] = row[who]["best_GBps"] / row["triad"]["best_GBps"]
        for who in ("deepspeed", "zero"):
            row[who]["vs_traffic_best"] = row[who]["best_GBps"] / row["traffic"]["best_GBps"]
        row["traffic_over_deepspeed_best"] = min(times["deepspeed"]) / min(times["traffic"])
        results.append(row)

    print(f"torch {torch.__version__}, DeepSpeed sources {csrc}, {args.params}Mi fp32 params, "
          f"{args.reps} alternating reps, OMP_WAIT_POLICY {os.environ['OMP_WAIT_POLICY']}")
    print(f"{'threads':>7s} {'impl':>10s} {'best Mp/s':>10s} {'med Mp/s':>10s} {'best GB/s':>10s} "
          f"{'vs triad':>9s} {'vs traffic':>10s}")
    for row in results:
        for who in ("deepspeed", "zero", "triad", "traffic"):
            r = row[who]
            print(f"{row['threads']:7d} {who:>10s} {r['best_mparams']:10.0f} "
                  f"{r['median_mparams']:10.0f} {r['best_GBps']:10.2f} "
                  f"{r.get('vs_triad_best', 1.0):9.2f} {r.get('vs_traffic_best', 1.0):10.2f}")
        print(f"{row['threads']:7d} zero/deepspeed: {row['zero_over_deepspeed_median']:.2f} "
              f"(median of pairs), {row['zero_over_deepspeed_best']:.2f} (best against best); "
              f"at most {row['traffic_over_deepspeed_best']:.2f} (AdamW's traffic alone against "
              f"DeepSpeed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "bytes_per_param": BYTES_PER_PARAM,
                       "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
