// Scalar loops: the fallback on CPUs without AVX2/F16C/FMA and the path ZERO_KERNELS_SCALAR=1
// selects. Every element goes through the shared definitions in dtype.h and optimizer_math.h,
// so these loops are the reference the vectorized path must match.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernel_paths.h"
#include "zero/kernels/quantize_math.h"

namespace zero::kernels::detail {
namespace {

void adamw_scalar(float* master, float* m, float* v, const void* grad, DType grad_dtype,
                  float grad_scale, void* param_out, DType param_dtype, size_t n,
                  const AdamWStepConstants& c) {
  for (size_t i = 0; i < n; ++i) {
    float g = load_as_float(grad, grad_dtype, i) * grad_scale;
    adamw_update(master[i], m[i], v[i], g, c);
    if (param_out) store_from_float(param_out, param_dtype, i, master[i]);
  }
}

void sgd_scalar(float* master, float* momentum_buf, const void* grad, DType grad_dtype,
                float grad_scale, void* param_out, DType param_dtype, size_t n,
                const SgdStepConstants& c) {
  // sgd_update ignores the buffer when momentum is 0, and the buffer may then be null.
  float unused_buf = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    float g = load_as_float(grad, grad_dtype, i) * grad_scale;
    sgd_update(master[i], momentum_buf ? momentum_buf[i] : unused_buf, g, c);
    if (param_out) store_from_float(param_out, param_dtype, i, master[i]);
  }
}

void cast_scalar(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  for (size_t i = 0; i < n; ++i)
    store_from_float(dst, dst_dtype, i, load_as_float(src, src_dtype, i));
}

double sum_squares_block_scalar(const void* x, DType dtype, size_t n) {
  double lanes[kSumSquaresLanes] = {};
  for (size_t i = 0; i < n; ++i) {
    double value = load_as_float(x, dtype, i);
    lanes[i % kSumSquaresLanes] += value * value;
  }
  return reduce_sum_squares_lanes(lanes);
}

bool all_finite_scalar(const void* x, DType dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(load_as_float(x, dtype, i))) return false;
  }
  return true;
}

void accumulate_scalar(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    store_from_float(dst, dst_dtype, i,
                     load_as_float(dst, dst_dtype, i) + load_as_float(src, src_dtype, i));
  }
}

void scale_scalar(void* x, DType dtype, float alpha, size_t n) {
  for (size_t i = 0; i < n; ++i) store_from_float(x, dtype, i, load_as_float(x, dtype, i) * alpha);
}

void sum_in_order_scalar(void* dst, const void* const* srcs, size_t sources, size_t offset,
                         DType dtype, size_t n) {
  for (size_t i = offset; i < offset + n; ++i) {
    float sum = load_as_float(srcs[0], dtype, i);
    for (size_t k = 1; k < sources; ++k) sum += load_as_float(srcs[k], dtype, i);
    store_from_float(dst, dtype, i, sum);
  }
}

void copy_to_all_scalar(void* const* dsts, size_t count, const void* src, size_t offset,
                        size_t bytes) {
  for (size_t done = 0; done < bytes; done += kCopyPieceBytes) {
    const size_t n = std::min(kCopyPieceBytes, bytes - done);
    for (size_t k = 0; k < count; ++k) {
      std::memcpy(static_cast<char*>(dsts[k]) + offset + done,
                  static_cast<const char*>(src) + offset + done, n);
    }
  }
}

// Per block: max|x| first, then every element against it.
void quantize_int8_scalar(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                          float* scales) {
  for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
    const size_t end = std::min(n, begin + block);
    float absmax = 0.0f;
    for (size_t i = begin; i < end; ++i) {
      absmax = int8_absmax_step(absmax, load_as_float(src, src_dtype, i));
    }
    scales[b] = int8_scale(absmax);
    const float inverse = int8_inverse_scale(absmax);
    for (size_t i = begin; i < end; ++i) {
      values[i] = int8_quantize(load_as_float(src, src_dtype, i), inverse);
    }
  }
}

void dequantize_int8_scalar(const int8_t* values, const float* scales, size_t n, size_t block,
                            void* dst, DType dst_dtype) {
  for (size_t begin = 0, b = 0; begin < n; begin += block, ++b) {
    const size_t end = std::min(n, begin + block);
    for (size_t i = begin; i < end; ++i) {
      store_from_float(dst, dst_dtype, i, int8_dequantize(values[i], scales[b]));
    }
  }
}

}  // namespace

const KernelPath kScalarPath = {
    adamw_scalar,       sgd_scalar,           cast_scalar,           sum_squares_block_scalar,
    all_finite_scalar,  accumulate_scalar,    scale_scalar,          sum_in_order_scalar,
    copy_to_all_scalar, quantize_int8_scalar, dequantize_int8_scalar};

}  // namespace zero::kernels::detail
