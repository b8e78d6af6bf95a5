// The GPT-2 CUDA kernels' per-thread bodies (kernels/cuda/transformer_kernel_bodies.h), run by
// g++ over their whole grid: every block, every thread, each phase of a block for all of its
// threads before the next (where the GPU has a barrier), the reduction trees level by level as
// the kernels in transformer.cu run them. Compared with the double-precision reference of
// transformer_reference.h at a relative tolerance of 1e-5 (floored at 1e-5 of the tensor's
// largest value, see expect_close): float rounding of sums of at most a few hundred terms stays
// well inside it, while a missed, doubled or misplaced term does not. The GEMMs themselves are
// cuBLAS's and are checked on a GPU (tests/cuda/transformer_kernels_gpu_test.cpp); their bias
// and column-sum kernels are checked here. Needs no GPU and no nvcc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/transformer_kernel_bodies.h"
#include "tests/kernels/transformer_reference.h"

namespace zero::kernels::cuda::transformer {
namespace {

namespace ref = zero::testing::transformer_reference;
using ref::expect_close;
using ref::narrow;
using ref::uniform;
using ref::widen;

constexpr double kTolerance = 1e-5;
constexpr float kEps = 1e-5f;

// --- the grid, as the kernels in transformer.cu run it ---------------------------------------

template <typename Body>
void each_thread(uint32_t threads, Body body) {
  for (uint32_t t = 0; t < threads; ++t) body(t);
}

// row_reduce: every thread's partial into shared, then the tree down to shared[0].
template <typename Op, typename Partial>
float row_reduce(Partial partial) {
  std::vector<float> shared(kRowThreads);
  each_thread(kRowThreads, [&](uint32_t t) { shared[t] = partial(t); });
  for (uint32_t half = kRowThreads / 2; half >= 1; half /= 2) {
    each_thread(kRowThreads, [&](uint32_t t) { tree_level<Op>(shared.data(), t, half); });
  }
  return shared[0];
}

// column_reduce: the tree down to one total per lane in shared[0 .. kColumnLanes).
template <typename Partial>
std::vector<float> column_reduce(Partial partial) {
  std::vector<float> shared(kColumnThreads);
  each_thread(kColumnThreads, [&](uint32_t t) { shared[t] = partial(t); });
  for (uint32_t half = kColumnThreads / 2; half >= kColumnLanes; half /= 2) {
    each_thread(kColumnThreads, [&](uint32_t t) { tree_level<SumOp>(shared.data(), t, half); });
  }
  return shared;
}

template <typename Body>
void element_grid(size_t n, Body body) {
  const uint32_t blocks = grid_blocks(n, kElementThreads, "test");
  for (uint32_t b = 0; b < blocks; ++b)
    each_thread(kElementThreads, [&](uint32_t t) { body(b, t); });
}

void grid_embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens,
                             int B, int T, int C, int first = 0, int rows = kAllRows) {
  element_grid(static_cast<size_t>(T) * C, [&](uint32_t b, uint32_t t) {
    embedding_backward_wpe_thread(b, t, dwpe, dout, B, T, C);
  });
  for (uint32_t b = 0; b < embedding_wte_blocks(C); ++b) {
    each_thread(kElementThreads, [&](uint32_t t) {
      embedding_backward_wte_thread(b, t, dwte, dout, tokens, first, rows, B, T, C);
    });
  }
}

void grid_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int N, int C, float eps) {
  for (uint32_t b = 0; b < static_cast<uint32_t>(N); ++b) {
    const float m = row_mean(
        row_reduce<SumOp>([&](uint32_t t) { return layernorm_sum_partial(b, t, inp, C); }), C);
    const float s = layernorm_rstd(
        row_reduce<SumOp>([&](uint32_t t) { return layernorm_var_partial(b, t, inp, C, m); }), C,
        eps);
    each_thread(kRowThreads, [&](uint32_t t) {
      layernorm_forward_out(b, t, out, mean, rstd, inp, weight, bias, C, m, s);
    });
  }
}

