// bf16 and fp16 training: the ZeRO paper's memory per rank, parity across stages, agreement
// with fp32, fp16's dynamic loss scaling around an injected overflow, and the non-finite
// gradient rules of fp32/bf16. Also the scheduling options that must not change the numbers.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>

#include "tests/runtime/train_util.h"
#include "zero/kernels/check.h"

namespace zero {
namespace {

using namespace zero::testing;

std::string name_of(DType dtype, int stage) {
  return std::string(dtype_name(dtype)) + " stage " + std::to_string(stage);
}

TEST(MixedPrecision, ModelStateBytesFollowThePaper) {
  const uint64_t n = static_cast<uint64_t>(world_size());
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      RunOptions o;
      o.stage = stage;
      o.steps = 1;
      o.dtype = dtype;
      const TrainResult run = train(o);
      const uint64_t psi = run.padded_params;
      // 2-byte params, K = 12 bytes of fp32 master and Adam moments per parameter, and the
      // kept gradients in the accumulation dtype: 2 bytes for fp16, 4 for bf16 (DeepSpeed's
      // default data_types.grad_accum_dtype for bf16 is fp32). With g = 2 these are the paper's.
      const uint64_t g = dtype == DType::kBFloat16 ? 4 : 2;
      const uint64_t expected[4] = {(14 + g) * psi, (2 + g) * psi + 12 * psi / n,
                                    2 * psi + (12 + g) * psi / n, (14 + g) * psi / n};
      EXPECT_EQ(run.model_state_bytes, expected[stage]) << name_of(dtype, stage);
      EXPECT_EQ(run.plan.model_state, run.model_state_bytes) << name_of(dtype, stage);
      EXPECT_EQ(run.plan.buffers, run.buffer_bytes) << name_of(dtype, stage);
    }
  }
}

// The sums are the same at every stage when the reductions round the same way: gradients
// accumulated in bf16 and reduced in bf16, or accumulated in fp32 and reduced in fp32
// (communication_data_type fp32; else stages 2-3 round each reduced micro-batch to bf16 where
// stages 0-1 reduce the fp32 accumulator).
TEST(MixedPrecision, StagesAgreeInBf16AsInFp32) {
  const std::pair<const char*, std::function<void(EngineConfig&)>> numerics[] = {
      {"bf16 accumulation", [](EngineConfig& c) { c.grad_accum_dtype = DType::kBFloat16; }},
      {"fp32 accumulation and reduction",
       [](EngineConfig& c) {
         c.grad_accum_dtype = DType::kFloat32;
         c.reduce_in_fp32 = true;
       }},
  };
  for (const auto& [what, tweak] : numerics) {
    RunOptions o;
    o.dtype = DType::kBFloat16;
    o.tweak = tweak;
    const TrainResult reference = train(o);
    for (int stage = 1; stage <= 3; ++stage) {
      o.stage = stage;
      const TrainResult run = train(o);
      const std::string name = name_of(o.dtype, stage) + ", " + what;
      if (world_size() <= 2) {
        for (size_t i = 0; i < run.losses.size(); ++i) {
          EXPECT_EQ(run.losses[i], reference.losses[i]) << name << " step " << i;
        }
      } else {
        expect_close(run.losses, reference.losses, 1e-6, name);
      }
    }
  }
}

TEST(MixedPrecision, Bf16AndFp16TrackFp32) {
  for (int stage : {0, 3}) {
    // zero-train's example: its default model, batch and learning rate.
    RunOptions o;
    o.stage = stage;
    o.steps = 50;
    o.mlp = MlpConfig{};
    o.lr = 1e-3f;
    o.seed = 1;
    const TrainResult fp32 = train(o);
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      o.dtype = dtype;
      const TrainResult run = train(o);
      expect_close(run.losses, fp32.losses, 2e-2, name_of(dtype, stage) + " vs fp32");
      for (bool skipped : run.skipped) EXPECT_FALSE(skipped) << name_of(dtype, stage);
    }
  }
}

TEST(MixedPrecision, Fp16OverflowSkipsTheStepAndFollowsHysteresis) {
  for (int stage : {0, 1, 2, 3}) {
    RunOptions o;
    o.stage = stage;
    o.dtype = DType::kFloat16;
    o.steps = 10;
    o.record_params = true;
    o.inf_grad_step = 5;
    o.tweak = [](EngineConfig& c) { c.loss_scaler.scale_window = 4; };
    const TrainResult run = train(o);
    const std::string what = name_of(o.dtype, stage);
    for (size_t i = 0; i < run.skipped.size(); ++i) {
      EXPECT_EQ(run.skipped[i], i == 4) << what << " step " << i + 1;
      EXPECT_TRUE(std::isfinite(run.losses[i])) << what << " step " << i + 1;
    }
    // Step 5 changed nothing.
    EXPECT_EQ(run.params_after_step[4], run.params_after_step[3]) << what;
    EXPECT_NE(run.params_after_step[5], run.params_after_step[4]) << what;
    // 2^16 to start; clean steps 1-4 fill the window of 4 and double it; the overflow at step 5
    // only uses up one unit of hysteresis (2 -> 1), so the scale holds; four clean steps (6-9)
    // double it again.
    const float start = 65536.0f;
    EXPECT_EQ(run.loss_scales[2], start) << what;
    EXPECT_EQ(run.loss_scales[3], 2 * start) << what;
    EXPECT_EQ(run.loss_scales[4], 2 * start) << what;
    EXPECT_EQ(run.loss_scales[7], 2 * start) << what;
    EXPECT_EQ(run.loss_scales[8], 4 * start) << what;
  }
}

