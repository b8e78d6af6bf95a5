// Optimizer against PyTorch: tests/data/torch_golden.json holds, for AdamW, Adam and SGD, the
// initial parameters and every step's gradient, parameters and state as torch.optim computed
// them. We replay the gradients and compare at every step. Then the properties the engine relies
// on: a shard may be updated in pieces, the working copy is the rounded master, and bad
// hyperparameters or missing arrays are refused with an error that names them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "zero/core/check.h"
#include "zero/core/dtype.h"
#include "zero/optimizer/optimizer.h"

namespace zero {
namespace {

using nlohmann::json;

// Agreement to 1e-6 relative. Relative to what: an update that nearly cancels the old value
// (m = 0.9 * 0.0209 + 0.1 * -0.196 = -0.00085) carries the rounding error of its terms, so the
// scale is the larger of the new value and the old one. PyTorch rounds such sums once (fused
// multiply-add); rounding twice moves the small result by up to 3e-6 of itself. The floor only
// keeps an exact zero from demanding exact equality: the moments are as small as 1e-5, and a
// floor near them would hide percent-level errors.
constexpr double kRelTolerance = 1e-6;
constexpr double kAbsFloor = 1e-12;

json load_golden() {
  const std::string path = std::string(ZERO_SOURCE_DIR) + "/tests/data/torch_golden.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return json::parse(in);
}

std::vector<float> hex_floats(const json& values) {
  std::vector<float> out;
  for (const json& v : values) {
    out.push_back(bits_float(static_cast<uint32_t>(std::stoul(v.get<std::string>(), nullptr, 16))));
  }
  return out;
}

OptimizerConfig config_from_golden(const json& entry) {
  OptimizerConfig config;
  const std::string name = entry.at("optimizer");
  if (name == "AdamW") {
    config.type = OptimizerType::kAdamW;
  } else if (name == "Adam") {
    config.type = OptimizerType::kAdam;
  } else if (name == "SGD") {
    config.type = OptimizerType::kSgd;
  } else {
    throw std::runtime_error("golden file names an unknown optimizer " + name);
  }
  // PyTorch's defaults where the file leaves a field out: no decay, no momentum.
  config.weight_decay = 0.0f;
  config.momentum = 0.0f;
  for (const auto& [key, value] : entry.at("hyperparameters").items()) {
    if (key == "lr") {
      config.lr = value.get<float>();
    } else if (key == "betas") {
      config.beta1 = value.at(0).get<double>();
      config.beta2 = value.at(1).get<double>();
    } else if (key == "eps") {
      config.eps = value.get<float>();
    } else if (key == "weight_decay") {
      config.weight_decay = value.get<float>();
    } else if (key == "momentum") {
      config.momentum = value.get<float>();
    } else {
      // A hyperparameter we do not model (nesterov, amsgrad, ...) would make the replay wrong.
      throw std::runtime_error("golden file has a hyperparameter we do not support: " + key);
    }
  }
  return config;
}

// Every element within tolerance of `expected`, scaled by max(|expected|, |previous|) where
// `previous` (the same array one step earlier) is given. On failure, reports how many are off
// and the worst one rather than one line per element.
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::vector<float>* previous, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  if (previous != nullptr) {
    ASSERT_EQ(previous->size(), expected.size()) << what;
  }
  size_t bad = 0;
  size_t worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    double scale = std::fabs(expected[i]);
    if (previous != nullptr) scale = std::fmax(scale, std::fabs((*previous)[i]));
    const double tolerance = std::fmax(kRelTolerance * scale, kAbsFloor);
    const double error = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (!(error <= tolerance)) ++bad;
    if (!(error / tolerance <= worst_ratio)) {
      worst_ratio = error / tolerance;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << expected.size()
                     << " elements off; worst is element " << worst << ": " << actual[worst]
                     << " vs " << expected[worst] << " (" << worst_ratio << " x the tolerance)";
}

// The state arrays of one shard, owned by the test as the engine would own them.
struct OwnedShard {
  std::vector<float> master;
  std::vector<float> state0;
  std::vector<float> state1;

  explicit OwnedShard(const std::vector<float>& params)
      : master(params), state0(params.size(), 0.0f), state1(params.size(), 0.0f) {}