void grid_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, int N, int C) {
  for (uint32_t b = 0; b < static_cast<uint32_t>(N); ++b) {
    auto partial = [&](uint32_t t) {
      return layernorm_backward_partial(b, t, dout, inp, weight, mean, rstd, C);
    };
    LayernormRowSums sums;
    sums.dnorm = row_reduce<SumOp>([&](uint32_t t) { return partial(t).dnorm; });
    sums.dnorm_norm = row_reduce<SumOp>([&](uint32_t t) { return partial(t).dnorm_norm; });
    each_thread(kRowThreads, [&](uint32_t t) {
      layernorm_backward_dinp(b, t, dinp, dout, inp, weight, mean, rstd, C, sums);
    });
  }
  for (uint32_t b = 0; b < grid_blocks(C, kColumnLanes, "test"); ++b) {
    auto partial = [&](uint32_t t) {
      return layernorm_params_partial(b, t, dout, inp, mean, rstd, N, C);
    };
    const auto dbias_shared = column_reduce([&](uint32_t t) { return partial(t).dnorm; });
    const auto dweight_shared = column_reduce([&](uint32_t t) { return partial(t).dnorm_norm; });
    each_thread(kColumnThreads, [&](uint32_t t) {
      column_sum_finish(b, t, dbias_shared.data(), dbias, C);
      column_sum_finish(b, t, dweight_shared.data(), dweight, C);
    });
  }
}

void grid_column_sum(float* dst, const float* x, int rows, int cols) {
  for (uint32_t b = 0; b < grid_blocks(cols, kColumnLanes, "test"); ++b) {
    const auto shared =
        column_reduce([&](uint32_t t) { return column_sum_partial(b, t, x, rows, cols); });
    each_thread(kColumnThreads,
                [&](uint32_t t) { column_sum_finish(b, t, shared.data(), dst, cols); });
  }
}

// The forward's two row reductions, then `finish(block, thread, max, sum)` per thread.
template <typename Finish>
void grid_cross_entropy_rows(const float* logits, int N, int V, int Vp, Finish finish) {
  for (uint32_t b = 0; b < static_cast<uint32_t>(N); ++b) {
    const float max = row_reduce<MaxOp>(
        [&](uint32_t t) { return cross_entropy_max_partial(b, t, logits, V, Vp); });
    const float sum = row_reduce<SumOp>(
        [&](uint32_t t) { return cross_entropy_sum_partial(b, t, logits, V, Vp, max); });
    each_thread(kRowThreads, [&](uint32_t t) { finish(b, t, max, sum); });
  }
}

void grid_cross_entropy_forward(float* losses, float* lse, const float* logits,
                                const int32_t* targets, int N, int V, int Vp) {
  grid_cross_entropy_rows(logits, N, V, Vp, [&](uint32_t b, uint32_t t, float max, float sum) {
    cross_entropy_forward_finish(b, t, losses, lse, logits, targets, Vp, max, sum);
  });
}

void grid_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH) {
  const uint32_t blocks = grid_blocks(static_cast<size_t>(B) * NH * T, 1, "test");
  for (uint32_t b = 0; b < blocks; ++b) {
    // Poisoned, as uninitialized shared memory may be: every score read must have been written.
    std::vector<float> scores(T, std::numeric_limits<float>::quiet_NaN());
    const float max = row_reduce<MaxOp>(
        [&](uint32_t t) { return attention_scores_partial(b, t, qkv, T, C, NH, scores.data()); });
    const float sum = row_reduce<SumOp>(
        [&](uint32_t t) { return attention_exp_partial(b, t, T, scores.data(), max); });
    each_thread(kRowThreads, [&](uint32_t t) {
      attention_forward_out(b, t, out, lse, qkv, T, C, NH, scores.data(), max, sum);
    });
  }
}

