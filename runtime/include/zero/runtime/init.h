// Parameter initialization that does not depend on the world size: every element's value is a
// pure function of (seed, parameter index, element index), computed by a counter-based
// generator, so a rank can fill just the slice it owns and the full model is the same at any N.
#pragma once

#include <cstdint>

namespace zero {

enum class InitKind { kZeros, kOnes, kUniform };

struct ParamInit {
  InitKind kind = InitKind::kUniform;
  float scale = 0.02f;  // kUniform: values in [-scale, scale)
};

// SplitMix64's finalizer: a bijective mix with good avalanche, enough for initialization.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from a 64-bit key: the top 24 bits, exactly representable in fp32.
inline float uniform_from_key(uint64_t key) {
  return static_cast<float>(mix64(key) >> 40) * (1.0f / 16777216.0f);
}

inline float init_value(uint64_t seed, uint64_t param_index, uint64_t element,
                        const ParamInit& init) {
  switch (init.kind) {
    case InitKind::kZeros:
      return 0.0f;
    case InitKind::kOnes:
      return 1.0f;
    case InitKind::kUniform: {
      uint64_t key = mix64(mix64(seed) ^ (param_index * 0x632be59bd9b4e019ull)) ^ element;
      return (2.0f * uniform_from_key(key) - 1.0f) * init.scale;
    }
  }
  return 0.0f;
}

}  // namespace zero
