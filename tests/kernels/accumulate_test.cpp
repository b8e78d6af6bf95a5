// The typed accumulate against the scalar definition: fp32 exactly as the fp32 kernel, 16-bit
// sums computed in fp32 and rounded once.
#include <gtest/gtest.h>

#include <vector>

#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels {
namespace {

TEST(TypedAccumulate, SixteenBitSumsRoundOnce) {
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{70001}}) {
      std::vector<uint16_t> dst(n), src(n), expected(n);
      for (size_t i = 0; i < n; ++i) {
        store_from_float(dst.data(), dtype, i, 0.37f * static_cast<float>(i % 101) - 9.0f);
        store_from_float(src.data(), dtype, i, 1.0f / static_cast<float>(1 + i % 13));
        store_from_float(expected.data(), dtype, i,
                         load_as_float(dst.data(), dtype, i) + load_as_float(src.data(), dtype, i));
      }
      accumulate(dst.data(), src.data(), dtype, n, KernelOptions{2});
      EXPECT_EQ(dst, expected) << dtype_name(dtype) << " n=" << n;
    }
  }
}

TEST(TypedAccumulate, Fp32MatchesTheFp32Kernel) {
  std::vector<float> a(1001), b(1001);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.1f * static_cast<float>(i);
    b[i] = 3.0f - 0.01f * static_cast<float>(i);
  }
  std::vector<float> typed = a;
  accumulate(a.data(), b.data(), a.size());
  accumulate(typed.data(), b.data(), DType::kFloat32, typed.size());
  EXPECT_EQ(a, typed);
}

}  // namespace
}  // namespace zero::kernels
