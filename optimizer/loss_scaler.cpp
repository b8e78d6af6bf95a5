#include "zero/optimizer/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "zero/core/check.h"

namespace zero {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  ZERO_CHECK(config.static_scale >= 0.0f,
             "loss_scale must be >= 0 (0 = dynamic), got " << config.static_scale);
  ZERO_CHECK(config.initial_scale_power >= 0 && config.initial_scale_power <= 127,
             "initial_scale_power must be in [0, 127], got " << config.initial_scale_power);
  ZERO_CHECK(config.scale_window >= 1,
             "loss_scale_window must be at least 1, got " << config.scale_window);
  ZERO_CHECK(config.hysteresis >= 1, "hysteresis must be at least 1, got " << config.hysteresis);
  ZERO_CHECK(config.min_scale > 0.0f, "min_loss_scale must be > 0, got " << config.min_scale);
  scale_ = dynamic() ? std::ldexp(1.0f, config.initial_scale_power) : config.static_scale;
  hysteresis_left_ = config.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!dynamic()) return overflow;
  if (!overflow) {
    clean_steps_ += 1;
    // DeepSpeed restores the hysteresis allowance only when the scale grows (its default,
    // consecutive_hysteresis = false).
    if (clean_steps_ % config_.scale_window == 0) {
      hysteresis_left_ = config_.hysteresis;
      scale_ *= 2.0f;
    }
    return false;
  }
  clean_steps_ = 0;
  if (hysteresis_left_ > 1) {
    hysteresis_left_ -= 1;
    return true;
  }
  ZERO_CHECK(scale_ > config_.min_scale,
             "the fp16 loss scale is already at its minimum ("
                 << config_.min_scale
                 << ") and the gradients still overflow; lowering it further is not allowed, so "
                    "every later step would be skipped. Check the model and data for values "
                    "that overflow fp16, lower the learning rate, or use bf16");
  scale_ = std::max(scale_ / 2.0f, config_.min_scale);
  return true;
}

void LossScaler::set_state(const State& state) {
  ZERO_CHECK(state.scale > 0.0f && std::isfinite(state.scale),
             "loss scaler state: scale must be positive and finite, got " << state.scale);
  scale_ = state.scale;
  hysteresis_left_ = state.hysteresis_left;
  clean_steps_ = state.clean_steps;
}

}  // namespace zero
