// The GPT-2 CUDA kernels (cuda_transformer_kernels.h) on a device, cuBLAS's GEMMs included,
// against the double-precision reference of tests/kernels/transformer_reference.h, at the grid
// test's relative tolerance of 1e-5 (floored at 1e-5 of the tensor's largest value), on odd
// shapes and on GPT-2's own (C = 768, 12 heads, the padded 50257-token vocabulary). The
// backward kernels also run twice on the same inputs and must give the same bits: no float
// atomics anywhere.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "tests/kernels/transformer_reference.h"
#include "zero/kernels/cuda_transformer_kernels.h"

namespace zero::kernels::cuda {
namespace {

namespace ref = zero::testing::transformer_reference;
using ref::expect_close;
using ref::narrow;
using ref::uniform;
using ref::widen;
using zero::testing::DeviceBuffer;

constexpr double kTolerance = 1e-5;
constexpr float kEps = 1e-5f;

class TransformerKernelsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ZERO_SKIP_WITHOUT_CUDA_DEVICE();
    ZERO_CUDA_CHECK(cudaStreamCreate(&stream_));
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (handle_) cublasDestroy(handle_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // A device copy of host values, kept alive by the fixture.
  template <typename T>
  T* device(const std::vector<T>& host) {
    buffers_.push_back(std::make_unique<DeviceBuffer>(host.size() * sizeof(T)));
    buffers_.back()->upload(host.data(), host.size() * sizeof(T));
    return buffers_.back()->as<T>();
  }
  // Device memory filled with NaN: outputs that are overwritten must be written everywhere.
  float* poisoned(size_t n) { return device(std::vector<float>(n, NAN)); }
  std::vector<float> download(const float* data, size_t n) {
    ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> out(n);
    ZERO_CUDA_CHECK(cudaMemcpy(out.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
  void upload(float* data, const std::vector<float>& host) {
    ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_));
    ZERO_CUDA_CHECK(
        cudaMemcpy(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

struct Shape {
  int B, T, C, NH;
};
// Odd sizes (no multiple of 32 anywhere), then GPT-2 small's widths.
const std::vector<Shape> kShapes = {{3, 37, 67, 1}, {2, 131, 90, 3}, {2, 64, 768, 12}};

std::vector<float> random_tokens(size_t n, int V, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(0, V - 1);
  std::vector<float> tokens(n);
  for (float& t : tokens) t = static_cast<float>(dist(rng));
  return tokens;
}

TEST_F(TransformerKernelsGpu, EmbeddingForwardAndBackward) {
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    const int V = 97;
    const size_t BT = static_cast<size_t>(s.B) * s.T, BTC = BT * s.C;
    const auto tokens = random_tokens(BT, V, rng);
    const auto wte = uniform(static_cast<size_t>(V) * s.C, -1, 1, rng);
    const auto wpe = uniform(static_cast<size_t>(s.T) * s.C, -1, 1, rng);
    float* out = poisoned(BTC);
    embedding_forward(out, device(tokens), device(wte), device(wpe), s.B, s.T, s.C, stream_);
    expect_close(download(out, BTC), ref::embedding_forward(tokens, wte, wpe, s.B, s.T, s.C),
                 kTolerance, "embedding out");

    const auto dout = uniform(BTC, -1, 1, rng);
    const auto dwte0 = uniform(wte.size(), -1, 1, rng), dwpe0 = uniform(wpe.size(), -1, 1, rng);
    auto want_wte = widen(dwte0), want_wpe = widen(dwpe0);
    ref::embedding_backward(want_wte, want_wpe, dout, tokens, s.B, s.T, s.C);
    float *dwte = device(dwte0), *dwpe = device(dwpe0);
    const float *d_dout = device(dout), *d_tokens = device(tokens);
    embedding_backward(dwte, dwpe, d_dout, d_tokens, s.B, s.T, s.C, stream_);
    const auto got_wte = download(dwte, wte.size()), got_wpe = download(dwpe, wpe.size());
    expect_close(got_wte, want_wte, kTolerance, "dwte");
    expect_close(got_wpe, want_wpe, kTolerance, "dwpe");
    upload(dwte, dwte0);
    upload(dwpe, dwpe0);
    embedding_backward(dwte, dwpe, d_dout, d_tokens, s.B, s.T, s.C, stream_);
    EXPECT_EQ(download(dwte, wte.size()), got_wte) << "dwte differs between two runs";
    EXPECT_EQ(download(dwpe, wpe.size()), got_wpe) << "dwpe differs between two runs";
  }
}

TEST_F(TransformerKernelsGpu, LayernormForwardAndBackward) {
  std::mt19937 rng(2);
  for (const Shape& s : kShapes) {
    const int N = s.B * s.T, C = s.C;
    const size_t NC = static_cast<size_t>(N) * C;
    const auto inp = uniform(NC, 1, 3, rng);
    const auto weight = uniform(C, -2, 2, rng), bias = uniform(C, -1, 1, rng);
    float *out = poisoned(NC), *mean = poisoned(N), *rstd = poisoned(N);
    const float* d_inp = device(inp);
    const float* d_weight = device(weight);
    layernorm_forward(out, mean, rstd, d_inp, d_weight, device(bias), N, C, kEps, stream_);
    const auto fwd = ref::layernorm_forward(inp, weight, bias, N, C, kEps);
    expect_close(download(out, NC), fwd.out, kTolerance, "layernorm out");
    expect_close(download(mean, N), fwd.mean, kTolerance, "layernorm mean");
    expect_close(download(rstd, N), fwd.rstd, kTolerance, "layernorm rstd");

    const auto dout = uniform(NC, -1, 1, rng);
    const auto dinp0 = uniform(NC, -1, 1, rng);
    const auto dweight0 = uniform(C, -1, 1, rng), dbias0 = uniform(C, -1, 1, rng);
    auto want_dinp = widen(dinp0), want_dweight = widen(dweight0), want_dbias = widen(dbias0);
    ref::layernorm_backward(want_dinp, want_dweight, want_dbias, dout, inp, weight,
                            download(mean, N), download(rstd, N), N, C);
    float *dinp = device(dinp0), *dweight = device(dweight0), *dbias = device(dbias0);
    const float* d_dout = device(dout);
    auto run = [&] {
      layernorm_backward(dinp, dweight, dbias, d_dout, d_inp, d_weight, mean, rstd, N, C, stream_);
    };
    run();
    const auto got_dinp = download(dinp, NC), got_dweight = download(dweight, C),
               got_dbias = download(dbias, C);
    expect_close(got_dinp, want_dinp, kTolerance, "layernorm dinp");
    expect_close(got_dweight, want_dweight, kTolerance, "layernorm dweight");
    expect_close(got_dbias, want_dbias, kTolerance, "layernorm dbias");
    upload(dinp, dinp0);
    upload(dweight, dweight0);
    upload(dbias, dbias0);
    run();
    EXPECT_EQ(download(dinp, NC), got_dinp) << "dinp differs between two runs";
    EXPECT_EQ(download(dweight, C), got_dweight) << "dweight differs between two runs";
    EXPECT_EQ(download(dbias, C), got_dbias) << "dbias differs between two runs";
    // The two halves apart (a zero-bubble schedule's), weight unread by the second: the bits of
    // the call that computes both.
    upload(dinp, dinp0);
    upload(dweight, dweight0);
    upload(dbias, dbias0);
    layernorm_backward(dinp, nullptr, nullptr, d_dout, d_inp, d_weight, mean, rstd, N, C, stream_);
    layernorm_backward(nullptr, dweight, dbias, d_dout, d_inp, nullptr, mean, rstd, N, C, stream_);
    EXPECT_EQ(download(dinp, NC), got_dinp) << "dinp alone differs";
    EXPECT_EQ(download(dweight, C), got_dweight) << "dweight alone differs";
    EXPECT_EQ(download(dbias, C), got_dbias) << "dbias alone differs";
  }
}

TEST_F(TransformerKernelsGpu, MatmulForwardAndBackwardInBothLayouts) {
  std::mt19937 rng(3);
  struct Dims {
    int N, C, OC;
  };
  for (const Dims& d : std::vector<Dims>{{111, 67, 130}, {64, 768, 2304}}) {
    for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
      for (bool with_bias : {true, false}) {
        const std::string what = std::string(layout == WeightLayout::kInOut ? "in-out" : "out-in") +
                                 (with_bias ? " with bias: " : " without bias: ");
        const size_t NC = static_cast<size_t>(d.N) * d.C, NOC = static_cast<size_t>(d.N) * d.OC;
        const auto inp = uniform(NC, -1, 1, rng);
        const auto weight = uniform(static_cast<size_t>(d.C) * d.OC, -1, 1, rng);
        const auto bias = with_bias ? uniform(d.OC, -1, 1, rng) : std::vector<float>{};
        const float *d_inp = device(inp), *d_weight = device(weight);
        float* out = poisoned(NOC);
        matmul_forward(out, d_inp, d_weight, with_bias ? device(bias) : nullptr, d.N, d.C, d.OC,
                       layout, handle_, stream_);
        expect_close(download(out, NOC),
                     ref::matmul_forward(inp, weight, bias, d.N, d.C, d.OC, layout), kTolerance,
                     what + "out");

        const auto dout = uniform(NOC, -1, 1, rng);
        const auto dweight0 = uniform(weight.size(), -1, 1, rng);
        const auto dbias0 = uniform(d.OC, -1, 1, rng);
        std::vector<double> want_dinp, want_dweight = widen(dweight0), want_dbias = widen(dbias0);
        ref::matmul_backward(want_dinp, want_dweight, want_dbias, dout, inp, weight, d.N, d.C, d.OC,
                             layout);
        float *dinp = poisoned(NC), *dweight = device(dweight0), *dbias = device(dbias0);
        // Without bias, the model passes no dbias and no dinp (the first layer): both skipped.
        matmul_backward(with_bias ? dinp : nullptr, dweight, with_bias ? dbias : nullptr,
                        device(dout), d_inp, d_weight, d.N, d.C, d.OC, layout, handle_, stream_);
        expect_close(download(dweight, weight.size()), want_dweight, kTolerance, what + "dweight");
        if (with_bias) {
          expect_close(download(dinp, NC), want_dinp, kTolerance, what + "dinp");
          expect_close(download(dbias, d.OC), want_dbias, kTolerance, what + "dbias");
          // dinp over inp itself, as the GPT-2's backward runs it: the same bits as apart.
          float* inp_then_dinp = device(inp);
          float *dweight_in_place = device(dweight0), *dbias_in_place = device(dbias0);
          matmul_backward(inp_then_dinp, dweight_in_place, dbias_in_place, device(dout),
                          inp_then_dinp, d_weight, d.N, d.C, d.OC, layout, handle_, stream_);
          EXPECT_EQ(download(inp_then_dinp, NC), download(dinp, NC)) << what << "dinp in place";
          EXPECT_EQ(download(dweight_in_place, weight.size()), download(dweight, weight.size()))
              << what << "dweight with dinp in place";
          EXPECT_EQ(download(dbias_in_place, d.OC), download(dbias, d.OC))
              << what << "dbias with dinp in place";
          // The input's gradient alone (inp unread), then the weight's and bias's alone (weight
          // unread): the bits of the call that computes all three.
          float *dinp_alone = poisoned(NC), *dweight_alone = device(dweight0);
          float* dbias_alone = device(dbias0);
          matmul_backward(dinp_alone, nullptr, nullptr, device(dout), nullptr, d_weight, d.N, d.C,
                          d.OC, layout, handle_, stream_);
          matmul_backward(nullptr, dweight_alone, dbias_alone, device(dout), d_inp, nullptr, d.N,
                          d.C, d.OC, layout, handle_, stream_);
          EXPECT_EQ(download(dinp_alone, NC), download(dinp, NC)) << what << "dinp alone";
          EXPECT_EQ(download(dweight_alone, weight.size()), download(dweight, weight.size()))
              << what << "dweight alone";
          EXPECT_EQ(download(dbias_alone, d.OC), download(dbias, d.OC)) << what << "dbias alone";
        } else {
          const auto untouched = download(dinp, NC);
          EXPECT_TRUE(std::isnan(untouched[0]) && std::isnan(untouched[NC - 1]))
              << what << "dinp written although null was passed";
          EXPECT_EQ(download(dbias, d.OC), dbias0) << what << "dbias written although null";
        }
      }
    }
  }
}

TEST_F(TransformerKernelsGpu, GeluForwardAndBackward) {
  std::mt19937 rng(4);
  const size_t n = 100003;
  const auto inp = uniform(n, -6, 6, rng), dout = uniform(n, -1, 1, rng);
  float *out = poisoned(n), *dinp = poisoned(n);
  const float* d_inp = device(inp);
  gelu_forward(out, d_inp, n, stream_);
  gelu_backward(dinp, d_inp, device(dout), n, stream_);
  expect_close(download(out, n), ref::gelu_forward(inp), kTolerance, "gelu out");
  expect_close(download(dinp, n), ref::gelu_backward(inp, dout), kTolerance, "gelu dinp");
  // In place over dout, as the GPT-2's backward runs it: the same bits.
  float* dout_then_dinp = device(dout);
  gelu_backward(dout_then_dinp, d_inp, dout_then_dinp, n, stream_);
  EXPECT_EQ(download(dout_then_dinp, n), download(dinp, n)) << "gelu dinp in place";
}

TEST_F(TransformerKernelsGpu, AttentionForwardAndBackward) {
  std::mt19937 rng(5);
  for (const Shape& s : kShapes) {
    const size_t BTC = static_cast<size_t>(s.B) * s.T * s.C;
    const size_t lse_n = static_cast<size_t>(s.B) * s.NH * s.T;
    const auto qkv = uniform(3 * BTC, -2, 2, rng);
    const float* d_qkv = device(qkv);
    float *out = poisoned(BTC), *lse = poisoned(lse_n);
    attention_forward(out, lse, d_qkv, s.B, s.T, s.C, s.NH, stream_);
    const auto fwd = ref::attention_forward(qkv, s.B, s.T, s.C, s.NH);
    expect_close(download(out, BTC), fwd.out, kTolerance, "attention out");
    expect_close(download(lse, lse_n), fwd.lse, kTolerance, "attention lse");

    const auto dout = uniform(BTC, -1, 1, rng);
    const float* d_dout = device(dout);
    float* dqkv = poisoned(3 * BTC);
    attention_backward(dqkv, d_dout, d_qkv, out, lse, s.B, s.T, s.C, s.NH, stream_);
    const auto got = download(dqkv, 3 * BTC);
    expect_close(got, ref::attention_backward(dout, qkv, s.B, s.T, s.C, s.NH), kTolerance,
                 "attention dqkv");
    upload(dqkv, std::vector<float>(3 * BTC, NAN));
    attention_backward(dqkv, d_dout, d_qkv, out, lse, s.B, s.T, s.C, s.NH, stream_);
    EXPECT_EQ(download(dqkv, 3 * BTC), got) << "dqkv differs between two runs";
  }
}

TEST_F(TransformerKernelsGpu, CrossEntropyZeroesThePaddingAndRunsInPlace) {
  std::mt19937 rng(6);
  struct Vocabulary {
    int N, V, Vp;
  };
  for (const Vocabulary& s : std::vector<Vocabulary>{{37, 101, 128}, {16, 50257, 50304}}) {
    const size_t NVp = static_cast<size_t>(s.N) * s.Vp;
    auto logits = uniform(NVp, -20, 20, rng);
    for (int n = 0; n < s.N; ++n) {
      for (int v = s.V; v < s.Vp; ++v) logits[static_cast<size_t>(n) * s.Vp + v] = 1e4f;
    }
    std::vector<int32_t> targets(s.N);
    std::uniform_int_distribution<int32_t> pick(0, s.V - 1);
    for (int32_t& t : targets) t = pick(rng);
    targets[0] = s.V - 1;
    float* d_logits = device(logits);
    const int32_t* d_targets = device(targets);
    float *losses = poisoned(s.N), *lse = poisoned(s.N);
    cross_entropy_forward(losses, lse, d_logits, d_targets, s.N, s.V, s.Vp, stream_);
    const auto want = ref::cross_entropy_forward(logits, targets, s.N, s.V, s.Vp);
    expect_close(download(losses, s.N), want.losses, kTolerance, "losses");
    expect_close(download(lse, s.N), want.lse, kTolerance, "lse");

    const float dloss = 1.0f / static_cast<float>(s.N);
    cross_entropy_backward(d_logits, d_logits, lse, d_targets, dloss, s.N, s.V, s.Vp, stream_);
    const auto d = download(d_logits, NVp);
    expect_close(d, ref::cross_entropy_backward(logits, targets, dloss, s.N, s.V, s.Vp), kTolerance,
                 "dlogits");
    for (int n = 0; n < s.N; ++n) {
      for (int v = s.V; v < s.Vp; ++v) {
        ASSERT_EQ(d[static_cast<size_t>(n) * s.Vp + v], 0.0f) << "padding at " << n << ", " << v;
      }
    }
  }
}

// The vocabulary-parallel kernels (tensor parallelism) of GPT-2's padded vocabulary split over
// 2 ranks (25,129 rows each, rank 1's last one padding), each rank's on its own columns:
// combined as the model combines them, the whole vocabulary's lse, losses and dlogits; the
// embedding's rows look up and gather exactly their tokens.
TEST_F(TransformerKernelsGpu, VocabularyParallelKernelsCombineToTheWholeVocabulary) {
  std::mt19937 rng(7);
  const int N = 16, V = 50257, Vr = 25129, C = 8, B = 2, T = N / B;
  const auto whole = uniform(static_cast<size_t>(N) * V, -20, 20, rng);
  std::vector<int32_t> targets(N);
  std::uniform_int_distribution<int32_t> pick(0, V - 1);
  for (int32_t& t : targets) t = pick(rng);
  targets[0] = V - 1;
  targets[1] = Vr - 1;
  const int32_t* d_targets = device(targets);
  std::vector<std::vector<float>> lse(2), target_logits(2), dlogits(2);
  for (int r = 0; r < 2; ++r) {
    const int first = r * Vr, count = std::min(Vr, V - first);
    std::vector<float> logits(static_cast<size_t>(N) * Vr, 1e4f);  // padding that would dominate
    for (int n = 0; n < N; ++n) {
      for (int v = 0; v < count; ++v) {
        logits[static_cast<size_t>(n) * Vr + v] = whole[static_cast<size_t>(n) * V + first + v];
      }
    }
    float* d_logits = device(logits);
    float *d_lse = poisoned(N), *d_target = poisoned(N);
    cross_entropy_partials(d_lse, d_target, d_logits, d_targets, first, N, count, Vr, stream_);
    lse[r] = download(d_lse, N);
    target_logits[r] = download(d_target, N);
    dlogits[r] = logits;
  }
  const auto want = ref::cross_entropy_forward(whole, targets, N, V, V);
  std::vector<float> combined(N), losses(N);
  for (int n = 0; n < N; ++n) {
    const double m = std::max(lse[0][n], lse[1][n]);
    combined[n] =
        static_cast<float>(m + std::log(std::exp(lse[0][n] - m) + std::exp(lse[1][n] - m)));
    losses[n] = combined[n] - (target_logits[0][n] + target_logits[1][n]);
  }
  expect_close(combined, want.lse, kTolerance, "combined lse");
  expect_close(losses, want.losses, kTolerance, "losses");
  const float dloss = 1.0f / N;
  const float* d_combined = device(combined);
  std::vector<float> d(whole.size(), NAN);
  for (int r = 0; r < 2; ++r) {
    const int first = r * Vr, count = std::min(Vr, V - first);
    float* d_logits = device(dlogits[r]);
    cross_entropy_backward_partial(d_logits, d_logits, d_combined, d_targets, first, dloss, N,
                                   count, Vr, stream_);
    const auto mine = download(d_logits, dlogits[r].size());
    for (int n = 0; n < N; ++n) {
      for (int v = 0; v < Vr; ++v) {
        const float x = mine[static_cast<size_t>(n) * Vr + v];
        if (v >= count) {
          ASSERT_EQ(x, 0.0f) << "padding of rank " << r;
        } else {
          d[static_cast<size_t>(n) * V + first + v] = x;
        }
      }
    }
  }
  expect_close(d, ref::cross_entropy_backward(whole, targets, dloss, N, V, V), kTolerance,
               "dlogits of both ranks");

  // The embedding: rank 1's rows of a table of 2 * 5 rows, tokens on both sides.
  const int rows = 5;
  const std::vector<float> tokens = {0, 4, 5, 9, 7, 2, 5, 8, 1, 6, 3, 9, 5, 0, 7, 4};
  const auto wte = uniform(static_cast<size_t>(2 * rows) * C, -1, 1, rng);
  const std::vector<float> no_wpe(static_cast<size_t>(T) * C, 0.0f);
  std::vector<float> mine_only = wte;
  std::fill(mine_only.begin(), mine_only.begin() + rows * C, 0.0f);
  const std::vector<float> rank1_rows(wte.begin() + rows * C, wte.end());
  float* out = poisoned(static_cast<size_t>(N) * C);
  const float* d_tokens = device(tokens);
  embedding_forward_rows(out, d_tokens, device(rank1_rows), nullptr, rows, rows, B, T, C, stream_);
  expect_close(download(out, static_cast<size_t>(N) * C),
               ref::embedding_forward(tokens, mine_only, no_wpe, B, T, C), kTolerance,
               "embedding rows out");
  const auto dout = uniform(static_cast<size_t>(N) * C, -1, 1, rng);
  float* dwte = device(std::vector<float>(static_cast<size_t>(2 * rows) * C, 0.0f));
  float* dwpe = device(std::vector<float>(static_cast<size_t>(T) * C, 0.0f));
  const float* d_dout = device(dout);
  embedding_backward_rows(dwte, dwpe, d_dout, d_tokens, 0, rows, B, T, C, stream_);
  embedding_backward_rows(dwte + rows * C, dwpe, d_dout, d_tokens, rows, rows, B, T, C, stream_);
  std::vector<double> want_wte(static_cast<size_t>(2 * rows) * C, 0.0),
      want_wpe(no_wpe.size(), 0.0);
  ref::embedding_backward(want_wte, want_wpe, dout, tokens, B, T, C);
  expect_close(download(dwte, want_wte.size()), want_wte, kTolerance, "dwte of both ranks' rows");
  for (double& v : want_wpe) v *= 2;  // both ranks added it
  expect_close(download(dwpe, want_wpe.size()), want_wpe, kTolerance, "dwpe");
}

}  // namespace
}  // namespace zero::kernels::cuda
