// The GPT-2 CPU kernels at the size the model is benchmarked at against PyTorch: 8 sequences
// of 256 positions, 384 channels in 6 heads, the vocabulary of 50257 padded to 50304. The
// argument is the thread count. ZERO_KERNELS_SCALAR=1 measures the scalar path.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "zero/kernels/transformer_kernels.h"

namespace {

using namespace zero::kernels;

constexpr int kB = 8, kT = 256, kC = 384, kNH = 6, kV = 50257, kVp = 50304;
constexpr int kN = kB * kT;

std::vector<float> random_values(size_t n, float spread) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-spread, spread);
  std::vector<float> values(n);
  for (float& v : values) v = uniform(rng);
  return values;
}

KernelOptions options(const benchmark::State& state) {
  KernelOptions opt;
  opt.threads = static_cast<int>(state.range(0));
  return opt;
}

void BM_LayerNormForwardBackward(benchmark::State& state) {
  std::vector<float> x = random_values(kN * kC, 1), w = random_values(kC, 1),
                     b = random_values(kC, 1), out(kN * kC), mean(kN), rstd(kN), dx(kN * kC),
                     dw(kC), db(kC);
  for (auto _ : state) {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), kN, kC,
                      1e-5f, options(state));
    layernorm_backward(dx.data(), dw.data(), db.data(), out.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), kN, kC, options(state));
  }
}

void BM_GeluForwardBackward(benchmark::State& state) {
  const size_t n = size_t{kN} * 4 * kC;
  std::vector<float> x = random_values(n, 4), out(n), dx(n);
  for (auto _ : state) {
    gelu_forward(out.data(), x.data(), n, options(state));
    gelu_backward(dx.data(), x.data(), out.data(), n, options(state));
  }
}

void BM_AttentionForwardBackward(benchmark::State& state) {
  std::vector<float> qkv = random_values(size_t{kN} * 3 * kC, 1), out(size_t{kN} * kC),
                     lse(size_t{kB} * kNH * kT), dqkv(qkv.size());
  for (auto _ : state) {
    attention_forward(out.data(), lse.data(), qkv.data(), kB, kT, kC, kNH, options(state));
    attention_backward(dqkv.data(), out.data(), qkv.data(), out.data(), lse.data(), kB, kT, kC, kNH,
                       options(state));
  }
}

// The fused QKV projection, forward and backward.
void BM_MatmulQkvForwardBackward(benchmark::State& state) {
  std::vector<float> x = random_values(size_t{kN} * kC, 1), w = random_values(kC * 3 * kC, 0.05f),
                     bias(3 * kC), out(size_t{kN} * 3 * kC), dx(x.size()), dw(w.size()),
                     db(bias.size());
  for (auto _ : state) {
    matmul_forward(out.data(), x.data(), w.data(), bias.data(), kN, kC, 3 * kC,
                   WeightLayout::kInOut, options(state));
    matmul_backward(dx.data(), dw.data(), db.data(), out.data(), x.data(), w.data(), kN, kC, 3 * kC,
                    WeightLayout::kInOut, options(state));
  }
}

// The tied LM head and the loss: logits, cross-entropy forward and backward in place, and the
// head's backward.
void BM_LmHeadAndLoss(benchmark::State& state) {
  std::vector<float> x = random_values(size_t{kN} * kC, 1), wte = random_values(kVp * kC, 0.05f),
                     logits(size_t{kN} * kVp), losses(kN), lse(kN), dx(x.size()), dwte(wte.size());
  std::vector<int32_t> targets(kN);
  for (int n = 0; n < kN; ++n) targets[n] = (n * 7919) % kV;
  for (auto _ : state) {
    matmul_forward(logits.data(), x.data(), wte.data(), nullptr, kN, kC, kVp, WeightLayout::kOutIn,
                   options(state));
    cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), kN, kV, kVp,
                          options(state));
    cross_entropy_backward(logits.data(), logits.data(), lse.data(), targets.data(), 1.0f / kN, kN,
                           kV, kVp, options(state));
    matmul_backward(dx.data(), dwte.data(), nullptr, logits.data(), x.data(), wte.data(), kN, kC,
                    kVp, WeightLayout::kOutIn, options(state));
  }
}

BENCHMARK(BM_LayerNormForwardBackward)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GeluForwardBackward)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AttentionForwardBackward)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulQkvForwardBackward)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LmHeadAndLoss)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
