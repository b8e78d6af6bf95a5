// Blockwise int8 quantization (ZeRO++'s wire format) against a reference quantizer written
// plainly here, on DeepSpeed's own test grid: group counts {1, 13, 512}, group sizes from 8 to
// 16384 elements, and all zeros. The L1 error of a round trip must stay within 1.05x the
// reference's and every output must be finite; each path and thread count gives the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/kernels/kernel_test_util.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels::testing {
namespace {

const std::vector<size_t> kGroupCounts = {1, 13, 512};
const std::vector<size_t> kGroupSizes = {8, 16, 32, 64, 128, 256, 4096, 8192, 12288, 16384};

// Per group: scale = max|x| / 127; q = x / scale rounded and clamped; x' = q * scale, in double.
std::vector<double> reference_round_trip(const std::vector<float>& x, size_t group) {
  std::vector<double> out(x.size(), 0.0);
  for (size_t begin = 0; begin < x.size(); begin += group) {
    const size_t end = std::min(x.size(), begin + group);
    double absmax = 0.0;
    for (size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(double{x[i]}));
    if (absmax == 0.0) continue;
    const double scale = absmax / 127.0;
    for (size_t i = begin; i < end; ++i) {
      const double q = std::clamp(std::nearbyint(x[i] / scale), -127.0, 127.0);
      out[i] = q * scale;
    }
  }
  return out;
}

double l1_error(const std::vector<float>& x, const std::vector<double>& back) {
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) sum += std::fabs(back[i] - x[i]);
  return sum;
}

struct RoundTrip {
  std::vector<int8_t> values;
  std::vector<float> scales;
  std::vector<float> back;
};

RoundTrip round_trip(const std::vector<float>& x, size_t block, const KernelOptions& opt) {
  RoundTrip r;
  r.values.assign(x.size(), 0);
  r.scales.assign((x.size() + block - 1) / block, -1.0f);
  r.back.assign(x.size(), -1.0f);
  quantize_int8(x.data(), DType::kFloat32, x.size(), block, r.values.data(), r.scales.data(), opt);
  dequantize_int8(r.values.data(), r.scales.data(), x.size(), block, r.back.data(), DType::kFloat32,
                  opt);
  return r;
}

using QuantizeTest = KernelPathTest;

TEST_P(QuantizeTest, ErrorWithinDeepSpeedsBoundOfTheReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst_ratio = 0.0;
  for (size_t groups : kGroupCounts) {
    for (size_t group : kGroupSizes) {
      std::vector<float> x(groups * group);
      for (float& v : x) v = normal(rng);
      const RoundTrip r = round_trip(x, group, options());
      std::vector<double> back(r.back.begin(), r.back.end());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(r.back[i])) << groups << " x " << group << ", element " << i;
      }
      const double ours = l1_error(x, back);
      const double reference = l1_error(x, reference_round_trip(x, group));
      EXPECT_LE(ours, 1.05 * reference) << groups << " groups of " << group;
      worst_ratio = std::max(worst_ratio, ours / reference);
    }
  }
  RecordProperty("worst_l1_ratio", std::to_string(worst_ratio));
}

TEST_P(QuantizeTest, ZerosStayZerosWithScaleZero) {
  for (size_t n : {size_t{8}, size_t{4096}, size_t{70001}}) {
    const std::vector<float> x(n, 0.0f);
    const RoundTrip r = round_trip(x, 4096, options());
    for (float s : r.scales) EXPECT_EQ(s, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(r.values[i], 0) << "element " << i;
      ASSERT_EQ(float_bits(r.back[i]), 0u) << "element " << i;
    }
  }
}

// The block's largest magnitude comes back exactly as itself (q = +-127, scale = max / 127);
// a tie rounds to even; a last block shorter than the others has its own scale.
TEST_P(QuantizeTest, ExtremesTiesAndShortLastBlock) {
  const std::vector<float> x = {127.0f, -127.0f, 0.5f, 1.5f, 2.5f, -0.5f, 3.0f};
  const RoundTrip r = round_trip(x, 6, options());
  ASSERT_EQ(r.scales.size(), 2u);
  EXPECT_EQ(r.scales[0], 1.0f);
  EXPECT_EQ(r.values, (std::vector<int8_t>{127, -127, 0, 2, 2, 0, 127}));
  EXPECT_EQ(r.scales[1], 3.0f / 127.0f);
  EXPECT_EQ(r.back[0], 127.0f);
  EXPECT_EQ(r.back[1], -127.0f);
}

