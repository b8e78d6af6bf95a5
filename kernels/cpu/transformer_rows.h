// Log-sum-exp and softmax written once over a set of vector primitives, which each
// path supplies as a struct of static functions in its own anonymous namespace (so every
// instantiation is local to its translation unit and the AVX2 one can never stand in for the
// scalar one at link time):
//   float max(const float* x, size_t n)                              n >= 1
//   float exp_shift(float* y, const float* x, float shift, float factor, size_t n)
//       y = exp(x - shift) * factor (y may be x, or null when only the sum is wanted);
//       returns the sum of exp(x - shift)
//   void scale(float* y, float factor, size_t n)                     y *= factor
//   float log(float x)
// The templates call nothing else, for the same reason.
#pragma once

#include <cstddef>

namespace zero::kernels::detail {

template <typename Ops>
float logsumexp_row(const float* x, size_t n) {
  float max = Ops::max(x, n);
  float sum = Ops::exp_shift(nullptr, x, max, 1.0f, n);
  return max + Ops::log(sum);
}

// y = softmax(x), as exp(x - max) times 1 / their sum: one exp per value where
// exp(x - logsumexp) would need the sum first, so a second pass of exps. Returns logsumexp_row(x),
// the same bits (the same max, sum and log).
template <typename Ops>
float softmax_row(float* y, const float* x, size_t n) {
  float max = Ops::max(x, n);
  float sum = Ops::exp_shift(y, x, max, 1.0f, n);
  Ops::scale(y, 1.0f / sum, n);
  return max + Ops::log(sum);
}

}  // namespace zero::kernels::detail