  // The view of elements [begin, begin + n).
  ShardState view(size_t begin, size_t n) {
    ShardState s;
    s.master = master.data() + begin;
    s.state[0] = state0.data() + begin;
    s.state[1] = state1.data() + begin;
    s.n = n;
    return s;
  }
};

TEST(OptimizerGolden, MatchesTorchAtEveryStep) {
  const json golden = load_golden();
  ASSERT_FALSE(golden.at("optimizers").empty());
  for (const json& entry : golden.at("optimizers")) {
    const OptimizerConfig config = config_from_golden(entry);
    const std::string name = entry.at("optimizer");
    const size_t n = entry.at("n");
    Optimizer optimizer(config);
    OwnedShard shard(hex_floats(entry.at("initial_params")));
    ASSERT_EQ(shard.master.size(), n) << name;

    // The golden arrays one step earlier: the scale of each element's rounding error.
    std::vector<float> previous_params = shard.master;
    std::vector<float> previous_state0(n, 0.0f);
    std::vector<float> previous_state1(n, 0.0f);
    const bool sgd = config.type == OptimizerType::kSgd;
    int step_number = 0;
    for (const json& step : entry.at("steps")) {
      ++step_number;
      const std::string where =
          name + " (n=" + std::to_string(n) + ") step " + std::to_string(step_number);
      const std::vector<float> grad = hex_floats(step.at("grad"));
      ASSERT_EQ(grad.size(), n) << where;
      optimizer.begin_step(config.lr);
      optimizer.apply(shard.view(0, n), grad.data(), DType::kFloat32, 1.0f, nullptr,
                      DType::kFloat32);
      EXPECT_EQ(optimizer.step(), step_number);

      const std::vector<float> params = hex_floats(step.at("params"));
      expect_close(shard.master, params, &previous_params, where + " params");
      previous_params = params;
      const std::vector<float> state0 = hex_floats(step.at(sgd ? "momentum_buffer" : "exp_avg"));
      expect_close(shard.state0, state0, &previous_state0, where + (sgd ? " momentum" : " m"));
      previous_state0 = state0;
      if (!sgd) {
        const std::vector<float> state1 = hex_floats(step.at("exp_avg_sq"));
        expect_close(shard.state1, state1, &previous_state1, where + " v");
        previous_state1 = state1;
      }
    }
  }
}

// A resumed optimizer (fresh object, counter restored with set_step, arrays carried over) must
// continue exactly where the first one stopped: the bias corrections depend on the step.
TEST(OptimizerGolden, ResumeWithSetStepContinuesTorchTrajectory) {
  const json golden = load_golden();
  for (const json& entry : golden.at("optimizers")) {
    const OptimizerConfig config = config_from_golden(entry);
    const std::string name = entry.at("optimizer");
    const size_t n = entry.at("n");
    const json& steps = entry.at("steps");
    ASSERT_GE(steps.size(), 3u) << name;
    OwnedShard shard(hex_floats(entry.at("initial_params")));
    const long resume_after = 2;
    {
      Optimizer before(config);
      for (long i = 0; i < resume_after; ++i) {
        const std::vector<float> grad = hex_floats(steps[i].at("grad"));
        before.begin_step(config.lr);
        before.apply(shard.view(0, n), grad.data(), DType::kFloat32, 1.0f, nullptr,
                     DType::kFloat32);
      }
    }
    Optimizer after(config);
    after.set_step(resume_after);
    for (size_t i = resume_after; i < steps.size(); ++i) {
      const std::vector<float> grad = hex_floats(steps[i].at("grad"));
      after.begin_step(config.lr);
      after.apply(shard.view(0, n), grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32);
      const std::vector<float> previous = hex_floats(steps[i - 1].at("params"));
      expect_close(shard.master, hex_floats(steps[i].at("params")), &previous,
                   name + " resumed, step " + std::to_string(i + 1) + " params");
    }
  }
}

// Deterministic inputs for the property tests: no two elements alike, signs mixed.
std::vector<float> pattern(size_t n, float scale, float phase) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = scale * std::sin(0.7f * static_cast<float>(i) + phase);
  return out;
}

// One rank's shard is often updated in pieces (one apply per unit); the pieces must agree with
// one apply over the whole, for every optimizer and across steps (the step constants are
// fixed by begin_step, not by the number of apply calls).
TEST(Optimizer, ShardSplitInTwoEqualsWhole) {
  OptimizerConfig adamw;
  OptimizerConfig adam;
  adam.type = OptimizerType::kAdam;
  adam.weight_decay = 0.05f;
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  sgd.lr = 0.05f;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 1e-4f;
  for (const OptimizerConfig& config : {adamw, adam, sgd}) {
    // 101 = 37 + 64: the cut falls inside a vector of the AVX2 loop, so both halves have tails.
    const size_t n = 101;
    const size_t cut = 37;
    Optimizer whole_optimizer(config);
    Optimizer split_optimizer(config);
    OwnedShard whole(pattern(n, 0.5f, 0.0f));
    OwnedShard split(pattern(n, 0.5f, 0.0f));
    for (int step = 1; step <= 4; ++step) {
      const std::vector<float> grad = pattern(n, 0.1f, static_cast<float>(step));
      whole_optimizer.begin_step(config.lr);
      whole_optimizer.apply(whole.view(0, n), grad.data(), DType::kFloat32, 1.0f, nullptr,
                            DType::kFloat32);
      split_optimizer.begin_step(config.lr);
      split_optimizer.apply(split.view(0, cut), grad.data(), DType::kFloat32, 1.0f, nullptr,
                            DType::kFloat32);
      split_optimizer.apply(split.view(cut, n - cut), grad.data() + cut, DType::kFloat32, 1.0f,
                            nullptr, DType::kFloat32);
      const std::string where =
          "type " + std::to_string(static_cast<int>(config.type)) + " step " + std::to_string(step);
      expect_close(split.master, whole.master, nullptr, where + " master");
      expect_close(split.state0, whole.state0, nullptr, where + " state0");
      expect_close(split.state1, whole.state1, nullptr, where + " state1");
    }
  }
}

// The working copy written in the same pass is exactly the master rounded to its dtype.
TEST(Optimizer, ParamOutIsRoundedMaster) {
  const size_t n = 45;
  for (DType param_dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    Optimizer optimizer(OptimizerConfig{});
    OwnedShard shard(pattern(n, 0.5f, 0.3f));
    std::vector<uint8_t> param_out(n * dtype_size(param_dtype), 0xff);
    for (int step = 1; step <= 3; ++step) {
      const std::vector<float> grad = pattern(n, 0.1f, static_cast<float>(step));
      optimizer.begin_step(1e-2f);
      optimizer.apply(shard.view(0, n), grad.data(), DType::kFloat32, 1.0f, param_out.data(),
                      param_dtype);
      for (size_t i = 0; i < n; ++i) {
        const float master = shard.master[i];
        if (param_dtype == DType::kBFloat16) {
          EXPECT_EQ(reinterpret_cast<const uint16_t*>(param_out.data())[i], float_to_bf16(master))
              << "bf16 element " << i << " step " << step;
        } else if (param_dtype == DType::kFloat16) {
          EXPECT_EQ(reinterpret_cast<const uint16_t*>(param_out.data())[i], float_to_fp16(master))
              << "fp16 element " << i << " step " << step;
        } else {
          EXPECT_EQ(float_bits(reinterpret_cast<const float*>(param_out.data())[i]),
                    float_bits(master))
              << "fp32 element " << i << " step " << step;
        }
      }
    }
  }
}

// grad_scale multiplies the gradient before use: a power-of-two scale is exact, so applying
// 4 * g with scale 1/4 must give the same bits as applying g.
TEST(Optimizer, GradScaleIsAppliedToGradient) {
  const size_t n = 29;
  Optimizer plain(OptimizerConfig{});
  Optimizer scaled(OptimizerConfig{});
  OwnedShard a(pattern(n, 0.5f, 0.1f));
  OwnedShard b(pattern(n, 0.5f, 0.1f));
  const std::vector<float> grad = pattern(n, 0.1f, 1.0f);
  std::vector<float> grad_times_4(grad);
  for (float& g : grad_times_4) g *= 4.0f;
  plain.begin_step(1e-3f);
  plain.apply(a.view(0, n), grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32);
  scaled.begin_step(1e-3f);
  scaled.apply(b.view(0, n), grad_times_4.data(), DType::kFloat32, 0.25f, nullptr, DType::kFloat32);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(float_bits(a.master[i]), float_bits(b.master[i])) << "element " << i;
    EXPECT_EQ(float_bits(a.state1[i]), float_bits(b.state1[i])) << "element " << i;
  }
}

