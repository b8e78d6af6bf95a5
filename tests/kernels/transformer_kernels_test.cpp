// The transformer kernels against references written here in double, straight from the
// definitions (the attention reference keeps each row's full softmax; the backward references
// are the textbook chain rule, checked in turn against central finite differences). Each kernel
// runs on the AVX2 and the scalar path, at 1, 2 and 3 threads on sizes large enough for every
// thread to get work, and must return the same bits at every thread count. Sizes are odd on
// purpose: rows of C not a multiple of 8, T not a multiple of 8, head sizes below and above 32,
// a vocabulary padded with columns that must not count, single rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "zero/kernels/transformer_kernels.h"

namespace zero::kernels::testing {
namespace {

using Doubles = std::vector<double>;
using Floats = std::vector<float>;

// fp32 kernels against exact double references: every output is a sum of at most a few hundred
// products (tens of thousands for the cross-entropy's exp sum, which sums in 8 lanes), each
// rounded to float (6e-8 relative), of terms no larger than the array's largest value. An
// error below 1e-5 of that value leaves a wide margin, while any indexing, scaling or sign bug
// is off by a large fraction of it.
constexpr double kTolerance = 1e-5;
// Central differences of double functions with step 1e-6: truncation error ~1e-12 and rounding
// error ~1e-10 relative, far below this.
constexpr double kGradientTolerance = 1e-6;

Floats random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> uniform(lo, hi);
  Floats values(n);
  for (float& v : values) v = uniform(rng);
  return values;
}

Doubles to_doubles(const Floats& values) {
  return Doubles(values.begin(), values.end());
}

double max_abs(const Doubles& values) {
  double m = 0.0;
  for (double v : values) m = std::max(m, std::abs(v));
  return m;
}

// |actual - expected| <= tolerance * (|expected| + the largest |expected|), element by element.
::testing::AssertionResult close(const Floats& actual, const Doubles& expected,
                                 double tolerance = kTolerance) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << actual.size() << " values, expected " << expected.size();
  }
  const double scale = max_abs(expected);
  for (size_t i = 0; i < actual.size(); ++i) {
    double error = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (!(error <= tolerance * (std::abs(expected[i]) + scale))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << actual[i] << " vs "
                                           << expected[i] << " (largest " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult close(const Doubles& actual, const Doubles& expected, double tolerance) {
  return close(Floats(actual.begin(), actual.end()), expected, tolerance);
}

::testing::AssertionResult same_bits(const Floats& actual, const Floats& expected) {
  if (actual.size() != expected.size() ||
      std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)) != 0) {
    return ::testing::AssertionFailure() << "bits differ from the single-thread result";
  }
  return ::testing::AssertionSuccess();
}

Doubles plus(const Doubles& a, const Doubles& b, double b_times = 1.0) {
  Doubles sum(a);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += b_times * b[i];
  return sum;
}

// d f / d x[i] for every i, by central differences.
Doubles numeric_gradient(const std::function<double(const Doubles&)>& f, Doubles x) {
  constexpr double kStep = 1e-6;
  Doubles gradient(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + kStep;
    double up = f(x);
    x[i] = saved - kStep;
    double down = f(x);
    x[i] = saved;
    gradient[i] = (up - down) / (2.0 * kStep);
  }
  return gradient;
}

double dot(const Doubles& a, const Doubles& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

KernelOptions threads(int count) {
  KernelOptions opt;
  opt.threads = count;
  return opt;
}

// --- References in double ---------------------------------------------------------------------

Doubles embedding_reference(const Floats& tokens, const Doubles& wte, const Doubles& wpe, int B,
                            int T, int C) {
  Doubles out(static_cast<size_t>(B) * T * C);
  for (int row = 0; row < B * T; ++row) {
    int token = static_cast<int>(tokens[row]);
    for (int c = 0; c < C; ++c) out[row * C + c] = wte[token * C + c] + wpe[(row % T) * C + c];
  }
  return out;
}

void embedding_backward_reference(Doubles& dwte, Doubles& dwpe, const Doubles& dout,
                                  const Floats& tokens, int B, int T, int C) {
  for (int row = 0; row < B * T; ++row) {
    int token = static_cast<int>(tokens[row]);
    for (int c = 0; c < C; ++c) {
      dwte[token * C + c] += dout[row * C + c];
      dwpe[(row % T) * C + c] += dout[row * C + c];
    }
  }
}

struct LayerNormOut {
  Doubles out, mean, rstd;
};

LayerNormOut layernorm_reference(const Doubles& x, const Doubles& w, const Doubles& b, int N, int C,
                                 double eps) {
  LayerNormOut r{Doubles(x.size()), Doubles(N), Doubles(N)};
  for (int n = 0; n < N; ++n) {
    double mean = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) mean += x[n * C + c] / C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - mean) * (x[n * C + c] - mean) / C;
    double rstd = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = (x[n * C + c] - mean) * rstd * w[c] + b[c];
    r.mean[n] = mean;
    r.rstd[n] = rstd;
  }
  return r;
}

