// The double-precision references of the CPU transformer kernels' tests, written straight from
// the definitions (the attention reference keeps each row's full softmax; the backward
// references are the textbook chain rule, checked against central finite differences in
// transformer_reference_test.cpp), and the helpers the tests share.
#pragma once

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

using Doubles = std::vector<double>;
using Floats = std::vector<float>;

// fp32 kernels against exact double references: every output is a sum of at most a few hundred
// products (tens of thousands for the cross-entropy's exp sum, which sums in 8 lanes), each
// rounded to float (6e-8 relative), of terms no larger than the array's largest value. An
// error below 1e-5 of that value leaves a wide margin, while any indexing, scaling or sign bug
// is off by a large fraction of it.
inline constexpr double kTolerance = 1e-5;
// Central differences of double functions with step 1e-6: truncation error ~1e-12 and rounding
// error ~1e-10 relative, far below this.
inline constexpr double kGradientTolerance = 1e-6;

inline Floats random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> uniform(lo, hi);
  Floats values(n);
  for (float& v : values) v = uniform(rng);
  return values;
}

inline Doubles to_doubles(const Floats& values) {
  return Doubles(values.begin(), values.end());
}

inline double max_abs(const Doubles& values) {
  double m = 0.0;
  for (double v : values) m = std::max(m, std::abs(v));
  return m;
}

// |actual - expected| <= tolerance * (|expected| + the largest |expected|), element by element.
inline ::testing::AssertionResult close(const Floats& actual, const Doubles& expected,
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

inline ::testing::AssertionResult close(const Doubles& actual, const Doubles& expected,
                                        double tolerance) {
  return close(Floats(actual.begin(), actual.end()), expected, tolerance);
}

inline ::testing::AssertionResult same_bits(const Floats& actual, const Floats& expected) {
  if (actual.size() != expected.size() ||
      std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(float)) != 0) {
    return ::testing::AssertionFailure() << "bits differ from the single-thread result";
  }
  return ::testing::AssertionSuccess();
}

inline Doubles plus(const Doubles& a, const Doubles& b, double b_times = 1.0) {
  Doubles sum(a);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += b_times * b[i];
  return sum;
}

// d f / d x[i] for every i, by central differences.
inline Doubles numeric_gradient(const std::function<double(const Doubles&)>& f, Doubles x) {
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

inline double dot(const Doubles& a, const Doubles& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

inline KernelOptions threads(int count) {
  KernelOptions opt;
  opt.threads = count;
  return opt;
}

// --- References in double ---------------------------------------------------------------------

inline Doubles embedding_reference(const Floats& tokens, const Doubles& wte, const Doubles& wpe,
                                   int B, int T, int C) {
  Doubles out(static_cast<size_t>(B) * T * C);
  for (int row = 0; row < B * T; ++row) {
    int token = static_cast<int>(tokens[row]);
    for (int c = 0; c < C; ++c) out[row * C + c] = wte[token * C + c] + wpe[(row % T) * C + c];
  }
  return out;
}

inline void embedding_backward_reference(Doubles& dwte, Doubles& dwpe, const Doubles& dout,
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

inline LayerNormOut layernorm_reference(const Doubles& x, const Doubles& w, const Doubles& b, int N,
                                        int C, double eps) {
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
inline void layernorm_backward_reference(Doubles& dx, Doubles& dw, Doubles& db, const Doubles& dout,
                                         const Doubles& x, const Doubles& w, int N, int C,
                                         double eps) {
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
inline double weight_at(const Doubles& w, int i, int o, int C, int OC, WeightLayout layout) {
  return layout == WeightLayout::kInOut ? w[i * OC + o] : w[o * C + i];
}

inline Doubles matmul_reference(const Doubles& x, const Doubles& w, const Doubles* bias, int N,
                                int C, int OC, WeightLayout layout) {
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
inline void matmul_backward_reference(Doubles& dx, Doubles& dw, Doubles& db, const Doubles& dout,
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

inline double gelu_reference(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

inline double gelu_derivative_reference(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  double t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

struct AttentionOut {
  Doubles out, lse;
};

// Each query row's softmax over keys 0..i in full.
inline AttentionOut attention_reference(const Doubles& qkv, int B, int T, int C, int NH) {
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
inline Doubles attention_backward_reference(const Doubles& dout, const Doubles& qkv, int B, int T,
                                            int C, int NH) {
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
inline Doubles cross_entropy_reference(const Doubles& logits, const std::vector<int32_t>& targets,
                                       int N, int V, int Vp, Doubles* lse = nullptr) {
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

inline Doubles cross_entropy_backward_reference(const Doubles& logits,
                                                const std::vector<int32_t>& targets, double dloss,
                                                int N, int V, int Vp) {
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

}  // namespace zero::kernels::testing