TEST(Optimizer, StateCountPerType) {
  OptimizerConfig config;
  EXPECT_EQ(Optimizer(config).state_count(), 2);
  config.type = OptimizerType::kAdam;
  EXPECT_EQ(Optimizer(config).state_count(), 2);
  config.type = OptimizerType::kSgd;
  config.momentum = 0.0f;
  EXPECT_EQ(Optimizer(config).state_count(), 0);
  config.momentum = 0.9f;
  EXPECT_EQ(Optimizer(config).state_count(), 1);
}

// Plain SGD needs no state arrays at all: p -= lr * (g + wd * p).
TEST(Optimizer, PlainSgdRunsWithoutState) {
  OptimizerConfig config;
  config.type = OptimizerType::kSgd;
  config.lr = 0.5f;
  config.weight_decay = 0.0f;
  config.momentum = 0.0f;
  Optimizer optimizer(config);
  std::vector<float> master = {1.0f, -2.0f, 0.25f};
  const std::vector<float> grad = {0.5f, 1.0f, -0.5f};
  ShardState shard;
  shard.master = master.data();
  shard.n = master.size();
  optimizer.begin_step(config.lr);
  optimizer.apply(shard, grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32);
  EXPECT_EQ(master[0], 0.75f);
  EXPECT_EQ(master[1], -2.5f);
  EXPECT_EQ(master[2], 0.5f);
}