TEST(MixedPrecision, Fp16OverflowWithoutHysteresisHalvesTheScale) {
  RunOptions o;
  o.stage = 3;
  o.dtype = DType::kFloat16;
  o.steps = 6;
  o.inf_grad_step = 3;
  o.tweak = [](EngineConfig& c) { c.loss_scaler.hysteresis = 1; };
  const TrainResult run = train(o);
  EXPECT_TRUE(run.skipped[2]);
  EXPECT_EQ(run.loss_scales[1], 65536.0f);
  EXPECT_EQ(run.loss_scales[2], 32768.0f);
}

TEST(MixedPrecision, OverflowAtTheMinimumScaleIsAnError) {
  RunOptions o;
  o.dtype = DType::kFloat16;
  o.steps = 3;
  o.inf_grad_step = 2;
  o.tweak = [](EngineConfig& c) {
    c.loss_scaler.initial_scale_power = 0;
    c.loss_scaler.hysteresis = 1;
  };
  try {
    train(o);
    FAIL() << "no error at the minimum loss scale";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss scale is already at its minimum"), std::string::npos)
        << e.what();
  }
}

TEST(MixedPrecision, NonFiniteGradientInBf16StopsWithTheUnitNamed) {
  RunOptions o;
  o.dtype = DType::kBFloat16;
  o.steps = 3;
  o.inf_grad_step = 2;
  try {
    train(o);
    FAIL() << "no error for an infinite gradient";
  } catch (const Error& e) {
    const std::string message = e.what();
    // The infinity enters at the output and spreads through backward to every unit; the first
    // in order is reported.
    EXPECT_NE(message.find("step 2: the gradient of unit 0 (starting at parameter "
                           "'layers.0.weight') is not finite on some rank"),
              std::string::npos)
        << message;
  }
  o.tweak = [](EngineConfig& c) { c.skip_nonfinite_steps = true; };
  o.record_params = true;
  const TrainResult run = train(o);
  EXPECT_TRUE(run.skipped[1]);
  EXPECT_EQ(run.params_after_step[1], run.params_after_step[0]);
}

TEST(MixedPrecision, Fp32ReductionAndPredivideGiveTheSameTraining) {
  for (int stage = 0; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    o.dtype = DType::kBFloat16;
    o.steps = 10;
    const TrainResult plain = train(o);
    o.tweak = [](EngineConfig& c) {
      c.reduce_in_fp32 = true;
      c.gradient_predivide_factor = 2.0f;  // a power of two: exact in every dtype
    };
    const TrainResult fp32_reduce = train(o);
    expect_close(fp32_reduce.losses, plain.losses, 1e-2, name_of(o.dtype, stage));
  }
}

TEST(Scheduling, OptionsThatMustNotChangeTheNumbers) {
  RunOptions o;
  o.stage = 3;
  o.steps = 6;
  o.mlp = MlpConfig{8, 24, 4, 5};
  const TrainResult reference = train(o);
  const std::vector<std::pair<std::string, std::function<void(EngineConfig&)>>> variants = {
      {"no overlap", [](EngineConfig& c) { c.overlap_comm = false; }},
      {"all-reduce instead of reduce-scatter", [](EngineConfig& c) { c.reduce_scatter = false; }},
      {"prefetch everything", [](EngineConfig& c) { c.prefetch_elements = 1u << 30; }},
      {"live budget of one unit", [](EngineConfig& c) { c.max_live_elements = 1; }},
      {"persistent small units", [](EngineConfig& c) { c.persistence_threshold = 1u << 30; }},
      {"reuse at the end of forward", [](EngineConfig& c) { c.max_reuse_distance = 1u << 30; }},
  };
  for (const auto& [name, tweak] : variants) {
    o.tweak = tweak;
    const TrainResult run = train(o);
    if (world_size() <= 2) {
      EXPECT_EQ(run.losses, reference.losses) << name;
    } else {
      expect_close(run.losses, reference.losses, 1e-6, name);
    }
  }
}

TEST(Scheduling, ReuseAndPersistenceSaveCommunication) {
  if (world_size() < 2) GTEST_SKIP() << "one rank communicates nothing";
  RunOptions o;
  o.stage = 3;
  o.steps = 2;
  const TrainResult plain = train(o);
  o.tweak = [](EngineConfig& c) { c.max_reuse_distance = 1u << 30; };
  const TrainResult reuse = train(o);
  EXPECT_LT(reuse.comm_bytes[1], plain.comm_bytes[1]);
  o.tweak = [](EngineConfig& c) { c.persistence_threshold = 1u << 30; };
  const TrainResult persistent = train(o);
  EXPECT_LT(persistent.comm_bytes[1], plain.comm_bytes[1]);
  EXPECT_GT(persistent.model_state_bytes, plain.model_state_bytes);
}

}  // namespace
}  // namespace zero
