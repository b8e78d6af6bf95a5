// Shared by the kernel tests: a fixture that runs each test on the AVX-512, the AVX2 and the
// scalar path at 1 and 2 threads, buffers placed at unaligned starts with guard bytes on both
// sides, and deterministic random data.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "zero/core/dtype.h"
#include "zero/kernels/cpu_features.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels::testing {

enum class Path { kAvx512, kAvx2, kScalar };
inline const std::vector<Path> kAllPaths = {Path::kAvx512, Path::kAvx2, Path::kScalar};

inline KernelIsa isa_of(Path path) {
  switch (path) {
    case Path::kAvx512:
      return KernelIsa::kAvx512;
    case Path::kAvx2:
      return KernelIsa::kAvx2;
    case Path::kScalar:
      break;
  }
  return KernelIsa::kScalar;
}

inline std::string path_name(Path path) {
  return kernel_isa_name(isa_of(path));
}

// Runs `path`'s bodies from now on; false (and the choice unchanged) when this CPU or the
// environment (ZERO_KERNELS_ISA, ZERO_KERNELS_SCALAR) leaves no such path.
inline bool use_path(Path path) {
  return force_kernel_isa_for_testing(isa_of(path));
}

// Odd sizes exercise the vector tails; 140003 spans three sum_squares blocks and is large
// enough for two threads to split it (32768 elements per thread at least).
inline const std::vector<size_t> kSizes = {0, 1, 7, 8, 15, 17, 1000, 4099, 140003};
// Element offsets from a 64-byte aligned start, so loads and stores are unaligned.
inline const std::vector<size_t> kOffsets = {0, 1, 2, 3};
inline const std::vector<DType> kDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// Parameter: which path, how many threads.
class KernelPathTest : public ::testing::TestWithParam<std::tuple<Path, int>> {
 protected:
  void SetUp() override {
    reset_kernel_isa_for_testing();
    if (!use_path(path())) {
      GTEST_SKIP() << "this CPU (or ZERO_KERNELS_ISA / ZERO_KERNELS_SCALAR) leaves no "
                   << path_name(path()) << " path to test";
    }
  }
  void TearDown() override { reset_kernel_isa_for_testing(); }

  Path path() const { return std::get<0>(GetParam()); }
  KernelOptions options() const {
    KernelOptions opt;
    opt.threads = std::get<1>(GetParam());
    return opt;
  }
};

inline std::string path_param_name(const ::testing::TestParamInfo<std::tuple<Path, int>>& info) {
  return path_name(std::get<0>(info.param)) + "_" + std::to_string(std::get<1>(info.param)) +
         "threads";
}

#define ZERO_INSTANTIATE_PATHS(fixture)                                            \
  INSTANTIATE_TEST_SUITE_P(                                                        \
      Paths, fixture,                                                              \
      ::testing::Combine(::testing::ValuesIn(::zero::kernels::testing::kAllPaths), \
                         ::testing::Values(1, 2)),                                 \
      ::zero::kernels::testing::path_param_name)

// n elements of a dtype starting `offset` elements after a 64-byte boundary, with guard bytes
// before and after that a kernel must never touch. A copy keeps the values and guards but not
// the alignment (tests use copies as reference results).
class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 64;
  static constexpr unsigned char kGuardByte = 0xA5;

  GuardedBuffer(DType dtype, size_t n, size_t offset)
      : dtype_(dtype), n_(n), start_(kGuardBytes + offset * dtype_size(dtype)) {
    storage_.assign(start_ + n * dtype_size(dtype) + kGuardBytes + 64, kGuardByte);
    // Move the start onto a 64-byte boundary of the real address, then apply the offset.
    size_t misalignment = reinterpret_cast<uintptr_t>(storage_.data()) % 64;
    start_ += (64 - misalignment) % 64;
  }

  DType dtype() const { return dtype_; }
  size_t size() const { return n_; }
  void* data() { return storage_.data() + start_; }
  const void* data() const { return storage_.data() + start_; }
  float* floats() { return static_cast<float*>(data()); }
  size_t bytes() const { return n_ * dtype_size(dtype_); }

  float get(size_t i) const { return load_as_float(data(), dtype_, i); }
  void set(size_t i, float value) { store_from_float(data(), dtype_, i, value); }
  uint32_t bits(size_t i) const {
    if (dtype_ == DType::kFloat32) return float_bits(static_cast<const float*>(data())[i]);
    return static_cast<const uint16_t*>(data())[i];
  }

  // True when no byte outside [data(), data() + bytes()) has changed.
  bool guards_intact() const {
    for (size_t b = 0; b < storage_.size(); ++b) {
      bool inside = b >= start_ && b < start_ + bytes();
      if (!inside && storage_[b] != kGuardByte) return false;
    }
    return true;
  }

 private:
  DType dtype_;
  size_t n_;
  size_t start_;
  std::vector<unsigned char> storage_;
};

// Index of the first element whose bits differ, or n when all match. NaNs of any payload
// compare equal when nan_payloads_may_differ is set.
inline size_t first_difference(const GuardedBuffer& a, const GuardedBuffer& b,
                               bool nan_payloads_may_differ = false) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a.bits(i) == b.bits(i)) continue;
    if (nan_payloads_may_differ && std::isnan(a.get(i)) && std::isnan(b.get(i))) continue;
    return i;
  }
  return a.size();
}

// Deterministic values spread uniformly over [-spread, spread] (or [0, spread]), rounded to the
// buffer's dtype.
inline void fill_uniform(GuardedBuffer& buffer, std::mt19937& rng, float spread,
                         bool non_negative = false) {
  std::uniform_real_distribution<float> uniform(non_negative ? 0.0f : -spread, spread);
  for (size_t i = 0; i < buffer.size(); ++i) buffer.set(i, uniform(rng));
}

// Uniformly random bit patterns: every exponent, NaN, infinity and subnormal shows up.
inline void fill_random_bits(GuardedBuffer& buffer, std::mt19937& rng) {
  for (size_t i = 0; i < buffer.size(); ++i) {
    uint32_t bits = rng();
    if (buffer.dtype() == DType::kFloat32) {
      static_cast<float*>(buffer.data())[i] = bits_float(bits);
    } else {
      static_cast<uint16_t*>(buffer.data())[i] = static_cast<uint16_t>(bits);
    }
  }
}

inline void copy_values(const GuardedBuffer& from, GuardedBuffer& to) {
  std::memcpy(to.data(), from.data(), from.bytes());
}

}  // namespace zero::kernels::testing
