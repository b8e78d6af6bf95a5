// AVX2/F16C loops, 8 floats per step. This file alone is compiled with -mavx2 -mf16c -mfma,
// so it calls none of the inline functions of dtype.h and optimizer_math.h: an out-of-line
// copy of one compiled here could be picked by the linker for the whole program and then run
// AVX instructions on a CPU without them. Tails of fewer than 8 elements go to the scalar path
// (compiled without those flags), which is the reference these loops match bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernel_paths.h"

namespace zero::kernels::detail {
namespace {

constexpr size_t kWidth = 8;

size_t bytes_of(DType t) {
  return t == DType::kFloat32 ? 4 : 2;
}

const void* advance(const void* p, DType t, size_t i) {
  return static_cast<const char*>(p) + i * bytes_of(t);
}

void* advance(void* p, DType t, size_t i) {
  return static_cast<char*>(p) + i * bytes_of(t);
}

// Calls fn with the dtype as a compile-time constant, so each loop is built per dtype and the
// element conversions inline into it.
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

__m128i load_halves(const void* data, size_t i) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
}

// 8 elements of dtype T from element i, widened to fp32 exactly.
template <DType T>
__m256 load8(const void* data, size_t i) {
  if constexpr (T == DType::kFloat32) {
    return _mm256_loadu_ps(static_cast<const float*>(data) + i);
  } else if constexpr (T == DType::kBFloat16) {
    __m256i wide = _mm256_cvtepu16_epi32(load_halves(data, i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  } else {
    return _mm256_cvtph_ps(load_halves(data, i));
  }
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

// Stores 8 floats as dtype T at element i, rounding to nearest even when narrowing. kStream
// writes around the caches (non-temporal), which needs element i 8-element aligned.
template <DType T, bool kStream = false>
void store8(void* data, size_t i, __m256 x) {
  if constexpr (T == DType::kFloat32) {
    float* at = static_cast<float*>(data) + i;
    if constexpr (kStream) {
      _mm256_stream_ps(at, x);
    } else {
      _mm256_storeu_ps(at, x);
    }
  } else {
    __m128i halves =
        T == DType::kBFloat16 ? float8_to_bf16(x) : _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    __m128i* at = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + i);
    if constexpr (kStream) {
      _mm_stream_si128(at, halves);
    } else {
      _mm_storeu_si128(at, halves);
    }
  }
}

// How far ahead of the loop the optimizer loops prefetch each stream, in elements: 1 KiB of
// each fp32 array. One core streams too many arrays (four to five, each in its own pages) for
// the hardware prefetchers to keep enough lines in flight, and they stop at every 4 KiB page
// boundary; measured on the 2-core Xeon, 256 elements beat 128 and 512.
constexpr size_t kPrefetchDistance = 256;

// Prefetches the line kPrefetchDistance elements past element i of a dtype-T array. Prefetches
// never fault, so the address may lie past the array's end; it is formed as an integer so the
// pointer arithmetic stays inside the array.
template <DType T>
void prefetch_ahead(const void* data, size_t i) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data) + (i + kPrefetchDistance) * bytes_of(T);
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

// Elements before param_out is aligned for store8<P, true>, or n when it cannot be (a pointer
// not aligned even to one element).
size_t elements_to_stream_alignment(const void* param_out, DType param_dtype, size_t n) {
  const size_t element = bytes_of(param_dtype);
  const uintptr_t address = reinterpret_cast<uintptr_t>(param_out);
  if (address % element != 0) return n;
  const size_t alignment = kWidth * element;
  return (alignment - address % alignment) % alignment / element;
}

// --- AdamW ---------------------------------------------------------------------------------

// The operations of adamw_update, in its order and without FMA, so that every element rounds
// exactly as the scalar definition does. Two vectors (one 64-byte line of each fp32 array) per
// iteration, so each stream gets one prefetch per line.
template <DType G, DType P, bool kWriteParam, bool kStream>
void adamw_typed(float* master, float* m, float* v, const void* grad, float grad_scale,
                 void* param_out, size_t n, const AdamWStepConstants& c) {
  const __m256 scale = _mm256_set1_ps(grad_scale);
  const __m256 l2 = _mm256_set1_ps(c.l2);
  const __m256 decay = _mm256_set1_ps(c.decay_factor);
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 inv_sqrt_bias2 = _mm256_set1_ps(c.inv_sqrt_bias2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 step_size = _mm256_set1_ps(c.step_size);
  auto update8 = [&](size_t i) {
    __m256 g = _mm256_mul_ps(load8<G>(grad, i), scale);
    __m256 p = _mm256_loadu_ps(master + i);
    __m256 mi = _mm256_loadu_ps(m + i);
    __m256 vi = _mm256_loadu_ps(v + i);
    g = _mm256_add_ps(g, _mm256_mul_ps(l2, p));
    p = _mm256_mul_ps(p, decay);
    mi = _mm256_add_ps(_mm256_mul_ps(beta1, mi), _mm256_mul_ps(one_minus_beta1, g));
    vi = _mm256_add_ps(_mm256_mul_ps(beta2, vi),
                       _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, g), g));
    __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), inv_sqrt_bias2), eps);
    p = _mm256_sub_ps(p, _mm256_mul_ps(step_size, _mm256_div_ps(mi, denom)));
    _mm256_storeu_ps(master + i, p);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    if constexpr (kWriteParam) store8<P, kStream>(param_out, i, p);
  };
  size_t i = 0;
  for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
    prefetch_ahead<DType::kFloat32>(master, i);
    prefetch_ahead<DType::kFloat32>(m, i);
    prefetch_ahead<DType::kFloat32>(v, i);
    prefetch_ahead<G>(grad, i);
    update8(i);
    update8(i + kWidth);
  }
  if (i + kWidth <= n) update8(i);
  // Non-temporal stores are weakly ordered: fence them before another thread may read the copy.
  if constexpr (kStream) _mm_sfence();
}

