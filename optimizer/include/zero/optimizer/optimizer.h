// Optimizers over one rank's flat fp32 shard. The optimizer owns hyperparameters and the step
// counter; the state arrays (master, moments) are owned by the caller (the engine allocates
// them through its tagged allocator), so the optimizer can be applied to any set of shards.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/core/dtype.h"
#include "zero/kernels/cpu_kernels.h"

struct CUstream_st;

namespace zero {

enum class OptimizerType { kAdamW, kAdam, kSgd };

// The text forms of the enums below (optimizer_names.cpp) have two spellings on purpose:
//   name  DeepSpeed's, in configs (any case) and messages: "AdamW", "Adam", "SGD";
//         "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", and "constant" for no scheduler.
//   key   the checkpoint manifest's (zero-checkpoint prints it too): "adamw", "adam", "sgd";
//         "constant", "warmup", "warmup_linear_decay", "warmup_cosine".
// A warm-up type has one: "log" or "linear". Each parse returns false, leaving *out as it
// was, on a text that is none of them.
const char* optimizer_type_name(OptimizerType type);
const char* optimizer_type_key(OptimizerType type);
bool parse_optimizer_type_name(const std::string& name, OptimizerType* out);  // any case
bool parse_optimizer_type_key(const std::string& key, OptimizerType* out);    // exact

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  float lr = 1e-3f;
  // Betas are double so that 1 - beta can be rounded once from the decimal value, as PyTorch
  // does: 1.0f - 0.999f is 0.00099998713, 1.3e-5 away from 0.001f.
  double beta1 = 0.9;
  double beta2 = 0.999;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // decoupled for AdamW; coupled (added to the gradient) for SGD
  float momentum = 0.0f;       // SGD only
};

// One shard's arrays, all of n elements. state_count() of them are optimizer state
// (AdamW: m and v; SGD with momentum: the momentum buffer; plain SGD: none).
struct ShardState {
  float* master = nullptr;
  float* state[2] = {nullptr, nullptr};
  size_t n = 0;
};

// One shard's part of a step: its arrays, its gradient, where its working copy goes (null:
// nowhere, the master is the working copy), and its own weight decay (a parameter group's;
// nullopt: the config's).
struct ShardUpdate {
  ShardState shard;
  const void* grad = nullptr;
  void* param_out = nullptr;
  std::optional<float> weight_decay = std::nullopt;
};

class Optimizer {
 public:
  // Throws zero::Error naming the first hyperparameter out of range.
  explicit Optimizer(const OptimizerConfig& config);

  // Number of fp32 state arrays per element (2 for Adam/AdamW, 1 for SGD with momentum, else 0).
  int state_count() const;

  // Starts a step: increments the step counter; every apply() until the next begin_step()
  // uses this step's constants (bias corrections) with learning rate lr.
  void begin_step(float lr);

  // Updates one shard with its gradient (grad_dtype, scaled by grad_scale); writes the
  // working copy to param_out (param_dtype) when param_out is non-null. Throws zero::Error
  // before the first begin_step() or when a pointer the update needs is null.
  void apply(const ShardState& shard, const void* grad, DType grad_dtype, float grad_scale,
             void* param_out, DType param_dtype, const kernels::KernelOptions& opt = {}) const;
  // The same, with the shard's own weight decay (ShardUpdate::weight_decay).
  void apply(const ShardUpdate& update, DType grad_dtype, float grad_scale, DType param_dtype,
             const kernels::KernelOptions& opt = {}) const;

#if ZERO_HAVE_CUDA
  // The same update of several shards in device memory, enqueued on `stream` (a cudaStream_t)
  // as multi-tensor launches (one per run of shards with the same weight decay); bitwise the
  // CPU result.
  void apply_cuda(const std::vector<ShardUpdate>& shards, DType grad_dtype, float grad_scale,
                  DType param_dtype, CUstream_st* stream) const;
#endif