void grid_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, int B, int T, int C, int NH) {
  const uint32_t blocks = grid_blocks(static_cast<size_t>(B) * NH * T, 1, "test");
  for (uint32_t b = 0; b < blocks; ++b) {
    std::vector<float> ds(T, std::numeric_limits<float>::quiet_NaN());
    each_thread(kRowThreads, [&](uint32_t t) {
      attention_dq_scores(b, t, dout, qkv, out, lse, T, C, NH, ds.data());
    });
    each_thread(kRowThreads,
                [&](uint32_t t) { attention_dq_out(b, t, dqkv, qkv, T, C, NH, ds.data()); });
  }
  for (uint32_t b = 0; b < blocks; ++b) {
    std::vector<float> p(T, std::numeric_limits<float>::quiet_NaN()), ds = p;
    each_thread(kRowThreads, [&](uint32_t t) {
      attention_dkv_scores(b, t, dout, qkv, out, lse, T, C, NH, p.data(), ds.data());
    });
    each_thread(kRowThreads, [&](uint32_t t) {
      attention_dkv_out(b, t, dqkv, dout, qkv, T, C, NH, p.data(), ds.data());
    });
  }
}

// Token ids in [0, V) as floats, with repeats (and ids equal mod kEmbeddingBuckets) so that
// several positions add into one dwte row.
std::vector<float> random_tokens(size_t n, int V, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(0, V - 1);
  std::vector<float> tokens(n);
  for (float& t : tokens) t = static_cast<float>(dist(rng));
  return tokens;
}

// --- tests -------------------------------------------------------------------------------------

struct Shape {
  int B, T, C;
};
// Channel counts below, at and across the 32 lanes, the 128 row threads and the 256 element
// threads; T odd and above 128 so a thread strides over several keys.
const std::vector<Shape> kShapes = {{1, 1, 1}, {2, 5, 32}, {3, 37, 67}, {2, 130, 300}};

TEST(CudaTransformerGrid, EmbeddingForwardMatchesReference) {
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    const int V = 53;
    const auto tokens = random_tokens(static_cast<size_t>(s.B) * s.T, V, rng);
    const auto wte = uniform(static_cast<size_t>(V) * s.C, -1, 1, rng);
    const auto wpe = uniform(static_cast<size_t>(s.T) * s.C, -1, 1, rng);
    std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.C, NAN);
    element_grid(out.size(), [&](uint32_t b, uint32_t t) {
      embedding_forward_thread(b, t, out.data(), tokens.data(), wte.data(), wpe.data(), 0, kAllRows,
                               s.B, s.T, s.C);
    });
    expect_close(out, ref::embedding_forward(tokens, wte, wpe, s.B, s.T, s.C), kTolerance,
                 "embedding out");
  }
}

TEST(CudaTransformerGrid, EmbeddingBackwardAddsEveryPositionIntoItsRows) {
  std::mt19937 rng(2);
  for (const Shape& s : kShapes) {
    // V of 70 ids over up to 260 positions: every id repeats, ids 3 and 35 share a bucket.
    const int V = 70;
    const auto tokens = random_tokens(static_cast<size_t>(s.B) * s.T, V, rng);
    const auto dout = uniform(static_cast<size_t>(s.B) * s.T * s.C, -1, 1, rng);
    auto dwte = uniform(static_cast<size_t>(V) * s.C, -1, 1, rng);  // += onto what is there
    auto dwpe = uniform(static_cast<size_t>(s.T) * s.C, -1, 1, rng);
    auto want_wte = widen(dwte), want_wpe = widen(dwpe);
    ref::embedding_backward(want_wte, want_wpe, dout, tokens, s.B, s.T, s.C);
    grid_embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
    expect_close(dwte, want_wte, kTolerance, "dwte");
    expect_close(dwpe, want_wpe, kTolerance, "dwpe");
  }
}

