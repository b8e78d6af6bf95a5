// Inputs of the collective tests chosen so that the order of the additions shows: ranks
// contribute values of very different magnitudes and signs, so adding them in any other order
// than the one a path promises changes the bits.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/core/dtype.h"

namespace zero::testing {

// Rank r's element i, before rounding to the dtype: a fraction in [0.5, 1.5) times a scale that
// cycles through large, tiny, negative large and small over the ranks: even 16-bit inputs then
// span more bits than fp32 holds, so their sums round differently in another order.
inline float value(int rank, size_t i) {
  const float scales[] = {3.0e4f, 3.0e-3f, -2.9e4f, 1.0f};
  const uint64_t hash = (i * 2654435761u + static_cast<uint64_t>(rank) * 40503u) % 1000003u;
  return scales[rank % 4] * (0.5f + static_cast<float>(hash) / 1000003.0f);
}

using Bytes = std::vector<unsigned char>;

// n elements of value(rank, first + i) rounded to dtype.
inline Bytes contribution(int rank, size_t first, size_t n, DType dtype) {
  Bytes out(n * dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) store_from_float(out.data(), dtype, i, value(rank, first + i));
  return out;
}

// A reduce-scatter on `comm` of this rank's contribution of count x ranks elements gives
// `expected` (this rank's block of the sum) bit for bit, out of place and in place (the block
// left at the rank's own place). Returns the out-of-place result.
inline Bytes expect_exact_reduce_scatter(Communicator& comm, size_t count, DType dtype,
                                         const Bytes& expected) {
  const int rank = comm.rank();
  const size_t elem = dtype_size(dtype);
  const Bytes send = contribution(rank, 0, count * comm.world_size(), dtype);
  Bytes recv(count * elem), in_place = send;
  comm.reduce_scatter_sync(send.data(), recv.data(), count, dtype);
  EXPECT_TRUE(recv == expected) << "count " << count;
  comm.reduce_scatter_sync(in_place.data(), in_place.data() + rank * count * elem, count, dtype);
  EXPECT_EQ(0, std::memcmp(in_place.data() + rank * count * elem, expected.data(), expected.size()))
      << "in place, count " << count;
  return recv;
}

// An all-reduce on `comm` of this rank's contribution of `count` elements gives `expected` bit
// for bit, out of place and in place. Returns the out-of-place result.
inline Bytes expect_exact_all_reduce(Communicator& comm, size_t count, DType dtype,
                                     const Bytes& expected) {
  const Bytes send = contribution(comm.rank(), 0, count, dtype);
  Bytes recv(count * dtype_size(dtype)), in_place = send;
  comm.all_reduce_sync(send.data(), recv.data(), count, dtype);
  EXPECT_TRUE(recv == expected) << "count " << count;
  comm.all_reduce_sync(in_place.data(), in_place.data(), count, dtype);
  EXPECT_TRUE(in_place == expected) << "in place, count " << count;
  return recv;
}

// An all-gather of `count` elements per rank on `comm`, out of place and in place (this rank's
// part already where it lands), gives every rank's contribution in rank order, bit for bit.
// Returns that expected result.
inline Bytes expect_exact_all_gather(Communicator& comm, size_t count, DType dtype) {
  const int n = comm.world_size();
  const int rank = comm.rank();
  const size_t elem = dtype_size(dtype);
  Bytes expected;
  for (int r = 0; r < n; ++r) {
    const Bytes part = contribution(r, 0, count, dtype);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  const Bytes send = contribution(rank, 0, count, dtype);
  Bytes recv(count * n * elem), in_place(count * n * elem, 0xab);
  comm.all_gather_sync(send.data(), recv.data(), count, dtype);
  EXPECT_TRUE(recv == expected) << "count " << count;
  std::memcpy(in_place.data() + rank * count * elem, send.data(), send.size());
  comm.all_gather_sync(in_place.data() + rank * count * elem, in_place.data(), count, dtype);
  EXPECT_TRUE(in_place == expected) << "in place, count " << count;
  return expected;
}

}  // namespace zero::testing
