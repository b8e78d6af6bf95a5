// Optimizer: validates hyperparameters once, turns (step, lr) into the per-step constants of
// optimizer_math.h and hands each shard to the fused CPU kernel. The arrays belong to the
// caller, so one Optimizer serves every shard (and every piece of a shard) of a rank.
#include "zero/optimizer/optimizer.h"

#include <cmath>

#include "zero/core/check.h"
#include "zero/kernels/optimizer_math.h"
#if ZERO_HAVE_CUDA
#include "zero/kernels/cuda_kernels.h"
#endif

namespace zero {

namespace {

// NaN fails both comparisons, so it is rejected as well. The kernels run in fp32, where a
// value just below 1 may round to 1 and zero the bias correction 1 - beta^t.
void check_in_unit_interval(double value, const char* name) {
  ZERO_CHECK(
      value >= 0.0 && static_cast<float>(value) < 1.0f,
      "optimizer: " << name << " must be in [0, 1) (also after rounding to fp32), got " << value);
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config) : config_(config) {
  ZERO_CHECK(config.type == OptimizerType::kAdamW || config.type == OptimizerType::kAdam ||
                 config.type == OptimizerType::kSgd,
             "optimizer: unknown type " << static_cast<int>(config.type));
  ZERO_CHECK(config.lr >= 0.0f && std::isfinite(config.lr),
             "optimizer: lr must be finite and >= 0, got " << config.lr);
  ZERO_CHECK(config.weight_decay >= 0.0f && std::isfinite(config.weight_decay),
             "optimizer: weight_decay must be finite and >= 0, got " << config.weight_decay);
  check_in_unit_interval(config.beta1, "beta1");
  check_in_unit_interval(config.beta2, "beta2");
  ZERO_CHECK(config.eps > 0.0f && std::isfinite(config.eps),
             "optimizer: eps must be finite and > 0, got " << config.eps);
  check_in_unit_interval(config.momentum, "momentum");
}

int Optimizer::state_count() const {
  if (config_.type == OptimizerType::kSgd) return config_.momentum != 0.0f ? 1 : 0;
  return 2;
}

void Optimizer::begin_step(float lr) {
  ZERO_CHECK(lr >= 0.0f && std::isfinite(lr),
             "optimizer: step lr must be finite and >= 0, got " << lr);
  ++step_;
  lr_ = lr;
}

void Optimizer::check_update(const ShardState& shard, const void* grad) const {
  const char* name = optimizer_type_name(config_.type);
  // Bias corrections divide by 1 - beta^t, which is 0 at t = 0.
  ZERO_CHECK(step_ >= 1, name << ": apply() before begin_step() (step counter is " << step_ << ")");
  ZERO_CHECK(shard.master != nullptr, name << ": shard has no master array");
  ZERO_CHECK(grad != nullptr, name << ": gradient pointer is null");
  for (int i = 0; i < state_count(); ++i) {
    ZERO_CHECK(shard.state[i] != nullptr,
               name << " needs " << state_count() << " state arrays, state[" << i << "] is null");
  }
}

float Optimizer::decay_of(const std::optional<float>& weight_decay) const {
  if (!weight_decay) return config_.weight_decay;
  ZERO_CHECK(*weight_decay >= 0.0f && std::isfinite(*weight_decay),
             "optimizer: a shard's weight_decay must be finite and >= 0, got " << *weight_decay);
  return *weight_decay;
}

SgdStepConstants Optimizer::sgd_constants(float weight_decay) const {
  SgdStepConstants c;
  c.lr = lr_;
  c.momentum = config_.momentum;
  c.weight_decay = weight_decay;
  // PyTorch fills the momentum buffer with the first gradient instead of decaying zeros.
  c.first_step = step_ == 1;
  return c;
}

AdamWStepConstants Optimizer::adamw_constants(float weight_decay) const {
  const bool decoupled = config_.type == OptimizerType::kAdamW;
  return adamw_step_constants(lr_, config_.beta1, config_.beta2, config_.eps, weight_decay, step_,
                              decoupled);
}

void Optimizer::apply(const ShardState& shard, const void* grad, DType grad_dtype, float grad_scale,
                      void* param_out, DType param_dtype, const kernels::KernelOptions& opt) const {
  apply(ShardUpdate{shard, grad, param_out, std::nullopt}, grad_dtype, grad_scale, param_dtype,
        opt);
}

void Optimizer::apply(const ShardUpdate& u, DType grad_dtype, float grad_scale, DType param_dtype,
                      const kernels::KernelOptions& opt) const {
  check_update(u.shard, u.grad);
  const float decay = decay_of(u.weight_decay);
  const ShardState& shard = u.shard;
  if (config_.type == OptimizerType::kSgd) {
    kernels::fused_sgd(shard.master, shard.state[0], u.grad, grad_dtype, grad_scale, u.param_out,
                       param_dtype, shard.n, sgd_constants(decay), opt);
    return;
  }
  kernels::fused_adamw(shard.master, shard.state[0], shard.state[1], u.grad, grad_dtype, grad_scale,
                       u.param_out, param_dtype, shard.n, adamw_constants(decay), opt);
}

#if ZERO_HAVE_CUDA
void Optimizer::apply_cuda(const std::vector<ShardUpdate>& shards, DType grad_dtype,
                           float grad_scale, DType param_dtype, CUstream_st* stream) const {
  for (const ShardUpdate& u : shards) check_update(u.shard, u.grad);
  // The step's constants hold the decay: one launch per run of shards that share it.
  for (size_t first = 0; first < shards.size();) {
    const float decay = decay_of(shards[first].weight_decay);
    size_t end = first + 1;
    while (end < shards.size() && decay_of(shards[end].weight_decay) == decay) ++end;
    if (config_.type == OptimizerType::kSgd) {
      std::vector<kernels::cuda::SgdTensor> tensors;
      for (size_t i = first; i < end; ++i) {
        const ShardUpdate& u = shards[i];
        tensors.push_back({u.shard.master, u.shard.state[0], u.grad, u.param_out, u.shard.n});
      }
      kernels::cuda::fused_sgd(tensors.data(), tensors.size(), grad_dtype, param_dtype, grad_scale,
                               sgd_constants(decay), {}, stream);
    } else {
      std::vector<kernels::cuda::AdamWTensor> tensors;
      for (size_t i = first; i < end; ++i) {
        const ShardUpdate& u = shards[i];
        tensors.push_back(
            {u.shard.master, u.shard.state[0], u.shard.state[1], u.grad, u.param_out, u.shard.n});
      }
      kernels::cuda::fused_adamw(tensors.data(), tensors.size(), grad_dtype, param_dtype,
                                 grad_scale, adamw_constants(decay), {}, stream);
    }
    first = end;
  }
}
#endif

}  // namespace zero