void adamw_avx2(float* master, float* m, float* v, const void* grad, DType grad_dtype,
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
  size_t done = n - count % kWidth;
  kScalarPath.adamw(master + done, m + done, v + done, advance(grad, grad_dtype, done), grad_dtype,
                    grad_scale, param_out ? advance(param_out, param_dtype, done) : nullptr,
                    param_dtype, n - done, c);
}

// --- SGD -----------------------------------------------------------------------------------

// The operations of sgd_update, in its order and without FMA.
template <DType G, DType P, bool kWriteParam>
void sgd_typed(float* master, float* momentum_buf, const void* grad, float grad_scale,
               void* param_out, size_t n, const SgdStepConstants& c) {
  const __m256 scale = _mm256_set1_ps(grad_scale);
  const __m256 weight_decay = _mm256_set1_ps(c.weight_decay);
  const __m256 momentum = _mm256_set1_ps(c.momentum);
  const __m256 lr = _mm256_set1_ps(c.lr);
  const bool use_momentum = c.momentum != 0.0f;
  for (size_t i = 0; i + kWidth <= n; i += kWidth) {
    __m256 g = _mm256_mul_ps(load8<G>(grad, i), scale);
    __m256 p = _mm256_loadu_ps(master + i);
    g = _mm256_add_ps(g, _mm256_mul_ps(weight_decay, p));
    if (use_momentum) {
      if (!c.first_step) {
        g = _mm256_add_ps(_mm256_mul_ps(momentum, _mm256_loadu_ps(momentum_buf + i)), g);
      }
      _mm256_storeu_ps(momentum_buf + i, g);
    }
    p = _mm256_sub_ps(p, _mm256_mul_ps(lr, g));
    _mm256_storeu_ps(master + i, p);
    if constexpr (kWriteParam) store8<P>(param_out, i, p);
  }
}

void sgd_avx2(float* master, float* momentum_buf, const void* grad, DType grad_dtype,
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
  size_t done = n - n % kWidth;
  kScalarPath.sgd(master + done, momentum_buf ? momentum_buf + done : nullptr,
                  advance(grad, grad_dtype, done), grad_dtype, grad_scale,
                  param_out ? advance(param_out, param_dtype, done) : nullptr, param_dtype,
                  n - done, c);
}

// --- Element-wise helpers --------------------------------------------------------------------

void cast_avx2(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  with_dtype(src_dtype, [&](auto s) {
    with_dtype(dst_dtype, [&](auto d) {
      for (size_t i = 0; i + kWidth <= n; i += kWidth) {
        store8<decltype(d)::value>(dst, i, load8<decltype(s)::value>(src, i));
      }
    });
  });
  size_t done = n - n % kWidth;
  kScalarPath.cast(advance(src, src_dtype, done), src_dtype, advance(dst, dst_dtype, done),
                   dst_dtype, n - done);
}

// Adds 16 exact squares to the 16 lanes (see kernel_paths.h): lanes 0-3 in acc[0], 4-7 in
// acc[1], and so on.
template <DType T>
void add_squares16(const void* x, size_t i, __m256d* acc) {
  for (size_t half = 0; half < 2; ++half) {
    __m256 values = load8<T>(x, i + half * kWidth);
    __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(values));
    __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(values, 1));
    acc[2 * half] = _mm256_add_pd(acc[2 * half], _mm256_mul_pd(low, low));
    acc[2 * half + 1] = _mm256_add_pd(acc[2 * half + 1], _mm256_mul_pd(high, high));
  }
}