// Overwrites dx, dw and db with the gradients of sum(out * dout).
void layernorm_backward_reference(Doubles& dx, Doubles& dw, Doubles& db, const Doubles& dout,
                                  const Doubles& x, const Doubles& w, int N, int C, double eps) {
  LayerNormOut fwd = layernorm_reference(x, w, Doubles(C, 0.0), N, C, eps);
  dx.assign(x.size(), 0.0);
  dw.assign(C, 0.0);
  db.assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int c = 0; c < C; ++c) {
      double norm = (x[n * C + c] - fwd.mean[n]) * fwd.rstd[n];
      double dnorm = dout[n * C + c] * w[c];
      dnorm_mean += dnorm / C;
      dnorm_norm_mean += dnorm * norm / C;
      dw[c] += dout[n * C + c] * norm;
      db[c] += dout[n * C + c];
    }
    for (int c = 0; c < C; ++c) {
      double norm = (x[n * C + c] - fwd.mean[n]) * fwd.rstd[n];
      double dnorm = dout[n * C + c] * w[c];
      dx[n * C + c] = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * fwd.rstd[n];
    }
  }
}

// W[i][o] of either layout.
double weight_at(const Doubles& w, int i, int o, int C, int OC, WeightLayout layout) {
  return layout == WeightLayout::kInOut ? w[i * OC + o] : w[o * C + i];
}

Doubles matmul_reference(const Doubles& x, const Doubles& w, const Doubles* bias, int N, int C,
                         int OC, WeightLayout layout) {
  Doubles out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double sum = bias ? (*bias)[o] : 0.0;
      for (int i = 0; i < C; ++i) sum += x[n * C + i] * weight_at(w, i, o, C, OC, layout);
      out[n * OC + o] = sum;
    }
  }
  return out;
}

// Overwrites dx, dw (in the weight's layout) and db.
void matmul_backward_reference(Doubles& dx, Doubles& dw, Doubles& db, const Doubles& dout,
                               const Doubles& x, const Doubles& w, int N, int C, int OC,
                               WeightLayout layout) {
  dx.assign(static_cast<size_t>(N) * C, 0.0);
  dw.assign(static_cast<size_t>(C) * OC, 0.0);
  db.assign(OC, 0.0);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double d = dout[n * OC + o];
      db[o] += d;
      for (int i = 0; i < C; ++i) {
        dx[n * C + i] += d * weight_at(w, i, o, C, OC, layout);
        size_t at = layout == WeightLayout::kInOut ? static_cast<size_t>(i) * OC + o
                                                   : static_cast<size_t>(o) * C + i;
        dw[at] += d * x[n * C + i];
      }
    }
  }
}

double gelu_reference(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_derivative_reference(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

struct AttentionOut {
  Doubles out, lse;
};

// Each query row's softmax over keys 0..i in full.
AttentionOut attention_reference(const Doubles& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  AttentionOut r{Doubles(static_cast<size_t>(B) * T * C, 0.0),
                 Doubles(static_cast<size_t>(B) * NH * T)};
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        const double* q = &qkv[(b * T + i) * 3 * C + h * hs];
        Doubles s(i + 1);
        double max = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          s[j] = 0.0;
          for (int c = 0; c < hs; ++c) s[j] += q[c] * k[c] * scale;
          max = std::max(max, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - max);
        for (int j = 0; j <= i; ++j) {
          double p = std::exp(s[j] - max) / sum;
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hs];
          for (int c = 0; c < hs; ++c) r.out[(b * T + i) * C + h * hs + c] += p * v[c];
        }
        r.lse[(b * NH + h) * T + i] = max + std::log(sum);
      }
    }
  }
  return r;
}

