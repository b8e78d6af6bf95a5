// AVX-512 loops (F, BW, VL, DQ), 16 floats per step: the operations of kernels_avx2.cpp's
// loops in the same order and without FMA, so every element rounds as the scalar definitions
// do and the results equal the AVX2 path's bit for bit. Tails of fewer than 16 elements run
// through masked loads and stores of the same vector code. This file alone is compiled with
// the AVX-512 flags, so, like kernels_avx2.cpp, it calls none of the inline functions of
// dtype.h and optimizer_math.h (an out-of-line copy compiled here could be picked by the linker
// for the whole program and then run AVX-512 instructions on a CPU without them).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernel_paths.h"

namespace zero::kernels::detail {
namespace {

constexpr size_t kWidth = 16;

size_t bytes_of(DType t) {
  return t == DType::kFloat32 ? 4 : 2;
}

const void* advance(const void* p, DType t, size_t i) {
  return static_cast<const char*>(p) + i * bytes_of(t);
}

void* advance(void* p, DType t, size_t i) {
  return static_cast<char*>(p) + i * bytes_of(t);
}

template <typename Fn>
void with_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::kFloat32:
      fn(std::integral_constant<DType, DType::kFloat32>{});
      return;
    case DType::kBFloat16:
      fn(std::integral_constant<DType, DType::kBFloat16>{});
      return;
    case DType::kFloat16:
      fn(std::integral_constant<DType, DType::kFloat16>{});
      return;
  }
}

// The lanes of a step at element i of n: all 16, or the n - i that remain.
__mmask16 lanes(size_t i, size_t n) {
  return n - i >= kWidth ? static_cast<__mmask16>(0xffff)
                         : static_cast<__mmask16>((1u << (n - i)) - 1u);
}

// 16 elements of dtype T from element i (the masked-off lanes read nothing and hold zero),
// widened to fp32 exactly.
template <DType T>
__m512 load16(const void* data, size_t i, __mmask16 mask) {
  if constexpr (T == DType::kFloat32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(data) + i);
  } else {
    __m256i halves = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(data) + i);
    if constexpr (T == DType::kBFloat16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
    } else {
      return _mm512_cvtph_ps(halves);
    }
  }
}

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

// Stores the mask's lanes of x as dtype T at element i, rounding to nearest even when
// narrowing.
template <DType T>
void store16(void* data, size_t i, __m512 x, __mmask16 mask) {
  if constexpr (T == DType::kFloat32) {
    _mm512_mask_storeu_ps(static_cast<float*>(data) + i, mask, x);
  } else {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(data) + i, mask, narrow16<T>(x));
  }
}

// All 16 lanes around the caches (non-temporal): element i must be 16-element aligned.
template <DType T>
void stream16(void* data, size_t i, __m512 x) {
  if constexpr (T == DType::kFloat32) {
    _mm512_stream_ps(static_cast<float*>(data) + i, x);
  } else {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(data) + i),
                        narrow16<T>(x));
  }
}

// kernels_avx2.cpp's distance, 1 KiB of each fp32 array ahead (not tuned apart for AVX-512).
constexpr size_t kPrefetchDistance = 256;

template <DType T>
void prefetch_ahead(const void* data, size_t i) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data) + (i + kPrefetchDistance) * bytes_of(T);
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

// Elements before param_out is aligned for stream16 (a full 16-element vector), or n when it
// cannot be (a pointer not aligned even to one element).
size_t elements_to_stream_alignment(const void* param_out, DType param_dtype, size_t n) {
  const size_t element = bytes_of(param_dtype);
  const uintptr_t address = reinterpret_cast<uintptr_t>(param_out);
  if (address % element != 0) return n;
  const size_t alignment = kWidth * element;
  return std::min(n, (alignment - address % alignment) % alignment / element);
}

// --- AdamW ---------------------------------------------------------------------------------

