// The transformer kernels against the double references of transformer_test_reference.h (the
// attention reference keeps each row's full softmax; the backward references are the textbook
// chain rule, checked in turn against central finite differences). Each kernel
// runs on the AVX-512, the AVX2 and the scalar path, at 1, 2 and 3 threads on sizes large enough
// for every thread to get work, and must return the same bits at every thread count. Sizes are odd
// on purpose: rows of C not a multiple of 8, T not a multiple of 8, head sizes below and above 32,
// a vocabulary padded with columns that must not count, single rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "tests/expect_error.h"
#include "transformer_test_reference.h"
#include "zero/core/check.h"
#include "zero/kernels/transformer_kernels.h"

namespace zero::kernels::testing {
namespace {

// --- The kernels on both paths ----------------------------------------------------------------

class TransformerKernelTest : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    reset_kernel_isa_for_testing();
    if (!use_path(GetParam())) {
      GTEST_SKIP() << "this CPU (or ZERO_KERNELS_ISA / ZERO_KERNELS_SCALAR) leaves no "
                   << path_name(GetParam()) << " path to test";
    }
  }
  void TearDown() override { reset_kernel_isa_for_testing(); }
};

INSTANTIATE_TEST_SUITE_P(Paths, TransformerKernelTest, ::testing::ValuesIn(kAllPaths),
                         [](const ::testing::TestParamInfo<Path>& path) {
                           return path_name(path.param);
                         });

const std::vector<int> kThreadCounts = {1, 2, 3};

// Each *Size below is small enough for the double references and, in its last entry, large
// enough that 3 threads each get work (the kernels start a thread per 32768 elements of work).

struct EmbeddingSize {
  int B, T, C, V;
};

TEST_P(TransformerKernelTest, Embedding) {
  std::mt19937 rng(10);
  for (EmbeddingSize s : {EmbeddingSize{1, 1, 3, 2}, EmbeddingSize{5, 67, 301, 7}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C);
    const size_t rows = static_cast<size_t>(s.B) * s.T;
    Floats tokens(rows);
    std::uniform_int_distribution<int> token(0, s.V - 1);
    for (float& t : tokens) t = static_cast<float>(token(rng));  // few tokens: many repeats
    Floats wte = random_floats(s.V * s.C, rng, -1, 1), wpe = random_floats(s.T * s.C, rng, -1, 1);
    Floats dout = random_floats(rows * s.C, rng, -1, 1);
    Floats dwte_prior = random_floats(wte.size(), rng, -1, 1);
    Floats dwpe_prior = random_floats(wpe.size(), rng, -1, 1);
    Doubles out_ref = embedding_reference(tokens, to_doubles(wte), to_doubles(wpe), s.B, s.T, s.C);
    Doubles dwte_ref(wte.size(), 0.0), dwpe_ref(wpe.size(), 0.0);
    embedding_backward_reference(dwte_ref, dwpe_ref, to_doubles(dout), tokens, s.B, s.T, s.C);

    Floats out_1, dwte_1, dwpe_1;
    for (int t : kThreadCounts) {
      SCOPED_TRACE(::testing::Message() << t << " threads");
      Floats out(rows * s.C);
      embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C,
                        threads(t));
      EXPECT_TRUE(close(out, out_ref));
      // Called twice onto a prior value: parameter gradients add up.
      Floats dwte = dwte_prior, dwpe = dwpe_prior;
      for (int call = 0; call < 2; ++call) {
        embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C,
                           threads(t));
      }
      EXPECT_TRUE(close(dwte, plus(to_doubles(dwte_prior), dwte_ref, 2.0)));
      EXPECT_TRUE(close(dwpe, plus(to_doubles(dwpe_prior), dwpe_ref, 2.0)));
      if (t == 1) {
        out_1 = out, dwte_1 = dwte, dwpe_1 = dwpe;
      } else {
        EXPECT_TRUE(same_bits(out, out_1));
        EXPECT_TRUE(same_bits(dwte, dwte_1));
        EXPECT_TRUE(same_bits(dwpe, dwpe_1));
      }
    }
  }
}

// The embedding of a 16-bit table (bf16 and fp16) against the fp32 kernels on the table's
// values: forward the bits of embedding_forward on the widened table; backward the bits of
// embedding_backward into a zeroed fp32 table added into the 16-bit gradient (rounding once),
// with the rows no token names left as they were (NaN here, to show they are not read or
// written), and dwpe as embedding_backward's. A null dwte (a frozen table) gets nothing. The
// same bits at every thread count.
TEST_P(TransformerKernelTest, EmbeddingOf16BitTable) {
  std::mt19937 rng(11);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (EmbeddingSize s : {EmbeddingSize{1, 1, 3, 2}, EmbeddingSize{5, 67, 301, 97}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " B=" << s.B << " T=" << s.T
                                        << " C=" << s.C << " V=" << s.V);
      const size_t rows = static_cast<size_t>(s.B) * s.T, table = static_cast<size_t>(s.V) * s.C;
      Floats tokens(rows);
      // Tokens from the lower half of the vocabulary only: the upper rows are never named.
      std::uniform_int_distribution<int> token(0, std::max(0, s.V / 2 - 1));
      for (float& t : tokens) t = static_cast<float>(token(rng));
      const Floats wpe = random_floats(s.T * s.C, rng, -1, 1);
      const Floats dout = random_floats(rows * s.C, rng, -1, 1);
      std::vector<uint16_t> wte(table), dwte_prior(table);
      Floats wte_values(table), named(s.V, 0.0f);
      for (size_t i = 0; i < table; ++i) {
        store_from_float(wte.data(), dtype, i, static_cast<float>(rng() % 2001) / 1000.0f - 1.0f);
        wte_values[i] = load_as_float(wte.data(), dtype, i);
        store_from_float(dwte_prior.data(), dtype, i, static_cast<float>(rng() % 2001) / 500.0f);
      }
      for (float t : tokens) named[static_cast<size_t>(t)] = 1.0f;
      Floats out_fp32(rows * s.C), dwte_fp32(table, 0.0f), dwpe_fp32 = wpe;
      embedding_forward(out_fp32.data(), tokens.data(), wte_values.data(), wpe.data(), s.B, s.T,
                        s.C);
      embedding_backward(dwte_fp32.data(), dwpe_fp32.data(), dout.data(), tokens.data(), s.B, s.T,
                         s.C);
      std::vector<uint16_t> dwte_expected = dwte_prior;
      accumulate(dwte_expected.data(), dtype, dwte_fp32.data(), DType::kFloat32, table);
      for (int v = 0; v < s.V; ++v) {
        if (named[v] != 0.0f) continue;
        for (int c = 0; c < s.C; ++c) dwte_expected[static_cast<size_t>(v) * s.C + c] = 0x7fff;
      }

      for (int t : kThreadCounts) {
        SCOPED_TRACE(::testing::Message() << t << " threads");
        Floats out(rows * s.C);
        embedding_forward_16bit(out.data(), tokens.data(), wte.data(), dtype, wpe.data(), s.B, s.T,
                                s.C, threads(t));
        EXPECT_TRUE(same_bits(out, out_fp32));
        std::vector<uint16_t> dwte = dwte_prior;
        for (int v = 0; v < s.V; ++v) {
          if (named[v] != 0.0f) continue;
          for (int c = 0; c < s.C; ++c) dwte[static_cast<size_t>(v) * s.C + c] = 0x7fff;
        }
        Floats dwpe = wpe;
        embedding_backward_16bit(dwte.data(), dtype, dwpe.data(), dout.data(), tokens.data(), s.B,
                                 s.T, s.C, threads(t));
        EXPECT_EQ(dwte, dwte_expected);
        EXPECT_TRUE(same_bits(dwpe, dwpe_fp32));
        Floats dwpe_alone = wpe;
        embedding_backward_16bit(nullptr, dtype, dwpe_alone.data(), dout.data(), tokens.data(), s.B,
                                 s.T, s.C, threads(t));
        EXPECT_TRUE(same_bits(dwpe_alone, dwpe_fp32));
      }
    }
  }
  Floats out(3), tokens(1, 0.0f), wpe(3);
  const float table[3] = {};
  ::zero::testing::expect_error_naming(
      [&] {
        embedding_forward_16bit(out.data(), tokens.data(), table, DType::kFloat32, wpe.data(), 1, 1,
                                3);
      },
      "embedding_forward_16bit: the table must be bf16 or fp16, got fp32");
}