// The vocabulary-parallel embedding (tensor parallelism): rank 1 of 2 holds rows [27, 54) of a
// vocabulary of 53, the last row padding. Its lookups are the whole table's for its tokens and 0
// for the others, without wpe; its dwte rows gather exactly its tokens' positions, and together
// with rank 0's they are the whole table's gradient.
TEST(CudaTransformerGrid, EmbeddingRowsLookUpAndGatherOnlyTheRanksTokens) {
  std::mt19937 rng(11);
  for (const Shape& s : kShapes) {
    const int V = 53, rows = 27;
    const auto tokens = random_tokens(static_cast<size_t>(s.B) * s.T, V, rng);
    const auto wte = uniform(static_cast<size_t>(2 * rows) * s.C, -1, 1, rng);
    const auto wpe = uniform(static_cast<size_t>(s.T) * s.C, -1, 1, rng);
    const std::vector<float> no_wpe(wpe.size(), 0.0f);
    std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.C, NAN);
    element_grid(out.size(), [&](uint32_t b, uint32_t t) {
      embedding_forward_thread(b, t, out.data(), tokens.data(), wte.data() + rows * s.C, nullptr,
                               rows, rows, s.B, s.T, s.C);
    });
    std::vector<float> mine_only = wte;  // rank 1's rows, zeros where rank 0's are
    std::fill(mine_only.begin(), mine_only.begin() + rows * s.C, 0.0f);
    expect_close(out, ref::embedding_forward(tokens, mine_only, no_wpe, s.B, s.T, s.C), kTolerance,
                 "embedding rows out");

    const auto dout = uniform(out.size(), -1, 1, rng);
    std::vector<float> dwte(static_cast<size_t>(2 * rows) * s.C, 0.0f), dwpe(wpe.size(), 0.0f);
    std::vector<float> dwpe_again(wpe.size(), 0.0f);
    grid_embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C, 0,
                            rows);
    grid_embedding_backward(dwte.data() + rows * s.C, dwpe_again.data(), dout.data(), tokens.data(),
                            s.B, s.T, s.C, rows, rows);
    std::vector<double> want_wte(dwte.size(), 0.0), want_wpe(dwpe.size(), 0.0);
    ref::embedding_backward(want_wte, want_wpe, dout, tokens, s.B, s.T, s.C);
    expect_close(dwte, want_wte, kTolerance, "dwte of both ranks' rows");
    expect_close(dwpe, want_wpe, kTolerance, "dwpe");
    EXPECT_EQ(dwpe, dwpe_again) << "every rank adds the same position gradient";
  }
}

TEST(CudaTransformerGrid, LayernormForwardMatchesReference) {
  std::mt19937 rng(3);
  for (const Shape& s : kShapes) {
    const int N = s.B * s.T, C = s.C;
    // An offset, so that a one-pass variance would cancel and the mean matters.
    const auto inp = uniform(static_cast<size_t>(N) * C, 2, 4, rng);
    const auto weight = uniform(C, -2, 2, rng), bias = uniform(C, -1, 1, rng);
    std::vector<float> out(static_cast<size_t>(N) * C, NAN), mean(N, NAN), rstd(N, NAN);
    grid_layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                           bias.data(), N, C, kEps);
    const auto want = ref::layernorm_forward(inp, weight, bias, N, C, kEps);
    expect_close(out, want.out, kTolerance, "layernorm out");
    expect_close(mean, want.mean, kTolerance, "layernorm mean");
    // C = 1: the variance is 0 and rstd is 1 / sqrt(eps), exactly what eps is there for.
    expect_close(rstd, want.rstd, kTolerance, "layernorm rstd");
  }
}

