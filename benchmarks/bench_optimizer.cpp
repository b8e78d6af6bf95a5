// Fused AdamW on the CPU against the memory system's own speed: a STREAM triad that moves the
// same bytes. AdamW on a large shard does a few flops per 28 bytes of traffic, so the triad's
// bandwidth is the ceiling and bytes_per_s(AdamW) / bytes_per_s(triad) says how close we are.
//
//   zero-bench-optimizer --benchmark_filter='FusedAdamW_fp32/67108864/1|StreamTriad/67108864/1'
//
// Names end with /<params>/<threads>. Bytes counted per parameter (each array read once and
// written once, no write-allocate traffic since every written line was read first):
//   FusedAdamW_fp32            read master, m, v, fp32 grad (16) + write master, m, v (12) = 28
//   FusedAdamW_bf16_out_bf16   read master, m, v, bf16 grad (14) + write master, m, v (12)
//                              + write the bf16 working copy (2) = 28 (mixed precision)
//   FusedAdamW_fp16            read master, m, v, fp16 grad (14) + write master, m, v (12) = 26
// StreamTriad/<params>/<threads> runs a[i] = b[i] + s * c[i] over 28 * params / 12 floats per
// array, counted as STREAM counts it: 12 bytes per element (read b and c, write a), so it
// moves the 28 bytes per param of FusedAdamW_fp32. Its stores go to a line not read before,
// which costs the hardware a write-allocate read that STREAM does not count; the triad thus
// moves 4/3 of its counted bytes, and the ratio is conservative for AdamW.
//
// Rates are computed from wall-clock time measured around the timed loop: the library's own
// kIsRate counters divide by the main thread's CPU time unless UseRealTime() is set, and that
// would rename every benchmark with a /real_time suffix.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "zero/kernels/cpu_kernels.h"

namespace {

using zero::DType;

// 64-byte aligned, first-touched so page faults stay out of the timed loop.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<void, FreeDeleter>;

Buffer make_buffer(DType dtype, size_t n, float value) {
  size_t bytes = (n * zero::dtype_size(dtype) + 63) / 64 * 64;
  Buffer buffer(std::aligned_alloc(64, bytes));
  if (!buffer) std::abort();
  for (size_t i = 0; i < n; ++i) zero::store_from_float(buffer.get(), dtype, i, value);
  return buffer;
}

float* floats(const Buffer& b) {
  return static_cast<float*>(b.get());
}

// Times the loop on the wall clock and reports params/s and bytes/s from it.
template <typename Body>
void run_timed(benchmark::State& state, size_t params, double bytes_per_param, Body&& body) {
  auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double total_params = static_cast<double>(params) * static_cast<double>(state.iterations());
  state.counters["params_per_s"] = benchmark::Counter(total_params / seconds);
  state.counters["bytes_per_s"] = benchmark::Counter(total_params * bytes_per_param / seconds);
}

void run_fused_adamw(benchmark::State& state, DType grad_dtype, bool write_bf16_params) {
  const size_t params = static_cast<size_t>(state.range(0));
  zero::kernels::KernelOptions opt;
  opt.threads = static_cast<int>(state.range(1));
  Buffer master = make_buffer(DType::kFloat32, params, 0.5f);
  Buffer m = make_buffer(DType::kFloat32, params, 0.0f);
  Buffer v = make_buffer(DType::kFloat32, params, 0.0f);
  Buffer grad = make_buffer(grad_dtype, params, 0.01f);
  Buffer param_out = write_bf16_params ? make_buffer(DType::kBFloat16, params, 0.0f) : Buffer();
  const zero::AdamWStepConstants c = zero::adamw_step_constants(1e-3f, 0.9, 0.999, 1e-8f, 0.01f, 1);
  double bytes_per_param = 12.0 + 12.0 + static_cast<double>(zero::dtype_size(grad_dtype)) +
                           (write_bf16_params ? 2.0 : 0.0);
  run_timed(state, params, bytes_per_param, [&] {
    zero::kernels::fused_adamw(floats(master), floats(m), floats(v), grad.get(), grad_dtype, 1.0f,
                               param_out.get(), DType::kBFloat16, params, c, opt);
  });
}

void FusedAdamW_fp32(benchmark::State& state) {
  run_fused_adamw(state, DType::kFloat32, false);
}
void FusedAdamW_bf16_out_bf16(benchmark::State& state) {
  run_fused_adamw(state, DType::kBFloat16, true);
}
void FusedAdamW_fp16(benchmark::State& state) {
  run_fused_adamw(state, DType::kFloat16, false);
}

// The triad, split over threads the way the kernels split a range: contiguous chunks on
// multiples of 64 elements, the calling thread taking the first, threads started per call.
void triad(float* a, const float* b, const float* c, float s, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
}

void StreamTriad(benchmark::State& state) {
  const size_t params = static_cast<size_t>(state.range(0));
  const size_t threads = static_cast<size_t>(state.range(1));
  const size_t n = params * 28 / 12;
  Buffer a = make_buffer(DType::kFloat32, n, 0.0f);
  Buffer b = make_buffer(DType::kFloat32, n, 1.0f);
  Buffer c = make_buffer(DType::kFloat32, n, 2.0f);
  const size_t chunk = ((n + threads - 1) / threads + 63) / 64 * 64;
  run_timed(state, params, 12.0 * static_cast<double>(n) / static_cast<double>(params), [&] {
    std::vector<std::thread> workers;
    for (size_t begin = chunk; begin < n; begin += chunk) {
      workers.emplace_back(triad, floats(a), floats(b), floats(c), 3.0f, begin,
                           std::min(n, begin + chunk));
    }
    triad(floats(a), floats(b), floats(c), 3.0f, 0, std::min(n, chunk));
    for (std::thread& worker : workers) worker.join();
  });
}

// 1M to 256M parameters in powers of 4, on 1 and 2 threads. The largest holds 4 GiB of fp32
// state, so a run takes few iterations; shorten with --benchmark_min_time.
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgsProduct({benchmark::CreateRange(1 << 20, 1 << 28, 4), {1, 2}});
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(FusedAdamW_fp32)->Apply(shapes);
BENCHMARK(FusedAdamW_bf16_out_bf16)->Apply(shapes);
BENCHMARK(FusedAdamW_fp16)->Apply(shapes);
BENCHMARK(StreamTriad)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