// Into a 16-bit working dtype, each value is the fp32 round trip rounded once to it; from one,
// the same as from its fp32 values.
TEST_P(QuantizeTest, SixteenBitDtypesRoundOnce) {
  std::mt19937 rng(5);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const size_t n = 10000;
    GuardedBuffer source(dtype, n, 1);
    fill_uniform(source, rng, 3.0f);
    std::vector<float> as_float(n);
    for (size_t i = 0; i < n; ++i) as_float[i] = source.get(i);
    std::vector<int8_t> values(n);
    std::vector<float> scales((n + 4095) / 4096);
    quantize_int8(source.data(), dtype, n, 4096, values.data(), scales.data(), options());
    const RoundTrip expected = round_trip(as_float, 4096, options());
    EXPECT_EQ(values, expected.values) << dtype_name(dtype);
    EXPECT_EQ(scales, expected.scales) << dtype_name(dtype);
    GuardedBuffer back(dtype, n, 3);
    dequantize_int8(values.data(), scales.data(), n, 4096, back.data(), dtype, options());
    for (size_t i = 0; i < n; ++i) {
      GuardedBuffer one(dtype, 1, 0);
      one.set(0, expected.back[i]);
      ASSERT_EQ(back.bits(i), one.bits(0)) << dtype_name(dtype) << ", element " << i;
    }
    EXPECT_TRUE(back.guards_intact()) << dtype_name(dtype);
  }
}

// Every path and thread count gives the scalar single-thread bits (threads take whole blocks).
TEST_P(QuantizeTest, SameBitsAsTheScalarPathOnOneThread) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(140003);
  for (float& v : x) v = normal(rng);
  const RoundTrip here = round_trip(x, 4096, options());
  force_scalar_for_testing(true);
  const RoundTrip scalar = round_trip(x, 4096, KernelOptions{});
  force_scalar_for_testing(false);
  EXPECT_EQ(here.values, scalar.values);
  EXPECT_EQ(here.scales, scalar.scales);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(float_bits(here.back[i]), float_bits(scalar.back[i])) << "element " << i;
  }
}

// The same in every dtype, over every bit pattern (NaN and infinity among them, whose blocks
// must come out alike on every path too), with short last blocks and vector tails.
TEST_P(QuantizeTest, SameBitsAsTheScalarPathForEveryDtypeAndBitPattern) {
  std::mt19937 rng(8);
  for (DType dtype : kDTypes) {
    for (bool random_bits : {false, true}) {
      const size_t n = 3 * 4096 + 1003;
      GuardedBuffer source(dtype, n, 1);
      if (random_bits) {
        fill_random_bits(source, rng);
      } else {
        fill_uniform(source, rng, 5.0f);
      }
      const auto run = [&](const KernelOptions& opt) {
        std::pair<std::vector<int8_t>, std::vector<float>> q{std::vector<int8_t>(n),
                                                             std::vector<float>(4)};
        quantize_int8(source.data(), dtype, n, 4096, q.first.data(), q.second.data(), opt);
        return q;
      };
      const auto here = run(options());
      GuardedBuffer back(dtype, n, 2);
      dequantize_int8(here.first.data(), here.second.data(), n, 4096, back.data(), dtype,
                      options());
      force_scalar_for_testing(true);
      const auto scalar = run(KernelOptions{});
      GuardedBuffer scalar_back(dtype, n, 2);
      dequantize_int8(scalar.first.data(), scalar.second.data(), n, 4096, scalar_back.data(),
                      dtype);
      force_scalar_for_testing(false);
      const std::string what =
          std::string(dtype_name(dtype)) + (random_bits ? ", random bits" : ", uniform");
      EXPECT_EQ(here.first, scalar.first) << what;
      for (size_t b = 0; b < 4; ++b) {
        EXPECT_EQ(float_bits(here.second[b]), float_bits(scalar.second[b]))
            << what << ", block " << b;
      }
      EXPECT_EQ(first_difference(back, scalar_back), n) << what;
      EXPECT_TRUE(back.guards_intact()) << what;
    }
  }
}

ZERO_INSTANTIATE_PATHS(QuantizeTest);

}  // namespace
}  // namespace zero::kernels::testing