struct RowsSize {
  int N, C;
};

TEST_P(TransformerKernelTest, LayerNorm) {
  std::mt19937 rng(11);
  const float eps = 1e-5f;
  for (RowsSize s : {RowsSize{1, 5}, RowsSize{7, 8}, RowsSize{301, 337}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const size_t n = static_cast<size_t>(s.N) * s.C;
    // An offset of 3 on the inputs: the variance must not come from E[x^2] - mean^2.
    Floats x = random_floats(n, rng, 1, 5), w = random_floats(s.C, rng, 0.5f, 1.5f);
    Floats b = random_floats(s.C, rng, -1, 1), dout = random_floats(n, rng, -1, 1);
    Floats dx_prior = random_floats(n, rng, -1, 1), dw_prior = random_floats(s.C, rng, -1, 1);
    Floats db_prior = random_floats(s.C, rng, -1, 1);
    LayerNormOut ref =
        layernorm_reference(to_doubles(x), to_doubles(w), to_doubles(b), s.N, s.C, eps);
    Doubles dx_ref, dw_ref, db_ref;
    layernorm_backward_reference(dx_ref, dw_ref, db_ref, to_doubles(dout), to_doubles(x),
                                 to_doubles(w), s.N, s.C, eps);

    std::vector<Floats> first;
    for (int t : kThreadCounts) {
      SCOPED_TRACE(::testing::Message() << t << " threads");
      Floats out(n), mean(s.N), rstd(s.N);
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), s.N,
                        s.C, eps, threads(t));
      EXPECT_TRUE(close(out, ref.out));
      EXPECT_TRUE(close(mean, ref.mean));
      EXPECT_TRUE(close(rstd, ref.rstd));
      // dinp adds too (it lands on the residual stream); called twice onto prior values.
      Floats dx = dx_prior, dw = dw_prior, db = db_prior;
      for (int call = 0; call < 2; ++call) {
        layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), s.N, s.C, threads(t));
      }
      EXPECT_TRUE(close(dx, plus(to_doubles(dx_prior), dx_ref, 2.0)));
      EXPECT_TRUE(close(dw, plus(to_doubles(dw_prior), dw_ref, 2.0)));
      EXPECT_TRUE(close(db, plus(to_doubles(db_prior), db_ref, 2.0)));
      // The two parts apart (a zero-bubble schedule's input and weight gradients), weight
      // unread by the second: the bits of the call that computes both.
      Floats dx_apart = dx_prior, dw_apart = dw_prior, db_apart = db_prior;
      Floats dx_both = dx_prior, dw_both = dw_prior, db_both = db_prior;
      layernorm_backward(dx_both.data(), dw_both.data(), db_both.data(), dout.data(), x.data(),
                         w.data(), mean.data(), rstd.data(), s.N, s.C, threads(t));
      layernorm_backward(dx_apart.data(), nullptr, nullptr, dout.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), s.N, s.C, threads(t));
      layernorm_backward(nullptr, dw_apart.data(), db_apart.data(), dout.data(), x.data(), nullptr,
                         mean.data(), rstd.data(), s.N, s.C, threads(t));
      EXPECT_TRUE(same_bits(dx_apart, dx_both));
      EXPECT_TRUE(same_bits(dw_apart, dw_both));
      EXPECT_TRUE(same_bits(db_apart, db_both));
      std::vector<Floats> results = {out, mean, rstd, dx, dw, db};
      if (t == 1) first = results;
      for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(same_bits(results[i], first[i]));
    }
  }
}

struct MatmulSize {
  int N, C, OC;
};

