// The fp16 loss scaler against DeepSpeed's rules: start at 2^initial_scale_power, double after
// loss_scale_window clean steps, spend the hysteresis allowance before halving, never go below
// min_loss_scale (an overflow there is an error), and a static scale that never moves.
#include <gtest/gtest.h>

#include <string>

#include "zero/core/check.h"
#include "zero/optimizer/loss_scaler.h"

namespace zero {
namespace {

TEST(LossScaler, GrowsAfterEveryWindowOfCleanSteps) {
  LossScalerConfig config;
  config.initial_scale_power = 4;
  config.scale_window = 3;
  LossScaler scaler(config);
  EXPECT_TRUE(scaler.dynamic());
  EXPECT_EQ(scaler.scale(), 16.0f);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 16.0f);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 32.0f);
  for (int i = 0; i < 3; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 64.0f);
}

TEST(LossScaler, HysteresisDelaysTheDecrease) {
  LossScalerConfig config;
  config.initial_scale_power = 10;
  config.scale_window = 100;
  config.hysteresis = 3;
  LossScaler scaler(config);
  EXPECT_TRUE(scaler.update(true));  // skipped, allowance 3 -> 2
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.update(true));  // 2 -> 1
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.update(true));  // allowance spent: halve
  EXPECT_EQ(scaler.scale(), 512.0f);
  EXPECT_TRUE(scaler.update(true));  // still spent: halve again
  EXPECT_EQ(scaler.scale(), 256.0f);
  // A clean step does not restore the allowance until the scale grows (DeepSpeed's default).
  EXPECT_FALSE(scaler.update(false));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 128.0f);
}

TEST(LossScaler, OverflowCountsRestartTheWindow) {
  LossScalerConfig config;
  config.initial_scale_power = 2;
  config.scale_window = 2;
  config.hysteresis = 2;
  LossScaler scaler(config);
  scaler.update(false);
  scaler.update(true);  // uses the allowance; the clean-step count starts again
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 4.0f);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8.0f);
}

TEST(LossScaler, OverflowAtTheMinimumIsAnError) {
  LossScalerConfig config;
  config.initial_scale_power = 1;
  config.hysteresis = 1;
  config.min_scale = 1.0f;
  LossScaler scaler(config);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 1.0f);
  try {
    scaler.update(true);
    FAIL() << "no error at the minimum";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already at its minimum (1)"), std::string::npos)
        << e.what();
  }
}

TEST(LossScaler, StaticScaleNeverMovesButSkipsOverflows) {
  LossScalerConfig config;
  config.static_scale = 128.0f;
  LossScaler scaler(config);
  EXPECT_FALSE(scaler.dynamic());
  EXPECT_TRUE(scaler.update(true));
  for (int i = 0; i < 5000; ++i) EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 128.0f);
}

TEST(LossScaler, StateRoundTrips) {
  LossScalerConfig config;
  config.scale_window = 4;
  LossScaler a(config);
  a.update(true);
  a.update(false);
  LossScaler b(config);
  b.set_state(a.state());
  for (bool overflow : {false, false, false, true, true, false}) {
    EXPECT_EQ(a.update(overflow), b.update(overflow));
    EXPECT_EQ(a.scale(), b.scale());
  }
  EXPECT_THROW(b.set_state(LossScaler::State{0.0f, 1, 0}), Error);
}

TEST(LossScaler, RejectsBadSettings) {
  auto message_of = [](LossScalerConfig c) {
    try {
      LossScaler scaler(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LossScalerConfig c;
  c.scale_window = 0;
  EXPECT_NE(message_of(c).find("loss_scale_window must be at least 1, got 0"), std::string::npos);
  c = LossScalerConfig{};
  c.hysteresis = 0;
  EXPECT_NE(message_of(c).find("hysteresis must be at least 1, got 0"), std::string::npos);
  c = LossScalerConfig{};
  c.min_scale = 0.0f;
  EXPECT_NE(message_of(c).find("min_loss_scale must be > 0, got 0"), std::string::npos);
  c = LossScalerConfig{};
  c.static_scale = -1.0f;
  EXPECT_NE(message_of(c).find("loss_scale must be >= 0 (0 = dynamic), got -1"), std::string::npos);
}

}  // namespace
}  // namespace zero
