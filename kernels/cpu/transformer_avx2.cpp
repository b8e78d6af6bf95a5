// AVX2/FMA loops of the transformer kernels, 8 floats per step. This file alone is compiled
// with -mavx2 -mf16c -mfma, so it calls no inline function defined outside it (an out-of-line
// copy compiled here could be picked by the linker for the whole program and then run AVX
// instructions on a CPU without them): only intrinsics, libc/libm functions and the templates
// of transformer_rows.h instantiated with this file's own primitives. Rows whose length is not a
// multiple of 8 end with a masked step, so every element goes through the same vector code.
#include <immintrin.h>
#include <math.h>

#include <cstddef>

#include "transformer_paths.h"
#include "transformer_rows.h"

namespace zero::kernels::detail {
namespace {

constexpr size_t kWidth = 8;

// All lanes when 8 or more elements remain from i, else the first n - i.
__m256i lanes(size_t i, size_t n) {
  int remaining = n - i >= kWidth ? static_cast<int>(kWidth) : static_cast<int>(n - i);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(remaining),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 floats from p + i, or the fewer that remain before n with zeros in the other lanes (a masked
// load touches no memory outside its lanes).
__m256 load(const float* p, size_t i, size_t n) {
  if (i + kWidth <= n) return _mm256_loadu_ps(p + i);
  return _mm256_maskload_ps(p + i, lanes(i, n));
}

void store(float* p, size_t i, size_t n, __m256 v) {
  if (i + kWidth <= n) {
    _mm256_storeu_ps(p + i, v);
  } else {
    _mm256_maskstore_ps(p + i, lanes(i, n), v);
  }
}

// v with the lanes at or beyond n (counting from i) set to zero.
__m256 keep_in_range(__m256 v, size_t i, size_t n) {
  return i + kWidth <= n ? v : _mm256_and_ps(v, _mm256_castsi256_ps(lanes(i, n)));
}

float horizontal_sum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

float horizontal_max(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// e^x to about 1 ulp over the range of floats (Cephes' expf): x = n ln2 + r with |r| <= ln2/2,
// e^r from a degree-7 polynomial, 2^n built in the exponent bits. x is first clamped to
// [-87.33, 88], where n stays within the normal exponents; the operand order of the clamp lets
// a NaN through, so NaN in gives NaN out.
__m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.33654f), x);
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 in two parts, the first exact in 9 bits, so that n * ln2_hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i exponent =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
}

// --- LayerNorm --------------------------------------------------------------------------------

void layernorm_forward_avx2(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, size_t rows, size_t C,
                            float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    __m256 sum = _mm256_setzero_ps();
    for (size_t c = 0; c < C; c += kWidth) sum = _mm256_add_ps(sum, load(x, c, C));
    const float m = horizontal_sum(sum) / static_cast<float>(C);
    const __m256 mv = _mm256_set1_ps(m);
    // The variance from the centred values: E[x^2] - m^2 would cancel for large means.
    __m256 squares = _mm256_setzero_ps();
    for (size_t c = 0; c < C; c += kWidth) {
      __m256 d = keep_in_range(_mm256_sub_ps(load(x, c, C), mv), c, C);
      squares = _mm256_fmadd_ps(d, d, squares);
    }
    const float s = 1.0f / sqrtf(horizontal_sum(squares) / static_cast<float>(C) + eps);
    const __m256 sv = _mm256_set1_ps(s);
    float* y = out + r * C;
    for (size_t c = 0; c < C; c += kWidth) {
      __m256 norm = _mm256_mul_ps(_mm256_sub_ps(load(x, c, C), mv), sv);
      store(y, c, C, _mm256_fmadd_ps(norm, load(weight, c, C), load(bias, c, C)));
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward_input_avx2(float* dinp, const float* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd,
                                   size_t rows, size_t C) {
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    const __m256 mv = _mm256_set1_ps(mean[r]);
    const __m256 sv = _mm256_set1_ps(rstd[r]);
    // Lanes past C load zeros for dout, so their dnorm and both products are zero.
    __m256 dnorm_sum = _mm256_setzero_ps();
    __m256 dnorm_norm_sum = _mm256_setzero_ps();
    for (size_t c = 0; c < C; c += kWidth) {
      __m256 dnorm = _mm256_mul_ps(load(dy, c, C), load(weight, c, C));
      __m256 norm = _mm256_mul_ps(_mm256_sub_ps(load(x, c, C), mv), sv);
      dnorm_sum = _mm256_add_ps(dnorm_sum, dnorm);
      dnorm_norm_sum = _mm256_fmadd_ps(dnorm, norm, dnorm_norm_sum);
    }
    const __m256 dnorm_mean = _mm256_set1_ps(horizontal_sum(dnorm_sum) / static_cast<float>(C));
    const __m256 dnorm_norm_mean =
        _mm256_set1_ps(horizontal_sum(dnorm_norm_sum) / static_cast<float>(C));
    float* dx = dinp + r * C;
    for (size_t c = 0; c < C; c += kWidth) {
      __m256 dnorm = _mm256_mul_ps(load(dy, c, C), load(weight, c, C));
      __m256 norm = _mm256_mul_ps(_mm256_sub_ps(load(x, c, C), mv), sv);
      __m256 g = _mm256_fnmadd_ps(norm, dnorm_norm_mean, _mm256_sub_ps(dnorm, dnorm_mean));
      store(dx, c, C, _mm256_fmadd_ps(g, sv, load(dx, c, C)));
    }
  }
}

// --- GELU -------------------------------------------------------------------------------------

// exp(-2u) of the sigmoid form of GELU (see kGeluMaxExpArg), and u' through du.
__m256 gelu_exp(__m256 x) {
  __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  __m256 u = _mm256_mul_ps(_mm256_set1_ps(kGeluSqrt2OverPi),
                           _mm256_fmadd_ps(_mm256_set1_ps(kGeluCubic), x3, x));
  __m256 arg = _mm256_mul_ps(_mm256_set1_ps(-2.0f), u);
  return exp8(_mm256_min_ps(_mm256_set1_ps(kGeluMaxExpArg), arg));
}

void gelu_forward_avx2(float* out, const float* inp, size_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += kWidth) {
    __m256 x = load(inp, i, n);
    store(out, i, n, _mm256_div_ps(x, _mm256_add_ps(one, gelu_exp(x))));
  }
}

// d/dx x s(2u) = s + 2 x u' s (1 - s), with s = 1 / (1 + e), 1 - s = e s and e = exp(-2u).
void gelu_backward_avx2(float* dinp, const float* inp, const float* dout, size_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += kWidth) {
    __m256 x = load(inp, i, n);
    __m256 e = gelu_exp(x);
    __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    __m256 du =
        _mm256_mul_ps(_mm256_set1_ps(kGeluSqrt2OverPi),
                      _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kGeluCubic), _mm256_mul_ps(x, x), one));
    __m256 slope = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(x, x), du),
                                 _mm256_mul_ps(s, _mm256_mul_ps(e, s)));
    store(dinp, i, n, _mm256_mul_ps(_mm256_add_ps(s, slope), load(dout, i, n)));
  }
}