TEST_P(TransformerKernelTest, Matmul) {
  std::mt19937 rng(12);
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    for (MatmulSize s : {MatmulSize{1, 3, 5}, MatmulSize{259, 77, 390}}) {
      SCOPED_TRACE(::testing::Message()
                   << "N=" << s.N << " C=" << s.C << " OC=" << s.OC
                   << (layout == WeightLayout::kInOut ? " in-out" : " out-in"));
      const size_t in = static_cast<size_t>(s.N) * s.C, out_n = static_cast<size_t>(s.N) * s.OC;
      Floats x = random_floats(in, rng, -1, 1), w = random_floats(s.C * s.OC, rng, -1, 1);
      Floats bias = random_floats(s.OC, rng, -1, 1), dout = random_floats(out_n, rng, -1, 1);
      Floats dw_prior = random_floats(w.size(), rng, -1, 1);
      Floats db_prior = random_floats(s.OC, rng, -1, 1);
      Doubles bias_d = to_doubles(bias);
      Doubles out_ref =
          matmul_reference(to_doubles(x), to_doubles(w), &bias_d, s.N, s.C, s.OC, layout);
      Doubles out_nobias_ref =
          matmul_reference(to_doubles(x), to_doubles(w), nullptr, s.N, s.C, s.OC, layout);
      Doubles dx_ref, dw_ref, db_ref;
      matmul_backward_reference(dx_ref, dw_ref, db_ref, to_doubles(dout), to_doubles(x),
                                to_doubles(w), s.N, s.C, s.OC, layout);

      std::vector<Floats> first;
      for (int t : kThreadCounts) {
        SCOPED_TRACE(::testing::Message() << t << " threads");
        // Outputs start as garbage: they must be overwritten.
        Floats out(out_n, 1e30f), out_nobias(out_n, 1e30f), dx(in, 1e30f);
        matmul_forward(out.data(), x.data(), w.data(), bias.data(), s.N, s.C, s.OC, layout,
                       threads(t));
        matmul_forward(out_nobias.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC, layout,
                       threads(t));
        EXPECT_TRUE(close(out, out_ref));
        EXPECT_TRUE(close(out_nobias, out_nobias_ref));
        Floats dw = dw_prior, db = db_prior;
        matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), s.N, s.C,
                        s.OC, layout, threads(t));
        // The second call skips dinp and dbias.
        matmul_backward(nullptr, dw.data(), nullptr, dout.data(), x.data(), w.data(), s.N, s.C,
                        s.OC, layout, threads(t));
        EXPECT_TRUE(close(dx, dx_ref));
        EXPECT_TRUE(close(dw, plus(to_doubles(dw_prior), dw_ref, 2.0)));
        EXPECT_TRUE(close(db, plus(to_doubles(db_prior), db_ref)));
        // dinp over inp itself (the GPT-2's backward writes gradients over dead activations):
        // the same bits as into a buffer of its own.
        Floats x_then_dx = x, dw_in_place = dw_prior, db_in_place = db_prior;
        Floats dw_apart = dw_prior, db_apart = db_prior;
        matmul_backward(dx.data(), dw_apart.data(), db_apart.data(), dout.data(), x.data(),
                        w.data(), s.N, s.C, s.OC, layout, threads(t));
        matmul_backward(x_then_dx.data(), dw_in_place.data(), db_in_place.data(), dout.data(),
                        x_then_dx.data(), w.data(), s.N, s.C, s.OC, layout, threads(t));
        EXPECT_TRUE(same_bits(x_then_dx, dx));
        EXPECT_TRUE(same_bits(dw_in_place, dw_apart));
        EXPECT_TRUE(same_bits(db_in_place, db_apart));
        // The input's gradient alone (weight gradients skipped, inp unread), then the weight's
        // and bias's alone (weight unread): the bits of the call that computes all three.
        Floats dx_alone(in, 1e30f), dw_alone = dw_prior, db_alone = db_prior;
        matmul_backward(dx_alone.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), s.N, s.C,
                        s.OC, layout, threads(t));
        matmul_backward(nullptr, dw_alone.data(), db_alone.data(), dout.data(), x.data(), nullptr,
                        s.N, s.C, s.OC, layout, threads(t));
        EXPECT_TRUE(same_bits(dx_alone, dx));
        EXPECT_TRUE(same_bits(dw_alone, dw_apart));
        EXPECT_TRUE(same_bits(db_alone, db_apart));
        std::vector<Floats> results = {out, out_nobias, dx, dw, db};
        if (t == 1) first = results;
        for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(same_bits(results[i], first[i]));
      }
    }
  }
}

TEST_P(TransformerKernelTest, Gelu) {
  std::mt19937 rng(13);
  for (size_t n : {size_t{1}, size_t{13}, size_t{100003}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    Floats x = random_floats(n, rng, -5, 5), dout = random_floats(n, rng, -1, 1);
    Doubles out_ref(n), dx_ref(n);
    for (size_t i = 0; i < n; ++i) {
      out_ref[i] = gelu_reference(x[i]);
      dx_ref[i] = gelu_derivative_reference(x[i]) * dout[i];
    }
    std::vector<Floats> first;
    for (int t : kThreadCounts) {
      SCOPED_TRACE(::testing::Message() << t << " threads");
      Floats out(n), dx(n, 1e30f);
      gelu_forward(out.data(), x.data(), n, threads(t));
      gelu_backward(dx.data(), x.data(), dout.data(), n, threads(t));
      EXPECT_TRUE(close(out, out_ref));
      EXPECT_TRUE(close(dx, dx_ref));
      // In place over dout, as the GPT-2's backward runs it: the same bits.
      Floats dout_then_dx = dout;
      gelu_backward(dout_then_dx.data(), x.data(), dout_then_dx.data(), n, threads(t));
      EXPECT_TRUE(same_bits(dout_then_dx, dx));
      std::vector<Floats> results = {out, dx};
      if (t == 1) first = results;
      for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(same_bits(results[i], first[i]));
    }
  }
}

// Relative accuracy value by value, where GELU is tiny too (x down to -5, gelu ~ -1e-6): the
// tolerance of close() is relative to the array's largest value and would not see it. Float
// evaluation of u = sqrt(2/pi) (x + 0.044715 x^3) alone costs about |2u| ulps of exp(-2u). The
// derivative crosses zero near x = -0.75, where only an absolute error (float rounding of terms
// near 1) has a meaning: hence its floor of 1e-7.
TEST_P(TransformerKernelTest, GeluIsAccurateRelativeToEachValue) {
  constexpr double kRelative = 5e-6;
  constexpr double kSlopeFloor = 1e-7;
  Floats x;
  for (float v = -5.0f; v <= 5.0f; v += 0.01f) x.push_back(v);
  Floats out(x.size()), dx(x.size());
  Floats ones(x.size(), 1.0f);
  gelu_forward(out.data(), x.data(), x.size());
  gelu_backward(dx.data(), x.data(), ones.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double expected = gelu_reference(x[i]);
    double slope = gelu_derivative_reference(x[i]);
    EXPECT_LE(std::abs(out[i] - expected), kRelative * std::abs(expected) + 1e-30) << x[i];
    EXPECT_LE(std::abs(dx[i] - slope), kRelative * std::abs(slope) + kSlopeFloor) << x[i];
  }
}

struct AttentionSize {
  int B, T, C, NH;
};

TEST_P(TransformerKernelTest, Attention) {
  std::mt19937 rng(14);
  // Head sizes 3, 12, 32 and 8: below one vector, a vector and a tail, four vectors, one. T 67
  // and 128 span two of the 64-row tiles (the second short, or full), T 21 and 1 one.
  for (AttentionSize s : {AttentionSize{1, 1, 3, 1}, AttentionSize{2, 67, 36, 3},
                          AttentionSize{1, 21, 64, 2}, AttentionSize{1, 128, 16, 2}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const size_t rows = static_cast<size_t>(s.B) * s.T;
    // Spread 2: scores of several units, so softmaxes are far from uniform.
    Floats qkv = random_floats(rows * 3 * s.C, rng, -2, 2);
    Floats dout = random_floats(rows * s.C, rng, -1, 1);
    AttentionOut ref = attention_reference(to_doubles(qkv), s.B, s.T, s.C, s.NH);
    Doubles dqkv_ref =
        attention_backward_reference(to_doubles(dout), to_doubles(qkv), s.B, s.T, s.C, s.NH);

    std::vector<Floats> first;
    for (int t : kThreadCounts) {
      SCOPED_TRACE(::testing::Message() << t << " threads");
      Floats out(rows * s.C), lse(static_cast<size_t>(s.B) * s.NH * s.T);
      Floats dqkv(qkv.size(), 1e30f);
      attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, threads(t));
      EXPECT_TRUE(close(out, ref.out));
      EXPECT_TRUE(close(lse, ref.lse));
      attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T,
                         s.C, s.NH, threads(t));
      EXPECT_TRUE(close(dqkv, dqkv_ref));
      std::vector<Floats> results = {out, lse, dqkv};
      if (t == 1) first = results;
      for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(same_bits(results[i], first[i]));
    }
  }
}