double sum_squares_block_avx2(const void* x, DType dtype, size_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    size_t i = 0;
    for (; i + kSumSquaresLanes <= n; i += kSumSquaresLanes) add_squares16<T>(x, i, acc);
    // The tail runs through the same lanes from a zero-padded copy: adding +0.0 to a lane
    // (a sum of squares, never -0.0) leaves it unchanged, so the result matches the scalar loop.
    if (i < n) {
      alignas(32) float padded[kSumSquaresLanes] = {};
      memcpy(padded, advance(x, dtype, i), (n - i) * bytes_of(dtype));
      add_squares16<T>(padded, 0, acc);
    }
  });
  // reduce_sum_squares_lanes's tree, written with vectors: quarter q = (l[q] + l[q+4]) +
  // (l[q+8] + l[q+12]), then (q0 + q1) + (q2 + q3).
  __m256d quarters = _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]), _mm256_add_pd(acc[2], acc[3]));
  alignas(32) double q[4];
  _mm256_store_pd(q, quarters);
  return (q[0] + q[1]) + (q[2] + q[3]);
}

bool all_finite_avx2(const void* x, DType dtype, size_t n) {
  size_t i = 0;
  if (dtype == DType::kFloat32) {
    // A float is NaN or infinite exactly when its exponent bits are all ones.
    const __m256i exponent = _mm256_set1_epi32(0x7f800000);
    const float* data = static_cast<const float*>(x);
    for (; i + kWidth <= n; i += kWidth) {
      __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(data + i));
      __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(bits, exponent), exponent);
      if (!_mm256_testz_si256(bad, bad)) return false;
    }
  } else {
    const __m256i exponent = _mm256_set1_epi16(dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00);
    const uint16_t* data = static_cast<const uint16_t*>(x);
    for (; i + 2 * kWidth <= n; i += 2 * kWidth) {
      __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i));
      __m256i bad = _mm256_cmpeq_epi16(_mm256_and_si256(bits, exponent), exponent);
      if (!_mm256_testz_si256(bad, bad)) return false;
    }
  }
  return kScalarPath.all_finite(advance(x, dtype, i), dtype, n - i);
}

void accumulate_avx2(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i + kWidth <= n; i += kWidth) {
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
  }
  size_t done = n - n % kWidth;
  kScalarPath.accumulate(dst + done, src + done, n - done);
}

void scale_avx2(void* x, DType dtype, float alpha, size_t n) {
  const __m256 factor = _mm256_set1_ps(alpha);
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    for (size_t i = 0; i + kWidth <= n; i += kWidth) {
      store8<T>(x, i, _mm256_mul_ps(load8<T>(x, i), factor));
    }
  });
  size_t done = n - n % kWidth;
  kScalarPath.scale(advance(x, dtype, done), dtype, alpha, n - done);
}

// Each 8-lane step loads every source before it stores, so dst may be one of the sources.
void sum_in_order_avx2(void* dst, const void* const* srcs, size_t sources, size_t offset,
                       DType dtype, size_t n) {
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    for (size_t i = offset; i + kWidth <= offset + n; i += kWidth) {
      __m256 sum = load8<T>(srcs[0], i);
      for (size_t k = 1; k < sources; ++k) sum = _mm256_add_ps(sum, load8<T>(srcs[k], i));
      store8<T>(dst, i, sum);
    }
  });
  const size_t done = n - n % kWidth;
  kScalarPath.sum_in_order(dst, srcs, sources, offset + done, dtype, n - done);
}

// One piece into one destination with non-temporal stores: its lines are written without being
// read first (a cached store reads every line before writing it), and none of the caches is
// filled with data the copying thread never reads again. Bytes before dst's first 32-byte
// boundary and after its last go through memcpy.
void stream_copy(char* dst, const char* src, size_t n) {
  const size_t head = std::min(n, (32 - reinterpret_cast<uintptr_t>(dst) % 32) % 32);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 32 <= n; i += 32) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), x);
  }
  std::memcpy(dst + i, src + i, n - i);
}

void copy_to_all_avx2(void* const* dsts, size_t count, const void* src, size_t offset,
                      size_t bytes) {
  for (size_t done = 0; done < bytes; done += kCopyPieceBytes) {
    const size_t n = std::min(kCopyPieceBytes, bytes - done);
    for (size_t k = 0; k < count; ++k) {
      stream_copy(static_cast<char*>(dsts[k]) + offset + done,
                  static_cast<const char*>(src) + offset + done, n);
    }
  }
  // Non-temporal stores are weakly ordered: they must be visible before whatever tells another
  // thread or process that the copy is done.
  _mm_sfence();
}

}  // namespace

const KernelPath kAvx2Path = {adamw_avx2,      sgd_avx2,        cast_avx2,  sum_squares_block_avx2,
                              all_finite_avx2, accumulate_avx2, scale_avx2, sum_in_order_avx2,
                              copy_to_all_avx2};

}  // namespace zero::kernels::detail