// The chain rule through the full softmax: ds_j = p_j (dp_j - sum_k p_k dp_k).
Doubles attention_backward_reference(const Doubles& dout, const Doubles& qkv, int B, int T, int C,
                                     int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Doubles dqkv(qkv.size(), 0.0);
  auto at = [&](int b, int t, int part, int h) { return (b * T + t) * 3 * C + part * C + h * hs; };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        Doubles p(i + 1), dp(i + 1);
        double max = -std::numeric_limits<double>::infinity();
        for (int j = 0; j <= i; ++j) {
          p[j] = 0.0;
          for (int c = 0; c < hs; ++c) p[j] += qkv[at(b, i, 0, h) + c] * qkv[at(b, j, 1, h) + c];
          p[j] *= scale;
          max = std::max(max, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - max));
        double weighted = 0.0;
        for (int j = 0; j <= i; ++j) {
          p[j] /= sum;
          dp[j] = 0.0;
          for (int c = 0; c < hs; ++c) {
            dp[j] += dout[(b * T + i) * C + h * hs + c] * qkv[at(b, j, 2, h) + c];
          }
          weighted += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          double ds = p[j] * (dp[j] - weighted) * scale;
          for (int c = 0; c < hs; ++c) {
            dqkv[at(b, j, 2, h) + c] += p[j] * dout[(b * T + i) * C + h * hs + c];
            dqkv[at(b, i, 0, h) + c] += ds * qkv[at(b, j, 1, h) + c];
            dqkv[at(b, j, 1, h) + c] += ds * qkv[at(b, i, 0, h) + c];
          }
        }
      }
    }
  }
  return dqkv;
}

// losses[n] = logsumexp(logits[n, :V]) - logits[n, target].
Doubles cross_entropy_reference(const Doubles& logits, const std::vector<int32_t>& targets, int N,
                                int V, int Vp, Doubles* lse = nullptr) {
  Doubles losses(N);
  for (int n = 0; n < N; ++n) {
    double max = logits[static_cast<size_t>(n) * Vp];
    for (int v = 0; v < V; ++v) max = std::max(max, logits[static_cast<size_t>(n) * Vp + v]);
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(logits[static_cast<size_t>(n) * Vp + v] - max);
    double row_lse = max + std::log(sum);
    if (lse) (*lse)[n] = row_lse;
    losses[n] = row_lse - logits[static_cast<size_t>(n) * Vp + targets[n]];
  }
  return losses;
}

Doubles cross_entropy_backward_reference(const Doubles& logits, const std::vector<int32_t>& targets,
                                         double dloss, int N, int V, int Vp) {
  Doubles lse(N);
  cross_entropy_reference(logits, targets, N, V, Vp, &lse);
  Doubles d(logits.size(), 0.0);
  for (int n = 0; n < N; ++n) {
    for (int v = 0; v < V; ++v) {
      size_t at = static_cast<size_t>(n) * Vp + v;
      d[at] = (std::exp(logits[at] - lse[n]) - (v == targets[n] ? 1.0 : 0.0)) * dloss;
    }
  }
  return d;
}

// --- The references' backward passes are the true gradients -----------------------------------

// For every reference below, the loss is sum(forward output * g) for a fixed random g, whose
// gradient the backward reference computes with dout = g.

TEST(TransformerReference, EmbeddingBackwardIsTheGradient) {
  std::mt19937 rng(1);
  const int B = 2, T = 3, C = 4, V = 3;
  Floats tokens = {0, 2, 2, 1, 0, 2};
  Doubles wte = to_doubles(random_floats(V * C, rng, -1, 1));
  Doubles wpe = to_doubles(random_floats(T * C, rng, -1, 1));
  Doubles g = to_doubles(random_floats(B * T * C, rng, -1, 1));
  Doubles dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  embedding_backward_reference(dwte, dwpe, g, tokens, B, T, C);
  auto loss_wte = [&](const Doubles& x) {
    return dot(embedding_reference(tokens, x, wpe, B, T, C), g);
  };
  auto loss_wpe = [&](const Doubles& x) {
    return dot(embedding_reference(tokens, wte, x, B, T, C), g);
  };
  EXPECT_TRUE(close(dwte, numeric_gradient(loss_wte, wte), kGradientTolerance));
  EXPECT_TRUE(close(dwpe, numeric_gradient(loss_wpe, wpe), kGradientTolerance));
}

TEST(TransformerReference, LayerNormBackwardIsTheGradient) {
  std::mt19937 rng(2);
  const int N = 3, C = 5;
  const double eps = 1e-5;
  Doubles x = to_doubles(random_floats(N * C, rng, -2, 2));
  Doubles w = to_doubles(random_floats(C, rng, 0.5f, 1.5f));
  Doubles b = to_doubles(random_floats(C, rng, -1, 1));
  Doubles g = to_doubles(random_floats(N * C, rng, -1, 1));
  Doubles dx, dw, db;
  layernorm_backward_reference(dx, dw, db, g, x, w, N, C, eps);
  auto loss = [&](const Doubles& xi, const Doubles& wi, const Doubles& bi) {
    return dot(layernorm_reference(xi, wi, bi, N, C, eps).out, g);
  };
  EXPECT_TRUE(close(dx, numeric_gradient([&](const Doubles& v) { return loss(v, w, b); }, x),
                    kGradientTolerance));
  EXPECT_TRUE(close(dw, numeric_gradient([&](const Doubles& v) { return loss(x, v, b); }, w),
                    kGradientTolerance));
  EXPECT_TRUE(close(db, numeric_gradient([&](const Doubles& v) { return loss(x, w, v); }, b),
                    kGradientTolerance));
}

