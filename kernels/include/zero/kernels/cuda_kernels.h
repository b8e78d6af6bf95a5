// CUDA kernels on device memory: the operations of cpu_kernels.h for the GPU path. Every
// function only enqueues work on `stream` (asynchronous, no host synchronization); all pointers
// are device pointers unless stated otherwise. The element math is the one of optimizer_math.h
// and dtype.h, compiled without FMA contraction, so results are bitwise those of the CPU
// kernels (sum_squares excepted: it sums in a different, but fixed, order).
//
// This header needs no CUDA headers (the stream is the opaque CUstream_st*, which is what
// cudaStream_t is), so code built without nvcc can call these functions.
#pragma once

#include <cstddef>

#include "zero/core/dtype.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/kernels/optimizer_math.h"

struct CUstream_st;

namespace zero::kernels::cuda {

// One tensor of a multi-tensor AdamW launch. param_out may be null (no working copy).
struct AdamWTensor {
  float* master;
  float* m;
  float* v;
  const void* grad;
  void* param_out;
  size_t numel;
};

// Device-side inputs of a step, so that neither skipping nor clipping needs the host to read a
// device value first. Both pointers are optional (null: not used).
struct DeviceStepControl {
  // When *skip_flag != 0 (e.g. set by check_finite or sum_squares), the kernel changes nothing.
  const int* skip_flag = nullptr;
  // When set, *grad_scale replaces the host grad_scale (e.g. a clip factor computed on device).
  const float* grad_scale = nullptr;
};

// Fused AdamW over many tensors in one launch per 64 tensors: master, m, v updated in place,
// grad (grad_dtype) multiplied by grad_scale first, param_out (param_dtype) receives the updated
// master rounded, in the same pass. Same contract as kernels::fused_adamw, per tensor.
void fused_adamw(const AdamWTensor* tensors, size_t count, DType grad_dtype, DType param_dtype,
                 float grad_scale, const AdamWStepConstants& c, const DeviceStepControl& control,
                 CUstream_st* stream);

// One tensor of a multi-tensor SGD launch. momentum may be null when the step's momentum is 0
// (it is then never touched, as on the CPU); param_out may be null (no working copy).
struct SgdTensor {
  float* master;
  float* momentum;
  const void* grad;
  void* param_out;
  size_t numel;
};

// Fused SGD with momentum over many tensors in one launch per 64 tensors, with the grad_scale,
// control and param_out conventions of fused_adamw. Same contract as kernels::fused_sgd, per
// tensor.
void fused_sgd(const SgdTensor* tensors, size_t count, DType grad_dtype, DType param_dtype,
               float grad_scale, const SgdStepConstants& c, const DeviceStepControl& control,
               CUstream_st* stream);

// Batched copies of many tensors into / out of one flat buffer, one launch per 64 tensors
// (TensorSlot as in cpu_kernels.h: the tensors array itself is in host memory).
void flatten(const TensorSlot* tensors, size_t count, void* flat, DType dtype, CUstream_st* stream);
void unflatten(const void* flat, const TensorSlot* tensors, size_t count, DType dtype,
               CUstream_st* stream);

// Converts n elements (round to nearest even when narrowing); equal dtypes are a plain copy.
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
          CUstream_st* stream);

// dst[i] += src[i] for n elements, any pair of dtypes: each sum is computed in fp32 and rounded
// once to dst_dtype, as kernels::accumulate does for equal dtypes (e.g. adding fp32 gradients
// into bf16 storage rounds once, not twice). dst and src may be the same buffer.
void add(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
         CUstream_st* stream);

// x[i] *= alpha for n elements, the product computed in fp32 and rounded once (kernels::scale).
void scale(void* x, DType dtype, float alpha, size_t n, CUstream_st* stream);

// Blockwise int8 quantization (quantize_math.h), the same bits as kernels::quantize_int8 and
// kernels::dequantize_int8: n elements in blocks of `block`, one fp32 scale per block.
void quantize_int8(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                   float* scales, CUstream_st* stream);
void dequantize_int8(const int8_t* values, const float* scales, size_t n, size_t block, void* dst,
                     DType dst_dtype, CUstream_st* stream);

// A read-only tensor of a multi-tensor reduction.
struct ConstTensor {
  const void* data;
  size_t numel;
};

// Device scratch (bytes) that sum_squares needs for these tensors: one double per 8192 elements.
size_t sum_squares_workspace_bytes(const ConstTensor* tensors, size_t count);

// *out (device float) = sum over all tensors of x*x, accumulated in double and rounded once. The
// order is fixed by the tensor sizes alone, so the same input always gives the same bits. When
// nonfinite_flag is non-null and the sum is not finite, *nonfinite_flag is set to 1 (never
// cleared): one pass gives the norm and the overflow flag.
void sum_squares(const ConstTensor* tensors, size_t count, DType dtype, float* out, void* workspace,
                 size_t workspace_bytes, int* nonfinite_flag, CUstream_st* stream);

// Sets *flag (device int) to 1 when any element is NaN or infinite; never clears it (zero it
// with cudaMemsetAsync at the start of a step). Stops reading once the flag is set.
void check_finite(const ConstTensor* tensors, size_t count, DType dtype, int* flag,
                  CUstream_st* stream);

}  // namespace zero::kernels::cuda
