// Error checks for cuBLAS calls: a failed call throws zero::Error naming the call, cuBLAS's status
// text, the file and the line. For code that includes cublas_v2.h anyway.
#pragma once

#include <cublas_v2.h>

#include "zero/core/check.h"

// ZERO_CUBLAS_CHECK(cublasXxx(...)): throws zero::Error when the call does not succeed.
#define ZERO_CUBLAS_CHECK(call)                                                      \
  do {                                                                               \
    const cublasStatus_t zero_cublas_status_ = (call);                               \
    if (zero_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                              \
      ZERO_FAIL(#call << " failed: " << cublasGetStatusString(zero_cublas_status_)); \
    }                                                                                \
  } while (0)
