// AVX-512 loops of the transformer kernels, 16 floats per step: transformer_avx2.cpp's
// operations on twice the lanes, with a masked last step in each row. The element-wise loops
// (GELU, exp) run the same operations per element as the AVX2 ones and return the same bits;
// a row's sums (LayerNorm's mean and variance, softmax's sum) run over 16 lanes before they are
// added, so they round differently from the AVX2 path's 8 (transformer_paths.h). This file
// alone is compiled with the AVX-512 flags and calls no inline function defined outside it
// (see transformer_avx2.cpp).
#include <immintrin.h>
#include <math.h>

#include <cstddef>

#include "transformer_paths.h"
#include "transformer_rows.h"

namespace zero::kernels::detail {
namespace {

constexpr size_t kWidth = 16;

// All lanes when 16 or more elements remain from i, else the first n - i.
__mmask16 lanes(size_t i, size_t n) {
  return n - i >= kWidth ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << (n - i)) - 1u);
}

// 16 floats from p + i, or the fewer that remain before n with zeros in the other lanes.
__m512 load(const float* p, size_t i, size_t n) {
  return _mm512_maskz_loadu_ps(lanes(i, n), p + i);
}

void store(float* p, size_t i, size_t n, __m512 v) {
  _mm512_mask_storeu_ps(p + i, lanes(i, n), v);
}

// transformer_avx2.cpp's exp8 on 16 lanes: the same clamp, reduction and polynomial.
__m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.33654f), x);
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  __m512i exponent =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(exponent));
}

// --- LayerNorm --------------------------------------------------------------------------------

void layernorm_forward_avx512(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, size_t rows, size_t C,
                              float eps) {
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    __m512 sum = _mm512_setzero_ps();
    for (size_t c = 0; c < C; c += kWidth) sum = _mm512_add_ps(sum, load(x, c, C));
    const float m = _mm512_reduce_add_ps(sum) / static_cast<float>(C);
    const __m512 mv = _mm512_set1_ps(m);
    // The variance from the centred values: E[x^2] - m^2 would cancel for large means.
    __m512 squares = _mm512_setzero_ps();
    for (size_t c = 0; c < C; c += kWidth) {
      __m512 d = _mm512_maskz_sub_ps(lanes(c, C), load(x, c, C), mv);
      squares = _mm512_fmadd_ps(d, d, squares);
    }
    const float s = 1.0f / sqrtf(_mm512_reduce_add_ps(squares) / static_cast<float>(C) + eps);
    const __m512 sv = _mm512_set1_ps(s);
    float* y = out + r * C;
    for (size_t c = 0; c < C; c += kWidth) {
      __m512 norm = _mm512_mul_ps(_mm512_sub_ps(load(x, c, C), mv), sv);
      store(y, c, C, _mm512_fmadd_ps(norm, load(weight, c, C), load(bias, c, C)));
    }
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward_input_avx512(float* dinp, const float* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd,
                                     size_t rows, size_t C) {
  for (size_t r = 0; r < rows; ++r) {
    const float* x = inp + r * C;
    const float* dy = dout + r * C;
    const __m512 mv = _mm512_set1_ps(mean[r]);
    const __m512 sv = _mm512_set1_ps(rstd[r]);
    // Lanes past C load zeros for dout, so their dnorm and both products are zero.
    __m512 dnorm_sum = _mm512_setzero_ps();
    __m512 dnorm_norm_sum = _mm512_setzero_ps();
    for (size_t c = 0; c < C; c += kWidth) {
      __m512 dnorm = _mm512_mul_ps(load(dy, c, C), load(weight, c, C));
      __m512 norm = _mm512_mul_ps(_mm512_sub_ps(load(x, c, C), mv), sv);
      dnorm_sum = _mm512_add_ps(dnorm_sum, dnorm);
      dnorm_norm_sum = _mm512_fmadd_ps(dnorm, norm, dnorm_norm_sum);
    }
    const __m512 dnorm_mean =
        _mm512_set1_ps(_mm512_reduce_add_ps(dnorm_sum) / static_cast<float>(C));
    const __m512 dnorm_norm_mean =
        _mm512_set1_ps(_mm512_reduce_add_ps(dnorm_norm_sum) / static_cast<float>(C));
    float* dx = dinp + r * C;
    for (size_t c = 0; c < C; c += kWidth) {
      __m512 dnorm = _mm512_mul_ps(load(dy, c, C), load(weight, c, C));
      __m512 norm = _mm512_mul_ps(_mm512_sub_ps(load(x, c, C), mv), sv);
      __m512 g = _mm512_fnmadd_ps(norm, dnorm_norm_mean, _mm512_sub_ps(dnorm, dnorm_mean));
      store(dx, c, C, _mm512_fmadd_ps(g, sv, load(dx, c, C)));
    }
  }
}

// --- GELU -------------------------------------------------------------------------------------

__m512 gelu_exp(__m512 x) {
  __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  __m512 u = _mm512_mul_ps(_mm512_set1_ps(kGeluSqrt2OverPi),
                           _mm512_fmadd_ps(_mm512_set1_ps(kGeluCubic), x3, x));
  __m512 arg = _mm512_mul_ps(_mm512_set1_ps(-2.0f), u);
  return exp16(_mm512_min_ps(_mm512_set1_ps(kGeluMaxExpArg), arg));
}

void gelu_forward_avx512(float* out, const float* inp, size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += kWidth) {
    __m512 x = load(inp, i, n);
    store(out, i, n, _mm512_div_ps(x, _mm512_add_ps(one, gelu_exp(x))));
  }
}

