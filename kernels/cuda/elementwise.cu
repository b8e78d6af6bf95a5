// Single-tensor arithmetic in place: add (any dtype pair, e.g. fp32 gradients into bf16 storage)
// and scale. The per-thread work is add_thread and scale_thread in cuda_kernel_bodies.h.
#include "cuda_kernel_bodies.h"
#include "dispatch.cuh"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

// No __restrict__: dst and src may be the same buffer, which each thread reads before it writes.
template <DType D, DType S>
__global__ void __launch_bounds__(kBlockThreads) add_kernel(void* dst, const void* src, size_t n) {
  add_thread<D, S>(blockIdx.x, threadIdx.x, dst, src, n);
}

template <DType D>
__global__ void __launch_bounds__(kBlockThreads) scale_kernel(void* x, float alpha, size_t n) {
  scale_thread<D>(blockIdx.x, threadIdx.x, x, alpha, n);
}

}  // namespace

void add(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
         CUstream_st* stream) {
  if (n == 0) return;
  ZERO_CHECK(dst != nullptr && src != nullptr, "add: null buffer with n " << n);
  const uint32_t blocks = element_blocks(n, "add");
  with_dtype(dst_dtype, [&](auto dst_tag) {
    with_dtype(src_dtype, [&](auto src_tag) {
      constexpr DType D = decltype(dst_tag)::value;
      constexpr DType S = decltype(src_tag)::value;
      add_kernel<D, S><<<blocks, kBlockThreads, 0, stream>>>(dst, src, n);
      ZERO_CUDA_CHECK_LAUNCH();
    });
  });
}

void scale(void* x, DType dtype, float alpha, size_t n, CUstream_st* stream) {
  if (n == 0) return;
  ZERO_CHECK(x != nullptr, "scale: null buffer with n " << n);
  const uint32_t blocks = element_blocks(n, "scale");
  with_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    scale_kernel<D><<<blocks, kBlockThreads, 0, stream>>>(x, alpha, n);
    ZERO_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace zero::kernels::cuda
