// What the MPI communicator's tests send and check: each rank's contribution and a host buffer
// of any dtype. Inputs are small integers, so every sum is exact in fp32, bf16 and fp16 whatever
// the order of reduction, and the expected result is known exactly.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "zero/core/dtype.h"

namespace zero::comm_test {

// Element i of rank r's contribution: an integer in [-4, 4].
inline float value(int rank, size_t i) {
  return static_cast<float>((rank * 5 + i * 3) % 9) - 4.0f;
}

// A host buffer of `n` elements of one dtype, read and written as float through dtype.h.
class Buffer {
 public:
  Buffer(DType dtype, size_t n) : dtype_(dtype), bytes_(n * dtype_size(dtype)) {}
  void* data() { return bytes_.empty() ? nullptr : bytes_.data(); }
  void* at(size_t i) { return bytes_.data() + i * dtype_size(dtype_); }
  float get(size_t i) const { return load_as_float(bytes_.data(), dtype_, i); }
  void set(size_t i, float v) { store_from_float(bytes_.data(), dtype_, i, v); }

 private:
  DType dtype_;
  std::vector<unsigned char> bytes_;
};

// Compares n elements against expected(i); reports how many differ and the first one.
template <typename Expected>
::testing::AssertionResult matches(const Buffer& got, size_t n, Expected expected) {
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got.get(i) != expected(i)) {
      if (wrong == 0) first = i;
      ++wrong;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong << " of " << n << " elements wrong; first at " << first << ": got "
         << got.get(first) << ", expected " << expected(first);
}

}  // namespace zero::comm_test