using testing::expect_error_naming;

TEST(Optimizer, RejectsBadHyperparameters) {
  auto with = [](auto change) {
    OptimizerConfig config;
    change(config);
    return [config] { Optimizer optimizer(config); };
  };
  expect_error_naming(with([](OptimizerConfig& c) { c.lr = -1e-3f; }), "lr");
  expect_error_naming(with([](OptimizerConfig& c) { c.lr = NAN; }), "lr");
  expect_error_naming(with([](OptimizerConfig& c) { c.beta1 = 1.0; }), "beta1");
  expect_error_naming(with([](OptimizerConfig& c) { c.beta1 = -0.1; }), "beta1");
  expect_error_naming(with([](OptimizerConfig& c) { c.beta2 = 1.5; }), "beta2");
  expect_error_naming(with([](OptimizerConfig& c) { c.eps = 0.0f; }), "eps");
  expect_error_naming(with([](OptimizerConfig& c) { c.weight_decay = -0.01f; }), "weight_decay");
  expect_error_naming(with([](OptimizerConfig& c) {
                        c.type = OptimizerType::kSgd;
                        c.momentum = 1.0f;
                      }),
                      "momentum");
  EXPECT_NO_THROW(with([](OptimizerConfig& c) { c.beta1 = 0.0; })());
}

TEST(Optimizer, ApplyChecksItsInputs) {
  OwnedShard shard(pattern(8, 0.5f, 0.0f));
  const std::vector<float> grad = pattern(8, 0.1f, 0.0f);
  Optimizer adamw(OptimizerConfig{});
  expect_error_naming(
      [&] {
        adamw.apply(shard.view(0, 8), grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32);
      },
      "begin_step");
  adamw.begin_step(1e-3f);
  ShardState no_master = shard.view(0, 8);
  no_master.master = nullptr;
  expect_error_naming(
      [&] { adamw.apply(no_master, grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32); },
      "master");
  expect_error_naming(
      [&] {
        adamw.apply(shard.view(0, 8), nullptr, DType::kFloat32, 1.0f, nullptr, DType::kFloat32);
      },
      "gradient");
  ShardState no_v = shard.view(0, 8);
  no_v.state[1] = nullptr;
  expect_error_naming(
      [&] { adamw.apply(no_v, grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32); },
      "state[1]");

  OptimizerConfig sgd_config;
  sgd_config.type = OptimizerType::kSgd;
  sgd_config.momentum = 0.9f;
  Optimizer sgd(sgd_config);
  sgd.begin_step(0.1f);
  ShardState no_buffer = shard.view(0, 8);
  no_buffer.state[0] = nullptr;
  expect_error_naming(
      [&] { sgd.apply(no_buffer, grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32); },
      "state[0]");
  expect_error_naming([&] { sgd.begin_step(-0.1f); }, "lr");
}

}  // namespace
}  // namespace zero
