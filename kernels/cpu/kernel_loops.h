// The entries of the vector KernelPaths written once, over a traits type V that
// kernels_avx2.cpp and kernels_avx512.cpp each define with their own intrinsics. The loops run
// the operations of the scalar definitions (optimizer_math.h) in their order and without FMA, so
// every path rounds every element alike, and AVX2 and AVX-512 return the same bits.
//
// Those files are compiled with different ISA flags, so they call none of the inline functions
// of dtype.h and optimizer_math.h, and nothing here has external linkage (see vector_steps.h):
// the templates below are instantiated with the including file's own V.
//
// V provides:
//   kWidth, kMaskedTail, tail_lanes(i, n)     as vector_steps (vector_steps.h) uses them
//   Vec; set1, add, sub, mul, div, sqrt       fp32 vectors and their arithmetic
//   load<T>(data, i, lanes)                   kWidth elements of dtype T at element i, in fp32
//   store<T>(data, i, x, lanes)               x as dtype T at element i, rounded to nearest even
//   stream<T>(data, i, x)                     the same for all lanes around the caches;
//                                             element i kWidth-aligned
//   SquareLanes; no_squares(), add_squares16<T>(x, i, lanes), sum_square_lanes(lanes)
//                                             kernel_paths.h's 16 lanes of sum_squares
//   kHalvesWidth; any_non_finite(floats, i, lanes), any_non_finite(halves, i, exponent, lanes),
//   tail_halves(i, n)                         the NaN/infinity test of kWidth floats or
//                                             kHalvesWidth 16-bit values
//   kStreamBytes; stream_bytes(dst, src)      one non-temporal store of kStreamBytes, dst aligned
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernel_paths.h"
#include "vector_steps.h"

