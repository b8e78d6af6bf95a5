// The element-wise optimizer updates, defined once. The scalar reference in the tests, the
// AVX2 loop's scalar tail and the CUDA kernels all call these functions, so the three agree
// on the order of operations (PyTorch's: decay, moments, bias-corrected step).
#pragma once

#include <cmath>

#include "zero/core/dtype.h"

namespace zero {

// Per-step constants of AdamW, computed once on the host from the hyperparameters and the
// step number so the per-element work is a handful of multiply-adds.
struct AdamWStepConstants {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float decay_factor;     // 1 - lr * weight_decay for AdamW (decoupled), 1 for Adam
  float l2;               // weight_decay for Adam (added to the gradient), 0 for AdamW
  float step_size;        // lr / (1 - beta1^t)
  float inv_sqrt_bias2;   // 1 / sqrt(1 - beta2^t)
  float one_minus_beta1;  // 1 - beta1 and 1 - beta2, rounded once from the double betas as
  float one_minus_beta2;  // PyTorch does (1.0f - 0.999f is 1.3e-5 away from 0.001f)
};

// step is 1-based: the first update uses t = 1, as PyTorch does. decoupled = true gives
// AdamW (torch.optim.AdamW), false gives Adam with L2 decay (torch.optim.Adam). The betas are
// double, like PyTorch's Python floats: every constant derived from them (1 - beta, the bias
// corrections) is computed in double and rounded to float once. Pass them as double (0.999,
// not 0.999f), or 1 - beta2 inherits the float's error.
inline AdamWStepConstants adamw_step_constants(float lr, double beta1, double beta2, float eps,
                                               float weight_decay, long step,
                                               bool decoupled = true) {
  AdamWStepConstants c;
  c.lr = lr;
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.eps = eps;
  c.decay_factor =
      decoupled ? static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay) : 1.0f;
  c.l2 = decoupled ? 0.0f : weight_decay;
  double bias1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  double bias2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  c.step_size = static_cast<float>(lr / bias1);
  c.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  return c;
}

// One AdamW element: p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
// p -= step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps). (Adam: g += wd*p first instead.)
ZERO_HD void adamw_update(float& p, float& m, float& v, float g, const AdamWStepConstants& c) {
  g += c.l2 * p;
  p *= c.decay_factor;
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  float denom = sqrtf(v) * c.inv_sqrt_bias2 + c.eps;
  p -= c.step_size * (m / denom);
}

// SGD with momentum and (coupled, PyTorch-style) weight decay, no dampening:
// g += wd * p; buf = momentum * buf + g (buf = g on the first step); p -= lr * buf.
struct SgdStepConstants {
  float lr;
  float momentum;
  float weight_decay;
  bool first_step;
};

ZERO_HD void sgd_update(float& p, float& buf, float g, const SgdStepConstants& c) {
  g += c.weight_decay * p;
  if (c.momentum != 0.0f) {
    buf = c.first_step ? g : c.momentum * buf + g;
    g = buf;
  }
  p -= c.lr * g;
}

}  // namespace zero
