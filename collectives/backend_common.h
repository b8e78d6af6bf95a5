// What the Communicator backends share beyond the interface (with ZERO_MPI_CHECK): the timeout
// from the environment, the ring byte counts and the buffer checks, so that the MPI and NCCL
// backends validate, count and time out from one definition.
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
#include "zero/collectives/mpi_check.h"
#include "zero/kernels/check.h"

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

// ZERO_DEBUG is a comma-separated list of debug modes; "collectives" turns the desync check
// on. Other words belong to other parts of the runtime and are left to them.
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

// The address `offset` bytes past p, keeping p's constness.
inline const char* bytes_at(const void* p, size_t offset) {
  return static_cast<const char*>(p) + offset;
}
inline char* bytes_at(void* p, size_t offset) {
  return static_cast<char*>(p) + offset;
}

inline void check_size(size_t count, size_t elem, int ranks, const char* op) {
  ZERO_CHECK(count <= SIZE_MAX / elem / static_cast<size_t>(ranks),
             op << ": count " << count << " times " << ranks << " ranks overflows size_t");
}

inline void check_buffers(const void* send, const void* recv, size_t count, const char* op) {
  ZERO_CHECK(count == 0 || (send != nullptr && recv != nullptr),
             op << ": null buffer with count " << count);
}

// The argument checks of each collective, one definition for every backend so that bad input
// gets the same message whichever runs it. Each returns whether the call is in place.

inline bool check_all_gather(const void* send, const void* recv, size_t count, DType dtype,
                             int rank, int ranks) {
  const size_t elem = dtype_size(dtype);
  check_size(count, elem, ranks, "all_gather");
  check_buffers(send, recv, count, "all_gather");
  const size_t block_bytes = count * elem;
  const bool in_place = send == bytes_at(recv, rank * block_bytes);
  ZERO_CHECK(in_place || !overlap(send, block_bytes, recv, block_bytes * ranks),
             "all_gather: send overlaps recv; the only overlap allowed is send == recv + rank * "
             "count (in place)");
  return in_place;
}

inline bool check_reduce_scatter(const void* send, const void* recv, size_t count, DType dtype,
                                 int rank, int ranks) {
  const size_t elem = dtype_size(dtype);
  check_size(count, elem, ranks, "reduce_scatter");
  check_buffers(send, recv, count, "reduce_scatter");
  const size_t block_bytes = count * elem;
  const bool in_place = recv == bytes_at(send, rank * block_bytes);
  ZERO_CHECK(in_place || !overlap(send, block_bytes * ranks, recv, block_bytes),
             "reduce_scatter: recv overlaps send; the only overlap allowed is recv == send + "
             "rank * count (in place)");
  return in_place;
}

inline bool check_all_reduce(const void* send, const void* recv, size_t count, DType dtype,
                             int ranks) {
  const size_t elem = dtype_size(dtype);
  check_size(count, elem, ranks, "all_reduce");
  check_buffers(send, recv, count, "all_reduce");
  const bool in_place = send == recv;
  ZERO_CHECK(
      in_place || !overlap(send, count * elem, recv, count * elem),
      "all_reduce: send and recv partially overlap; they must be disjoint or equal (in place)");
  return in_place;
}

inline void check_broadcast(const void* buffer, size_t count, DType dtype, int root, int ranks) {
  check_size(count, dtype_size(dtype), ranks, "broadcast");
  check_buffers(buffer, buffer, count, "broadcast");
  ZERO_CHECK(root >= 0 && root < ranks, "broadcast: root "
                                            << root << " is not a rank of this communicator (0 to "
                                            << ranks - 1 << ")");
}

}  // namespace zero::backend