namespace zero::kernels::detail {
namespace {

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

// How far ahead of the loop the optimizer loops prefetch each stream, in elements: 1 KiB of
// each fp32 array. One core streams too many arrays (four to five, each in its own pages) for
// the hardware prefetchers to keep enough lines in flight, and they stop at every 4 KiB page
// boundary; measured on the 2-core Xeon with AVX2, 256 elements beat 128 and 512 (not tuned
// apart for AVX-512).
constexpr size_t kPrefetchDistance = 256;

// The floats of one 64-byte cache line: the optimizer loops prefetch once per line of each array.
constexpr size_t kLineFloats = 16;

// Prefetches the line kPrefetchDistance elements past element i of a dtype-T array. Prefetches
// never fault, so the address may lie past the array's end; it is formed as an integer so the
// pointer arithmetic stays inside the array.
template <DType T>
void prefetch_ahead(const void* data, size_t i) {
  uintptr_t address = reinterpret_cast<uintptr_t>(data) + (i + kPrefetchDistance) * bytes_of(T);
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

// Elements before param_out is aligned for V::stream (a whole vector), or n when it cannot be
// (a pointer not aligned even to one element).
template <typename V>
size_t elements_to_stream_alignment(const void* param_out, DType param_dtype, size_t n) {
  const size_t element = bytes_of(param_dtype);
  const uintptr_t address = reinterpret_cast<uintptr_t>(param_out);
  if (address % element != 0) return n;
  const size_t alignment = V::kWidth * element;
  return std::min(n, (alignment - address % alignment) % alignment / element);
}

// --- AdamW ---------------------------------------------------------------------------------

// adamw_update's operations in its order, without FMA. One 64-byte line of each fp32 array per
// iteration, so each stream gets one prefetch per line. Returns where the vector steps stopped.
template <typename V, DType G, DType P, bool kWriteParam, bool kStream>
size_t adamw_typed(float* master, float* m, float* v, const void* grad, float grad_scale,
                   void* param_out, size_t n, const AdamWStepConstants& c) {
  using Vec = typename V::Vec;
  constexpr DType F = DType::kFloat32;
  const Vec scale = V::set1(grad_scale);
  const Vec l2 = V::set1(c.l2);
  const Vec decay = V::set1(c.decay_factor);
  const Vec beta1 = V::set1(c.beta1);
  const Vec one_minus_beta1 = V::set1(c.one_minus_beta1);
  const Vec beta2 = V::set1(c.beta2);
  const Vec one_minus_beta2 = V::set1(c.one_minus_beta2);
  const Vec inv_sqrt_bias2 = V::set1(c.inv_sqrt_bias2);
  const Vec eps = V::set1(c.eps);
  const Vec step_size = V::set1(c.step_size);
  auto update = [&](size_t i, auto lanes) {
    Vec g = V::mul(V::template load<G>(grad, i, lanes), scale);
    Vec p = V::template load<F>(master, i, lanes);
    Vec mi = V::template load<F>(m, i, lanes);
    Vec vi = V::template load<F>(v, i, lanes);
    g = V::add(g, V::mul(l2, p));
    p = V::mul(p, decay);
    mi = V::add(V::mul(beta1, mi), V::mul(one_minus_beta1, g));
    vi = V::add(V::mul(beta2, vi), V::mul(V::mul(one_minus_beta2, g), g));
    Vec denom = V::add(V::mul(V::sqrt(vi), inv_sqrt_bias2), eps);
    p = V::sub(p, V::mul(step_size, V::div(mi, denom)));
    V::template store<F>(master, i, p, lanes);
    V::template store<F>(m, i, mi, lanes);
    V::template store<F>(v, i, vi, lanes);
    if constexpr (kWriteParam) {
      if constexpr (kStream && std::is_same_v<decltype(lanes), AllLanes>) {
        V::template stream<P>(param_out, i, p);
      } else {
        V::template store<P>(param_out, i, p, lanes);
      }
    }
  };
  size_t i = 0;
  for (; i + kLineFloats <= n; i += kLineFloats) {
    prefetch_ahead<F>(master, i);
    prefetch_ahead<F>(m, i);
    prefetch_ahead<F>(v, i);
    prefetch_ahead<G>(grad, i);
    for (size_t step = 0; step < kLineFloats; step += V::kWidth) update(i + step, AllLanes{});
  }
  const size_t done = vector_steps<V>(i, n, update);
  // Non-temporal stores are weakly ordered: fence them before another thread may read the copy.
  if constexpr (kStream) _mm_sfence();
  return done;
}

template <typename V>
void adamw_vector(float* master, float* m, float* v, const void* grad, DType grad_dtype,
                  float grad_scale, void* param_out, DType param_dtype, size_t n,
                  const AdamWStepConstants& c) {
  // Large working copies are streamed; the elements before `start` (the scalar path) align
  // the copy for the streaming stores.
  size_t start = 0;
  bool stream = false;
  if (param_out != nullptr && n >= kStreamingMinElements) {
    start = elements_to_stream_alignment<V>(param_out, param_dtype, n);
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
  size_t done = 0;
  with_dtype(grad_dtype, [&](auto g) {
    constexpr DType G = decltype(g)::value;
    if (!param_out) {
      done = adamw_typed<V, G, DType::kFloat32, false, false>(master_at, m_at, v_at, grad_at,
                                                              grad_scale, nullptr, count, c);
      return;
    }
    with_dtype(param_dtype, [&](auto p) {
      constexpr DType P = decltype(p)::value;
      if (stream) {
        done = adamw_typed<V, G, P, true, true>(master_at, m_at, v_at, grad_at, grad_scale, out_at,
                                                count, c);
      } else {
        done = adamw_typed<V, G, P, true, false>(master_at, m_at, v_at, grad_at, grad_scale, out_at,
                                                 count, c);
      }
    });
  });
  done += start;
  if (done == n) return;
  kScalarPath.adamw(master + done, m + done, v + done, advance(grad, grad_dtype, done), grad_dtype,
                    grad_scale, param_out ? advance(param_out, param_dtype, done) : nullptr,
                    param_dtype, n - done, c);
}

// --- SGD -----------------------------------------------------------------------------------

// sgd_update's operations in its order, without FMA. Returns where the vector steps stopped.
template <typename V, DType G, DType P, bool kWriteParam>
size_t sgd_typed(float* master, float* momentum_buf, const void* grad, float grad_scale,
                 void* param_out, size_t n, const SgdStepConstants& c) {
  using Vec = typename V::Vec;
  constexpr DType F = DType::kFloat32;
  const Vec scale = V::set1(grad_scale);
  const Vec weight_decay = V::set1(c.weight_decay);
  const Vec momentum = V::set1(c.momentum);
  const Vec lr = V::set1(c.lr);
  const bool use_momentum = c.momentum != 0.0f;
  return vector_steps<V>(0, n, [&](size_t i, auto lanes) {
    Vec g = V::mul(V::template load<G>(grad, i, lanes), scale);
    Vec p = V::template load<F>(master, i, lanes);
    g = V::add(g, V::mul(weight_decay, p));
    if (use_momentum) {
      if (!c.first_step)
        g = V::add(V::mul(momentum, V::template load<F>(momentum_buf, i, lanes)), g);
      V::template store<F>(momentum_buf, i, g, lanes);
    }
    p = V::sub(p, V::mul(lr, g));
    V::template store<F>(master, i, p, lanes);
    if constexpr (kWriteParam) V::template store<P>(param_out, i, p, lanes);
  });
}

template <typename V>
void sgd_vector(float* master, float* momentum_buf, const void* grad, DType grad_dtype,
                float grad_scale, void* param_out, DType param_dtype, size_t n,
                const SgdStepConstants& c) {
  size_t done = 0;
  with_dtype(grad_dtype, [&](auto g) {
    constexpr DType G = decltype(g)::value;
    if (!param_out) {
      done = sgd_typed<V, G, DType::kFloat32, false>(master, momentum_buf, grad, grad_scale,
                                                     nullptr, n, c);
      return;
    }
    with_dtype(param_dtype, [&](auto p) {
      done = sgd_typed<V, G, decltype(p)::value, true>(master, momentum_buf, grad, grad_scale,
                                                       param_out, n, c);
    });
  });
  if (done == n) return;
  kScalarPath.sgd(master + done, momentum_buf ? momentum_buf + done : nullptr,
                  advance(grad, grad_dtype, done), grad_dtype, grad_scale,
                  param_out ? advance(param_out, param_dtype, done) : nullptr, param_dtype,
                  n - done, c);
}

// --- Element-wise helpers --------------------------------------------------------------------

template <typename V>
void cast_vector(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  size_t done = 0;
  with_dtype(src_dtype, [&](auto s) {
    with_dtype(dst_dtype, [&](auto d) {
      done = vector_steps<V>(0, n, [&](size_t i, auto lanes) {
        V::template store<decltype(d)::value>(
            dst, i, V::template load<decltype(s)::value>(src, i, lanes), lanes);
      });
    });
  });
  if (done == n) return;
  kScalarPath.cast(advance(src, src_dtype, done), src_dtype, advance(dst, dst_dtype, done),
                   dst_dtype, n - done);
}

// kernel_paths.h's 16 lanes, a group of kSumSquaresLanes elements at a time. The last, partial
// group runs through the same lanes from a zero-padded copy: adding +0.0 to a lane (a sum of
// squares, never -0.0) leaves it unchanged, so the result matches the scalar loop.
template <typename V>
double sum_squares_block_vector(const void* x, DType dtype, size_t n) {
  typename V::SquareLanes lanes = V::no_squares();
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    size_t i = 0;
    for (; i + kSumSquaresLanes <= n; i += kSumSquaresLanes) {
      V::template add_squares16<T>(x, i, lanes);
    }
    if (i < n) {
      alignas(64) float padded[kSumSquaresLanes] = {};
      std::memcpy(padded, advance(x, dtype, i), (n - i) * bytes_of(dtype));
      V::template add_squares16<T>(padded, 0, lanes);
    }
  });
  return V::sum_square_lanes(lanes);
}

template <typename V>
bool all_finite_vector(const void* x, DType dtype, size_t n) {
  size_t i = 0;
  if (dtype == DType::kFloat32) {
    const float* data = static_cast<const float*>(x);
    for (; i + V::kWidth <= n; i += V::kWidth) {
      if (V::any_non_finite(data, i, AllLanes{})) return false;
    }
    if constexpr (V::kMaskedTail) return i == n || !V::any_non_finite(data, i, V::tail_lanes(i, n));
  } else {
    // The exponent bits, all ones exactly in NaN and infinity.
    const uint16_t exponent = dtype == DType::kBFloat16 ? 0x7f80 : 0x7c00;
    const uint16_t* data = static_cast<const uint16_t*>(x);
    for (; i + V::kHalvesWidth <= n; i += V::kHalvesWidth) {
      if (V::any_non_finite(data, i, exponent, AllLanes{})) return false;
    }
    if constexpr (V::kMaskedTail) {
      return i == n || !V::any_non_finite(data, i, exponent, V::tail_halves(i, n));
    }
  }
  return kScalarPath.all_finite(advance(x, dtype, i), dtype, n - i);
}

template <typename V>
void accumulate_vector(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  size_t done = 0;
  with_dtype(dst_dtype, [&](auto d) {
    constexpr DType D = decltype(d)::value;
    with_dtype(src_dtype, [&](auto s) {
      constexpr DType S = decltype(s)::value;
      done = vector_steps<V>(0, n, [&](size_t i, auto lanes) {
        V::template store<D>(
            dst, i, V::add(V::template load<D>(dst, i, lanes), V::template load<S>(src, i, lanes)),
            lanes);
      });
    });
  });
  if (done < n) {
    kScalarPath.accumulate(advance(dst, dst_dtype, done), dst_dtype, advance(src, src_dtype, done),
                           src_dtype, n - done);
  }
}

template <typename V>
void scale_vector(void* x, DType dtype, float alpha, size_t n) {
  const typename V::Vec factor = V::set1(alpha);
  size_t done = 0;
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    done = vector_steps<V>(0, n, [&](size_t i, auto lanes) {
      V::template store<T>(x, i, V::mul(V::template load<T>(x, i, lanes), factor), lanes);
    });
  });
  if (done < n) kScalarPath.scale(advance(x, dtype, done), dtype, alpha, n - done);
}