TEST(CudaTransformerGrid, LayernormBackwardAddsIntoAllThreeGradients) {
  std::mt19937 rng(4);
  for (const Shape& s : kShapes) {
    const int N = s.B * s.T, C = s.C;
    const auto inp = uniform(static_cast<size_t>(N) * C, -2, 2, rng);
    const auto weight = uniform(C, -2, 2, rng), bias = uniform(C, -1, 1, rng);
    const auto fwd = ref::layernorm_forward(inp, weight, bias, N, C, kEps);
    const auto mean = narrow(fwd.mean), rstd = narrow(fwd.rstd);
    const auto dout = uniform(static_cast<size_t>(N) * C, -1, 1, rng);
    auto dinp = uniform(static_cast<size_t>(N) * C, -1, 1, rng);
    auto dweight = uniform(C, -1, 1, rng), dbias = uniform(C, -1, 1, rng);
    auto want_dinp = widen(dinp), want_dweight = widen(dweight), want_dbias = widen(dbias);
    ref::layernorm_backward(want_dinp, want_dweight, want_dbias, dout, inp, weight, mean, rstd, N,
                            C);
    grid_layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                            weight.data(), mean.data(), rstd.data(), N, C);
    expect_close(dinp, want_dinp, kTolerance, "layernorm dinp");
    expect_close(dweight, want_dweight, kTolerance, "layernorm dweight");
    expect_close(dbias, want_dbias, kTolerance, "layernorm dbias");
  }
}

// The matmul's own kernels: the bias added to each row of the GEMM's output, and dbias as the
// column sums of dout (added into), for row counts around the 8 slices of a column block.
TEST(CudaTransformerGrid, MatmulBiasAndColumnSumsMatchReference) {
  std::mt19937 rng(5);
  for (const auto& [N, OC] :
       std::vector<std::pair<int, int>>{{1, 1}, {7, 33}, {9, 64}, {111, 257}}) {
    auto out = uniform(static_cast<size_t>(N) * OC, -1, 1, rng);
    const auto bias = uniform(OC, -1, 1, rng);
    std::vector<double> want_out(out.size());
    for (size_t i = 0; i < out.size(); ++i)
      want_out[i] = static_cast<double>(out[i]) + bias[i % OC];
    element_grid(out.size(), [&](uint32_t b, uint32_t t) {
      add_bias_thread(b, t, out.data(), bias.data(), N, OC);
    });
    expect_close(out, want_out, kTolerance, "out + bias");

    const auto dout = uniform(static_cast<size_t>(N) * OC, -1, 1, rng);
    auto dbias = uniform(OC, -1, 1, rng);
    auto want_dbias = widen(dbias);
    for (int n = 0; n < N; ++n) {
      for (int oc = 0; oc < OC; ++oc) want_dbias[oc] += dout[static_cast<size_t>(n) * OC + oc];
    }
    grid_column_sum(dbias.data(), dout.data(), N, OC);
    expect_close(dbias, want_dbias, kTolerance, "dbias");
  }
}

TEST(CudaTransformerGrid, GeluForwardAndBackwardMatchReference) {
  std::mt19937 rng(6);
  for (size_t n : {size_t{1}, size_t{255}, size_t{256}, size_t{1000}}) {
    auto inp = uniform(n, -5, 5, rng);
    inp[0] = 0.0f;
    const auto dout = uniform(n, -1, 1, rng);
    std::vector<float> out(n, NAN), dinp(n, NAN);
    element_grid(n, [&](uint32_t b, uint32_t t) {
      gelu_forward_thread(b, t, out.data(), inp.data(), n);
      gelu_backward_thread(b, t, dinp.data(), inp.data(), dout.data(), n);
    });
    expect_close(out, ref::gelu_forward(inp), kTolerance, "gelu out");
    expect_close(dinp, ref::gelu_backward(inp, dout), kTolerance, "gelu dinp");
  }
}

struct Vocabulary {
  int N, V, Vp;
};

