// Blockwise int8 quantization on the GPU (quantize_math.h defines every element's bits, as for
// the CPU loops). One CUDA block per quantization block: its threads find max|x| with a
// shared-memory tree (max is exact in any order, so the scale's bits do not depend on it), then
// quantize their strided elements. The reduction needs __syncthreads, so this kernel has no
// per-thread body in cuda_kernel_bodies.h; dequantization is element-wise.
#include "cuda_kernel_bodies.h"
#include "dispatch.cuh"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernels.h"
#include "zero/kernels/quantize_math.h"

namespace zero::kernels::cuda {
namespace {

template <DType S>
__global__ void __launch_bounds__(kBlockThreads)
    quantize_int8_kernel(const void* __restrict__ src, size_t n, size_t block,
                         int8_t* __restrict__ values, float* __restrict__ scales) {
  __shared__ float absmax[kBlockThreads];
  const size_t begin = static_cast<size_t>(blockIdx.x) * block;
  const size_t end = begin + block < n ? begin + block : n;
  float mine = 0.0f;
  for (size_t i = begin + threadIdx.x; i < end; i += kBlockThreads) {
    mine = int8_absmax_step(mine, load_as_float(src, S, i));
  }
  absmax[threadIdx.x] = mine;
  __syncthreads();
  for (uint32_t half = kBlockThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      absmax[threadIdx.x] = int8_absmax_step(absmax[threadIdx.x], absmax[threadIdx.x + half]);
    }
    __syncthreads();
  }
  const float block_max = absmax[0];
  if (threadIdx.x == 0) scales[blockIdx.x] = int8_scale(block_max);
  const float inverse = int8_inverse_scale(block_max);
  for (size_t i = begin + threadIdx.x; i < end; i += kBlockThreads) {
    values[i] = int8_quantize(load_as_float(src, S, i), inverse);
  }
}

template <DType D>
__global__ void __launch_bounds__(kBlockThreads)
    dequantize_int8_kernel(const int8_t* __restrict__ values, const float* __restrict__ scales,
                           size_t n, size_t block, void* __restrict__ dst) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kBlockThreads;
  for (size_t i = static_cast<size_t>(blockIdx.x) * kBlockThreads + threadIdx.x; i < n;
       i += stride) {
    store_from_float(dst, D, i, int8_dequantize(values[i], scales[i / block]));
  }
}

}  // namespace

void quantize_int8(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                   float* scales, CUstream_st* stream) {
  if (n == 0) return;
  ZERO_CHECK(src != nullptr && values != nullptr && scales != nullptr,
             "quantize_int8: null buffer with n " << n);
  ZERO_CHECK(block > 0, "quantize_int8: the block size must be at least 1 element");
  const size_t blocks = int8_block_count(n, block);
  ZERO_CHECK(blocks <= kMaxBlocksPerLaunch,
             "quantize_int8 of " << n << " elements in blocks of " << block << " is too large");
  with_dtype(src_dtype, [&](auto tag) {
    constexpr DType S = decltype(tag)::value;
    quantize_int8_kernel<S><<<static_cast<uint32_t>(blocks), kBlockThreads, 0, stream>>>(
        src, n, block, values, scales);
    ZERO_CUDA_CHECK_LAUNCH();
  });
}

void dequantize_int8(const int8_t* values, const float* scales, size_t n, size_t block, void* dst,
                     DType dst_dtype, CUstream_st* stream) {
  if (n == 0) return;
  ZERO_CHECK(values != nullptr && scales != nullptr && dst != nullptr,
             "dequantize_int8: null buffer with n " << n);
  ZERO_CHECK(block > 0, "dequantize_int8: the block size must be at least 1 element");
  const uint32_t blocks = element_blocks(n, "dequantize_int8");
  with_dtype(dst_dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    dequantize_int8_kernel<D><<<blocks, kBlockThreads, 0, stream>>>(values, scales, n, block, dst);
    ZERO_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace zero::kernels::cuda
