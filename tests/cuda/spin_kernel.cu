// See spin_kernel.h.
#include "spin_kernel.h"
#include "zero/kernels/cuda_check.h"

namespace zero::testing {
namespace {

__global__ void spin_kernel(int64_t cycles) {
  const int64_t start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void launch_spin(cudaStream_t stream, int64_t cycles) {
  spin_kernel<<<1, 1, 0, stream>>>(cycles);
  ZERO_CUDA_CHECK_LAUNCH();
}

}  // namespace zero::testing