TEST(CudaTransformerGrid, CrossEntropyMatchesReferenceAndZeroesThePadding) {
  std::mt19937 rng(7);
  for (const Vocabulary& s :
       std::vector<Vocabulary>{{1, 1, 1}, {3, 101, 128}, {5, 300, 300}, {4, 1000, 1024}}) {
    // Wide logits, so that the max subtraction matters; the padding holds values that would
    // dominate the softmax if it were read.
    auto logits = uniform(static_cast<size_t>(s.N) * s.Vp, -20, 20, rng);
    for (int n = 0; n < s.N; ++n) {
      for (int v = s.V; v < s.Vp; ++v) logits[static_cast<size_t>(n) * s.Vp + v] = 1e4f;
    }
    std::vector<int32_t> targets(s.N);
    std::uniform_int_distribution<int32_t> pick(0, s.V - 1);
    for (int32_t& t : targets) t = pick(rng);
    targets[0] = s.V - 1;
    std::vector<float> losses(s.N, NAN), lse(s.N, NAN);
    grid_cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), s.N, s.V,
                               s.Vp);
    const auto want = ref::cross_entropy_forward(logits, targets, s.N, s.V, s.Vp);
    expect_close(losses, want.losses, kTolerance, "losses");
    expect_close(lse, want.lse, kTolerance, "lse");

    const float dloss = 1.0f / 3.0f;
    const auto want_d = ref::cross_entropy_backward(logits, targets, dloss, s.N, s.V, s.Vp);
    // In place, as the model calls it: dlogits is logits.
    auto d = logits;
    element_grid(d.size(), [&](uint32_t b, uint32_t t) {
      cross_entropy_backward_thread(b, t, d.data(), d.data(), lse.data(), targets.data(), 0, dloss,
                                    s.N, s.V, s.Vp);
    });
    expect_close(d, want_d, kTolerance, "dlogits");
    for (int n = 0; n < s.N; ++n) {
      for (int v = s.V; v < s.Vp; ++v) {
        ASSERT_EQ(d[static_cast<size_t>(n) * s.Vp + v], 0.0f) << "padding at " << n << ", " << v;
      }
    }
  }
}

// The vocabulary-parallel cross-entropy: the vocabulary split over 2 ranks, rank 1's last
// columns padding. Combined as the model combines them (the log-sum-exp of the ranks' lse, the
// sum of their target logits), the ranks' partials are the whole vocabulary's lse and loss;
// with that lse, the ranks' dlogits side by side are the whole vocabulary's.
TEST(CudaTransformerGrid, CrossEntropyPartialsCombineToTheWholeVocabulary) {
  std::mt19937 rng(12);
  for (const Vocabulary& s : std::vector<Vocabulary>{{3, 101, 51}, {5, 300, 150}, {4, 999, 500}}) {
    const int Vp = s.Vp;  // each rank's columns
    const int first[2] = {0, Vp};
    const int V[2] = {Vp, s.V - Vp};
    const auto whole = uniform(static_cast<size_t>(s.N) * s.V, -20, 20, rng);
    std::vector<int32_t> targets(s.N);
    std::uniform_int_distribution<int32_t> pick(0, s.V - 1);
    for (int32_t& t : targets) t = pick(rng);
    targets[0] = s.V - 1;
    targets[1] = Vp - 1;
    // Each rank's columns of the logits, the padding holding values that would dominate.
    std::vector<std::vector<float>> logits(2,
                                           std::vector<float>(static_cast<size_t>(s.N) * Vp, 1e4f));
    for (int r = 0; r < 2; ++r) {
      for (int n = 0; n < s.N; ++n) {
        for (int v = 0; v < V[r]; ++v) {
          logits[r][static_cast<size_t>(n) * Vp + v] =
              whole[static_cast<size_t>(n) * s.V + first[r] + v];
        }
      }
    }
    std::vector<std::vector<float>> lse(2, std::vector<float>(s.N, NAN));
    std::vector<std::vector<float>> target_logits(2, std::vector<float>(s.N, NAN));
    for (int r = 0; r < 2; ++r) {
      grid_cross_entropy_rows(
          logits[r].data(), s.N, V[r], Vp, [&](uint32_t b, uint32_t t, float max, float sum) {
            cross_entropy_partials_finish(b, t, lse[r].data(), target_logits[r].data(),
                                          logits[r].data(), targets.data(), first[r], V[r], Vp, max,
                                          sum);
          });
    }
    const auto want = ref::cross_entropy_forward(whole, targets, s.N, s.V, s.V);
    std::vector<float> combined(s.N), losses(s.N);
    for (int n = 0; n < s.N; ++n) {
      const double m = std::max(lse[0][n], lse[1][n]);
      combined[n] =
          static_cast<float>(m + std::log(std::exp(lse[0][n] - m) + std::exp(lse[1][n] - m)));
      losses[n] = combined[n] - (target_logits[0][n] + target_logits[1][n]);
      ASSERT_TRUE(target_logits[0][n] == 0.0f || target_logits[1][n] == 0.0f)
          << "row " << n << ": only the target's owner reports its logit";
    }
    expect_close(combined, want.lse, kTolerance, "combined lse");
    expect_close(losses, want.losses, kTolerance, "losses");

    const float dloss = 0.25f;
    const auto want_d = ref::cross_entropy_backward(whole, targets, dloss, s.N, s.V, s.V);
    std::vector<float> d(whole.size(), NAN);
    for (int r = 0; r < 2; ++r) {
      auto dr = logits[r];  // in place, as the model calls it
      element_grid(dr.size(), [&](uint32_t b, uint32_t t) {
        cross_entropy_backward_thread(b, t, dr.data(), dr.data(), combined.data(), targets.data(),
                                      first[r], dloss, s.N, V[r], Vp);
      });
      for (int n = 0; n < s.N; ++n) {
        for (int v = 0; v < Vp; ++v) {
          const float x = dr[static_cast<size_t>(n) * Vp + v];
          if (v >= V[r]) {
            ASSERT_EQ(x, 0.0f) << "padding of rank " << r << " at " << n << ", " << v;
          } else {
            d[static_cast<size_t>(n) * s.V + first[r] + v] = x;
          }
        }
      }
    }
    expect_close(d, want_d, kTolerance, "dlogits of both ranks");
  }
}

