// The loops of the vector TransformerPaths written once, over a traits type V that
// transformer_avx2.cpp and transformer_avx512.cpp each define with their own intrinsics. Those
// files are compiled with different ISA flags, so nothing here has external linkage (see
// vector_steps.h) and nothing calls an inline function defined outside them: only V's functions,
// libm and logsumexp_row (transformer_rows.h), all instantiated with the including file's own V.
// Every row ends with a masked step, so every element goes through the same vector code.
//
// V provides, besides kWidth, kMaskedTail and tail_lanes(i, n) for vector_steps:
//   Vec; zero(), set1, add, sub, mul, div, min, max (min and max return their second operand
//   where either is NaN), fmadd(a, b, c) = a b + c and fnmadd(a, b, c) = c - a b, fused
//   load(p, i, lanes), store(p, i, x, lanes)   floats at p + i; lanes outside a mask load zero
//   keep(x, lanes)                             x with the lanes outside the mask zeroed
//   running_max(m, x, lanes)                   lane-wise max of m and the lanes of x in the mask
//   horizontal_sum(x), horizontal_max(x)       over the lanes, in the path's order
//   round_nearest(x), pow2(n)                  x rounded to integers; 2^n for integral n within
//                                              the normal exponents
#pragma once

#include <math.h>

#include <cstddef>

#include "transformer_paths.h"
#include "transformer_rows.h"
#include "vector_steps.h"

