// Scalar loops of the transformer kernels: the fallback on CPUs without AVX2/FMA and the path
// ZERO_KERNELS_SCALAR=1 selects. Sums accumulate left to right in float.
#include <algorithm>
#include <cmath>

#include "transformer_paths.h"
#include "transformer_rows.h"

namespace zero::kernels::detail {
namespace {

void layernorm_forward_scalar(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, size_t rows, size_t C,
                              float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    float sum = 0.0f;
    for (size_t c = 0; c < C; ++c) sum += x[c];
    const float m = sum / static_cast<float>(C);
    // The variance from the centred values: E[x^2] - m^2 would cancel for large means.
    float squares = 0.0f;
    for (size_t c = 0; c < C; ++c) squares += (x[c] - m) * (x[c] - m);
    const float s = 1.0f / std::sqrt(squares / static_cast<float>(C) + eps);
    float* y = out + r * C;
    for (size_t c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward_input_scalar(float* dinp, const float* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd,
                                     size_t rows, size_t C) {
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    float dnorm_sum = 0.0f;
    float dnorm_norm_sum = 0.0f;
    for (size_t c = 0; c < C; ++c) {
      float dnorm = dy[c] * weight[c];
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * ((x[c] - mean[r]) * rstd[r]);
    }
    const float dnorm_mean = dnorm_sum / static_cast<float>(C);
    const float dnorm_norm_mean = dnorm_norm_sum / static_cast<float>(C);
    float* dx = dinp + r * C;
    for (size_t c = 0; c < C; ++c) {
      float norm = (x[c] - mean[r]) * rstd[r];
      dx[c] += (dy[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * rstd[r];
    }
  }
}

// exp(-2u) of gelu_forward's sigmoid form (see kGeluMaxExpArg).
float gelu_exp(float x) {
  float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return std::exp(std::min(-2.0f * u, kGeluMaxExpArg));
}

void gelu_forward_scalar(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = inp[i] / (1.0f + gelu_exp(inp[i]));
}

// d/dx x s(2u) = s + 2 x u' s (1 - s), with s = 1 / (1 + e), 1 - s = e s and e = exp(-2u).
void gelu_backward_scalar(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float x = inp[i];
    float e = gelu_exp(x);
    float s = 1.0f / (1.0f + e);
    float du = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = (s + 2.0f * x * du * s * (e * s)) * dout[i];
  }
}

struct ScalarOps {
  static float max(const float* x, size_t n) {
    float m = x[0];
    for (size_t i = 1; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }
  static float exp_shift(float* y, const float* x, float shift, float factor, size_t n) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; ++i) {
      float e = std::exp(x[i] - shift);
      sum += e;
      if (y) y[i] = e * factor;
    }
    return sum;
  }
  static void scale(float* y, float factor, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] *= factor;
  }
  static float log(float x) { return std::log(x); }
};

void scaled_exp_scalar(float* y, const float* x, float shift, float factor, size_t n) {
  ScalarOps::exp_shift(y, x, shift, factor, n);
}

}  // namespace

const TransformerPath kTransformerScalarPath = {
    layernorm_forward_scalar, layernorm_backward_input_scalar, gelu_forward_scalar,
    gelu_backward_scalar,     logsumexp_row<ScalarOps>,        scaled_exp_scalar,
    softmax_row<ScalarOps>};

}  // namespace zero::kernels::detail