// adamw_update's operations in its order, without FMA. One 64-byte line of each fp32 array per
// step, so each stream gets one prefetch per line. The last partial step is masked.
template <DType G, DType P, bool kWriteParam, bool kStream>
void adamw_typed(float* master, float* m, float* v, const void* grad, float grad_scale,
                 void* param_out, size_t n, const AdamWStepConstants& c) {
  const __m512 scale = _mm512_set1_ps(grad_scale);
  const __m512 l2 = _mm512_set1_ps(c.l2);
  const __m512 decay = _mm512_set1_ps(c.decay_factor);
  const __m512 beta1 = _mm512_set1_ps(c.beta1);
  const __m512 one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 inv_sqrt_bias2 = _mm512_set1_ps(c.inv_sqrt_bias2);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 step_size = _mm512_set1_ps(c.step_size);
  for (size_t i = 0; i < n; i += kWidth) {
    const __mmask16 mask = lanes(i, n);
    prefetch_ahead<DType::kFloat32>(master, i);
    prefetch_ahead<DType::kFloat32>(m, i);
    prefetch_ahead<DType::kFloat32>(v, i);
    prefetch_ahead<G>(grad, i);
    __m512 g = _mm512_mul_ps(load16<G>(grad, i, mask), scale);
    __m512 p = _mm512_maskz_loadu_ps(mask, master + i);
    __m512 mi = _mm512_maskz_loadu_ps(mask, m + i);
    __m512 vi = _mm512_maskz_loadu_ps(mask, v + i);
    g = _mm512_add_ps(g, _mm512_mul_ps(l2, p));
    p = _mm512_mul_ps(p, decay);
    mi = _mm512_add_ps(_mm512_mul_ps(beta1, mi), _mm512_mul_ps(one_minus_beta1, g));
    vi = _mm512_add_ps(_mm512_mul_ps(beta2, vi),
                       _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, g), g));
    __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vi), inv_sqrt_bias2), eps);
    p = _mm512_sub_ps(p, _mm512_mul_ps(step_size, _mm512_div_ps(mi, denom)));
    _mm512_mask_storeu_ps(master + i, mask, p);
    _mm512_mask_storeu_ps(m + i, mask, mi);
    _mm512_mask_storeu_ps(v + i, mask, vi);
    if constexpr (kWriteParam) {
      if (kStream && mask == 0xffff) {
        stream16<P>(param_out, i, p);
      } else {
        store16<P>(param_out, i, p, mask);
      }
    }
  }
  // Non-temporal stores are weakly ordered: fence them before another thread may read the copy.
  if constexpr (kStream) _mm_sfence();
}

void adamw_avx512(float* master, float* m, float* v, const void* grad, DType grad_dtype,
                  float grad_scale, void* param_out, DType param_dtype, size_t n,
                  const AdamWStepConstants& c) {
  // Large working copies are streamed; the elements before `start` (the scalar path) align
  // the copy for the streaming stores.
  size_t start = 0;
  bool stream = false;
  if (param_out != nullptr && n >= kStreamingMinElements) {
    start = elements_to_stream_alignment(param_out, param_dtype, n);
    stream = start < n;
    if (!stream) start = 0;
  }
  kScalarPath.adamw(master, m, v, grad, grad_dtype, grad_scale, param_out, param_dtype, start, c);
  float* const master_at = master + start;
  float* const m_at = m + start;
  float* const v_at = v + start;
  const void* const grad_at = advance(grad, grad_dtype, start);
  void* const out_at = param_out ? advance(param_out, param_dtype, start) : nullptr;
  const size_t count = n - start;
  with_dtype(grad_dtype, [&](auto g) {
    constexpr DType G = decltype(g)::value;
    if (!param_out) {
      adamw_typed<G, DType::kFloat32, false, false>(master_at, m_at, v_at, grad_at, grad_scale,
                                                    nullptr, count, c);
      return;
    }
    with_dtype(param_dtype, [&](auto p) {
      constexpr DType P = decltype(p)::value;
      if (stream) {
        adamw_typed<G, P, true, true>(master_at, m_at, v_at, grad_at, grad_scale, out_at, count, c);
      } else {
        adamw_typed<G, P, true, false>(master_at, m_at, v_at, grad_at, grad_scale, out_at, count,
                                       c);
      }
    });
  });
}

