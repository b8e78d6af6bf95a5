// Data movement: batched flatten/unflatten of many tensors per launch, and dtype casts. The
// per-thread work is copy_slots_thread and cast_thread in cuda_kernel_bodies.h.
#include "cuda_kernel_bodies.h"
#include "dispatch.cuh"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

static_assert(sizeof(LaunchTable<TensorSlot>) + sizeof(CopyArgs<true>) <= 4096,
              "copy launch arguments exceed 4 KB");

template <bool kToFlat>
__global__ void __launch_bounds__(kBlockThreads)
    copy_slots_kernel(const __grid_constant__ LaunchTable<TensorSlot> table,
                      const CopyArgs<kToFlat> args) {
  copy_slots_thread<kToFlat>(blockIdx.x, threadIdx.x, table, args);
}

template <DType S, DType D>
__global__ void __launch_bounds__(kBlockThreads)
    cast_kernel(const void* __restrict__ src, void* __restrict__ dst, size_t n) {
  cast_thread<S, D>(blockIdx.x, threadIdx.x, src, dst, n);
}

template <bool kToFlat>
void copy_slots(const TensorSlot* tensors, size_t count, const CopyArgs<kToFlat>& args,
                CUstream_st* stream, const char* op) {
  ZERO_CHECK(count == 0 || tensors != nullptr, op << ": null tensor list with count " << count);
  for (size_t i = 0; i < count; ++i) {
    ZERO_CHECK(tensors[i].numel == 0 || (tensors[i].data != nullptr && args.flat != nullptr),
               op << ": tensor " << i << " or the flat buffer is null");
  }
  const size_t elem = args.elem_size;
  const auto plans = plan_launches(tensors, count, kChunkBytes,
                                   [elem](const TensorSlot& s) { return slot_bytes(s, elem); });
  for (const auto& table : plans) {
    copy_slots_kernel<kToFlat><<<table.blocks(), kBlockThreads, 0, stream>>>(table, args);
    ZERO_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void flatten(const TensorSlot* tensors, size_t count, void* flat, DType dtype,
             CUstream_st* stream) {
  const CopyArgs<true> args{flat, static_cast<uint32_t>(dtype_size(dtype))};
  copy_slots(tensors, count, args, stream, "flatten");
}

void unflatten(const void* flat, const TensorSlot* tensors, size_t count, DType dtype,
               CUstream_st* stream) {
  const CopyArgs<false> args{flat, static_cast<uint32_t>(dtype_size(dtype))};
  copy_slots(tensors, count, args, stream, "unflatten");
}

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
          CUstream_st* stream) {
  if (n == 0) return;
  ZERO_CHECK(src != nullptr && dst != nullptr, "cast: null buffer with n " << n);
  if (src_dtype == dst_dtype) {
    ZERO_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, n * dtype_size(src_dtype), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const uint32_t blocks = element_blocks(n, "cast");
  with_dtype(src_dtype, [&](auto src_tag) {
    with_dtype(dst_dtype, [&](auto dst_tag) {
      constexpr DType S = decltype(src_tag)::value;
      constexpr DType D = decltype(dst_tag)::value;
      if constexpr (S != D) {
        cast_kernel<S, D><<<blocks, kBlockThreads, 0, stream>>>(src, dst, n);
        ZERO_CUDA_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace zero::kernels::cuda
