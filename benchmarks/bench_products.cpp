// The matrix products the GPT-2 runs, fp32 (OpenBLAS) against bf16 products (oneDNN, where the
// CPU has bf16 arithmetic), in GFLOP/s, through matmul_forward and matmul_backward as the model
// calls them:
//
//   zero-bench-products [--threads N] [--quick] [--json PATH]
//
// --quick: tiny shapes that only prove the pipeline (benchmarks/report --quick).
// Each row: the shape, fp32 GFLOP/s, bf16 GFLOP/s (the bf16 rounding of the operands included)
// and their ratio; --json writes them with the CPU's model, flags and kernel_summary() for
// benchmarks/report (the square product's rates are the report's sgemm and bf16 GEMM peaks). The
// first line is kernel_summary(): the CPU, its flags and what runs the products. Each figure is the
// best of 5 timed runs after one untimed one (which also creates oneDNN's primitive for the shape).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "zero/kernels/cpu_features.h"
#include "zero/kernels/transformer_kernels.h"

namespace {

using zero::kernels::KernelOptions;
using zero::kernels::WeightLayout;

double best_seconds(const std::function<void()>& run) {
  run();
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = uniform(rng);
  return values;
}

struct Shape {
  const char* name;
  int N, C, OC;
  WeightLayout layout;
  bool backward;  // forward and both backward products
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  bool quick = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--quick") {
      quick = true;
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      threads = 0;
      break;
    }
  }
  if (threads < 1) {
    std::fprintf(stderr, "usage: zero-bench-products [--threads N >= 1] [--quick] [--json PATH]\n");
    return 2;
  }
  const std::string summary = zero::kernels::kernel_summary();
  std::printf("%s\n", summary.c_str());
  const std::string title = "product (threads " + std::to_string(threads) + ")";
  std::printf("%-34s %10s %10s %7s\n", title.c_str(), "fp32 GF/s", "bf16 GF/s", "ratio");
  // n = 2048 square, and the GPT-2 benchmark's (6 x 384, T 256, batch 8: N = 2048 rows).
  const std::vector<Shape> full = {
      {"square 2048, forward", 2048, 2048, 2048, WeightLayout::kInOut, false},
      {"qkv 2048x384x1152, fwd+bwd", 2048, 384, 1152, WeightLayout::kInOut, true},
      {"attn proj 2048x384x384, fwd+bwd", 2048, 384, 384, WeightLayout::kInOut, true},
      {"mlp fc 2048x384x1536, fwd+bwd", 2048, 384, 1536, WeightLayout::kInOut, true},
      {"mlp proj 2048x1536x384, fwd+bwd", 2048, 1536, 384, WeightLayout::kInOut, true},
      {"lm head 2048x384x50257, fwd+bwd", 2048, 384, 50257, WeightLayout::kOutIn, true},
  };
  const std::vector<Shape> tiny = {
      {"square 128, forward", 128, 128, 128, WeightLayout::kInOut, false},
      {"lm head 64x64x515, fwd+bwd", 64, 64, 515, WeightLayout::kOutIn, true},
  };
  const std::vector<Shape>& shapes = quick ? tiny : full;
  std::mt19937 rng(1);
  std::string rows_json;
  for (const Shape& s : shapes) {
    const size_t in = static_cast<size_t>(s.N) * s.C, out_n = static_cast<size_t>(s.N) * s.OC;
    std::vector<float> x = random_floats(in, rng), w = random_floats(in / s.N * s.OC, rng);
    std::vector<float> dout = random_floats(out_n, rng), out(out_n), dx(in), dw(w.size(), 0.0f);
    const double flops = 2.0 * s.N * s.C * s.OC * (s.backward ? 3 : 1);
    double rate[2];
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      KernelOptions opt;
      opt.threads = threads;
      opt.bf16_products = bf16 == 1;
      rate[bf16] =
          flops / 1e9 / best_seconds([&] {
            zero::kernels::matmul_forward(out.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC,
                                          s.layout, opt);
            if (s.backward) {
              zero::kernels::matmul_backward(dx.data(), dw.data(), nullptr, dout.data(), x.data(),
                                             w.data(), s.N, s.C, s.OC, s.layout, opt);
            }
          });
    }
    std::printf("%-34s %10.1f %10.1f %6.2fx\n", s.name, rate[0], rate[1], rate[1] / rate[0]);
    char row[256];
    std::snprintf(row, sizeof row,
                  "%s\n  {\"product\": \"%s\", \"fp32_gflops\": %.2f, \"bf16_gflops\": %.2f}",
                  rows_json.empty() ? "" : ",", s.name, rate[0], rate[1]);
    rows_json += row;
  }
  if (!json_path.empty()) {
    const zero::kernels::CpuFeatures& f = zero::kernels::cpu_features();
    std::FILE* file = std::fopen(json_path.c_str(), "w");
    if (file == nullptr) {
      std::fprintf(stderr, "zero-bench-products: cannot write %s\n", json_path.c_str());
      return 1;
    }
    // The strings hold no quotes or backslashes (cpuid's brand string, fixed names).
    std::fprintf(file,
                 "{\"cpu_model\": \"%s\", \"cpu_flags\": \"%s\", \"kernels\": \"%s\", "
                 "\"bf16_products_in_bf16\": %s, \"threads\": %d, \"rows\": [%s\n]}\n",
                 f.model.c_str(), f.flags().c_str(), summary.c_str(),
                 zero::kernels::bf16_products_in_bf16() ? "true" : "false", threads,
                 rows_json.c_str());
    if (std::fclose(file) != 0) {
      std::fprintf(stderr, "zero-bench-products: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