// Heads that do not divide the channels, or have none, are refused, naming the kernel.
TEST(TransformerKernelArguments, AttentionRefusesBadHeads) {
  Floats qkv(3 * 6), out(6), lse(4), dqkv(3 * 6);
  const auto message = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const zero::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string indivisible = message(
      [&] { attention_forward(out.data(), lse.data(), qkv.data(), 1, 1, 6, 4, threads(1)); });
  EXPECT_NE(indivisible.find("attention_forward: 4 heads do not divide 6 channels"),
            std::string::npos)
      << indivisible;
  const std::string empty = message([&] {
    attention_backward(dqkv.data(), out.data(), qkv.data(), out.data(), lse.data(), 1, 1, 0, 2,
                       threads(1));
  });
  EXPECT_NE(empty.find("attention_backward: heads of 0 channels"), std::string::npos) << empty;
}

struct VocabSize {
  int N, V, Vp;
};

TEST_P(TransformerKernelTest, CrossEntropy) {
  std::mt19937 rng(15);
  const float dloss = 0.125f;
  for (VocabSize s : {VocabSize{1, 1, 1}, VocabSize{3, 7, 16}, VocabSize{5, 30001, 30016}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const size_t n = static_cast<size_t>(s.N) * s.Vp;
    Floats logits = random_floats(n, rng, -4, 4);
    std::vector<int32_t> targets(s.N);
    std::uniform_int_distribution<int32_t> target(0, s.V - 1);
    for (int32_t& t : targets) t = target(rng);
    // Large padding logits: the loss would change visibly if they entered.
    for (int row = 0; row < s.N; ++row) {
      for (int v = s.V; v < s.Vp; ++v) logits[static_cast<size_t>(row) * s.Vp + v] = 20.0f;
    }
    Doubles lse_ref(s.N);
    Doubles losses_ref =
        cross_entropy_reference(to_doubles(logits), targets, s.N, s.V, s.Vp, &lse_ref);
    Doubles d_ref =
        cross_entropy_backward_reference(to_doubles(logits), targets, dloss, s.N, s.V, s.Vp);

    std::vector<Floats> first;
    for (int t : kThreadCounts) {
      SCOPED_TRACE(::testing::Message() << t << " threads");
      Floats losses(s.N), lse(s.N), dlogits(n, std::numeric_limits<float>::quiet_NaN());
      cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), s.N, s.V,
                            s.Vp, threads(t));
      EXPECT_TRUE(close(losses, losses_ref));
      EXPECT_TRUE(close(lse, lse_ref));
      cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), dloss, s.N,
                             s.V, s.Vp, threads(t));
      EXPECT_TRUE(close(dlogits, d_ref));
      for (size_t i = 0; i < n; ++i) {
        if (static_cast<int>(i % s.Vp) >= s.V) {
          ASSERT_EQ(dlogits[i], 0.0f) << "padding " << i;
        }
      }
      // In place: the logits buffer becomes the gradient, with the same bits.
      Floats in_place = logits;
      cross_entropy_backward(in_place.data(), in_place.data(), lse.data(), targets.data(), dloss,
                             s.N, s.V, s.Vp, threads(t));
      EXPECT_TRUE(same_bits(in_place, dlogits));
      std::vector<Floats> results = {losses, lse, dlogits};
      if (t == 1) first = results;
      for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(same_bits(results[i], first[i]));
    }
  }
}
// The forward with the gradient made in it, rounded to bf16 in each row's first half: the
// losses and lse bit for bit cross_entropy_forward's on the same path; each gradient value the
// exact one, softmax - [v == target], within half a bf16 step of it (rounding) plus what fp32
// leaves (a step of 1 at the target's, where p - 1 cancels); the padding 0; the same bits at
// every thread count.
TEST_P(TransformerKernelTest, CrossEntropyWithBf16Gradient) {
  std::mt19937 rng(16);
  for (VocabSize s : {VocabSize{1, 1, 1}, VocabSize{3, 7, 16}, VocabSize{5, 30001, 30016}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const size_t n = static_cast<size_t>(s.N) * s.Vp;
    const Floats logits = random_floats(n, rng, -4, 4);
    std::vector<int32_t> targets(s.N);
    std::uniform_int_distribution<int32_t> target(0, s.V - 1);
    for (int32_t& t : targets) t = target(rng);
    const Doubles d_ref =
        cross_entropy_backward_reference(to_doubles(logits), targets, 1.0, s.N, s.V, s.Vp);
    Floats losses_unfused(s.N), lse_unfused(s.N);
    cross_entropy_forward(losses_unfused.data(), lse_unfused.data(), logits.data(), targets.data(),
                          s.N, s.V, s.Vp);

    Floats first;
    for (int t : kThreadCounts) {
      SCOPED_TRACE(::testing::Message() << t << " threads");
      Floats losses(s.N), lse(s.N), memory = logits;
      cross_entropy_forward_bf16_gradient(losses.data(), lse.data(), memory.data(), targets.data(),
                                          s.N, s.V, s.Vp, threads(t));
      EXPECT_TRUE(same_bits(losses, losses_unfused));
      EXPECT_TRUE(same_bits(lse, lse_unfused));
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(memory.data());
      Floats gradient(n);
      for (size_t row = 0; row < static_cast<size_t>(s.N); ++row) {
        for (size_t v = 0; v < static_cast<size_t>(s.Vp); ++v) {
          gradient[row * s.Vp + v] = bf16_to_float(bits[row * 2 * s.Vp + v]);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        if (static_cast<int>(i % s.Vp) >= s.V) {
          ASSERT_EQ(gradient[i], 0.0f) << "padding " << i;
          continue;
        }
        const double bound = std::ldexp(std::abs(d_ref[i]), -8) + std::ldexp(1.0, -23);
        ASSERT_LE(std::abs(gradient[i] - d_ref[i]), bound)
            << "value " << i << ": " << gradient[i] << " vs exact " << d_ref[i];
      }
      if (t == 1) first = gradient;
      EXPECT_TRUE(same_bits(gradient, first));
    }
  }
}

// --- The AVX-512 path against the AVX2 path ---------------------------------------------------

// The largest |a - b| over the largest |b|: how far two paths' results of one kernel lie apart,
// relative to the result's scale as close() measures it.
double relative_difference(const Floats& a, const Floats& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

// Runs `kernel` (which returns its result arrays) on the AVX-512 path and on the AVX2 path.
std::pair<std::vector<Floats>, std::vector<Floats>> on_avx512_and_avx2(
    const std::function<std::vector<Floats>()>& kernel) {
  EXPECT_TRUE(use_path(Path::kAvx512));
  std::vector<Floats> wide = kernel();
  EXPECT_TRUE(use_path(Path::kAvx2));
  std::vector<Floats> narrow = kernel();
  reset_kernel_isa_for_testing();
  return {wide, narrow};
}

bool avx512_and_avx2_available() {
  reset_kernel_isa_for_testing();
  return best_kernel_isa() == KernelIsa::kAvx512;
}

// GELU and the softmax's exp run the same operations per element on 16 lanes as on 8: the same
// bits. (cross_entropy_backward is scaled_exp per row, given the forward's lse.)
TEST(Avx512AgainstAvx2, ElementWiseKernelsGiveTheSameBits) {
  if (!avx512_and_avx2_available())
    GTEST_SKIP() << "this CPU (or the environment) has no AVX-512 path";
  std::mt19937 rng(21);
  const size_t n = 100003;
  const int N = 3, V = 30001, Vp = 30016;
  Floats x = random_floats(n, rng, -8, 8), dout = random_floats(n, rng, -1, 1);
  Floats logits = random_floats(static_cast<size_t>(N) * Vp, rng, -4, 4);
  Floats lse = {1.5f, 9.25f, 10.0f};
  std::vector<int32_t> targets = {0, 17, V - 1};
  auto [wide, narrow] = on_avx512_and_avx2([&] {
    Floats out(n), dx(n), dlogits(logits.size());
    gelu_forward(out.data(), x.data(), n);
    gelu_backward(dx.data(), x.data(), dout.data(), n);
    cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.5f, N, V,
                           Vp);
    return std::vector<Floats>{out, dx, dlogits};
  });
  for (size_t i = 0; i < wide.size(); ++i) EXPECT_TRUE(same_bits(wide[i], narrow[i])) << i;
}

// Sums over a row (LayerNorm's moments, softmax's normalizer, attention's GEMM-fed rows) add 16
// lane partial sums where AVX2 adds 8: a different order, so the bits differ by float rounding.
// Measured at these sizes: at most 3.1e-7 of the result's scale (LayerNorm's mean; attention's
// output 3.0e-7, the others 2.0e-7 or less, the cross-entropy's equal); bound 1e-6, well inside
// the 1e-5 both keep to the exact definitions.
TEST(Avx512AgainstAvx2, RowSumsAgreeToFloatRounding) {
  if (!avx512_and_avx2_available())
    GTEST_SKIP() << "this CPU (or the environment) has no AVX-512 path";
  constexpr double kBound = 1e-6;
  std::mt19937 rng(22);
  const int rows = 67, C = 771;
  const int N = 3, V = 30001, Vp = 30016;
  const int B = 2, T = 67, heads = 3, channels = 3 * 40;
  Floats inp = random_floats(static_cast<size_t>(rows) * C, rng, -3, 3);
  Floats weight = random_floats(C, rng, 0.5f, 1.5f), bias = random_floats(C, rng, -1, 1);
  Floats dout = random_floats(inp.size(), rng, -1, 1);
  Floats logits = random_floats(static_cast<size_t>(N) * Vp, rng, -4, 4);
  std::vector<int32_t> targets = {0, 17, V - 1};
  Floats qkv = random_floats(static_cast<size_t>(B) * T * 3 * channels, rng, -2, 2);
  Floats attention_dout = random_floats(static_cast<size_t>(B) * T * channels, rng, -1, 1);
  auto [wide, narrow] = on_avx512_and_avx2([&] {
    Floats out(inp.size()), mean(rows), rstd(rows), dinp(inp.size(), 0.0f);
    Floats dweight(C, 0.0f), dbias(C, 0.0f);
    layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(),
                      rows, C, 1e-5f);
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                       weight.data(), mean.data(), rstd.data(), rows, C);
    Floats losses(N), lse(N);
    cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, Vp);
    Floats att(attention_dout.size()), att_lse(static_cast<size_t>(B) * heads * T);
    Floats dqkv(qkv.size());
    attention_forward(att.data(), att_lse.data(), qkv.data(), B, T, channels, heads);
    attention_backward(dqkv.data(), attention_dout.data(), qkv.data(), att.data(), att_lse.data(),
                       B, T, channels, heads);
    return std::vector<Floats>{out, mean, rstd, dinp, losses, lse, att, att_lse, dqkv};
  });
  const char* names[] = {"layernorm out",  "mean",          "rstd",
                         "layernorm dinp", "losses",        "lse",
                         "attention out",  "attention lse", "dqkv"};
  for (size_t i = 0; i < wide.size(); ++i) {
    const double difference = relative_difference(wide[i], narrow[i]);
    RecordProperty(names[i], (::testing::Message() << difference).GetString());
    EXPECT_LE(difference, kBound) << names[i];
  }
}

