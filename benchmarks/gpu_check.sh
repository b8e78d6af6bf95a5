#!/usr/bin/env bash
# The GPU check, for a machine with a CUDA device: the GPU tests, the example MLP trained on the
# GPU, then the GPU optimizer benchmark against a device-to-device copy and against
# torch.optim.AdamW(fused=True) when python3 has torch. Everything (logs, JSON, a summary) goes
# to OUTDIR. Meant to finish within 8 minutes on one H200.
#
#   bash benchmarks/gpu_check.sh OUTDIR
#       builds the CUDA tree there ($ZERO_GPU_BUILD_DIR or /tmp/zero-gpu-build) and runs
#       ctest -L gpu. Where the project's other dependencies (MPI, protobuf, GoogleTest) are
#       missing, the build fails; the benchmark is then built alone with nvcc (it needs CUDA
#       only), the tests are reported as not run, and the script still measures.
#   bash BUNDLE/gpu_check.sh --bundle BUNDLE OUTDIR
#       runs the programs scripts/gpu_bundle.sh built elsewhere and packed with the libraries
#       the GPU machine lacks: no build there, each program a single MPI rank without mpirun.
set -uo pipefail
bundle=""
if [[ $# -eq 3 && "$1" == "--bundle" ]]; then
  bundle="$(cd "$2" && pwd)"
  shift 2
elif [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR  |  $0 --bundle BUNDLE_DIR OUTDIR" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
build="${ZERO_GPU_BUILD_DIR:-/tmp/zero-gpu-build}"
summary="$out/summary.txt"
arch="${CUDA_ARCH:-90}"
status=0

note() { echo "$*" | tee -a "$summary"; }
: > "$summary"
if [[ -n "$bundle" ]]; then
  note "gpu_check: $(date -u +%FT%TZ), bundle $bundle"
else
  note "gpu_check: $(date -u +%FT%TZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"

# One rank of an MPI program: through mpirun where the build is here, alone (an MPI singleton,
# OpenMPI's orted from the bundle serving it) for the bundle.
one_rank=()
if [[ -z "$bundle" ]]; then
  one_rank=(mpirun -np 1)
  [[ $(id -u) -eq 0 ]] && one_rank+=(--allow-run-as-root)
fi

system_library_path="${LD_LIBRARY_PATH:-}"
python=(python3)
if [[ -n "$bundle" ]]; then
  # 1. The bundle's libraries first, then CUDA's: the toolkit's and the pip packages' (torch's).
  cuda_dirs=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = {d for r in roots for p in ("nvidia/*/lib", "nvidia/*/*/lib") for d in glob.glob(os.path.join(r, p))}
print(":".join(sorted(dirs)))
PY
  )
  # PyTorch keeps the machine's own libraries: the bundle's are for our programs only.
  python=(env "LD_LIBRARY_PATH=$system_library_path" python3)
  export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$bundle/mpi"
  bin="$bundle/bin"
  bench="$bin/zero-bench-optimizer-gpu"
  missing=$(for program in "$bin"/*; do ldd "$program" | grep "not found"; done | sort -u)
  if [[ -n "$missing" ]]; then
    note "bundle: libraries not found on this machine:"
    note "$missing"
    status=1
  fi
  # 2. The GPU tests, one program each.
  for test in cuda_kernels_test transformer_kernels_gpu_test cuda_stream_test nccl_communicator_test \
              engine_gpu_test memory_timeline_gpu_test; do
    start=$SECONDS
    if timeout 180 "$bin/$test" > "$out/$test.log" 2>&1; then
      note "$test: passed in $((SECONDS - start)) s ($(grep -E '^\[ +(PASSED|SKIPPED) +\] [0-9]+ tests?' "$out/$test.log" | tr -s ' ' | paste -sd ' '))"
    else
      note "$test: FAILED (see $test.log)"
      grep -E "^\[  FAILED  \]|Failure|error" "$out/$test.log" | head -20 | tee -a "$summary"
      status=1
    fi
  done
  # What one query of the driver's memory costs: the memory timeline makes one per allocation.
  grep -h "^driver_memory(): " "$out/memory_timeline_gpu_test.log" | tee -a "$summary"
  # The GPT-2 trained on the GPU at every stage against PyTorch (tests/models/gpt2_golden.sh),
  # as it is and with full recomputation from checkpoints in pinned host memory.
  for variant in plain cpu_checkpoints; do
    flags=()
    if [ "$variant" = cpu_checkpoints ]; then
      flags=(--activation-checkpointing full --cpu-checkpointing true)
    fi
    start=$SECONDS
    if timeout 300 bash "$root/tests/models/gpt2_golden.sh" "$bin" 1 --device cuda "${flags[@]}" \
         -- > "$out/gpt2_golden_gpu_$variant.log" 2>&1; then
      note "gpt2_golden_gpu ($variant): passed in $((SECONDS - start)) s"
    else
      note "gpt2_golden_gpu ($variant): FAILED (see gpt2_golden_gpu_$variant.log)"
      grep -E "FAIL|error" "$out/gpt2_golden_gpu_$variant.log" | head -20 | tee -a "$summary"
      status=1
    fi
  done
else
  # 1. Build. One architecture keeps it short; the whole tree, so every gpu-labelled test is there.
  start=$SECONDS
  bin="$build/bin"
  bench="$bin/zero-bench-optimizer-gpu"
  if cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZERO_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES="$arch" > "$out/build.log" 2>&1 &&
     cmake --build "$build" -j "$(nproc)" >> "$out/build.log" 2>&1; then
    note "build: ok in $((SECONDS - start)) s"
    # 2. The GPU tests.
    start=$SECONDS
    if ctest --test-dir "$build" -L gpu --output-on-failure --timeout 180 > "$out/ctest.log" 2>&1; then
      note "ctest -L gpu: passed in $((SECONDS - start)) s"
    else
      note "ctest -L gpu: FAILED (see ctest.log)"
      status=1
    fi
    grep -E "tests passed|Skipped|Failed|\*\*\*" "$out/ctest.log" | tee -a "$summary"
  else
    note "build: the CMake build failed (see build.log); tests not run; building the benchmark alone"
    status=1
    mkdir -p "$build"
    bench="$build/zero-bench-optimizer-gpu-standalone"
    nvcc -O3 -std=c++17 -arch="sm_$arch" --fmad=false -I "$root/kernels/include" \
      "$root/benchmarks/bench_optimizer_gpu.cu" "$root"/kernels/cuda/*.cu -o "$bench" \
      >> "$out/build.log" 2>&1 || { note "standalone benchmark build failed too"; exit 1; }
  fi
fi

# 2b. The example MLP trained on the GPU through the engine (NCCL, CUDA kernels, cuBLAS): one
# rank, bf16, a model big enough for the GPU to matter, at stage 0 and stage 3; the ratio of their
# median step times (past 5 warm-up steps, host data making left out) is the engine's stage-3
# overhead on one GPU.
if [[ -x "$bin/zero-train" ]]; then
  for stage in 0 3; do
    if timeout 120 "${one_rank[@]}" "$bin/zero-train" --device cuda --stage "$stage" \
         --dtype bf16 --input-dim 1024 --hidden 4096 --output-dim 1024 --layers 8 \
         --global-batch 512 --steps 30 --steps-per-print 10 \
         --metrics "$out/zero_train_gpu_stage$stage.jsonl" > "$out/zero_train_gpu_stage$stage.log" 2>&1; then
      note "zero-train --device cuda, stage $stage (bf16, 8 x 4096 MLP):"
      grep -E "^step" "$out/zero_train_gpu_stage$stage.log" | tee -a "$summary"
    else
      note "zero-train --device cuda at stage $stage FAILED (see zero_train_gpu_stage$stage.log)"
      status=1
    fi
  done
  if [[ -f "$out/zero_train_gpu_stage0.jsonl" && -f "$out/zero_train_gpu_stage3.jsonl" ]]; then
    python3 - "$out" <<'PY' 2>&1 | tee -a "$summary"
import json, os, statistics, sys
def median_ms(stage):
    rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], f"zero_train_gpu_stage{stage}.jsonl"))]
    # The batch is made on the host (data_ms): leave it out, it is not the engine's time.
    return statistics.median(r["step_ms"] - r["data_ms"] for r in rows
                             if r.get("event") == "step" and r["step"] > 5)
s0, s3 = median_ms(0), median_ms(3)
print(f"step time on one GPU without data: stage 0 {s0:.2f} ms, stage 3 {s3:.2f} ms, "
      f"ratio {s3 / s0:.3f}")
PY
  fi
fi

# 3. Fused AdamW against the copy of the same bytes.
if timeout 240 "$bench" --json "$out/bench_optimizer_gpu.json" > "$out/bench_optimizer_gpu.log" 2>&1; then
  cat "$out/bench_optimizer_gpu.log" >> "$summary"
else
  note "zero-bench-optimizer-gpu FAILED (see bench_optimizer_gpu.log)"
  status=1
fi

# 4. PyTorch's fused AdamW on the same sizes, when python3 has torch with CUDA.
if "${python[@]}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  torch_bench="$root/benchmarks/torch_adamw_bench.py"
  [[ -n "$bundle" ]] && torch_bench="$bundle/torch_adamw_bench.py"
  if timeout 150 "${python[@]}" "$torch_bench" --json "$out/torch_adamw.json" \
       > "$out/torch_adamw.log" 2>&1; then
    cat "$out/torch_adamw.log" >> "$summary"
  else
    note "torch_adamw_bench.py FAILED (see torch_adamw.log)"
    status=1
  fi
else
  note "note: python3 has no torch with CUDA here; the torch.optim.AdamW(fused=True) comparison is skipped"
fi

# 5. The targets of issue 5 at the largest size: >= 85% of the copy, faster than torch.
if [[ -f "$out/bench_optimizer_gpu.json" ]]; then
  python3 - "$out" <<'PY' 2>&1 | tee -a "$summary"
import json, os, sys
out = sys.argv[1]
ours = json.load(open(os.path.join(out, "bench_optimizer_gpu.json")))["results"]
largest = max(r["params"] for r in ours)
row = next(r for r in ours if r["variant"] == "adamw_fp32" and r["params"] == largest)
print(f"target: adamw_fp32 at {largest} params: {100 * row['fraction_of_copy']:.1f}% of the copy (want >= 85%)")
path = os.path.join(out, "torch_adamw.json")
if os.path.exists(path):
    torch_rows = json.load(open(path))["results"]
    t = next((r for r in torch_rows if r["params"] == largest), None)
    if t:
        print(f"target: {row['ms']:.3f} ms against torch fused {t['ms']:.3f} ms: {t['ms'] / row['ms']:.2f}x (want > 1)")
PY
fi
exit $status
