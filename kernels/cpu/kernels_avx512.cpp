// The AVX-512 (F, BW, VL, DQ) traits of the vector KernelPath (kernel_loops.h), 16 floats per
// step: the loops kernels_avx2.cpp runs, on twice the lanes, so every element rounds as the
// scalar definitions do and the results equal the AVX2 path's bit for bit. Tails of fewer than 16
// elements run through masked loads and stores of the same vector code. This file alone is
// compiled with the AVX-512 flags, so, like kernels_avx2.cpp, it calls none of the inline
// functions of dtype.h and optimizer_math.h (an out-of-line copy compiled here could be picked by
// the linker for the whole program and then run AVX-512 instructions on a CPU without them).
#include <immintrin.h>

#include <cstdint>

#include "kernel_loops.h"

namespace zero::kernels::detail {
namespace {

// fp32 -> bf16 exactly as float_to_bf16 (and kernels_avx2.cpp's float8_to_bf16): add 0x7fff
// plus the lowest kept bit, keep the high half; NaNs keep their high half with the quiet bit
// set. (vcvtneps2bf16 would flush subnormals, so it is not used.)
__m256i float16_to_bf16(__m512 x) {
  __m512i bits = _mm512_castps_si512(x);
  __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  __mmask16 is_nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  __m512i high = _mm512_srli_epi32(bits, 16);
  __m512i rounding =
      _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, rounding), 16);
  __m512i quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
}

template <DType T>
__m256i narrow16(__m512 x) {
  if constexpr (T == DType::kBFloat16) {
    return float16_to_bf16(x);
  } else {
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  }
}

// 16 halves widened to fp32 exactly.
template <DType T>
__m512 widen16(__m256i halves) {
  if constexpr (T == DType::kBFloat16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
  } else {
    return _mm512_cvtph_ps(halves);
  }
}

struct Avx512 {
  using Vec = __m512;
  static constexpr size_t kWidth = 16;
  static constexpr bool kMaskedTail = true;

  // The first n - i lanes of the last, partial step at element i.
  static __mmask16 tail_lanes(size_t i, size_t n) {
    return static_cast<__mmask16>((1u << (n - i)) - 1u);
  }

  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
  static Vec sqrt(Vec a) { return _mm512_sqrt_ps(a); }

  // 16 elements of dtype T from element i, widened to fp32 exactly; with a mask, the lanes
  // outside it read nothing and hold zero.
  template <DType T>
  static Vec load(const void* data, size_t i, AllLanes) {
    if constexpr (T == DType::kFloat32) {
      return _mm512_loadu_ps(static_cast<const float*>(data) + i);
    } else {
      return widen16<T>(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(data) + i)));
    }
  }
  template <DType T>
  static Vec load(const void* data, size_t i, __mmask16 mask) {
    if constexpr (T == DType::kFloat32) {
      return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(data) + i);
    } else {
      return widen16<T>(_mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(data) + i));
    }
  }

  template <DType T>
  static void store(void* data, size_t i, Vec x, AllLanes) {
    if constexpr (T == DType::kFloat32) {
      _mm512_storeu_ps(static_cast<float*>(data) + i, x);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(data) + i),
                          narrow16<T>(x));
    }
  }
  template <DType T>
  static void store(void* data, size_t i, Vec x, __mmask16 mask) {
    if constexpr (T == DType::kFloat32) {
      _mm512_mask_storeu_ps(static_cast<float*>(data) + i, mask, x);
    } else {
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(data) + i, mask, narrow16<T>(x));
    }
  }

  template <DType T>
  static void stream(void* data, size_t i, Vec x) {
    if constexpr (T == DType::kFloat32) {
      _mm512_stream_ps(static_cast<float*>(data) + i, x);
    } else {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(data) + i),
                          narrow16<T>(x));
    }
  }

  // The 16 lanes of sum_squares: lanes 0-7 in acc[0], 8-15 in acc[1].
  struct SquareLanes {
    __m512d acc[2];
  };
  static SquareLanes no_squares() { return {{_mm512_setzero_pd(), _mm512_setzero_pd()}}; }
  template <DType T>
  static void add_squares16(const void* x, size_t i, SquareLanes& lanes) {
    __m512 values = load<T>(x, i, AllLanes{});
    __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(values));
    __m512d high =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(values), 1)));
    lanes.acc[0] = _mm512_add_pd(lanes.acc[0], _mm512_mul_pd(low, low));
    lanes.acc[1] = _mm512_add_pd(lanes.acc[1], _mm512_mul_pd(high, high));
  }
  // reduce_sum_squares_lanes's tree: quarter q = (l[q] + l[q+4]) + (l[q+8] + l[q+12]), then
  // (q0 + q1) + (q2 + q3).
  static double sum_square_lanes(const SquareLanes& lanes) {
    __m256d low = _mm256_add_pd(_mm512_castpd512_pd256(lanes.acc[0]),
                                _mm512_extractf64x4_pd(lanes.acc[0], 1));
    __m256d high = _mm256_add_pd(_mm512_castpd512_pd256(lanes.acc[1]),
                                 _mm512_extractf64x4_pd(lanes.acc[1], 1));
    alignas(32) double q[4];
    _mm256_store_pd(q, _mm256_add_pd(low, high));
    return (q[0] + q[1]) + (q[2] + q[3]);
  }

  static constexpr size_t kHalvesWidth = 32;
  // The first n - i of the 32 16-bit lanes of the last, partial step at element i.
  static __mmask32 tail_halves(size_t i, size_t n) {
    return static_cast<__mmask32>((uint64_t{1} << (n - i)) - 1);
  }
  // A float is NaN or infinite exactly when its exponent bits are all ones.
  static bool any_non_finite(const float* data, size_t i, AllLanes) {
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(data + i));
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), exponent) != 0;
  }
  static bool any_non_finite(const float* data, size_t i, __mmask16 mask) {
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, data + i));
    return _mm512_mask_cmpeq_epi32_mask(mask, _mm512_and_si512(bits, exponent), exponent) != 0;
  }
  static bool any_non_finite(const uint16_t* data, size_t i, uint16_t exponent_bits, AllLanes) {
    const __m512i exponent = _mm512_set1_epi16(static_cast<int16_t>(exponent_bits));
    __m512i bits = _mm512_loadu_si512(data + i);
    return _mm512_cmpeq_epi16_mask(_mm512_and_si512(bits, exponent), exponent) != 0;
  }
  static bool any_non_finite(const uint16_t* data, size_t i, uint16_t exponent_bits,
                             __mmask32 mask) {
    const __m512i exponent = _mm512_set1_epi16(static_cast<int16_t>(exponent_bits));
    __m512i bits = _mm512_maskz_loadu_epi16(mask, data + i);
    return _mm512_mask_cmpeq_epi16_mask(mask, _mm512_and_si512(bits, exponent), exponent) != 0;
  }

  // A whole 64-byte line per store.
  static constexpr size_t kStreamBytes = 64;
  static void stream_bytes(char* dst, const char* src) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst),
                        _mm512_loadu_si512(reinterpret_cast<const void*>(src)));
  }
};

}  // namespace

const KernelPath kAvx512Path = vector_path<Avx512>();

}  // namespace zero::kernels::detail
