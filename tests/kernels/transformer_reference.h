// A double-precision scalar reference for the GPT-2 operations of transformer_kernels.h, written
// straight from the math (attention's backward from the softmax Jacobian, not from the lse
// trick the kernels use), and the comparison the kernel tests use. Shared by the CUDA kernels'
// grid test (tests/kernels/cuda_transformer_grid_test.cpp) and their GPU test
// (tests/cuda/transformer_kernels_gpu_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "zero/kernels/transformer_kernels.h"

namespace zero::testing::transformer_reference {

using kernels::WeightLayout;

inline std::vector<float> uniform(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng);
  return x;
}

inline std::vector<double> widen(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

inline std::vector<float> narrow(const std::vector<double>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i]);
  return out;
}

// got matches want when |got - want| <= rtol * |want| + rtol * max |want|: relative, with an
// absolute floor at the tensor's scale, because a float sum of terms of either sign can lose
// relative precision where it cancels (GELU's 1 + tanh near -4, a gradient near 0) while its
// absolute error stays a few ulps of the terms. Reports the first mismatches.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                         double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0.0;
  for (double w : want) scale = std::fmax(scale, std::fabs(w));
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rtol * (std::fabs(want[i]) + scale))) {
      if (++bad <= 5) {
        ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i] << " (error "
                      << err << ", tolerance " << rtol << " x (|want| + " << scale << "))";
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// --- embedding ---------------------------------------------------------------------------------

inline std::vector<double> embedding_forward(const std::vector<float>& tokens,
                                             const std::vector<float>& wte,
                                             const std::vector<float>& wpe, int B, int T, int C) {
  std::vector<double> out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const size_t bt = static_cast<size_t>(b) * T + t;
      const auto token = static_cast<size_t>(tokens[bt]);
      for (int c = 0; c < C; ++c) {
        out[bt * C + c] =
            static_cast<double>(wte[token * C + c]) + wpe[static_cast<size_t>(t) * C + c];
      }
    }
  }
  return out;
}

// dwte and dwpe are added into.
inline void embedding_backward(std::vector<double>& dwte, std::vector<double>& dwpe,
                               const std::vector<float>& dout, const std::vector<float>& tokens,
                               int B, int T, int C) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const size_t bt = static_cast<size_t>(b) * T + t;
      const auto token = static_cast<size_t>(tokens[bt]);
      for (int c = 0; c < C; ++c) {
        dwte[token * C + c] += dout[bt * C + c];
        dwpe[static_cast<size_t>(t) * C + c] += dout[bt * C + c];
      }
    }
  }
}

// --- layernorm ---------------------------------------------------------------------------------

struct Layernorm {
  std::vector<double> out, mean, rstd;
};

inline Layernorm layernorm_forward(const std::vector<float>& inp, const std::vector<float>& weight,
                                   const std::vector<float>& bias, int N, int C, double eps) {
  Layernorm r{std::vector<double>(static_cast<size_t>(N) * C), std::vector<double>(N),
              std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    const float* x = inp.data() + static_cast<size_t>(n) * C;
    double mean = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) mean += x[c];
    mean /= C;
    for (int c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / C + eps);
    for (int c = 0; c < C; ++c) {
      r.out[static_cast<size_t>(n) * C + c] = (x[c] - mean) * rstd * weight[c] + bias[c];
    }
    r.mean[n] = mean;
    r.rstd[n] = rstd;
  }
  return r;
}

