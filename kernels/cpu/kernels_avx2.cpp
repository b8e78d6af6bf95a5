// The AVX2/F16C traits of the vector KernelPath (kernel_loops.h), 8 floats per step. This file
// alone is compiled with -mavx2 -mf16c -mfma, so it calls none of the inline functions of dtype.h
// and optimizer_math.h: an out-of-line copy of one compiled here could be picked by the linker
// for the whole program and then run AVX instructions on a CPU without them. AVX2 has no masked
// 16-bit loads, so tails of fewer than 8 elements go to the scalar path (compiled without those
// flags), which is the reference these loops match bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernel_loops.h"

namespace zero::kernels::detail {
namespace {

__m128i load_halves(const void* data, size_t i) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
}

// fp32 -> bf16 exactly as float_to_bf16: add 0x7fff plus the lowest kept bit, keep the high
// half; NaNs keep their high half with the quiet bit set.
__m128i float8_to_bf16(__m256 x) {
  __m256i bits = _mm256_castps_si256(x);
  __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  __m256i high = _mm256_srli_epi32(bits, 16);
  __m256i rounding =
      _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, rounding), 16);
  __m256i quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
  __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Every lane holds a value below 0x10000, so the unsigned-saturating pack only narrows.
  return _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
}

template <DType T>
__m128i narrow8(__m256 x) {
  if constexpr (T == DType::kBFloat16) {
    return float8_to_bf16(x);
  } else {
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  }
}

struct Avx2 {
  using Vec = __m256;
  static constexpr size_t kWidth = 8;
  static constexpr bool kMaskedTail = false;

  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
  static Vec sqrt(Vec a) { return _mm256_sqrt_ps(a); }

  // 8 elements of dtype T from element i, widened to fp32 exactly.
  template <DType T>
  static Vec load(const void* data, size_t i, AllLanes) {
    if constexpr (T == DType::kFloat32) {
      return _mm256_loadu_ps(static_cast<const float*>(data) + i);
    } else if constexpr (T == DType::kBFloat16) {
      __m256i wide = _mm256_cvtepu16_epi32(load_halves(data, i));
      return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
    } else {
      return _mm256_cvtph_ps(load_halves(data, i));
    }
  }

  template <DType T>
  static void store(void* data, size_t i, Vec x, AllLanes) {
    if constexpr (T == DType::kFloat32) {
      _mm256_storeu_ps(static_cast<float*>(data) + i, x);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i), narrow8<T>(x));
    }
  }

  template <DType T>
  static void stream(void* data, size_t i, Vec x) {
    if constexpr (T == DType::kFloat32) {
      _mm256_stream_ps(static_cast<float*>(data) + i, x);
    } else {
      _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i), narrow8<T>(x));
    }
  }

  // The 16 lanes of sum_squares: lanes 0-3 in acc[0], 4-7 in acc[1], and so on.
  struct SquareLanes {
    __m256d acc[4];
  };
  static SquareLanes no_squares() {
    return {{_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}};
  }
  template <DType T>
  static void add_squares16(const void* x, size_t i, SquareLanes& lanes) {
    for (size_t half = 0; half < 2; ++half) {
      __m256 values = load<T>(x, i + half * kWidth, AllLanes{});
      __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(values));
      __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(values, 1));
      lanes.acc[2 * half] = _mm256_add_pd(lanes.acc[2 * half], _mm256_mul_pd(low, low));
      lanes.acc[2 * half + 1] = _mm256_add_pd(lanes.acc[2 * half + 1], _mm256_mul_pd(high, high));
    }
  }
  // reduce_sum_squares_lanes's tree, written with vectors: quarter q = (l[q] + l[q+4]) +
  // (l[q+8] + l[q+12]), then (q0 + q1) + (q2 + q3).
  static double sum_square_lanes(const SquareLanes& lanes) {
    __m256d quarters = _mm256_add_pd(_mm256_add_pd(lanes.acc[0], lanes.acc[1]),
                                     _mm256_add_pd(lanes.acc[2], lanes.acc[3]));
    alignas(32) double q[4];
    _mm256_store_pd(q, quarters);
    return (q[0] + q[1]) + (q[2] + q[3]);
  }

  static constexpr size_t kHalvesWidth = 16;
  // A float is NaN or infinite exactly when its exponent bits are all ones.
  static bool any_non_finite(const float* data, size_t i, AllLanes) {
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(data + i));
    __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent);
    return !_mm256_testz_si256(bad, bad);
  }
  static bool any_non_finite(const uint16_t* data, size_t i, uint16_t exponent_bits, AllLanes) {
    const __m256i exponent = _mm256_set1_epi16(static_cast<int16_t>(exponent_bits));
    __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i));
    __m256i bad = _mm256_cmpeq_epi16(_mm256_and_si256(bits, exponent), exponent);
    return !_mm256_testz_si256(bad, bad);
  }

  static constexpr size_t kStreamBytes = 32;
  static void stream_bytes(char* dst, const char* src) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  }
};

