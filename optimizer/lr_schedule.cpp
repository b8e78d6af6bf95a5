// Learning-rate schedules. The formulas and their relation to DeepSpeed's classes are written
// out next to LrScheduleConfig in optimizer.h; this file computes them in double and rounds once.
#include <algorithm>
#include <cmath>

#include "zero/core/check.h"
#include "zero/optimizer/optimizer.h"

namespace zero {

namespace {

constexpr double kPi = 3.14159265358979323846;

bool is_decay(LrScheduleType type) {
  return type == LrScheduleType::kWarmupLinearDecay || type == LrScheduleType::kWarmupCosine;
}

}  // namespace

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) {
  const LrScheduleType type = config.type;
  ZERO_CHECK(type == LrScheduleType::kConstant || type == LrScheduleType::kWarmup || is_decay(type),
             "lr schedule: unknown type " << static_cast<int>(type));
  const char* name = lr_schedule_type_name(type);
  ZERO_CHECK(config.max_lr >= 0.0f && std::isfinite(config.max_lr),
             name << ": max_lr must be finite and >= 0, got " << config.max_lr);
  if (type == LrScheduleType::kConstant) return;

  ZERO_CHECK(config.min_lr >= 0.0f && std::isfinite(config.min_lr),
             name << ": min_lr must be finite and >= 0, got " << config.min_lr);
  ZERO_CHECK(config.min_lr <= config.max_lr,
             name << ": min_lr (" << config.min_lr << ") exceeds max_lr (" << config.max_lr << ")");
  ZERO_CHECK(config.warmup_steps >= 0,
             name << ": warmup_steps must be >= 0, got " << config.warmup_steps);
  ZERO_CHECK(
      config.warmup_type == LrWarmupType::kLog || config.warmup_type == LrWarmupType::kLinear,
      name << ": unknown warmup_type " << static_cast<int>(config.warmup_type));
  if (!is_decay(type)) return;

  ZERO_CHECK(config.total_steps > 0,
             name << ": total_steps must be > 0, got " << config.total_steps);
  ZERO_CHECK(config.warmup_steps <= config.total_steps,
             name << ": warmup_steps (" << config.warmup_steps << ") exceeds total_steps ("
                  << config.total_steps << ")");
  if (type == LrScheduleType::kWarmupCosine) {
    ZERO_CHECK(config.cos_min_ratio >= 0.0f && config.cos_min_ratio <= 1.0f,
               name << ": cos_min_ratio must be in [0, 1], got " << config.cos_min_ratio);
  }
}

float LrSchedule::lr_at(long step) const {
  ZERO_CHECK(step >= 1, lr_schedule_type_name(config_.type) << ": steps start at 1, got " << step);
  const double max_lr = config_.max_lr;
  if (config_.type == LrScheduleType::kConstant) return config_.max_lr;

  const double min_lr = config_.min_lr;
  // DeepSpeed raises warmup_num_steps to at least 2: log(W) must not be 0.
  const long warmup = config_.warmup_steps > 0 ? std::max(2L, config_.warmup_steps) : 0;
  // DeepSpeed's last_batch_iteration: 0 on the first step.
  const long iteration = step - 1;
  if (iteration < warmup) {
    const double gamma =
        config_.warmup_type == LrWarmupType::kLog
            ? std::log(static_cast<double>(iteration + 1)) / std::log(static_cast<double>(warmup))
            : static_cast<double>(iteration) / static_cast<double>(warmup);
    return static_cast<float>(min_lr + (max_lr - min_lr) * gamma);
  }
  if (config_.type == LrScheduleType::kWarmup) return config_.max_lr;

  // Steps after warm-up, over the length of the decay (T <= W leaves no decay at all, so the
  // schedule drops straight to its floor).
  const long decay_length = config_.total_steps - warmup;
  if (config_.type == LrScheduleType::kWarmupLinearDecay) {
    const double remaining = static_cast<double>(config_.total_steps - iteration) /
                             static_cast<double>(decay_length > 0 ? decay_length : 1);
    return static_cast<float>(min_lr + (max_lr - min_lr) * std::fmax(0.0, remaining));
  }
  const double progress =
      decay_length > 0
          ? std::fmin(1.0, static_cast<double>(step - warmup) / static_cast<double>(decay_length))
          : 1.0;
  const double floor_ratio = config_.cos_min_ratio;
  const double cosine = 0.5 * (1.0 + std::cos(kPi * progress));
  return static_cast<float>(max_lr * (floor_ratio + (1.0 - floor_ratio) * cosine));
}

}  // namespace zero
