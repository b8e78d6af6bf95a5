// Multi-tensor fused optimizers: one launch updates up to 64 tensors (master, optimizer state,
// working copy); the per-thread work is adamw_thread and sgd_thread in cuda_kernel_bodies.h.
#include "cuda_kernel_bodies.h"
#include "dispatch.cuh"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

// The table and arguments travel by value in the kernel's parameter space (constant memory),
// which the classic 4 KB limit bounds.
static_assert(sizeof(LaunchTable<AdamWTensor>) + sizeof(AdamWArgs) <= 4096,
              "AdamW launch arguments exceed 4 KB");
static_assert(sizeof(LaunchTable<SgdTensor>) + sizeof(SgdArgs) <= 4096,
              "SGD launch arguments exceed 4 KB");

template <DType G, DType P>
__global__ void __launch_bounds__(kBlockThreads)
    adamw_kernel(const __grid_constant__ LaunchTable<AdamWTensor> table, const AdamWArgs args) {
  adamw_thread<G, P>(blockIdx.x, threadIdx.x, table, args);
}

template <DType G, DType P>
__global__ void __launch_bounds__(kBlockThreads)
    sgd_kernel(const __grid_constant__ LaunchTable<SgdTensor> table, const SgdArgs args) {
  sgd_thread<G, P>(blockIdx.x, threadIdx.x, table, args);
}

// Plans the launches over `tensors` and calls launch(table, grad tag, param tag) for each, the
// gradient and working-copy dtypes being template arguments of the kernel it starts.
template <typename Tensor, typename Launch>
void launch_each_table(const Tensor* tensors, size_t count, DType grad_dtype, DType param_dtype,
                       Launch launch) {
  const auto plans =
      plan_launches(tensors, count, kChunkElements, [](const Tensor& t) { return t.numel; });
  with_dtype(grad_dtype, [&](auto grad_tag) {
    with_dtype(param_dtype, [&](auto param_tag) {
      for (const auto& table : plans) {
        launch(table, grad_tag, param_tag);
        ZERO_CUDA_CHECK_LAUNCH();
      }
    });
  });
}

}  // namespace

void fused_adamw(const AdamWTensor* tensors, size_t count, DType grad_dtype, DType param_dtype,
                 float grad_scale, const AdamWStepConstants& c, const DeviceStepControl& control,
                 CUstream_st* stream) {
  ZERO_CHECK(count == 0 || tensors != nullptr,
             "fused_adamw: null tensor list with count " << count);
  for (size_t i = 0; i < count; ++i) {
    const AdamWTensor& t = tensors[i];
    ZERO_CHECK(t.numel == 0 || (t.master && t.m && t.v && t.grad),
               "fused_adamw: tensor " << i << " has a null master, moment or gradient pointer");
  }
  const AdamWArgs args{c, grad_scale, control};
  launch_each_table(tensors, count, grad_dtype, param_dtype,
                    [&](const auto& table, auto grad_tag, auto param_tag) {
                      constexpr DType G = decltype(grad_tag)::value;
                      constexpr DType P = decltype(param_tag)::value;
                      adamw_kernel<G, P><<<table.blocks(), kBlockThreads, 0, stream>>>(table, args);
                    });
}

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
  launch_each_table(tensors, count, grad_dtype, param_dtype,
                    [&](const auto& table, auto grad_tag, auto param_tag) {
                      constexpr DType G = decltype(grad_tag)::value;
                      constexpr DType P = decltype(param_tag)::value;
                      sgd_kernel<G, P><<<table.blocks(), kBlockThreads, 0, stream>>>(table, args);
                    });
}

}  // namespace zero::kernels::cuda
