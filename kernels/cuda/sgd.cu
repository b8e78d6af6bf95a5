// Multi-tensor fused SGD with momentum: one launch updates up to 64 tensors (master, momentum,
// working copy); the per-thread work is sgd_thread in cuda_kernel_bodies.h.
#include "dispatch.cuh"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernel_bodies.h"
#include "zero/kernels/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

// The table and arguments travel by value in the kernel's parameter space (constant memory),
// which the classic 4 KB limit bounds.
static_assert(sizeof(LaunchTable<SgdTensor>) + sizeof(SgdArgs) <= 4096,
              "SGD launch arguments exceed 4 KB");

template <DType G, DType P>
__global__ void __launch_bounds__(kBlockThreads)
    sgd_kernel(const __grid_constant__ LaunchTable<SgdTensor> table, const SgdArgs args) {
  sgd_thread<G, P>(blockIdx.x, threadIdx.x, table, args);
}

}  // namespace

void fused_sgd(const SgdTensor* tensors, size_t count, DType grad_dtype, DType param_dtype,
               float grad_scale, const SgdStepConstants& c, const DeviceStepControl& control,
               CUstream_st* stream) {
  ZERO_CHECK(count == 0 || tensors != nullptr, "fused_sgd: null tensor list with count " << count);
  for (size_t i = 0; i < count; ++i) {
    const SgdTensor& t = tensors[i];
    ZERO_CHECK(t.numel == 0 || (t.master && t.grad),
               "fused_sgd: tensor " << i << " has a null master or gradient pointer");
    ZERO_CHECK(
        t.numel == 0 || c.momentum == 0.0f || t.momentum,
        "fused_sgd: tensor " << i << " has a null momentum buffer but momentum is " << c.momentum);
  }
  const SgdArgs args{c, grad_scale, control};
  const auto plans =
      plan_launches(tensors, count, kChunkElements, [](const SgdTensor& t) { return t.numel; });
  with_dtype(grad_dtype, [&](auto grad_tag) {
    with_dtype(param_dtype, [&](auto param_tag) {
      constexpr DType G = decltype(grad_tag)::value;
      constexpr DType P = decltype(param_tag)::value;
      for (const auto& table : plans) {
        sgd_kernel<G, P><<<table.blocks(), kBlockThreads, 0, stream>>>(table, args);
        ZERO_CUDA_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace zero::kernels::cuda