// --- SGD -----------------------------------------------------------------------------------

template <DType G, DType P, bool kWriteParam>
void sgd_typed(float* master, float* momentum_buf, const void* grad, float grad_scale,
               void* param_out, size_t n, const SgdStepConstants& c) {
  const __m512 scale = _mm512_set1_ps(grad_scale);
  const __m512 weight_decay = _mm512_set1_ps(c.weight_decay);
  const __m512 momentum = _mm512_set1_ps(c.momentum);
  const __m512 lr = _mm512_set1_ps(c.lr);
  const bool use_momentum = c.momentum != 0.0f;
  for (size_t i = 0; i < n; i += kWidth) {
    const __mmask16 mask = lanes(i, n);
    __m512 g = _mm512_mul_ps(load16<G>(grad, i, mask), scale);
    __m512 p = _mm512_maskz_loadu_ps(mask, master + i);
    g = _mm512_add_ps(g, _mm512_mul_ps(weight_decay, p));
    if (use_momentum) {
      if (!c.first_step) {
        g = _mm512_add_ps(_mm512_mul_ps(momentum, _mm512_maskz_loadu_ps(mask, momentum_buf + i)),
                          g);
      }
      _mm512_mask_storeu_ps(momentum_buf + i, mask, g);
    }
    p = _mm512_sub_ps(p, _mm512_mul_ps(lr, g));
    _mm512_mask_storeu_ps(master + i, mask, p);
    if constexpr (kWriteParam) store16<P>(param_out, i, p, mask);
  }
}

void sgd_avx512(float* master, float* momentum_buf, const void* grad, DType grad_dtype,
                float grad_scale, void* param_out, DType param_dtype, size_t n,
                const SgdStepConstants& c) {
  with_dtype(grad_dtype, [&](auto g) {
    constexpr DType G = decltype(g)::value;
    if (!param_out) {
      sgd_typed<G, DType::kFloat32, false>(master, momentum_buf, grad, grad_scale, nullptr, n, c);
      return;
    }
    with_dtype(param_dtype, [&](auto p) {
      sgd_typed<G, decltype(p)::value, true>(master, momentum_buf, grad, grad_scale, param_out, n,
                                             c);
    });
  });
}

// --- Element-wise helpers --------------------------------------------------------------------

void cast_avx512(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  with_dtype(src_dtype, [&](auto s) {
    with_dtype(dst_dtype, [&](auto d) {
      for (size_t i = 0; i < n; i += kWidth) {
        const __mmask16 mask = lanes(i, n);
        store16<decltype(d)::value>(dst, i, load16<decltype(s)::value>(src, i, mask), mask);
      }
    });
  });
}

// Adds 16 exact squares to the 16 lanes (kernel_paths.h): lanes 0-7 in acc[0], 8-15 in acc[1].
// Masked-off elements load as +0.0, whose square leaves a lane (never -0.0) unchanged.
template <DType T>
void add_squares16(const void* x, size_t i, __mmask16 mask, __m512d* acc) {
  __m512 values = load16<T>(x, i, mask);
  __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(values));
  __m512d high =
      _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(values), 1)));
  acc[0] = _mm512_add_pd(acc[0], _mm512_mul_pd(low, low));
  acc[1] = _mm512_add_pd(acc[1], _mm512_mul_pd(high, high));
}

double sum_squares_block_avx512(const void* x, DType dtype, size_t n) {
  __m512d acc[2] = {_mm512_setzero_pd(), _mm512_setzero_pd()};
  with_dtype(dtype, [&](auto t) {
    for (size_t i = 0; i < n; i += kWidth) {
      add_squares16<decltype(t)::value>(x, i, lanes(i, n), acc);
    }
  });
  // reduce_sum_squares_lanes's tree: quarter q = (l[q] + l[q+4]) + (l[q+8] + l[q+12]), then
  // (q0 + q1) + (q2 + q3).
  __m256d low = _mm256_add_pd(_mm512_castpd512_pd256(acc[0]), _mm512_extractf64x4_pd(acc[0], 1));
  __m256d high = _mm256_add_pd(_mm512_castpd512_pd256(acc[1]), _mm512_extractf64x4_pd(acc[1], 1));
  alignas(32) double q[4];
  _mm256_store_pd(q, _mm256_add_pd(low, high));
  return (q[0] + q[1]) + (q[2] + q[3]);
}

