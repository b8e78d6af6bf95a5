// Sizes that multiply (elements x bytes x ranks x layers) are counted in 64 bits: a product or
// sum past 2^64 is an error naming what was being counted, never the value modulo 2^64.
#pragma once

#include <cstdint>

#include "zero/core/check.h"

namespace zero {

inline uint64_t size_product(uint64_t a, uint64_t b, const char* what) {
  uint64_t result = 0;
  ZERO_CHECK(!__builtin_mul_overflow(a, b, &result),
             "too large to count in 64 bits: " << what << " (" << a << " x " << b << ")");
  return result;
}

inline uint64_t size_sum(uint64_t a, uint64_t b, const char* what) {
  uint64_t result = 0;
  ZERO_CHECK(!__builtin_add_overflow(a, b, &result),
             "too large to count in 64 bits: " << what << " (" << a << " + " << b << ")");
  return result;
}

}  // namespace zero