// --- bf16 products ----------------------------------------------------------------------------

// x rounded to bf16, as doubles.
Doubles rounded_to_bf16(const Floats& x) {
  Doubles out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16_to_float(float_to_bf16(x[i]));
  return out;
}

Doubles absolute(const Doubles& x) {
  Doubles out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = std::abs(x[i]);
  return out;
}

// Each value of `got` against the exact product of the bf16-rounded inputs: a sum of K products
// accumulated in fp32 in any order is off by at most gamma_K = K u / (1 - K u) times the sum of
// the products' magnitudes (u = 2^-24, Higham's bound; the products of two bf16 values are exact
// in fp32), one more u for adding a prior value (bias or +=) and one for the result's rounding.
::testing::AssertionResult within_fp32_accumulation(const Floats& got, const Doubles& exact,
                                                    const Doubles& magnitudes, int K) {
  const double u = std::ldexp(1.0, -24);
  const double gamma = (K + 2) * u / (1.0 - (K + 2) * u);
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = gamma * magnitudes[i] + 1e-30;
    const double ratio = std::abs(got[i] - exact[i]) / bound;
    if (!(ratio <= 1.0)) {
      return ::testing::AssertionFailure()
             << "value " << i << ": " << got[i] << " vs exact " << exact[i] << ", bound " << bound;
    }
    worst = std::max(worst, ratio);
  }
  return ::testing::AssertionSuccess() << "worst error " << worst << " of the bound";
}

