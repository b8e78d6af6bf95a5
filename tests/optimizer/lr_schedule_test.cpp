// Learning-rate schedules at their key steps (first step, last warm-up step, first step at the
// peak, middle of the decay, end, past the end) against values worked out by hand from the
// formulas in optimizer.h, plus the configuration errors.
#include <gtest/gtest.h>

#include <string>

#include "tests/expect_error.h"
#include "zero/core/check.h"
#include "zero/optimizer/optimizer.h"

namespace zero {
namespace {

LrScheduleConfig make_config(LrScheduleType type, float max_lr, float min_lr, long warmup,
                             long total, LrWarmupType warmup_type = LrWarmupType::kLinear) {
  LrScheduleConfig config;
  config.type = type;
  config.warmup_type = warmup_type;
  config.max_lr = max_lr;
  config.min_lr = min_lr;
  config.warmup_steps = warmup;
  config.total_steps = total;
  return config;
}

TEST(LrSchedule, ConstantIsMaxLrAtEveryStep) {
  const LrSchedule schedule(make_config(LrScheduleType::kConstant, 0.01f, 0.0f, 0, 0));
  EXPECT_FLOAT_EQ(schedule.lr_at(1), 0.01f);
  EXPECT_FLOAT_EQ(schedule.lr_at(1000000), 0.01f);
}

// WarmupLR, linear: lr = min + (max - min) * (s - 1) / W for s <= W, then max.
TEST(LrSchedule, WarmupRisesLinearlyThenHolds) {
  const LrSchedule from_zero(make_config(LrScheduleType::kWarmup, 0.01f, 0.0f, 10, 0));
  EXPECT_FLOAT_EQ(from_zero.lr_at(1), 0.0f);
  EXPECT_FLOAT_EQ(from_zero.lr_at(2), 0.001f);
  EXPECT_FLOAT_EQ(from_zero.lr_at(6), 0.005f);
  EXPECT_FLOAT_EQ(from_zero.lr_at(10), 0.009f);  // last warm-up step
  EXPECT_FLOAT_EQ(from_zero.lr_at(11), 0.01f);   // first step at the peak
  EXPECT_FLOAT_EQ(from_zero.lr_at(100000), 0.01f);

  const LrSchedule from_min(make_config(LrScheduleType::kWarmup, 0.01f, 0.002f, 4, 0));
  EXPECT_FLOAT_EQ(from_min.lr_at(1), 0.002f);
  EXPECT_FLOAT_EQ(from_min.lr_at(3), 0.006f);
  EXPECT_FLOAT_EQ(from_min.lr_at(5), 0.01f);
}

// DeepSpeed's default warm-up, "log": lr = min + (max - min) * log(s) / log(W) for s <= W (its
// gamma = inverse_log_warm_up * log(last_batch_iteration + 1)). Values by hand from that formula.
TEST(LrSchedule, WarmupIsLogarithmicByDefault) {
  EXPECT_EQ(LrScheduleConfig().warmup_type, LrWarmupType::kLog);
  const LrWarmupType log = LrWarmupType::kLog;
  const LrSchedule from_zero(make_config(LrScheduleType::kWarmup, 0.01f, 0.0f, 10, 0, log));
  EXPECT_FLOAT_EQ(from_zero.lr_at(1), 0.0f);        // log(1) = 0
  EXPECT_FLOAT_EQ(from_zero.lr_at(2), 0.0030103f);  // 0.01 * log10(2)
  EXPECT_FLOAT_EQ(from_zero.lr_at(5), 0.0069897f);  // 0.01 * log10(5)
  EXPECT_FLOAT_EQ(from_zero.lr_at(10), 0.01f);      // log(10) / log(10): the peak already
  EXPECT_FLOAT_EQ(from_zero.lr_at(11), 0.01f);
  const LrSchedule from_min(make_config(LrScheduleType::kWarmup, 0.01f, 0.002f, 4, 0, log));
  EXPECT_FLOAT_EQ(from_min.lr_at(2), 0.006f);       // 0.002 + 0.008 * log(2) / log(4)
  EXPECT_FLOAT_EQ(from_min.lr_at(3), 0.00833985f);  // 0.002 + 0.008 * log(3) / log(4)
  // The decay schedules warm up the same way.
  const LrSchedule decay(
      make_config(LrScheduleType::kWarmupLinearDecay, 0.011f, 0.001f, 10, 110, log));
  EXPECT_FLOAT_EQ(decay.lr_at(2), 0.0040103f);  // 0.001 + 0.01 * log10(2)
  EXPECT_FLOAT_EQ(decay.lr_at(61), 0.006f);
  const LrSchedule cosine(make_config(LrScheduleType::kWarmupCosine, 0.01f, 0.0f, 10, 110, log));
  EXPECT_FLOAT_EQ(cosine.lr_at(5), 0.0069897f);
  EXPECT_FLOAT_EQ(cosine.lr_at(60), 0.0050005f);  // 0.01 * (1e-4 + 0.9999 / 2)
}

// DeepSpeed raises warmup_num_steps to at least 2 (log(1) would be 0), for both warm-ups.
TEST(LrSchedule, OneWarmupStepMeansTwo) {
  const LrSchedule log(make_config(LrScheduleType::kWarmup, 0.01f, 0.0f, 1, 0, LrWarmupType::kLog));
  EXPECT_FLOAT_EQ(log.lr_at(1), 0.0f);
  EXPECT_FLOAT_EQ(log.lr_at(2), 0.01f);  // log(2) / log(2)
  const LrSchedule linear(make_config(LrScheduleType::kWarmup, 0.01f, 0.0f, 1, 0));
  EXPECT_FLOAT_EQ(linear.lr_at(1), 0.0f);
  EXPECT_FLOAT_EQ(linear.lr_at(2), 0.005f);  // 1 / 2
  EXPECT_FLOAT_EQ(linear.lr_at(3), 0.01f);
}

TEST(LrSchedule, NoWarmupStartsAtMaxLr) {
  const LrSchedule schedule(make_config(LrScheduleType::kWarmup, 0.01f, 0.001f, 0, 0));
  EXPECT_FLOAT_EQ(schedule.lr_at(1), 0.01f);
}

// WarmupDecayLR with W = 10, T = 110, min 0.001, max 0.011: after warm-up
// lr = 0.001 + 0.01 * (110 - s + 1) / 100.
TEST(LrSchedule, WarmupLinearDecayReachesMinLrAfterTotalSteps) {
  const LrSchedule schedule(
      make_config(LrScheduleType::kWarmupLinearDecay, 0.011f, 0.001f, 10, 110));
  EXPECT_FLOAT_EQ(schedule.lr_at(1), 0.001f);
  EXPECT_FLOAT_EQ(schedule.lr_at(10), 0.01f);   // 0.001 + 0.01 * 9 / 10
  EXPECT_FLOAT_EQ(schedule.lr_at(11), 0.011f);  // peak
  EXPECT_FLOAT_EQ(schedule.lr_at(61), 0.006f);  // half way down
  EXPECT_FLOAT_EQ(schedule.lr_at(110), 0.0011f);
  EXPECT_FLOAT_EQ(schedule.lr_at(111), 0.001f);
  EXPECT_FLOAT_EQ(schedule.lr_at(5000), 0.001f);
}

// WarmupCosineLR with W = 10, T = 110, max 0.01, warm-up from 0, floor ratio 0.1: after
// warm-up lr = 0.01 * (0.1 + 0.9 * (1 + cos(pi * (s - 10) / 100)) / 2).
TEST(LrSchedule, WarmupCosineDecaysToFloorAtTotalSteps) {
  LrScheduleConfig config = make_config(LrScheduleType::kWarmupCosine, 0.01f, 0.0f, 10, 110);
  config.cos_min_ratio = 0.1f;
  const LrSchedule schedule(config);
  EXPECT_FLOAT_EQ(schedule.lr_at(1), 0.0f);
  EXPECT_FLOAT_EQ(schedule.lr_at(6), 0.005f);
  EXPECT_FLOAT_EQ(schedule.lr_at(10), 0.009f);
  EXPECT_FLOAT_EQ(schedule.lr_at(11), 0.0099977795f);  // cos(pi / 100) = 0.99950656
  EXPECT_FLOAT_EQ(schedule.lr_at(35), 0.0086819805f);  // cos(pi / 4) = 0.70710678
  EXPECT_FLOAT_EQ(schedule.lr_at(60), 0.0055f);        // cos(pi / 2) = 0
  EXPECT_FLOAT_EQ(schedule.lr_at(110), 0.001f);
  EXPECT_FLOAT_EQ(schedule.lr_at(111), 0.001f);
  EXPECT_FLOAT_EQ(schedule.lr_at(100000), 0.001f);
}

// When warm-up takes all the steps there is nothing to decay over: the floor follows at once.
TEST(LrSchedule, DecayWithWarmupEqualToTotal) {
  const LrSchedule linear(make_config(LrScheduleType::kWarmupLinearDecay, 0.01f, 0.002f, 4, 4));
  EXPECT_FLOAT_EQ(linear.lr_at(4), 0.008f);
  EXPECT_FLOAT_EQ(linear.lr_at(5), 0.002f);
  LrScheduleConfig cosine_config = make_config(LrScheduleType::kWarmupCosine, 0.01f, 0.0f, 4, 4);
  cosine_config.cos_min_ratio = 0.5f;
  const LrSchedule cosine(cosine_config);
  EXPECT_FLOAT_EQ(cosine.lr_at(4), 0.0075f);
  EXPECT_FLOAT_EQ(cosine.lr_at(5), 0.005f);
}

// After warm-up, neither decay schedule ever raises the learning rate.
TEST(LrSchedule, DecaySchedulesNeverIncreaseAfterWarmup) {
  for (LrScheduleType type : {LrScheduleType::kWarmupLinearDecay, LrScheduleType::kWarmupCosine}) {
    const LrSchedule schedule(make_config(type, 3e-4f, 3e-5f, 7, 50));
    for (long step = 8; step < 80; ++step) {
      EXPECT_LE(schedule.lr_at(step + 1), schedule.lr_at(step))
          << "type " << static_cast<int>(type) << " step " << step;
    }
  }
}

using testing::expect_error_naming;

TEST(LrSchedule, RejectsBadConfigs) {
  auto build = [](LrScheduleConfig config) { return [config] { LrSchedule schedule(config); }; };
  const LrScheduleType decay = LrScheduleType::kWarmupLinearDecay;
  expect_error_naming(build(make_config(LrScheduleType::kConstant, -1e-3f, 0.0f, 0, 0)), "max_lr");
  expect_error_naming(build(make_config(LrScheduleType::kWarmup, 1e-3f, -1e-4f, 10, 0)), "min_lr");
  expect_error_naming(build(make_config(LrScheduleType::kWarmup, 1e-3f, 1e-2f, 10, 0)),
                      "exceeds max_lr");
  expect_error_naming(build(make_config(LrScheduleType::kWarmup, 1e-3f, 0.0f, -1, 0)),
                      "warmup_steps");
  expect_error_naming(build(make_config(decay, 1e-3f, 0.0f, 10, 0)), "total_steps");
  expect_error_naming(build(make_config(LrScheduleType::kWarmupCosine, 1e-3f, 0.0f, 0, 0)),
                      "total_steps");
  expect_error_naming(build(make_config(decay, 1e-3f, 0.0f, 20, 10)), "warmup_steps (20)");
  LrScheduleConfig bad_ratio = make_config(LrScheduleType::kWarmupCosine, 1e-3f, 0.0f, 1, 10);
  bad_ratio.cos_min_ratio = 1.5f;
  expect_error_naming(build(bad_ratio), "cos_min_ratio");

  const LrSchedule schedule(make_config(LrScheduleType::kConstant, 1e-3f, 0.0f, 0, 0));
  expect_error_naming([&] { schedule.lr_at(0); }, "steps start at 1");
}

}  // namespace
}  // namespace zero
