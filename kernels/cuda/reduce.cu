// Reductions over many tensors: the finite check (a device flag) and the sum of squares (two
// stages, each in a fixed order, so the result depends only on the input). The per-thread work
// is in cuda_kernel_bodies.h.
#include "cuda_kernel_bodies.h"
#include "dispatch.cuh"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

static_assert(sizeof(LaunchTable<ConstTensor>) + 2 * sizeof(void*) <= 4096,
              "reduction launch arguments exceed 4 KB");

template <DType D>
__global__ void __launch_bounds__(kBlockThreads)
    check_finite_kernel(const __grid_constant__ LaunchTable<ConstTensor> table, int* flag) {
  check_finite_thread<D>(blockIdx.x, threadIdx.x, table, flag);
}

// Adds a block's per-thread values with the fixed tree of tree_sum_level; returns the total on
// thread 0 (the others return a partial).
__device__ double block_tree_sum(double* shared, double value) {
  shared[threadIdx.x] = value;
  for (uint32_t half = kBlockThreads / 2; half > 0; half /= 2) {
    __syncthreads();
    tree_sum_level(shared, threadIdx.x, half);
  }
  return shared[0];
}

template <DType D>
__global__ void __launch_bounds__(kBlockThreads)
    sum_squares_kernel(const __grid_constant__ LaunchTable<ConstTensor> table, double* partials) {
  __shared__ double shared[kBlockThreads];
  const double total =
      block_tree_sum(shared, sum_squares_thread<D>(blockIdx.x, threadIdx.x, table));
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kBlockThreads)
    sum_partials_kernel(const double* partials, size_t count, float* out, int* nonfinite_flag) {
  __shared__ double shared[kBlockThreads];
  const double total = block_tree_sum(shared, sum_partials_thread(threadIdx.x, partials, count));
  if (threadIdx.x == 0) finish_sum_squares(total, out, nonfinite_flag);
}

std::vector<LaunchTable<ConstTensor>> plan_reduction(const ConstTensor* tensors, size_t count,
                                                     const char* op) {
  ZERO_CHECK(count == 0 || tensors != nullptr, op << ": null tensor list with count " << count);
  for (size_t i = 0; i < count; ++i) {
    ZERO_CHECK(tensors[i].numel == 0 || tensors[i].data != nullptr,
               op << ": tensor " << i << " is null");
  }
  return plan_launches(tensors, count, kChunkElements,
                       [](const ConstTensor& t) { return t.numel; });
}

size_t total_blocks(const std::vector<LaunchTable<ConstTensor>>& plans) {
  size_t blocks = 0;
  for (const auto& table : plans) blocks += table.blocks();
  return blocks;
}

}  // namespace

size_t sum_squares_workspace_bytes(const ConstTensor* tensors, size_t count) {
  return total_blocks(plan_reduction(tensors, count, "sum_squares")) * sizeof(double);
}

void sum_squares(const ConstTensor* tensors, size_t count, DType dtype, float* out, void* workspace,
                 size_t workspace_bytes, int* nonfinite_flag, CUstream_st* stream) {
  ZERO_CHECK(out != nullptr, "sum_squares: null output");
  const auto plans = plan_reduction(tensors, count, "sum_squares");
  const size_t partials = total_blocks(plans);
  ZERO_CHECK(workspace_bytes >= partials * sizeof(double) && (partials == 0 || workspace),
             "sum_squares: workspace of " << workspace_bytes << " bytes, needs "
                                          << partials * sizeof(double)
                                          << " (sum_squares_workspace_bytes)");
  auto* partial = static_cast<double*>(workspace);
  with_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    size_t offset = 0;
    for (const auto& table : plans) {
      sum_squares_kernel<D><<<table.blocks(), kBlockThreads, 0, stream>>>(table, partial + offset);
      ZERO_CUDA_CHECK_LAUNCH();
      offset += table.blocks();
    }
  });
  // Always launched, so an empty input writes 0 like the CPU kernel returns it.
  sum_partials_kernel<<<1, kBlockThreads, 0, stream>>>(partial, partials, out, nonfinite_flag);
  ZERO_CUDA_CHECK_LAUNCH();
}

void check_finite(const ConstTensor* tensors, size_t count, DType dtype, int* flag,
                  CUstream_st* stream) {
  ZERO_CHECK(flag != nullptr, "check_finite: null flag");
  const auto plans = plan_reduction(tensors, count, "check_finite");
  with_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    for (const auto& table : plans) {
      check_finite_kernel<D><<<table.blocks(), kBlockThreads, 0, stream>>>(table, flag);
      ZERO_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace zero::kernels::cuda
