// Fused AdamW on the GPU against a device-to-device copy of the same bytes, in the same run.
//
// AdamW with fp32 gradients and no working copy reads master, m, v and grad and writes master, m
// and v: 28 bytes per parameter, the least any AdamW can move. The yardstick is cudaMemcpyAsync
// of 14 bytes per parameter (14 read + 14 written = 28). Both are timed with CUDA events, the
// median of --reps runs after warm-up, on random data (never zeros). Variants: the same with
// bf16 gradients and a bf16 working copy (also 28 bytes: 4+4+4+2 read, 4+4+4+2 written), and the
// fp32 case cut into 64 tensors in one call (the multi-tensor path).
//
//   zero-bench-optimizer-gpu [--sizes 16,64,256] [--reps 20] [--json PATH]   (sizes in Mi params)
#include <cuda_runtime.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernels.h"

namespace {

using zero::DType;
namespace kc = zero::kernels::cuda;

// Uniform values in [lo, hi) from a hash of the index: random-looking data without a host copy.
__global__ void fill_uniform(float* x, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = lo + (hi - lo) * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  }
}

void fill(float* x, size_t n, uint32_t seed, float lo, float hi) {
  fill_uniform<<<1024, 256>>>(x, n, seed, lo, hi);
  ZERO_CUDA_CHECK_LAUNCH();
}

struct Options {
  std::vector<size_t> sizes_mi = {16, 64, 256};
  int reps = 20;
  std::string json;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--sizes" && has_value) {
      o.sizes_mi.clear();
      std::string list = argv[++i];
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        o.sizes_mi.push_back(std::stoul(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else if (arg == "--reps" && has_value) {
      o.reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--json" && has_value) {
      o.json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--sizes 16,64,256] [--reps 20] [--json PATH]\n", argv[0]);
      std::exit(2);
    }
  }
  return o;
}

// Median milliseconds of `reps` runs of f, each between two events, after 3 warm-up runs.
template <typename F>
double median_ms(int reps, F f) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t start, stop;
  ZERO_CUDA_CHECK(cudaEventCreate(&start));
  ZERO_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    ZERO_CUDA_CHECK(cudaEventRecord(start));
    f();
    ZERO_CUDA_CHECK(cudaEventRecord(stop));
    ZERO_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    ZERO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  ZERO_CUDA_CHECK(cudaEventDestroy(start));
  ZERO_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string variant;
  size_t params;
  double ms;
  double gbps;
  double copy_gbps;
};

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  cudaDeviceProp prop{};
  ZERO_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1u << 30));
  const auto c = zero::adamw_step_constants(1e-4f, 0.9, 0.999, 1e-8f, 0.01f, 10);
  constexpr double kBytesPerParam = 28.0;
  std::vector<Row> rows;
  for (size_t mi : opt.sizes_mi) {
    const size_t n = mi << 20;
    float *master, *m, *v, *grad;
    uint16_t *grad16, *param16;
    char *copy_src, *copy_dst;
    const size_t copy_bytes = n * 14;
    ZERO_CUDA_CHECK(cudaMalloc(&master, n * 4));
    ZERO_CUDA_CHECK(cudaMalloc(&m, n * 4));
    ZERO_CUDA_CHECK(cudaMalloc(&v, n * 4));
    ZERO_CUDA_CHECK(cudaMalloc(&grad, n * 4));
    ZERO_CUDA_CHECK(cudaMalloc(&grad16, n * 2));
    ZERO_CUDA_CHECK(cudaMalloc(&param16, n * 2));
    ZERO_CUDA_CHECK(cudaMalloc(&copy_src, copy_bytes));
    ZERO_CUDA_CHECK(cudaMalloc(&copy_dst, copy_bytes));
    fill(master, n, 1, -1.0f, 1.0f);
    fill(m, n, 2, -0.01f, 0.01f);
    fill(v, n, 3, 0.0f, 1e-4f);
    fill(grad, n, 4, -1.0f, 1.0f);
    kc::cast(grad, DType::kFloat32, grad16, DType::kBFloat16, n, nullptr);
    fill(reinterpret_cast<float*>(copy_src), copy_bytes / 4, 5, -1.0f, 1.0f);
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());

    const double copy_ms = median_ms(opt.reps, [&] {
      ZERO_CUDA_CHECK(cudaMemcpyAsync(copy_dst, copy_src, copy_bytes, cudaMemcpyDeviceToDevice));
    });
    const double copy_gbps = kBytesPerParam * n / (copy_ms * 1e6);
    auto add = [&](const std::string& variant, double ms) {
      rows.push_back({variant, n, ms, kBytesPerParam * n / (ms * 1e6), copy_gbps});
    };
    add("memcpy_d2d", copy_ms);

    const kc::AdamWTensor whole{master, m, v, grad, nullptr, n};
    add("adamw_fp32", median_ms(opt.reps, [&] {
          kc::fused_adamw(&whole, 1, DType::kFloat32, DType::kFloat32, 1.0f, c, {}, nullptr);
        }));
    const kc::AdamWTensor half{master, m, v, grad16, param16, n};
    add("adamw_bf16_grad_bf16_out", median_ms(opt.reps, [&] {
          kc::fused_adamw(&half, 1, DType::kBFloat16, DType::kBFloat16, 1.0f, c, {}, nullptr);
        }));
    std::vector<kc::AdamWTensor> pieces;
    for (size_t t = 0; t < 64; ++t) {
      const size_t begin = n / 64 * t, count = t == 63 ? n - begin : n / 64;
      pieces.push_back({master + begin, m + begin, v + begin, grad + begin, nullptr, count});
    }
    add("adamw_fp32_64_tensors", median_ms(opt.reps, [&] {
          kc::fused_adamw(pieces.data(), pieces.size(), DType::kFloat32, DType::kFloat32, 1.0f, c,
                          {}, nullptr);
        }));
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
    for (void* p :
         {static_cast<void*>(master), static_cast<void*>(m), static_cast<void*>(v),
          static_cast<void*>(grad), static_cast<void*>(grad16), static_cast<void*>(param16),
          static_cast<void*>(copy_src), static_cast<void*>(copy_dst)}) {
      ZERO_CUDA_CHECK(cudaFree(p));
    }
  }

  std::printf("%-26s %12s %10s %10s %12s\n", "variant", "params", "ms", "GB/s", "of copy");
  for (const Row& r : rows) {
    std::printf("%-26s %12zu %10.3f %10.1f %11.1f%%\n", r.variant.c_str(), r.params, r.ms, r.gbps,
                100.0 * r.gbps / r.copy_gbps);
  }
  if (!opt.json.empty()) {
    FILE* f = std::fopen(opt.json.c_str(), "w");
    ZERO_CHECK(f != nullptr, "cannot write " << opt.json << ": " << std::strerror(errno));
    std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"bytes_per_param\": 28,\n  \"results\": [\n",
                 prop.name);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(f,
                   "    {\"variant\": \"%s\", \"params\": %zu, \"ms\": %.5f, \"GBps\": %.2f, "
                   "\"copy_GBps\": %.2f, \"fraction_of_copy\": %.4f}%s\n",
                   r.variant.c_str(), r.params, r.ms, r.gbps, r.copy_gbps, r.gbps / r.copy_gbps,
                   i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  return 0;
}
