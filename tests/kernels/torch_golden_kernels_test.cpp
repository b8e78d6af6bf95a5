// The kernels against PyTorch (tests/data/torch_golden.json): the vectorized casts bit for bit
// at several unaligned starts, and fused_adamw / fused_sgd replaying torch.optim's steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/kernels/optimizer_math.h"

namespace zero::kernels::testing {
namespace {

using nlohmann::json;

// PyTorch orders the arithmetic slightly differently (it divides by sqrt(1 - beta2^t) where we
// multiply by its inverse), so agreement is to a few ulps, not bitwise.
constexpr double kRelTolerance = 1e-6;
constexpr double kAbsFloor = 1e-9;

const json& golden() {
  static const json data = [] {
    const std::string path = std::string(ZERO_SOURCE_DIR) + "/tests/data/torch_golden.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    return json::parse(in);
  }();
  return data;
}

std::vector<uint32_t> hex_bits(const json& values) {
  std::vector<uint32_t> out;
  for (const json& v : values) {
    out.push_back(static_cast<uint32_t>(std::stoul(v.get<std::string>(), nullptr, 16)));
  }
  return out;
}

std::vector<float> hex_floats(const json& values) {
  std::vector<float> out;
  for (uint32_t bits : hex_bits(values)) out.push_back(bits_float(bits));
  return out;
}

float half_to_float(DType t, uint32_t bits) {
  uint16_t half = static_cast<uint16_t>(bits);
  return t == DType::kBFloat16 ? bf16_to_float(half) : fp16_to_float(half);
}

class TorchGoldenTest : public KernelPathTest {};
ZERO_INSTANTIATE_PATHS(TorchGoldenTest);

// --- Casts ------------------------------------------------------------------------------------

TEST_P(TorchGoldenTest, CastsMatchPyTorchBitwise) {
  const json& casts = golden().at("casts");
  const std::vector<uint32_t> input = hex_bits(casts.at("input_fp32"));
  const std::vector<uint32_t> want_bf16 = hex_bits(casts.at("bf16"));
  const std::vector<uint32_t> want_fp16 = hex_bits(casts.at("fp16"));
  ASSERT_EQ(input.size(), want_bf16.size());
  ASSERT_EQ(input.size(), want_fp16.size());
  const size_t n = input.size();
  for (size_t offset : kOffsets) {
    SCOPED_TRACE(::testing::Message() << "offset=" << offset);
    GuardedBuffer src(DType::kFloat32, n, offset);
    for (size_t i = 0; i < n; ++i) static_cast<float*>(src.data())[i] = bits_float(input[i]);
    for (DType to : {DType::kBFloat16, DType::kFloat16}) {
      const std::vector<uint32_t>& want = to == DType::kBFloat16 ? want_bf16 : want_fp16;
      GuardedBuffer narrow(to, n, 3 - offset);
      cast(src.data(), DType::kFloat32, narrow.data(), to, n, options());
      EXPECT_TRUE(narrow.guards_intact());
      for (size_t i = 0; i < n; ++i) {
        // PyTorch's NaN payloads are not part of the contract; NaN must stay NaN.
        bool both_nan = std::isnan(narrow.get(i)) && std::isnan(half_to_float(to, want[i]));
        if (!both_nan) {
          EXPECT_EQ(narrow.bits(i), want[i]) << dtype_name(to) << " of input " << std::hex
                                             << input[i] << " (element " << std::dec << i << ")";
        }
      }
      // Widening back is exact: PyTorch's half value as a float.
      GuardedBuffer wide(DType::kFloat32, n, offset);
      cast(narrow.data(), to, wide.data(), DType::kFloat32, n, options());
      for (size_t i = 0; i < n; ++i) {
        float half_value = half_to_float(to, want[i]);
        if (std::isnan(half_value)) {
          EXPECT_TRUE(std::isnan(wide.get(i))) << "element " << i;
        } else {
          EXPECT_EQ(wide.bits(i), float_bits(half_value)) << dtype_name(to) << " element " << i;
        }
      }
    }
  }
}

// --- Optimizers -------------------------------------------------------------------------------

// |got - want| <= 1e-6 * scale + 1e-9, where scale is |want| or, for a sum whose terms may
// cancel, the sum of the terms' magnitudes: a correctly rounded sum is only accurate to an ulp
// of its terms. This matters for exp_avg: PyTorch's CPU add_(x, alpha) fuses the multiply-add
// (replaying its steps with an FMA reproduces every exp_avg bit), while the kernels round the
// product and the sum separately, so near cancellation the two differ by more than 1e-6 of
// the small result.
void expect_close(const float* got, const std::vector<float>& want, const char* what, int step,
                  const std::vector<double>& term_magnitudes = {}) {
  for (size_t i = 0; i < want.size(); ++i) {
    double scale = term_magnitudes.empty() ? std::fabs(want[i]) : term_magnitudes[i];
    double tolerance = kRelTolerance * std::max<double>(scale, std::fabs(want[i])) + kAbsFloor;
    EXPECT_NEAR(got[i], want[i], tolerance) << what << " at step " << step << ", element " << i;
  }
}

float hyperparameter(const json& hp, const char* key, float default_value) {
  return hp.contains(key) ? hp.at(key).get<float>() : default_value;
}

// Replays PyTorch's gradients through our kernel, keeping our own state from step to step, and
// compares parameters and state after every step.
TEST_P(TorchGoldenTest, OptimizersMatchPyTorchAtEveryStep) {
  const json& cases = golden().at("optimizers");
  ASSERT_FALSE(cases.empty());
  for (const json& entry : cases) {
    const std::string name = entry.at("optimizer");
    const json& hp = entry.at("hyperparameters");
    const size_t n = entry.at("n");
    SCOPED_TRACE(name + " with n=" + std::to_string(n));
    // The kernels implement PyTorch's defaults for these; a golden case using others would
    // not be a like-for-like comparison.
    ASSERT_EQ(hyperparameter(hp, "dampening", 0.0f), 0.0f) << "dampening is not supported";
    ASSERT_FALSE(hp.contains("nesterov") && hp.at("nesterov").get<bool>()) << "nesterov";
    ASSERT_FALSE(hp.contains("amsgrad") && hp.at("amsgrad").get<bool>()) << "amsgrad";

    GuardedBuffer master(DType::kFloat32, n, 1), first(DType::kFloat32, n, 2),
        second(DType::kFloat32, n, 3), grad(DType::kFloat32, n, 1);
    const std::vector<float> initial = hex_floats(entry.at("initial_params"));
    ASSERT_EQ(initial.size(), n);
    for (size_t i = 0; i < n; ++i) {
      master.set(i, initial[i]);
      first.set(i, 0.0f);
      second.set(i, 0.0f);
    }
    const float lr = hp.at("lr").get<float>();
    const float weight_decay = hyperparameter(hp, "weight_decay", 0.0f);
    // PyTorch's values after the previous step, for the size of the terms of exp_avg.
    std::vector<float> previous_params = initial, previous_exp_avg(n, 0.0f);
    int step = 0;
    for (const json& golden_step : entry.at("steps")) {
      ++step;
      const std::vector<float> g = hex_floats(golden_step.at("grad"));
      ASSERT_EQ(g.size(), n);
      for (size_t i = 0; i < n; ++i) grad.set(i, g[i]);
      if (name == "AdamW" || name == "Adam") {
        const json& betas = hp.at("betas");
        const double beta1 = betas.at(0).get<double>(), beta2 = betas.at(1).get<double>();
        const bool decoupled = name == "AdamW";
        AdamWStepConstants c = adamw_step_constants(lr, beta1, beta2, hp.at("eps").get<float>(),
                                                    weight_decay, step, decoupled);
        fused_adamw(master.floats(), first.floats(), second.floats(), grad.data(), DType::kFloat32,
                    1.0f, nullptr, DType::kFloat32, n, c, options());
        std::vector<double> exp_avg_terms(n);
        for (size_t i = 0; i < n; ++i) {
          double g_used = g[i] + (decoupled ? 0.0 : weight_decay * previous_params[i]);
          exp_avg_terms[i] =
              std::fabs(beta1 * previous_exp_avg[i]) + std::fabs((1 - beta1) * g_used);
        }
        previous_exp_avg = hex_floats(golden_step.at("exp_avg"));
        expect_close(first.floats(), previous_exp_avg, "exp_avg", step, exp_avg_terms);
        expect_close(second.floats(), hex_floats(golden_step.at("exp_avg_sq")), "exp_avg_sq", step);
      } else if (name == "SGD") {
        SgdStepConstants c{lr, hyperparameter(hp, "momentum", 0.0f), weight_decay, step == 1};
        fused_sgd(master.floats(), first.floats(), grad.data(), DType::kFloat32, 1.0f, nullptr,
                  DType::kFloat32, n, c, options());
        if (golden_step.contains("momentum_buffer")) {
          expect_close(first.floats(), hex_floats(golden_step.at("momentum_buffer")),
                       "momentum_buffer", step);
        }
      } else {
        FAIL() << "golden file names an unknown optimizer " << name;
      }
      previous_params = hex_floats(golden_step.at("params"));
      expect_close(master.floats(), previous_params, "params", step);
    }
    EXPECT_GE(step, 3) << "golden case has too few steps to test the bias correction";
  }
}

}  // namespace
}  // namespace zero::kernels::testing