// All three gradients are added into. mean and rstd are the (float) values forward saved.
inline void layernorm_backward(std::vector<double>& dinp, std::vector<double>& dweight,
                               std::vector<double>& dbias, const std::vector<float>& dout,
                               const std::vector<float>& inp, const std::vector<float>& weight,
                               const std::vector<float>& mean, const std::vector<float>& rstd,
                               int N, int C) {
  for (int n = 0; n < N; ++n) {
    const size_t row = static_cast<size_t>(n) * C;
    double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
    for (int c = 0; c < C; ++c) {
      const double norm = (static_cast<double>(inp[row + c]) - mean[n]) * rstd[n];
      const double dnorm = static_cast<double>(weight[c]) * dout[row + c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    for (int c = 0; c < C; ++c) {
      const double norm = (static_cast<double>(inp[row + c]) - mean[n]) * rstd[n];
      const double dnorm = static_cast<double>(weight[c]) * dout[row + c];
      dinp[row + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
      dweight[c] += dout[row + c] * norm;
      dbias[c] += dout[row + c];
    }
  }
}

// --- matmul ------------------------------------------------------------------------------------

// W[c, oc] in either layout.
inline double weight_at(const std::vector<float>& w, int c, int oc, int C, int OC,
                        WeightLayout layout) {
  return layout == WeightLayout::kInOut ? w[static_cast<size_t>(c) * OC + oc]
                                        : w[static_cast<size_t>(oc) * C + c];
}

// bias may be empty (none).
inline std::vector<double> matmul_forward(const std::vector<float>& inp,
                                          const std::vector<float>& weight,
                                          const std::vector<float>& bias, int N, int C, int OC,
                                          WeightLayout layout) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n) {
    for (int oc = 0; oc < OC; ++oc) {
      double sum = bias.empty() ? 0.0 : bias[oc];
      for (int c = 0; c < C; ++c) {
        sum += inp[static_cast<size_t>(n) * C + c] * weight_at(weight, c, oc, C, OC, layout);
      }
      out[static_cast<size_t>(n) * OC + oc] = sum;
    }
  }
  return out;
}

// dinp is overwritten; dweight (in the weight's layout) and dbias are added into.
inline void matmul_backward(std::vector<double>& dinp, std::vector<double>& dweight,
                            std::vector<double>& dbias, const std::vector<float>& dout,
                            const std::vector<float>& inp, const std::vector<float>& weight, int N,
                            int C, int OC, WeightLayout layout) {
  dinp.assign(static_cast<size_t>(N) * C, 0.0);
  for (int n = 0; n < N; ++n) {
    for (int oc = 0; oc < OC; ++oc) {
      const double d = dout[static_cast<size_t>(n) * OC + oc];
      dbias[oc] += d;
      for (int c = 0; c < C; ++c) {
        dinp[static_cast<size_t>(n) * C + c] += d * weight_at(weight, c, oc, C, OC, layout);
        const size_t w = layout == WeightLayout::kInOut ? static_cast<size_t>(c) * OC + oc
                                                        : static_cast<size_t>(oc) * C + c;
        dweight[w] += d * inp[static_cast<size_t>(n) * C + c];
      }
    }
  }
}

// --- GELU --------------------------------------------------------------------------------------

inline double gelu_inner(double x) {
  return std::sqrt(2.0 / std::acos(-1.0)) * (x + 0.044715 * x * x * x);
}

inline std::vector<double> gelu_forward(const std::vector<float>& inp) {
  std::vector<double> out(inp.size());
  for (size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i];
    out[i] = 0.5 * x * (1.0 + std::tanh(gelu_inner(x)));
  }
  return out;
}

inline std::vector<double> gelu_backward(const std::vector<float>& inp,
                                         const std::vector<float>& dout) {
  std::vector<double> out(inp.size());
  for (size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i], th = std::tanh(gelu_inner(x));
    const double dinner = std::sqrt(2.0 / std::acos(-1.0)) * (1.0 + 3.0 * 0.044715 * x * x);
    out[i] = (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * dinner) * dout[i];
  }
  return out;
}

// --- attention ---------------------------------------------------------------------------------

struct Attention {
  std::vector<double> out, lse;
};

// The softmax row of query i of head h in sequence b: probabilities over keys 0..i.
inline std::vector<double> attention_probabilities(const std::vector<float>& qkv, int b, int h,
                                                   int i, int T, int C, int NH, double* lse) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const size_t C3 = 3 * static_cast<size_t>(C);
  std::vector<double> p(i + 1);
  double max = -INFINITY;
  for (int j = 0; j <= i; ++j) {
    double s = 0.0;
    for (int c = 0; c < hs; ++c) {
      s += static_cast<double>(qkv[(static_cast<size_t>(b) * T + i) * C3 + h * hs + c]) *
           qkv[(static_cast<size_t>(b) * T + j) * C3 + C + h * hs + c];
    }
    p[j] = s * scale;
    max = std::fmax(max, p[j]);
  }
  double sum = 0.0;
  for (double& e : p) sum += (e = std::exp(e - max));
  for (double& e : p) e /= sum;
  if (lse) *lse = max + std::log(sum);
  return p;
}