bool all_finite_avx512(const void* x, DType dtype, size_t n) {
  if (dtype == DType::kFloat32) {
    // A float is NaN or infinite exactly when its exponent bits are all ones.
    const __m512i exponent = _mm512_set1_epi32(0x7f800000);
    const float* data = static_cast<const float*>(x);
    for (size_t i = 0; i < n; i += kWidth) {
      const __mmask16 mask = lanes(i, n);
      __m512i bits = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, data + i));
      if (_mm512_mask_cmpeq_epi32_mask(mask, _mm512_and_si512(bits, exponent), exponent) != 0) {
        return false;
      }
    }
    return true;
  }
  const __m512i exponent = _mm512_set1_epi16(dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00);
  const uint16_t* data = static_cast<const uint16_t*>(x);
  for (size_t i = 0; i < n; i += 2 * kWidth) {
    const __mmask32 mask =
        n - i >= 2 * kWidth ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (n - i)) - 1);
    __m512i bits = _mm512_maskz_loadu_epi16(mask, data + i);
    if (_mm512_mask_cmpeq_epi16_mask(mask, _mm512_and_si512(bits, exponent), exponent) != 0) {
      return false;
    }
  }
  return true;
}

void accumulate_avx512(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; i += kWidth) {
    const __mmask16 mask = lanes(i, n);
    _mm512_mask_storeu_ps(
        dst + i, mask,
        _mm512_add_ps(_mm512_maskz_loadu_ps(mask, dst + i), _mm512_maskz_loadu_ps(mask, src + i)));
  }
}

void scale_avx512(void* x, DType dtype, float alpha, size_t n) {
  const __m512 factor = _mm512_set1_ps(alpha);
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    for (size_t i = 0; i < n; i += kWidth) {
      const __mmask16 mask = lanes(i, n);
      store16<T>(x, i, _mm512_mul_ps(load16<T>(x, i, mask), factor), mask);
    }
  });
}

// Each step loads every source before it stores, so dst may be one of the sources.
void sum_in_order_avx512(void* dst, const void* const* srcs, size_t sources, size_t offset,
                         DType dtype, size_t n) {
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    for (size_t i = offset; i < offset + n; i += kWidth) {
      const __mmask16 mask = lanes(i, offset + n);
      __m512 sum = load16<T>(srcs[0], i, mask);
      for (size_t k = 1; k < sources; ++k) sum = _mm512_add_ps(sum, load16<T>(srcs[k], i, mask));
      store16<T>(dst, i, sum, mask);
    }
  });
}

// One piece into one destination with non-temporal stores (kernels_avx2.cpp's stream_copy, a
// whole 64-byte line per store).
void stream_copy(char* dst, const char* src, size_t n) {
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i),
                        _mm512_loadu_si512(reinterpret_cast<const void*>(src + i)));
  }
  std::memcpy(dst + i, src + i, n - i);
}

void copy_to_all_avx512(void* const* dsts, size_t count, const void* src, size_t offset,
                        size_t bytes) {
  for (size_t done = 0; done < bytes; done += kCopyPieceBytes) {
    const size_t n = std::min(kCopyPieceBytes, bytes - done);
    for (size_t k = 0; k < count; ++k) {
      stream_copy(static_cast<char*>(dsts[k]) + offset + done,
                  static_cast<const char*>(src) + offset + done, n);
    }
  }
  _mm_sfence();
}

}  // namespace

const KernelPath kAvx512Path = {
    adamw_avx512,      sgd_avx512,        cast_avx512,  sum_squares_block_avx512,
    all_finite_avx512, accumulate_avx512, scale_avx512, sum_in_order_avx512,
    copy_to_all_avx512};

}  // namespace zero::kernels::detail
