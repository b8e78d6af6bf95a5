// What the Communicator backends share beyond the interface: the MPI error check, the timeout
// from the environment, the ring byte counts and the buffer checks, so that the NCCL backend
// validates, counts and times out exactly as the MPI backend does. (mpi_communicator.cpp still
// carries its own copies of these; it can include this header instead.)
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "zero/collectives/communicator.h"
#include "zero/kernels/check.h"

// ZERO_MPI_CHECK(MPI_Xxx(...)): throws zero::Error naming the call, MPI's error text, file, line.
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

namespace zero::backend {

constexpr std::chrono::milliseconds kDefaultTimeout{300 * 1000};
// Longer timeouts are cut to this (about 31 years), so deadlines never overflow the clock.
constexpr std::chrono::milliseconds kLongestTimeout{1000LL * 1000 * 1000 * 1000};

// ZERO_COLLECTIVE_TIMEOUT_S (seconds, may be fractional) when set, else 300 s.
inline std::chrono::milliseconds timeout_from_environment() {
  const char* text = std::getenv("ZERO_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return kDefaultTimeout;
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  ZERO_CHECK(
      end != text && *end == '\0' && errno == 0 && std::isfinite(seconds) && seconds > 0,
      "ZERO_COLLECTIVE_TIMEOUT_S must be a positive number of seconds, got '" << text << "'");
  const double ms = std::min(seconds * 1000.0, static_cast<double>(kLongestTimeout.count()));
  return std::max(std::chrono::milliseconds(1), std::chrono::milliseconds(std::llround(ms)));
}

// ZERO_DEBUG is a comma-separated list of debug modes; "collectives" turns the desync check on.
inline bool desync_check_from_environment() {
  const char* text = std::getenv("ZERO_DEBUG");
  if (text == nullptr) return false;
  const std::string modes(text);
  for (size_t begin = 0; begin <= modes.size();) {
    size_t end = modes.find(',', begin);
    if (end == std::string::npos) end = modes.size();
    if (modes.compare(begin, end - begin, "collectives") == 0) return true;
    begin = end + 1;
  }
  return false;
}

// Ring-algorithm bytes a rank sends for a buffer of S bytes over n ranks (see CommCounters).
inline uint64_t bytes_sent(CollectiveOp op, uint64_t buffer_bytes, int ranks) {
  const auto n = static_cast<uint64_t>(ranks);
  switch (op) {
    case CollectiveOp::kAllReduce:
      return buffer_bytes * 2 * (n - 1) / n;
    case CollectiveOp::kAllGather:
    case CollectiveOp::kReduceScatter:
      return buffer_bytes * (n - 1) / n;
    case CollectiveOp::kBroadcast:
      return buffer_bytes;
    case CollectiveOp::kBarrier:
      return 0;
  }
  return 0;
}

// True when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

inline const char* bytes_at(const void* p, size_t offset) {
  return static_cast<const char*>(p) + offset;
}

inline void check_size(size_t count, size_t elem, int ranks, const char* op) {
  ZERO_CHECK(count <= SIZE_MAX / elem / static_cast<size_t>(ranks),
             op << ": count " << count << " times " << ranks << " ranks overflows size_t");
}

inline void check_buffers(const void* send, const void* recv, size_t count, const char* op) {
  ZERO_CHECK(count == 0 || (send != nullptr && recv != nullptr),
             op << ": null buffer with count " << count);
}

}  // namespace zero::backend