  long step() const {
    return step_;
  }
  // Restores the counter (checkpoint resume).
  void set_step(long step) {
    step_ = step;
  }
  const OptimizerConfig& config() const {
    return config_;
  }

 private:
  void check_update(const ShardState& shard, const void* grad) const;
  float decay_of(const std::optional<float>& weight_decay) const;
  SgdStepConstants sgd_constants(float weight_decay) const;
  AdamWStepConstants adamw_constants(float weight_decay) const;

  OptimizerConfig config_;
  long step_ = 0;
  float lr_ = 0.0f;
};

// Learning-rate schedules with DeepSpeed's meanings (deepspeed.runtime.lr_schedules), written
// for 1-based steps: lr_at(s) is DeepSpeed's get_lr() at last_batch_iteration = s - 1, so the
// first step sees the schedule at index 0 as in PyTorch's schedulers. (DeepSpeed's engine steps
// its scheduler after the optimizer, so its own first step runs with the optimizer's base lr and
// step s >= 2 with index s - 2; we do not copy that offset.) With W = warmup_steps (raised to at
// least 2 as DeepSpeed does, which its log warm-up needs; 0 means no warm-up), i = s - 1 and
// T = total_steps, every warm-up rises by gamma from min_lr to max_lr during steps 1..W:
//   kLog (DeepSpeed's default warmup_type)  gamma = log(i + 1) / log(W)
//   kLinear                                 gamma = i / W
//   kConstant          lr = max_lr.
//   kWarmup            WarmupLR: lr = min_lr + (max_lr - min_lr) * gamma for s <= W, then
//                      max_lr from step W + 1 on.
//   kWarmupLinearDecay WarmupDecayLR: the same warm-up, then
//                      lr = min_lr + (max_lr - min_lr) * (T - s + 1) / (T - W), reaching min_lr
//                      at step T + 1 (DeepSpeed's iteration T) and staying there.
//   kWarmupCosine      WarmupCosineLR: the same warm-up, then
//                      lr = max_lr * (r + (1 - r) * (1 + cos(pi * (s - W) / (T - W))) / 2) with
//                      r = cos_min_ratio, reaching max_lr * r at step T and staying there (as
//                      DeepSpeed's clamped progress does).
// One extension: warmup_steps 0 means no warm-up (DeepSpeed rejects 0).
enum class LrScheduleType { kConstant, kWarmup, kWarmupLinearDecay, kWarmupCosine };
enum class LrWarmupType { kLog, kLinear };

const char* lr_schedule_type_name(LrScheduleType type);
const char* lr_schedule_type_key(LrScheduleType type);
bool parse_lr_schedule_type_name(const std::string& name, LrScheduleType* out);  // any case
bool parse_lr_schedule_type_key(const std::string& key, LrScheduleType* out);    // exact
const char* lr_warmup_type_name(LrWarmupType type);
bool parse_lr_warmup_type(const std::string& name, LrWarmupType* out);  // exact

struct LrScheduleConfig {
  LrScheduleType type = LrScheduleType::kConstant;
  float max_lr = 1e-3f;   // warmup_max_lr; for WarmupCosineLR the optimizer's lr
  float min_lr = 0.0f;    // warmup_min_lr (start of warm-up, end of linear decay); for
                          // WarmupCosineLR warmup_min_ratio * the optimizer's lr
  long warmup_steps = 0;  // warmup_num_steps
  LrWarmupType warmup_type = LrWarmupType::kLog;  // warmup_type, DeepSpeed's default "log"
  long total_steps = 0;                           // total_num_steps (decay schedules only)
  float cos_min_ratio = 1e-4f;  // WarmupCosineLR's floor as a fraction of max_lr (its default)
};

class LrSchedule {
 public:
  // Throws zero::Error naming the bad field.
  explicit LrSchedule(const LrScheduleConfig& config);
  // Learning rate of step `step` (1-based; step < 1 is an error).
  float lr_at(long step) const;
  const LrScheduleConfig& config() const { return config_; }

 private:
  LrScheduleConfig config_;
};

}  // namespace zero
