// Blockwise symmetric int8 quantization (ZeRO++'s wire format), defined once: the CPU loops
// and the CUDA kernels call these functions, so every path returns the same bits.
//
// A block of elements is sent as one fp32 scale = max|x| / 127 and one int8 per element,
// q = x * (127 / max|x|) clamped to [-127, 127] and rounded to nearest even; it comes back as
// q * scale. A block of zeros has scale 0 and all-zero values (never 0/0).
#pragma once

#include <cmath>
#include <cstdint>

#include "zero/core/dtype.h"

namespace zero {

constexpr float kInt8Levels = 127.0f;

// A block's running max|x| with one more element; a NaN element leaves it as it was.
ZERO_HD float int8_absmax_step(float absmax, float x) {
  const float magnitude = fabsf(x);
  return magnitude > absmax ? magnitude : absmax;
}

// What a block's q is multiplied by to come back: max|x| / 127.
ZERO_HD float int8_scale(float absmax) {
  return absmax / kInt8Levels;
}

// What a block's elements are multiplied by before rounding: 127 / max|x|, or 0 for a block of
// zeros.
ZERO_HD float int8_inverse_scale(float absmax) {
  return absmax > 0.0f ? kInt8Levels / absmax : 0.0f;
}

// One element: clamped first (a product a rounding step above 127 stays in range; a NaN
// becomes -127, as fmaxf(NaN, -127) is), then rounded to nearest even.
ZERO_HD int8_t int8_quantize(float x, float inverse_scale) {
  const float clamped = fminf(fmaxf(x * inverse_scale, -kInt8Levels), kInt8Levels);
  return static_cast<int8_t>(static_cast<int>(rintf(clamped)));
}

ZERO_HD float int8_dequantize(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

// Blocks of `block` elements over n elements: the last one may be shorter.
ZERO_HD size_t int8_block_count(size_t n, size_t block) {
  return (n + block - 1) / block;
}

}  // namespace zero
