// The AVX2/FMA traits of the vector TransformerPath (transformer_loops.h), 8 floats per step.
// This file alone is compiled with -mavx2 -mf16c -mfma, so it calls no inline function defined
// outside it (an out-of-line copy compiled here could be picked by the linker for the whole
// program and then run AVX instructions on a CPU without them): only intrinsics, libc/libm
// functions and the internal templates of transformer_loops.h instantiated with these traits.
#include <immintrin.h>
#include <math.h>

#include <cstddef>

#include "transformer_loops.h"

namespace zero::kernels::detail {
namespace {

struct Avx2 {
  using Vec = __m256;
  // A mask of lanes: all bits set in a lane that takes part.
  using Mask = __m256i;
  static constexpr size_t kWidth = 8;
  static constexpr bool kMaskedTail = true;

  // The first n - i lanes of the last, partial step at element i.
  static Mask tail_lanes(size_t i, size_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }

  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
  static Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }

  // A masked load touches no memory outside its lanes.
  static Vec load(const float* p, size_t i, AllLanes) { return _mm256_loadu_ps(p + i); }
  static Vec load(const float* p, size_t i, Mask mask) { return _mm256_maskload_ps(p + i, mask); }
  static void store(float* p, size_t i, Vec x, AllLanes) { _mm256_storeu_ps(p + i, x); }
  static void store(float* p, size_t i, Vec x, Mask mask) { _mm256_maskstore_ps(p + i, mask, x); }
  static Vec keep(Vec x, AllLanes) { return x; }
  static Vec keep(Vec x, Mask mask) { return _mm256_and_ps(x, _mm256_castsi256_ps(mask)); }
  static Vec running_max(Vec m, Vec x, AllLanes) { return _mm256_max_ps(m, x); }
  static Vec running_max(Vec m, Vec x, Mask mask) {
    return _mm256_max_ps(m,
                         _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(mask)));
  }

  static float horizontal_sum(Vec v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static float horizontal_max(Vec v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }

  static Vec round_nearest(Vec x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Vec pow2(Vec n) {
    __m256i exponent =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(exponent);
  }
};

}  // namespace

const TransformerPath kTransformerAvx2Path = transformer_vector_path<Avx2>();

}  // namespace zero::kernels::detail
