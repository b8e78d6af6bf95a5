// Element types the runtime stores and communicates, and their scalar conversions.
// The conversions are __host__ __device__ so CPU loops, CUDA kernels and test references
// share one definition of rounding (round to nearest even, as PyTorch does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#if defined(__CUDACC__)
#define ZERO_HD __host__ __device__ __forceinline__
#else
#define ZERO_HD inline
#endif

namespace zero {

enum class DType : uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

inline size_t dtype_size(DType t) {
  return t == DType::kFloat32 ? 4 : 2;
}

// The names of each dtype, one row per dtype: the short name used in configs, flags and
// metrics (dtype_name), the longer ones parse_dtype also takes (bf16 has no alias: its long
// name stands twice), and the safetensors format's.
struct DTypeNames {
  DType type;
  const char* name;
  const char* long_name;
  const char* alias;
  const char* safetensors;
};
inline constexpr DTypeNames kDTypeNames[] = {
    {DType::kFloat32, "fp32", "float32", "float", "F32"},
    {DType::kBFloat16, "bf16", "bfloat16", "bfloat16", "BF16"},
    {DType::kFloat16, "fp16", "float16", "half", "F16"},
};

inline const DTypeNames* dtype_names(DType t) {
  for (const DTypeNames& n : kDTypeNames) {
    if (n.type == t) return &n;
  }
  return nullptr;
}

// Short names: fp32, bf16, fp16.
inline const char* dtype_name(DType t) {
  const DTypeNames* n = dtype_names(t);
  return n ? n->name : "?";
}

// The safetensors format's names: F32, BF16, F16.
inline const char* safetensors_dtype_name(DType t) {
  const DTypeNames* n = dtype_names(t);
  return n ? n->safetensors : "?";
}

// Parses fp32/bf16/fp16 (and float32/bfloat16/float16, float, half); returns false on anything
// else. With short_only, only the short names dtype_name gives, as configs spell them.
inline bool parse_dtype(const std::string& s, DType* out, bool short_only = false) {
  for (const DTypeNames& n : kDTypeNames) {
    if (s == n.name || (!short_only && (s == n.long_name || s == n.alias))) {
      *out = n.type;
      return true;
    }
  }
  return false;
}

// Parses F32, BF16 or F16 (exactly); returns false on anything else.
inline bool parse_safetensors_dtype(const std::string& s, DType* out) {
  for (const DTypeNames& n : kDTypeNames) {
    if (s == n.safetensors) {
      *out = n.type;
      return true;
    }
  }
  return false;
}

ZERO_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

ZERO_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet bit forced so rounding cannot
// turn a NaN whose payload lives in the low bits into infinity).
ZERO_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

ZERO_HD float bf16_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// fp32 -> IEEE fp16, round to nearest even, with subnormals, overflow to infinity and NaN.
ZERO_HD uint16_t float_to_fp16(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): shift the full significand into place, round to even.
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 113 - exp + 13
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t out = mant >> shift;
    if (rest > half || (rest == half && (out & 1u))) out += 1u;
    return static_cast<uint16_t>(sign | out);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  uint32_t rebased = abs - 0x38000000u;
  uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
}

ZERO_HD float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value is mant * 2^-24, exact in fp32.
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Reads element i of a buffer of the given dtype as float.
ZERO_HD float load_as_float(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kFloat16:
      return fp16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

// Writes float v as element i of a buffer of the given dtype, rounding to nearest even.
ZERO_HD void store_from_float(void* data, DType t, size_t i, float v) {
  switch (t) {
    case DType::kFloat32:
      static_cast<float*>(data)[i] = v;
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(data)[i] = float_to_bf16(v);
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(data)[i] = float_to_fp16(v);
      break;
  }
}

}  // namespace zero