// Each step loads every source before it stores, so dst may be one of the sources.
template <typename V>
void sum_in_order_vector(void* dst, const void* const* srcs, size_t sources, size_t offset,
                         DType dtype, size_t n) {
  size_t done = offset + n;
  with_dtype(dtype, [&](auto t) {
    constexpr DType T = decltype(t)::value;
    done = vector_steps<V>(offset, offset + n, [&](size_t i, auto lanes) {
      typename V::Vec sum = V::template load<T>(srcs[0], i, lanes);
      for (size_t k = 1; k < sources; ++k)
        sum = V::add(sum, V::template load<T>(srcs[k], i, lanes));
      V::template store<T>(dst, i, sum, lanes);
    });
  });
  if (done < offset + n)
    kScalarPath.sum_in_order(dst, srcs, sources, done, dtype, offset + n - done);
}

// One piece into one destination with non-temporal stores: its lines are written without being
// read first (a cached store reads every line before writing it), and none of the caches is
// filled with data the copying thread never reads again. Bytes before dst's first
// V::kStreamBytes boundary and after its last go through memcpy.
template <typename V>
void stream_copy(char* dst, const char* src, size_t n) {
  constexpr size_t kBytes = V::kStreamBytes;
  const size_t head = std::min(n, (kBytes - reinterpret_cast<uintptr_t>(dst) % kBytes) % kBytes);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + kBytes <= n; i += kBytes) V::stream_bytes(dst + i, src + i);
  std::memcpy(dst + i, src + i, n - i);
}

template <typename V>
void copy_to_all_vector(void* const* dsts, size_t count, const void* src, size_t offset,
                        size_t bytes) {
  for (size_t done = 0; done < bytes; done += kCopyPieceBytes) {
    const size_t n = std::min(kCopyPieceBytes, bytes - done);
    for (size_t k = 0; k < count; ++k) {
      stream_copy<V>(static_cast<char*>(dsts[k]) + offset + done,
                     static_cast<const char*>(src) + offset + done, n);
    }
  }
  // Non-temporal stores are weakly ordered: they must be visible before whatever tells another
  // thread or process that the copy is done.
  _mm_sfence();
}

// The path of traits V.
template <typename V>
constexpr KernelPath vector_path() {
  return {
      adamw_vector<V>,       sgd_vector<V>,        cast_vector<V>,      sum_squares_block_vector<V>,
      all_finite_vector<V>,  accumulate_vector<V>, scale_vector<V>,     sum_in_order_vector<V>,
      copy_to_all_vector<V>, quantize_int8_avx2,   dequantize_int8_avx2};
}

}  // namespace
}  // namespace zero::kernels::detail