// d/dx x s(2u) = s + 2 x u' s (1 - s), with s = 1 / (1 + e), 1 - s = e s and e = exp(-2u).
void gelu_backward_avx512(float* dinp, const float* inp, const float* dout, size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += kWidth) {
    __m512 x = load(inp, i, n);
    __m512 e = gelu_exp(x);
    __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, e));
    __m512 du =
        _mm512_mul_ps(_mm512_set1_ps(kGeluSqrt2OverPi),
                      _mm512_fmadd_ps(_mm512_set1_ps(3.0f * kGeluCubic), _mm512_mul_ps(x, x), one));
    __m512 slope = _mm512_mul_ps(_mm512_mul_ps(_mm512_add_ps(x, x), du),
                                 _mm512_mul_ps(s, _mm512_mul_ps(e, s)));
    store(dinp, i, n, _mm512_mul_ps(_mm512_add_ps(s, slope), load(dout, i, n)));
  }
}

// --- Softmax primitives ---------------------------------------------------------------------

struct Avx512Ops {
  static float max(const float* x, size_t n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (size_t i = 0; i < n; i += kWidth) {
      const __mmask16 mask = lanes(i, n);
      m = _mm512_mask_max_ps(m, mask, m, _mm512_maskz_loadu_ps(mask, x + i));
    }
    return _mm512_reduce_max_ps(m);
  }
  static float exp_shift(float* y, const float* x, float shift, float factor, size_t n) {
    const __m512 shift_v = _mm512_set1_ps(shift);
    const __m512 factor_v = _mm512_set1_ps(factor);
    __m512 sum = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += kWidth) {
      const __mmask16 mask = lanes(i, n);
      __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), shift_v));
      sum = _mm512_mask_add_ps(sum, mask, sum, e);
      if (y) _mm512_mask_storeu_ps(y + i, mask, _mm512_mul_ps(e, factor_v));
    }
    return _mm512_reduce_add_ps(sum);
  }
  static float log(float x) { return logf(x); }
};

void scaled_exp_avx512(float* y, const float* x, float shift, float factor, size_t n) {
  Avx512Ops::exp_shift(y, x, shift, factor, n);
}

}  // namespace

const TransformerPath kTransformerAvx512Path = {
    layernorm_forward_avx512, layernorm_backward_input_avx512, gelu_forward_avx512,
    gelu_backward_avx512,     logsumexp_row<Avx512Ops>,        scaled_exp_avx512};

}  // namespace zero::kernels::detail
