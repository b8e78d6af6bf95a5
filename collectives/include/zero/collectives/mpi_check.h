// ZERO_MPI_CHECK(MPI_Xxx(...)): throws zero::Error naming the call, MPI's error text, file and
// line. One definition for the MPI backends and for every program that calls MPI directly.
#pragma once

#include <mpi.h>

#include <string>

#include "zero/core/check.h"

#define ZERO_MPI_CHECK(call)                                                         \
  do {                                                                               \
    int zero_mpi_rc_ = (call);                                                       \
    if (zero_mpi_rc_ != MPI_SUCCESS) {                                               \
      char zero_mpi_text_[MPI_MAX_ERROR_STRING];                                     \
      int zero_mpi_len_ = 0;                                                         \
      MPI_Error_string(zero_mpi_rc_, zero_mpi_text_, &zero_mpi_len_);                \
      ZERO_FAIL(#call << " failed: " << std::string(zero_mpi_text_, zero_mpi_len_)); \
    }                                                                                \
  } while (0)