// The GPT-2's products with bf16 products asked for, where they run in bf16: the inputs rounded
// to bf16 and multiplied exactly, summed in fp32 (within_fp32_accumulation), for the GPT-2's
// shapes (C 384, its QKV's 1152 and MLP's 1536 columns, the tied head's [V, C] weight) and odd
// ones, at 1 and 2 threads. Where the CPU has no bf16 arithmetic they run in fp32, as the
// Matmul test checks.
TEST(Bf16Products, MatmulMatchesBf16InputsWithFp32Accumulation) {
  if (!bf16_products_in_bf16()) {
    GTEST_SKIP() << "bf16 products run in fp32 here: " << bf16_products_description();
  }
  std::mt19937 rng(23);
  struct Case {
    int N, C, OC;
    WeightLayout layout;
  };
  for (Case s :
       {Case{1, 3, 5, WeightLayout::kInOut}, Case{67, 771, 301, WeightLayout::kInOut},
        Case{259, 384, 1152, WeightLayout::kInOut}, Case{256, 1536, 384, WeightLayout::kInOut},
        Case{33, 384, 5003, WeightLayout::kOutIn}}) {
    SCOPED_TRACE(::testing::Message()
                 << "N=" << s.N << " C=" << s.C << " OC=" << s.OC
                 << (s.layout == WeightLayout::kInOut ? " in-out" : " out-in"));
    const size_t in = static_cast<size_t>(s.N) * s.C, out_n = static_cast<size_t>(s.N) * s.OC;
    Floats x = random_floats(in, rng, -1, 1), w = random_floats(in / s.N * s.OC, rng, -1, 1);
    Floats bias = random_floats(s.OC, rng, -1, 1), dout = random_floats(out_n, rng, -1, 1);
    Floats dw_prior = random_floats(w.size(), rng, -1, 1);
    const Doubles xr = rounded_to_bf16(x), wr = rounded_to_bf16(w), dr = rounded_to_bf16(dout);
    const Doubles bias_d = to_doubles(bias), bias_abs = absolute(bias_d);
    const Doubles out_exact = matmul_reference(xr, wr, &bias_d, s.N, s.C, s.OC, s.layout);
    const Doubles out_magnitude =
        matmul_reference(absolute(xr), absolute(wr), &bias_abs, s.N, s.C, s.OC, s.layout);
    Doubles dx_exact, dw_exact, db_exact, dx_magnitude, dw_magnitude, db_magnitude;
    matmul_backward_reference(dx_exact, dw_exact, db_exact, dr, xr, wr, s.N, s.C, s.OC, s.layout);
    matmul_backward_reference(dx_magnitude, dw_magnitude, db_magnitude, absolute(dr), absolute(xr),
                              absolute(wr), s.N, s.C, s.OC, s.layout);
    const Doubles prior = to_doubles(dw_prior);
    for (int t : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << t << " threads");
      KernelOptions opt = threads(t);
      opt.bf16_products = true;
      Floats out(out_n, 1e30f), dx(in, 1e30f), dw = dw_prior, db(s.OC, 0.0f);
      matmul_forward(out.data(), x.data(), w.data(), bias.data(), s.N, s.C, s.OC, s.layout, opt);
      EXPECT_TRUE(within_fp32_accumulation(out, out_exact, out_magnitude, s.C));
      // The bias is added to the products' fp32 sum once, however the product takes it.
      Floats out_nobias(out_n, 1e30f);
      matmul_forward(out_nobias.data(), x.data(), w.data(), nullptr, s.N, s.C, s.OC, s.layout,
                     opt);
      for (size_t i = 0; i < out_n; ++i) out_nobias[i] += bias[i % s.OC];
      EXPECT_TRUE(same_bits(out, out_nobias));
      matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), s.N, s.C,
                      s.OC, s.layout, opt);
      EXPECT_TRUE(within_fp32_accumulation(dx, dx_exact, dx_magnitude, s.OC));
      EXPECT_TRUE(within_fp32_accumulation(dw, plus(prior, dw_exact),
                                           plus(absolute(prior), dw_magnitude), s.N));
      // Something must differ from fp32 products where the inputs are not bf16 values.
      Floats out_fp32(out_n);
      matmul_forward(out_fp32.data(), x.data(), w.data(), bias.data(), s.N, s.C, s.OC, s.layout,
                     threads(t));
      EXPECT_FALSE(same_bits(out, out_fp32));
    }
  }
}

// Attention with bf16 products where they run in bf16, as double references: q, k, v and the
// output's gradient rounded to bf16; the softmax exact; P rounded (from fp32) before it
// multiplies v or dout, dS before it multiplies k or q; everything else exact.
struct Bf16Attention {
  Doubles out, dqkv;
};
Bf16Attention bf16_attention_reference(const Floats& qkv_f, const Floats& dout_f, int B, int T,
                                       int C, int NH) {
  const Doubles qkv = rounded_to_bf16(qkv_f), dout = rounded_to_bf16(dout_f);
  const auto bf16 = [](double x) {
    return static_cast<double>(bf16_to_float(float_to_bf16(static_cast<float>(x))));
  };
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Bf16Attention r{Doubles(static_cast<size_t>(B) * T * C, 0.0), Doubles(qkv.size(), 0.0)};
  auto at = [&](int b, int t, int part, int h) { return (b * T + t) * 3 * C + part * C + h * hs; };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        Doubles p(i + 1), dp(i + 1);
        double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int j = 0; j <= i; ++j) {
          p[j] = 0.0;
          for (int c = 0; c < hs; ++c) p[j] += qkv[at(b, i, 0, h) + c] * qkv[at(b, j, 1, h) + c];
          max = std::max(max, p[j] *= scale);
        }
        for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - max));
        const size_t row = static_cast<size_t>(b * T + i) * C + h * hs;
        for (int j = 0; j <= i; ++j) {
          p[j] /= sum;
          for (int c = 0; c < hs; ++c) r.out[row + c] += bf16(p[j]) * qkv[at(b, j, 2, h) + c];
        }
        double weighted = 0.0;  // D = dout . out, both fp32 in the kernel
        for (int c = 0; c < hs; ++c)
          weighted += static_cast<double>(dout_f[row + c]) * r.out[row + c];
        for (int j = 0; j <= i; ++j) {
          dp[j] = 0.0;
          for (int c = 0; c < hs; ++c) dp[j] += dout[row + c] * qkv[at(b, j, 2, h) + c];
          const double ds = bf16(p[j] * (dp[j] - weighted) * scale);
          for (int c = 0; c < hs; ++c) {
            r.dqkv[at(b, j, 2, h) + c] += bf16(p[j]) * dout[row + c];
            r.dqkv[at(b, i, 0, h) + c] += ds * qkv[at(b, j, 1, h) + c];
            r.dqkv[at(b, j, 1, h) + c] += ds * qkv[at(b, i, 0, h) + c];
          }
        }
      }
    }
  }
  return r;
}