namespace zero::kernels::detail {
namespace {

// e^x to about 1 ulp over the range of floats (Cephes' expf): x = n ln2 + r with |r| <= ln2/2,
// e^r from a degree-7 polynomial, 2^n built in the exponent bits. x is first clamped to
// [-87.33, 88], where n stays within the normal exponents; the operand order of the clamp lets
// a NaN through, so NaN in gives NaN out.
template <typename V>
typename V::Vec exp_vector(typename V::Vec x) {
  using Vec = typename V::Vec;
  x = V::max(V::set1(-87.33654f), x);
  x = V::min(V::set1(88.0f), x);
  Vec n = V::round_nearest(V::mul(x, V::set1(1.44269504088896341f)));
  // ln2 in two parts, the first exact in 9 bits, so that n * ln2_hi is exact.
  Vec r = V::fnmadd(n, V::set1(0.693359375f), x);
  r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
  Vec p = V::set1(1.9875691500e-4f);
  p = V::fmadd(p, r, V::set1(1.3981999507e-3f));
  p = V::fmadd(p, r, V::set1(8.3334519073e-3f));
  p = V::fmadd(p, r, V::set1(4.1665795894e-2f));
  p = V::fmadd(p, r, V::set1(1.6666665459e-1f));
  p = V::fmadd(p, r, V::set1(5.0000001201e-1f));
  p = V::fmadd(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
  return V::mul(p, V::pow2(n));
}

// --- LayerNorm --------------------------------------------------------------------------------

template <typename V>
void layernorm_forward_vector(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, size_t rows, size_t C,
                              float eps) {
  using Vec = typename V::Vec;
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    Vec sum = V::zero();
    vector_steps<V>(0, C, [&](size_t c, auto lanes) { sum = V::add(sum, V::load(x, c, lanes)); });
    const float m = V::horizontal_sum(sum) / static_cast<float>(C);
    const Vec mv = V::set1(m);
    // The variance from the centred values: E[x^2] - m^2 would cancel for large means.
    Vec squares = V::zero();
    vector_steps<V>(0, C, [&](size_t c, auto lanes) {
      Vec d = V::keep(V::sub(V::load(x, c, lanes), mv), lanes);
      squares = V::fmadd(d, d, squares);
    });
    const float s = 1.0f / sqrtf(V::horizontal_sum(squares) / static_cast<float>(C) + eps);
    const Vec sv = V::set1(s);
    float* y = out + r * C;
    vector_steps<V>(0, C, [&](size_t c, auto lanes) {
      Vec norm = V::mul(V::sub(V::load(x, c, lanes), mv), sv);
      V::store(y, c, V::fmadd(norm, V::load(weight, c, lanes), V::load(bias, c, lanes)), lanes);
    });
    mean[r] = m;
    rstd[r] = s;
  }
}

template <typename V>
void layernorm_backward_input_vector(float* dinp, const float* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd,
                                     size_t rows, size_t C) {
  using Vec = typename V::Vec;
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    const Vec mv = V::set1(mean[r]);
    const Vec sv = V::set1(rstd[r]);
    // Lanes past C load zeros for dout, so their dnorm and both products are zero.
    Vec dnorm_sum = V::zero();
    Vec dnorm_norm_sum = V::zero();
    vector_steps<V>(0, C, [&](size_t c, auto lanes) {
      Vec dnorm = V::mul(V::load(dy, c, lanes), V::load(weight, c, lanes));
      Vec norm = V::mul(V::sub(V::load(x, c, lanes), mv), sv);
      dnorm_sum = V::add(dnorm_sum, dnorm);
      dnorm_norm_sum = V::fmadd(dnorm, norm, dnorm_norm_sum);
    });
    const Vec dnorm_mean = V::set1(V::horizontal_sum(dnorm_sum) / static_cast<float>(C));
    const Vec dnorm_norm_mean = V::set1(V::horizontal_sum(dnorm_norm_sum) / static_cast<float>(C));
    float* dx = dinp + r * C;
    vector_steps<V>(0, C, [&](size_t c, auto lanes) {
      Vec dnorm = V::mul(V::load(dy, c, lanes), V::load(weight, c, lanes));
      Vec norm = V::mul(V::sub(V::load(x, c, lanes), mv), sv);
      Vec g = V::fnmadd(norm, dnorm_norm_mean, V::sub(dnorm, dnorm_mean));
      V::store(dx, c, V::fmadd(g, sv, V::load(dx, c, lanes)), lanes);
    });
  }
}

// --- GELU -------------------------------------------------------------------------------------

// exp(-2u) of the sigmoid form of GELU (see kGeluMaxExpArg).
template <typename V>
typename V::Vec gelu_exp(typename V::Vec x) {
  typename V::Vec x3 = V::mul(V::mul(x, x), x);
  typename V::Vec u = V::mul(V::set1(kGeluSqrt2OverPi), V::fmadd(V::set1(kGeluCubic), x3, x));
  typename V::Vec arg = V::mul(V::set1(-2.0f), u);
  return exp_vector<V>(V::min(V::set1(kGeluMaxExpArg), arg));
}

template <typename V>
void gelu_forward_vector(float* out, const float* inp, size_t n) {
  const typename V::Vec one = V::set1(1.0f);
  vector_steps<V>(0, n, [&](size_t i, auto lanes) {
    typename V::Vec x = V::load(inp, i, lanes);
    V::store(out, i, V::div(x, V::add(one, gelu_exp<V>(x))), lanes);
  });
}

// d/dx x s(2u) = s + 2 x u' s (1 - s), with s = 1 / (1 + e), 1 - s = e s and e = exp(-2u).
template <typename V>
void gelu_backward_vector(float* dinp, const float* inp, const float* dout, size_t n) {
  using Vec = typename V::Vec;
  const Vec one = V::set1(1.0f);
  vector_steps<V>(0, n, [&](size_t i, auto lanes) {
    Vec x = V::load(inp, i, lanes);
    Vec e = gelu_exp<V>(x);
    Vec s = V::div(one, V::add(one, e));
    Vec du =
        V::mul(V::set1(kGeluSqrt2OverPi), V::fmadd(V::set1(3.0f * kGeluCubic), V::mul(x, x), one));
    Vec slope = V::mul(V::mul(V::add(x, x), du), V::mul(s, V::mul(e, s)));
    V::store(dinp, i, V::mul(V::add(s, slope), V::load(dout, i, lanes)), lanes);
  });
}

// --- Softmax primitives ---------------------------------------------------------------------

// logsumexp_row's and softmax_row's primitives (transformer_rows.h) on V.
template <typename V>
struct VectorSoftmaxOps {
  static float max(const float* x, size_t n) {
    typename V::Vec m = V::set1(-INFINITY);
    vector_steps<V>(
        0, n, [&](size_t i, auto lanes) { m = V::running_max(m, V::load(x, i, lanes), lanes); });
    return V::horizontal_max(m);
  }
  static float exp_shift(float* y, const float* x, float shift, float factor, size_t n) {
    const typename V::Vec shift_v = V::set1(shift);
    const typename V::Vec factor_v = V::set1(factor);
    typename V::Vec sum = V::zero();
    vector_steps<V>(0, n, [&](size_t i, auto lanes) {
      typename V::Vec e = V::keep(exp_vector<V>(V::sub(V::load(x, i, lanes), shift_v)), lanes);
      sum = V::add(sum, e);
      if (y) V::store(y, i, V::mul(e, factor_v), lanes);
    });
    return V::horizontal_sum(sum);
  }
  static void scale(float* y, float factor, size_t n) {
    const typename V::Vec factor_v = V::set1(factor);
    vector_steps<V>(0, n, [&](size_t i, auto lanes) {
      V::store(y, i, V::mul(V::load(y, i, lanes), factor_v), lanes);
    });
  }
  static float log(float x) { return logf(x); }
};

template <typename V>
void scaled_exp_vector(float* y, const float* x, float shift, float factor, size_t n) {
  VectorSoftmaxOps<V>::exp_shift(y, x, shift, factor, n);
}

// The path of traits V.
template <typename V>
constexpr TransformerPath transformer_vector_path() {
  return {
      layernorm_forward_vector<V>,     layernorm_backward_input_vector<V>, gelu_forward_vector<V>,
      gelu_backward_vector<V>,         logsumexp_row<VectorSoftmaxOps<V>>, scaled_exp_vector<V>,
      softmax_row<VectorSoftmaxOps<V>>};
}

}  // namespace
}  // namespace zero::kernels::detail