inline Attention attention_forward(const std::vector<float>& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * static_cast<size_t>(C);
  Attention r{std::vector<double>(static_cast<size_t>(B) * T * C),
              std::vector<double>(static_cast<size_t>(B) * NH * T)};
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        double lse = 0.0;
        const auto p = attention_probabilities(qkv, b, h, i, T, C, NH, &lse);
        r.lse[(static_cast<size_t>(b) * NH + h) * T + i] = lse;
        for (int c = 0; c < hs; ++c) {
          double acc = 0.0;
          for (int j = 0; j <= i; ++j) {
            acc += p[j] * qkv[(static_cast<size_t>(b) * T + j) * C3 + 2 * C + h * hs + c];
          }
          r.out[(static_cast<size_t>(b) * T + i) * C + h * hs + c] = acc;
        }
      }
    }
  }
  return r;
}

// dqkv (overwritten) through the softmax's Jacobian: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik).
inline std::vector<double> attention_backward(const std::vector<float>& dout,
                                              const std::vector<float>& qkv, int B, int T, int C,
                                              int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * static_cast<size_t>(C);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> dqkv(static_cast<size_t>(B) * T * C3, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int i = 0; i < T; ++i) {
        const auto p = attention_probabilities(qkv, b, h, i, T, C, NH, nullptr);
        const size_t qi = (static_cast<size_t>(b) * T + i) * C3 + h * hs;
        const size_t oi = (static_cast<size_t>(b) * T + i) * C + h * hs;
        std::vector<double> dp(i + 1);
        double pdp = 0.0;
        for (int j = 0; j <= i; ++j) {
          const size_t vj = (static_cast<size_t>(b) * T + j) * C3 + 2 * C + h * hs;
          dp[j] = 0.0;
          for (int c = 0; c < hs; ++c) {
            dp[j] += static_cast<double>(dout[oi + c]) * qkv[vj + c];
            dqkv[vj + c] += p[j] * dout[oi + c];
          }
          pdp += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          const size_t kj = (static_cast<size_t>(b) * T + j) * C3 + C + h * hs;
          for (int c = 0; c < hs; ++c) {
            dqkv[qi + c] += ds * qkv[kj + c];
            dqkv[kj + c] += ds * qkv[qi + c];
          }
        }
      }
    }
  }
  return dqkv;
}

// --- softmax + cross-entropy ---------------------------------------------------------------------

struct CrossEntropy {
  std::vector<double> losses, lse;
};

inline CrossEntropy cross_entropy_forward(const std::vector<float>& logits,
                                          const std::vector<int32_t>& targets, int N, int V,
                                          int Vp) {
  CrossEntropy r{std::vector<double>(N), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    const float* x = logits.data() + static_cast<size_t>(n) * Vp;
    double max = -INFINITY, sum = 0.0;
    for (int v = 0; v < V; ++v) max = std::fmax(max, x[v]);
    for (int v = 0; v < V; ++v) sum += std::exp(x[v] - max);
    r.lse[n] = max + std::log(sum);
    r.losses[n] = r.lse[n] - x[targets[n]];
  }
  return r;
}

// From the logits alone (the softmax recomputed in double); the padding columns are 0.
inline std::vector<double> cross_entropy_backward(const std::vector<float>& logits,
                                                  const std::vector<int32_t>& targets, double dloss,
                                                  int N, int V, int Vp) {
  const auto fwd = cross_entropy_forward(logits, targets, N, V, Vp);
  std::vector<double> d(static_cast<size_t>(N) * Vp, 0.0);
  for (int n = 0; n < N; ++n) {
    for (int v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(n) * Vp + v;
      d[i] = (std::exp(logits[i] - fwd.lse[n]) - (v == targets[n] ? 1.0 : 0.0)) * dloss;
    }
  }
  return d;
}

}  // namespace zero::testing::transformer_reference