// The root mean square of got - want over the largest |want|.
double rms_error(const Floats& got, const Doubles& want) {
  double squares = 0.0;
  for (size_t i = 0; i < got.size(); ++i) squares += std::pow(got[i] - want[i], 2);
  return std::sqrt(squares / static_cast<double>(got.size())) / max_abs(want);
}

// Attention with bf16 products, where they run in bf16 (bf16_attention_in_bf16): against the
// reference above, for the sizes of the fp32 test and the GPT-2's (T 256, head size 64), at 1
// and 2 threads, bitwise the same at both. The reference's rounding of P and dS starts from
// exact values, the kernel's from fp32 ones, so now and then one lands on the other side of a
// bf16 midpoint: one term of a sum off by a bf16 step (2^-8 of it). Hence no bound per value,
// but the RMS error, which such flips barely move: measured at most 5.9e-8 of the largest value
// (AMD EPYC, avx512_core_bf16), held to 1e-6; fp32 products of the same inputs are 2.2e-4 or
// more away from this reference (held to more than 1e-4), so the check tells them apart.
TEST(Bf16Products, AttentionMatchesBf16InputsWithFp32Accumulation) {
  if (!bf16_attention_in_bf16()) {
    GTEST_SKIP() << "attention's bf16 products run in fp32 here: " << bf16_products_description();
  }
  std::mt19937 rng(31);
  for (AttentionSize s : {AttentionSize{2, 67, 36, 3}, AttentionSize{1, 21, 64, 2},
                          AttentionSize{1, 128, 16, 2}, AttentionSize{1, 256, 128, 2}}) {
    SCOPED_TRACE(::testing::Message()
                 << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const size_t rows = static_cast<size_t>(s.B) * s.T;
    const Floats qkv = random_floats(rows * 3 * s.C, rng, -2, 2);
    const Floats dout = random_floats(rows * s.C, rng, -1, 1);
    const Bf16Attention ref = bf16_attention_reference(qkv, dout, s.B, s.T, s.C, s.NH);
    std::vector<Floats> first;
    for (int t : {1, 2}) {
      for (bool bf16 : {true, false}) {
        KernelOptions opt = threads(t);
        opt.bf16_products = bf16;
        Floats out(rows * s.C), lse(static_cast<size_t>(s.B) * s.NH * s.T), dqkv(qkv.size());
        attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, opt);
        attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T,
                           s.C, s.NH, opt);
        const double out_error = rms_error(out, ref.out), dqkv_error = rms_error(dqkv, ref.dqkv);
        RecordProperty((::testing::Message()
                        << "T" << s.T << (bf16 ? " bf16" : " fp32") << " rms error out, dqkv")
                           .GetString(),
                       (::testing::Message() << out_error << ", " << dqkv_error).GetString());
        if (!bf16) {
          EXPECT_GT(std::min(out_error, dqkv_error), 1e-4) << "fp32 products look like bf16 ones";
          continue;
        }
        EXPECT_LE(out_error, 1e-6) << t << " threads";
        EXPECT_LE(dqkv_error, 1e-6) << t << " threads";
        if (t == 1) first = {out, lse, dqkv};
        EXPECT_TRUE(same_bits(out, first[0]));
        EXPECT_TRUE(same_bits(lse, first[1]));
        EXPECT_TRUE(same_bits(dqkv, first[2]));
      }
    }
  }
}

