// The AVX-512 traits of the vector TransformerPath (transformer_loops.h), 16 floats per step:
// transformer_avx2.cpp's loops on twice the lanes. The element-wise loops (GELU, exp) run the
// same operations per element as the AVX2 ones and return the same bits; a row's sums
// (LayerNorm's mean and variance, softmax's sum) run over 16 lanes before they are added, so they
// round differently from the AVX2 path's 8 (transformer_paths.h). This file alone is compiled
// with the AVX-512 flags and calls no inline function defined outside it (see
// transformer_avx2.cpp).
#include <immintrin.h>
#include <math.h>

#include <cstddef>

#include "transformer_loops.h"

namespace zero::kernels::detail {
namespace {

struct Avx512 {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr size_t kWidth = 16;
  static constexpr bool kMaskedTail = true;

  // The first n - i lanes of the last, partial step at element i.
  static Mask tail_lanes(size_t i, size_t n) { return static_cast<Mask>((1u << (n - i)) - 1u); }

  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }

  static Vec load(const float* p, size_t i, AllLanes) { return _mm512_loadu_ps(p + i); }
  static Vec load(const float* p, size_t i, Mask mask) {
    return _mm512_maskz_loadu_ps(mask, p + i);
  }
  static void store(float* p, size_t i, Vec x, AllLanes) { _mm512_storeu_ps(p + i, x); }
  static void store(float* p, size_t i, Vec x, Mask mask) { _mm512_mask_storeu_ps(p + i, mask, x); }
  static Vec keep(Vec x, AllLanes) { return x; }
  static Vec keep(Vec x, Mask mask) { return _mm512_maskz_mov_ps(mask, x); }
  static Vec running_max(Vec m, Vec x, AllLanes) { return _mm512_max_ps(m, x); }
  static Vec running_max(Vec m, Vec x, Mask mask) { return _mm512_mask_max_ps(m, mask, m, x); }

  static float horizontal_sum(Vec v) { return _mm512_reduce_add_ps(v); }
  static float horizontal_max(Vec v) { return _mm512_reduce_max_ps(v); }

  static Vec round_nearest(Vec x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Vec pow2(Vec n) {
    __m512i exponent =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(exponent);
  }
};

}  // namespace

const TransformerPath kTransformerAvx512Path = transformer_vector_path<Avx512>();

}  // namespace zero::kernels::detail