struct AttentionShape {
  int B, T, C, NH;
};
// Head sizes of 1, 6 and 130 (more channels than row threads), T across 128 threads.
const std::vector<AttentionShape> kAttentionShapes = {
    {1, 1, 1, 1}, {2, 7, 18, 3}, {1, 37, 12, 2}, {1, 131, 8, 4}, {1, 9, 260, 2}};

TEST(CudaTransformerGrid, AttentionForwardMatchesReference) {
  std::mt19937 rng(8);
  for (const AttentionShape& s : kAttentionShapes) {
    const auto qkv = uniform(static_cast<size_t>(s.B) * s.T * 3 * s.C, -2, 2, rng);
    std::vector<float> out(static_cast<size_t>(s.B) * s.T * s.C, NAN);
    std::vector<float> lse(static_cast<size_t>(s.B) * s.NH * s.T, NAN);
    grid_attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    const auto want = ref::attention_forward(qkv, s.B, s.T, s.C, s.NH);
    expect_close(out, want.out, kTolerance, "attention out");
    expect_close(lse, want.lse, kTolerance, "attention lse");
  }
}

TEST(CudaTransformerGrid, AttentionBackwardMatchesReference) {
  std::mt19937 rng(9);
  for (const AttentionShape& s : kAttentionShapes) {
    const auto qkv = uniform(static_cast<size_t>(s.B) * s.T * 3 * s.C, -2, 2, rng);
    const auto dout = uniform(static_cast<size_t>(s.B) * s.T * s.C, -1, 1, rng);
    const auto fwd = ref::attention_forward(qkv, s.B, s.T, s.C, s.NH);
    const auto out = narrow(fwd.out), lse = narrow(fwd.lse);
    // Poisoned: dqkv is overwritten, every element of it.
    std::vector<float> dqkv(qkv.size(), NAN);
    grid_attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T,
                            s.C, s.NH);
    expect_close(dqkv, ref::attention_backward(dout, qkv, s.B, s.T, s.C, s.NH), kTolerance,
                 "attention dqkv");
  }
}

}  // namespace
}  // namespace zero::kernels::cuda::transformer