// The LM head's backward from the gradient its forward left in the logits' memory
// (matmul_backward_scaled_bf16): bf16 rows 2 OC apart, whose gaps hold NaNs that must not be
// read, scaled in the products. Against the exact products of the bf16 inputs times the scale,
// within fp32 accumulation and one more rounding for the scale, at a scale that rounds and at
// one that does not. fp32 products refuse it.
TEST(Bf16Products, ScaledBf16GradientIsTheScaledProduct) {
  std::mt19937 rng(31);
  struct Case {
    int N, C, OC;
    WeightLayout layout;
  };
  for (Case s :
       {Case{33, 384, 5003, WeightLayout::kOutIn}, Case{67, 77, 301, WeightLayout::kInOut}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    const size_t in = static_cast<size_t>(s.N) * s.C, ld = 2 * static_cast<size_t>(s.OC);
    const Floats x = random_floats(in, rng, -1, 1), w = random_floats(in / s.N * s.OC, rng, -1, 1);
    const Floats dw_prior = random_floats(w.size(), rng, -1, 1);
    std::vector<uint16_t> rows(static_cast<size_t>(s.N) * ld, 0x7fc0);  // NaN between the rows
    Floats dout(static_cast<size_t>(s.N) * s.OC);
    for (size_t r = 0; r < static_cast<size_t>(s.N); ++r) {
      for (size_t c = 0; c < static_cast<size_t>(s.OC); ++c) {
        const uint16_t b = float_to_bf16(static_cast<float>(rng() % 2001) / 1000.0f - 1.0f);
        rows[r * ld + c] = b;
        dout[r * s.OC + c] = bf16_to_float(b);
      }
    }
    KernelOptions opt = threads(2);
    opt.bf16_products = true;
    if (!bf16_products_in_bf16()) {
      Floats dx(in);
      ::zero::testing::expect_error_naming(
          [&] {
            matmul_backward_scaled_bf16(dx.data(), nullptr, {rows.data(), ld, 1.0f}, nullptr,
                                        w.data(), s.N, s.C, s.OC, s.layout, opt);
          },
          "matmul_backward_scaled_bf16 needs bf16 products");
      continue;
    }
    const Doubles xr = rounded_to_bf16(x), wr = rounded_to_bf16(w), dr = to_doubles(dout);
    Doubles dx_exact, dw_exact, db_exact, dx_magnitude, dw_magnitude, db_magnitude;
    matmul_backward_reference(dx_exact, dw_exact, db_exact, dr, xr, wr, s.N, s.C, s.OC, s.layout);
    matmul_backward_reference(dx_magnitude, dw_magnitude, db_magnitude, absolute(dr), absolute(xr),
                              absolute(wr), s.N, s.C, s.OC, s.layout);
    const auto times = [](Doubles v, double f) {
      for (double& value : v) value *= f;
      return v;
    };
    const Doubles prior = to_doubles(dw_prior);
    for (float scale : {0.3f, 0.25f}) {
      SCOPED_TRACE(::testing::Message() << "scale " << scale);
      Floats dx(in, 1e30f), dw = dw_prior;
      matmul_backward_scaled_bf16(dx.data(), dw.data(), {rows.data(), ld, scale}, x.data(),
                                  w.data(), s.N, s.C, s.OC, s.layout, opt);
      EXPECT_TRUE(within_fp32_accumulation(dx, times(dx_exact, scale), times(dx_magnitude, scale),
                                           s.OC + 1));
      EXPECT_TRUE(within_fp32_accumulation(dw, plus(prior, times(dw_exact, scale)),
                                           plus(absolute(prior), times(dw_magnitude, scale)),
                                           s.N + 1));
    }
  }
}

// A bf16 weight gradient (MatrixGradient::bf16, a bf16 run's gradient) is added to inside bf16
// products with the bits of the product into a zeroed fp32 gradient added into it (rounding
// once), in both layouts, through matmul_backward and matmul_backward_scaled_bf16. fp32
// products refuse it.
TEST(Bf16Products, Bf16WeightGradientsGetTheBitsOfAnFp32OneAddedIn) {
  std::mt19937 rng(37);
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    const int N = 67, C = 384, OC = 301;
    SCOPED_TRACE(layout == WeightLayout::kInOut ? "in-out" : "out-in");
    const Floats x = random_floats(static_cast<size_t>(N) * C, rng, -1, 1);
    const Floats dout = random_floats(static_cast<size_t>(N) * OC, rng, -1, 1);
    std::vector<uint16_t> prior(static_cast<size_t>(C) * OC);
    for (uint16_t& b : prior) b = float_to_bf16(static_cast<float>(rng() % 2001) / 1000.0f - 1.0f);
    std::vector<uint16_t> rows(static_cast<size_t>(N) * 2 * OC, 0x7fc0);
    for (size_t r = 0; r < static_cast<size_t>(N); ++r) {
      for (size_t c = 0; c < static_cast<size_t>(OC); ++c) {
        rows[r * 2 * OC + c] = float_to_bf16(dout[r * OC + c]);
      }
    }
    KernelOptions opt = threads(2);
    opt.bf16_products = true;
    if (!bf16_products_in_bf16()) {
      std::vector<uint16_t> dw = prior;
      ::zero::testing::expect_error_naming(
          [&] {
            matmul_backward(nullptr, MatrixGradient::bf16(dw.data()), nullptr, dout.data(),
                            x.data(), nullptr, N, C, OC, layout, opt);
          },
          "a bf16 weight gradient (MatrixGradient::bf16) needs bf16 products");
      continue;
    }
    const auto added_in = [&](const Floats& fp32) {
      std::vector<uint16_t> out = prior;
      accumulate(out.data(), DType::kBFloat16, fp32.data(), DType::kFloat32, fp32.size());
      return out;
    };
    Floats fp32(prior.size(), 0.0f);
    matmul_backward(nullptr, fp32.data(), nullptr, dout.data(), x.data(), nullptr, N, C, OC, layout,
                    opt);
    std::vector<uint16_t> dw = prior;
    matmul_backward(nullptr, MatrixGradient::bf16(dw.data()), nullptr, dout.data(), x.data(),
                    nullptr, N, C, OC, layout, opt);
    EXPECT_EQ(dw, added_in(fp32));
    Floats fp32_scaled(prior.size(), 0.0f);
    matmul_backward_scaled_bf16(nullptr, fp32_scaled.data(), {rows.data(), 2 * size_t{OC}, 0.3f},
                                x.data(), nullptr, N, C, OC, layout, opt);
    std::vector<uint16_t> dw_scaled = prior;
    matmul_backward_scaled_bf16(nullptr, MatrixGradient::bf16(dw_scaled.data()),
                                {rows.data(), 2 * size_t{OC}, 0.3f}, x.data(), nullptr, N, C, OC,
                                layout, opt);
    EXPECT_EQ(dw_scaled, added_in(fp32_scaled));
    // fp32 products do not take it.
    opt.bf16_products = false;
    ::zero::testing::expect_error_naming(
        [&] {
          matmul_backward(nullptr, MatrixGradient::bf16(dw.data()), nullptr, dout.data(), x.data(),
                          nullptr, N, C, OC, layout, opt);
        },
        "a bf16 weight gradient (MatrixGradient::bf16) needs bf16 products");
  }
}

// A weight given as bf16 (MatrixWeight::bf16, a bf16 run's working copy) gives in bf16 products
// the bits of the same values given as fp32: they are the rounded operand as they are. fp32
// products (bf16_products off, or a CPU without bf16 arithmetic) refuse it.
TEST(Bf16Products, Bf16WeightsGiveTheBitsOfTheirFp32Values) {
  std::mt19937 rng(29);
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    const int N = 67, C = 384, OC = 301;
    const Floats x = random_floats(static_cast<size_t>(N) * C, rng, -1, 1);
    const Floats dout = random_floats(static_cast<size_t>(N) * OC, rng, -1, 1);
    const Floats bias = random_floats(OC, rng, -1, 1);
    std::vector<uint16_t> w_bf16(static_cast<size_t>(C) * OC);
    Floats w(w_bf16.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w_bf16[i] = float_to_bf16(static_cast<float>(rng() % 2001) / 1000.0f - 1.0f);
      w[i] = bf16_to_float(w_bf16[i]);
    }
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (layout == WeightLayout::kInOut ? "in-out" : "out-in")
                                        << (bf16 ? ", bf16 products" : ", fp32 products"));
      KernelOptions opt = threads(2);
      opt.bf16_products = bf16;
      Floats out(static_cast<size_t>(N) * OC), out_raw(out.size());
      if (!bf16 || !bf16_products_in_bf16()) {
        ::zero::testing::expect_error_naming(
            [&] {
              matmul_forward(out_raw.data(), x.data(), MatrixWeight::bf16(w_bf16.data()),
                             bias.data(), N, C, OC, layout, opt);
            },
            "a bf16 weight (MatrixWeight::bf16) needs bf16 products");
        continue;
      }
      matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, C, OC, layout, opt);
      matmul_forward(out_raw.data(), x.data(), MatrixWeight::bf16(w_bf16.data()), bias.data(), N, C,
                     OC, layout, opt);
      EXPECT_TRUE(same_bits(out, out_raw));
      Floats dx(x.size()), dx_raw(x.size());
      matmul_backward(dx.data(), nullptr, nullptr, dout.data(), nullptr, w.data(), N, C, OC, layout,
                      opt);
      matmul_backward(dx_raw.data(), nullptr, nullptr, dout.data(), nullptr,
                      MatrixWeight::bf16(w_bf16.data()), N, C, OC, layout, opt);
      EXPECT_TRUE(same_bits(dx, dx_raw));
    }
  }
  // One dtype or the other.
  const float one = 1.0f;
  const uint16_t one_bf16 = float_to_bf16(1.0f);
  MatrixWeight both(&one);
  both.bf16_bits = &one_bf16;
  float out = 0.0f;
  ::zero::testing::expect_error_naming(
      [&] { matmul_forward(&out, &one, both, nullptr, 1, 1, 1, WeightLayout::kInOut); },
      "matmul_forward: weight has both fp32 and bf16 values; give one");
}

}  // namespace
}  // namespace zero::kernels::testing
