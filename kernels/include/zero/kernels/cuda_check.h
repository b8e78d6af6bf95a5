// Error checks for CUDA runtime calls: a failed call throws zero::Error naming the call, CUDA's
// error name and text, the file and the line. For code that includes cuda_runtime.h anyway.
#pragma once

#include <cuda_runtime.h>

#include "zero/core/check.h"

// ZERO_CUDA_CHECK(cudaXxx(...)): throws zero::Error when the call does not return cudaSuccess.
#define ZERO_CUDA_CHECK(call)                                                   \
  do {                                                                          \
    const cudaError_t zero_cuda_rc_ = (call);                                   \
    if (zero_cuda_rc_ != cudaSuccess) {                                         \
      ZERO_FAIL(#call << " failed: " << cudaGetErrorName(zero_cuda_rc_) << ": " \
                      << cudaGetErrorString(zero_cuda_rc_));                    \
    }                                                                           \
  } while (0)

// ZERO_CUDA_CHECK_LAUNCH(): after a <<<...>>> launch, reports a bad configuration or a sticky
// error from earlier work (errors inside the kernel surface at the next synchronizing call).
#define ZERO_CUDA_CHECK_LAUNCH() ZERO_CUDA_CHECK(cudaGetLastError())
