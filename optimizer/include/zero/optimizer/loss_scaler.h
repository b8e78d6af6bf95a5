// Loss scaling for fp16 training, with DeepSpeed's meaning and defaults. The loss is multiplied
// by scale() before backward, so small gradients survive fp16; the optimizer divides it back
// out. Dynamic scaling: a step whose gradients overflowed is skipped, and the scale halves once
// `hysteresis` overflows have been seen (the first hysteresis - 1 only use up the allowance); it
// doubles after `scale_window` steps in a row without an overflow. A static scale
// (static_scale > 0) never changes and never skips.
#pragma once

namespace zero {

struct LossScalerConfig {
  float static_scale = 0.0f;     // fp16.loss_scale: > 0 fixes the scale, 0 = dynamic
  int initial_scale_power = 16;  // fp16.initial_scale_power: start at 2^power
  int scale_window = 1000;       // fp16.loss_scale_window
  int hysteresis = 2;            // fp16.hysteresis
  float min_scale = 1.0f;        // fp16.min_loss_scale
};

class LossScaler {
 public:
  // Throws zero::Error for a negative static scale, a window or hysteresis below 1, or a
  // minimum scale that is not positive.
  explicit LossScaler(const LossScalerConfig& config);

  float scale() const { return scale_; }
  bool dynamic() const { return config_.static_scale <= 0.0f; }

  // Reports whether this step's gradients overflowed (anywhere, on any rank) and updates the
  // scale. Returns true when the step must be skipped. An overflow at the minimum scale throws
  // zero::Error: lowering is no longer possible and every later step would be skipped too.
  bool update(bool overflow);

  // Checkpoint state: the scale, the hysteresis left, and steps since the last overflow.
  struct State {
    float scale;
    int hysteresis_left;
    long clean_steps;
  };
  State state() const { return State{scale_, hysteresis_left_, clean_steps_}; }
  void set_state(const State& state);

 private:
  LossScalerConfig config_;
  float scale_;
  int hysteresis_left_;
  long clean_steps_ = 0;  // steps since the last overflow (or the start)
};

}  // namespace zero