// --- Softmax primitives ---------------------------------------------------------------------

struct Avx2Ops {
  static float max(const float* x, size_t n) {
    const __m256 lowest = _mm256_set1_ps(-INFINITY);
    __m256 m = lowest;
    for (size_t i = 0; i < n; i += kWidth) {
      __m256 v = _mm256_blendv_ps(lowest, load(x, i, n), _mm256_castsi256_ps(lanes(i, n)));
      m = _mm256_max_ps(m, v);
    }
    return horizontal_max(m);
  }
  static float exp_shift(float* y, const float* x, float shift, float factor, size_t n) {
    const __m256 shift_v = _mm256_set1_ps(shift);
    const __m256 factor_v = _mm256_set1_ps(factor);
    __m256 sum = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += kWidth) {
      __m256 e = keep_in_range(exp8(_mm256_sub_ps(load(x, i, n), shift_v)), i, n);
      sum = _mm256_add_ps(sum, e);
      if (y) store(y, i, n, _mm256_mul_ps(e, factor_v));
    }
    return horizontal_sum(sum);
  }
  static float log(float x) { return logf(x); }
};

void scaled_exp_avx2(float* y, const float* x, float shift, float factor, size_t n) {
  Avx2Ops::exp_shift(y, x, shift, factor, n);
}

}  // namespace

const TransformerPath kTransformerAvx2Path = {layernorm_forward_avx2, layernorm_backward_input_avx2,
                                              gelu_forward_avx2,      gelu_backward_avx2,
                                              logsumexp_row<Avx2Ops>, scaled_exp_avx2};

}  // namespace zero::kernels::detail