// Blockwise int8 (quantize_math.h's definitions, written with vectors; the tails of fewer than 8
// elements go through zero-padded copies of 8, whose extra lanes are computed and dropped).
constexpr size_t kQuantWidth = 8;

template <DType T>
__m256 load8_padded(const void* data, size_t i, size_t count) {
  if (count == kQuantWidth) return Avx2::load<T>(data, i, AllLanes{});
  alignas(32) unsigned char padded[kQuantWidth * 4] = {};
  std::memcpy(padded, static_cast<const char*>(data) + i * bytes_of(T), count * bytes_of(T));
  return Avx2::load<T>(padded, 0, AllLanes{});
}

template <DType T>
void store8_partial(void* data, size_t i, __m256 x, size_t count) {
  if (count == kQuantWidth) {
    Avx2::store<T>(data, i, x, AllLanes{});
    return;
  }
  alignas(32) unsigned char lanes[kQuantWidth * 4];
  Avx2::store<T>(lanes, 0, x, AllLanes{});
  std::memcpy(static_cast<char*>(data) + i * bytes_of(T), lanes, count * bytes_of(T));
}

// int8_absmax_step over the lanes: MAXPS returns its second operand when either is NaN, so a
// NaN element leaves the running maximum as it was; the maximum of the lanes is exact in any
// order.
template <DType T>
float block_absmax(const void* src, size_t begin, size_t end) {
  const __m256 magnitude_bits = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 most = _mm256_setzero_ps();
  for (size_t i = begin; i < end; i += kQuantWidth) {
    const size_t count = std::min(kQuantWidth, end - i);
    const __m256 magnitude = _mm256_and_ps(load8_padded<T>(src, i, count), magnitude_bits);
    most = _mm256_max_ps(magnitude, most);
  }
  alignas(32) float lanes[kQuantWidth];
  _mm256_store_ps(lanes, most);
  float absmax = 0.0f;
  for (float lane : lanes) absmax = lane > absmax ? lane : absmax;
  return absmax;
}

// int8_quantize: clamp (MAXPS against -127 first, so a NaN becomes -127 as fmaxf makes it),
// then CVTPS2DQ, which rounds to nearest even as rintf does; narrowed with saturating packs,
// which leave values in [-127, 127] as they are.
template <DType T>
void quantize_block(const void* src, size_t begin, size_t end, float inverse, int8_t* values) {
  const __m256 scale = _mm256_set1_ps(inverse);
  const __m256 low = _mm256_set1_ps(-127.0f);
  const __m256 high = _mm256_set1_ps(127.0f);
  for (size_t i = begin; i < end; i += kQuantWidth) {
    const size_t count = std::min(kQuantWidth, end - i);
    const __m256 product = _mm256_mul_ps(load8_padded<T>(src, i, count), scale);
    const __m256 clamped = _mm256_min_ps(_mm256_max_ps(product, low), high);
    const __m256i q = _mm256_cvtps_epi32(clamped);
    const __m128i halves =
        _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i bytes = _mm_packs_epi16(halves, halves);
    alignas(16) int8_t lanes[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), bytes);
    std::memcpy(values + i, lanes, count);
  }
}

template <DType T>
void dequantize_block(const int8_t* values, size_t begin, size_t end, float scale, void* dst) {
  const __m256 by = _mm256_set1_ps(scale);
  for (size_t i = begin; i < end; i += kQuantWidth) {
    const size_t count = std::min(kQuantWidth, end - i);
    int64_t packed = 0;
    std::memcpy(&packed, values + i, count);
    const __m256i wide = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(packed));
    store8_partial<T>(dst, i, _mm256_mul_ps(_mm256_cvtepi32_ps(wide), by), count);
  }
}

}  // namespace

void quantize_int8_avx2(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                        float* scales) {
  with_dtype(src_dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
      const size_t end = std::min(n, begin + block);
      const float absmax = block_absmax<T>(src, begin, end);
      scales[b] = absmax / 127.0f;
      quantize_block<T>(src, begin, end, absmax > 0.0f ? 127.0f / absmax : 0.0f, values);
    }
  });
}

void dequantize_int8_avx2(const int8_t* values, const float* scales, size_t n, size_t block,
                          void* dst, DType dst_dtype) {
  with_dtype(dst_dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
      dequantize_block<T>(values, begin, std::min(n, begin + block), scales[b], dst);
    }
  });
}

const KernelPath kAvx2Path = vector_path<Avx2>();

}  // namespace zero::kernels::detail