TEST(TransformerReference, MatmulBackwardIsTheGradient) {
  std::mt19937 rng(3);
  const int N = 2, C = 3, OC = 4;
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    Doubles x = to_doubles(random_floats(N * C, rng, -1, 1));
    Doubles w = to_doubles(random_floats(C * OC, rng, -1, 1));
    Doubles bias = to_doubles(random_floats(OC, rng, -1, 1));
    Doubles g = to_doubles(random_floats(N * OC, rng, -1, 1));
    Doubles dx, dw, db;
    matmul_backward_reference(dx, dw, db, g, x, w, N, C, OC, layout);
    auto loss = [&](const Doubles& xi, const Doubles& wi, const Doubles& bi) {
      return dot(matmul_reference(xi, wi, &bi, N, C, OC, layout), g);
    };
    EXPECT_TRUE(close(dx, numeric_gradient([&](const Doubles& v) { return loss(v, w, bias); }, x),
                      kGradientTolerance));
    EXPECT_TRUE(close(dw, numeric_gradient([&](const Doubles& v) { return loss(x, v, bias); }, w),
                      kGradientTolerance));
    EXPECT_TRUE(close(db, numeric_gradient([&](const Doubles& v) { return loss(x, w, v); }, bias),
                      kGradientTolerance));
  }
}

TEST(TransformerReference, GeluDerivativeIsTheGradient) {
  Doubles x = {-6.0, -3.1, -1.0, -0.2, 0.0, 0.3, 1.7, 4.4}, derivative;
  for (double v : x) derivative.push_back(gelu_derivative_reference(v));
  auto loss = [](const Doubles& v) {
    double sum = 0.0;
    for (double value : v) sum += gelu_reference(value);
    return sum;
  };
  EXPECT_TRUE(close(derivative, numeric_gradient(loss, x), kGradientTolerance));
}

TEST(TransformerReference, AttentionBackwardIsTheGradient) {
  std::mt19937 rng(4);
  const int B = 2, T = 4, C = 6, NH = 2;
  Doubles qkv = to_doubles(random_floats(B * T * 3 * C, rng, -1, 1));
  Doubles g = to_doubles(random_floats(B * T * C, rng, -1, 1));
  auto loss = [&](const Doubles& x) { return dot(attention_reference(x, B, T, C, NH).out, g); };
  EXPECT_TRUE(close(attention_backward_reference(g, qkv, B, T, C, NH), numeric_gradient(loss, qkv),
                    kGradientTolerance));
}

TEST(TransformerReference, CrossEntropyBackwardIsTheGradient) {
  std::mt19937 rng(5);
  const int N = 3, V = 5, Vp = 7;
  const double dloss = 0.25;
  Doubles logits = to_doubles(random_floats(N * Vp, rng, -3, 3));
  std::vector<int32_t> targets = {4, 0, 2};
  auto loss = [&](const Doubles& x) {
    Doubles losses = cross_entropy_reference(x, targets, N, V, Vp);
    return dloss * (losses[0] + losses[1] + losses[2]);
  };
  EXPECT_TRUE(close(cross_entropy_backward_reference(logits, targets, dloss, N, V, Vp),
                    numeric_gradient(loss, logits), kGradientTolerance));
}

// --- The kernels on both paths ----------------------------------------------------------------

class TransformerKernelTest : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    force_scalar_for_testing(false);
    if (GetParam() == Path::kAvx2 && !cpu_has_avx2()) {
      GTEST_SKIP() << "this CPU (or ZERO_KERNELS_SCALAR) leaves no AVX2 path to test";
    }
    force_scalar_for_testing(GetParam() == Path::kScalar);
  }
  void TearDown() override { force_scalar_for_testing(false); }
};

INSTANTIATE_TEST_SUITE_P(Paths, TransformerKernelTest,
                         ::testing::Values(Path::kAvx2, Path::kScalar),
                         [](const ::testing::TestParamInfo<Path>& path) {
                           return std::string(path.param == Path::kAvx2 ? "avx2" : "scalar");
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
  // Head sizes 3, 12 and 32: below one vector, a vector and a tail, the 4-accumulator dot.
  for (AttentionSize s :
       {AttentionSize{1, 1, 3, 1}, AttentionSize{2, 67, 36, 3}, AttentionSize{1, 21, 64, 2}}) {
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

}  // namespace
}  // namespace zero::kernels::testing
