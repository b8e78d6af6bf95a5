#include "zero/torch/torch_model.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "zero/core/check.h"

namespace zero {

namespace {

// Autograd calls these around the accumulation of a parameter's gradient: before, to point
// .grad at the engine's buffer (so autograd adds into it in place), and after, to count it.
class BeforeAccumulate : public torch::autograd::FunctionPreHook {
 public:
  explicit BeforeAccumulate(std::function<void()> call) : call_(std::move(call)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    call_();
    return grads;
  }

 private:
  std::function<void()> call_;
};

class AfterAccumulate : public torch::autograd::FunctionPostHook {
 public:
  explicit AfterAccumulate(std::function<void()> call) : call_(std::move(call)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    call_();
    return outputs;
  }

 private:
  std::function<void()> call_;
};

std::vector<int64_t> shape_of(const torch::Tensor& tensor) {
  return std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end());
}

}  // namespace

TorchModel::TorchModel(Communicator& comm, torch::nn::Sequential module, const EngineConfig& config)
    : module_(std::move(module)) {
  ZERO_CHECK(config.stage >= 0 && config.stage <= 2,
             "TorchModel supports stages 0-2 so far; got stage " << config.stage);
  ZERO_CHECK(config.dtype == DType::kFloat32,
             "TorchModel supports the fp32 working dtype only so far");
  ZERO_CHECK(!config.device.is_cuda(), "TorchModel supports the CPU path only so far");
  std::vector<ParamDecl> decls;
  const auto children = module_->named_children();
  for (size_t m = 0; m < children.size(); ++m) {
    for (const auto& named : children[m].value()->named_parameters(/*recurse=*/true)) {
      const torch::Tensor& param = named.value();
      const std::string name = children[m].key() + "." + named.key();
      ZERO_CHECK(param.scalar_type() == torch::kFloat32 && param.device().is_cpu(),
                 "parameter '" << name << "' must be an fp32 CPU tensor");
      ParamDecl decl;
      decl.spec.name = name;
      decl.spec.shape = shape_of(param);
      decl.spec.module = static_cast<int>(m);
      decl.init = ParamInit{InitKind::kZeros, 0.0f};
      decl.trainable = param.requires_grad();
      decls.push_back(std::move(decl));
      params_.push_back(param);
    }
  }
  // Every rank starts from rank 0's values, as DDP and FSDP broadcast them at wrapping.
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& param : params_) {
    values.push_back(param.detach().contiguous().clone());
    comm.broadcast(values.back().data_ptr(), static_cast<size_t>(values.back().numel()),
                   DType::kFloat32, 0)
        .wait();
  }
  engine_ = std::make_unique<Engine>(comm, decls, config);
  const Layout& layout = engine_->layout();
  // The values go in as the engine's training state (the master weights of this rank's part
  // of each unit); state_loaded() then writes and gathers the working parameters from them.
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Engine::StateView view = engine_->state_view(static_cast<int>(u));
    for (int p : layout.units()[u].params) {
      const ParamPlacement& pl = layout.params()[p];
      const size_t begin = std::max(pl.offset, view.begin);
      const size_t end = std::min(pl.offset + pl.numel, view.end);
      if (begin >= end) continue;
      const float* from = values[p].data_ptr<float>() + (begin - pl.offset);
      std::copy(from, from + (end - begin), view.master + (begin - view.begin));
    }
  }
  engine_->state_loaded();

  due_.assign(layout.units().size(), 0);
  ready_.assign(layout.units().size(), 0);
  arrived_.assign(params_.size(), false);
  for (size_t p = 0; p < params_.size(); ++p) {
    const ParamPlacement& pl = layout.params()[p];
    engine_->gather(pl.unit);
    if (!pl.trainable) continue;
    ++due_[pl.unit];
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(params_[p]);
    const int index = static_cast<int>(p);
    accumulator->add_pre_hook(
        std::make_unique<BeforeAccumulate>([this, index] { before_accumulate(index); }));
    accumulator->add_post_hook(
        std::make_unique<AfterAccumulate>([this, index] { accumulated(index); }));
    accumulators_.push_back(std::move(accumulator));
  }
  pending_ = due_;
  bind_parameters();
}

// The engine's buffers go with it: the parameters get storage of their own. The hooks go with
// the accumulators, which only this object and live graphs hold.
TorchModel::~TorchModel() {
  torch::NoGradGuard no_grad;
  for (torch::Tensor& param : params_) {
    param.set_data(param.detach().clone());
    param.mutable_grad() = torch::Tensor();
  }
}

// Points each parameter's data at its place in the engine's gathered buffer (a no-op once it
// is there: at stages 0-2 the full parameters stay at one address for the whole run).
void TorchModel::bind_parameters() {
  torch::NoGradGuard no_grad;
  for (size_t p = 0; p < params_.size(); ++p) {
    void* data = engine_->param(static_cast<int>(p));
    if (params_[p].data_ptr() == data) continue;
    params_[p].set_data(torch::from_blob(data, params_[p].sizes(), torch::kFloat32));
  }
}

// Autograd adds into .grad in place when it is defined (backward runs without grad mode), so
// pointing it at the engine's buffer makes the accumulation the engine's, with no copy. At
// stage 2 the buffer is a pooled bucket acquired on first use, hence here and not earlier.
void TorchModel::before_accumulate(int param) {
  void* grad = engine_->grad(param);
  torch::Tensor& current = params_[param].mutable_grad();
  if (current.defined() && current.data_ptr() == grad) return;
  current = torch::from_blob(grad, params_[param].sizes(), torch::kFloat32);
}

// The last of a unit's gradients in this backward: hand the unit to the engine, which reduces
// it behind the rest of backward. The buffer then belongs to the reduction (and at stage 2
// goes back to the pool), so .grad lets go of it.
void TorchModel::accumulated(int param) {
  const int unit = engine_->layout().params()[param].unit;
  arrived_[param] = true;
  if (--pending_[unit] > 0) return;
  engine_->grads_ready(unit);
  ++ready_[unit];
  pending_[unit] = due_[unit];
  for (int p : engine_->layout().units()[unit].params) {
    arrived_[p] = false;
    params_[p].mutable_grad() = torch::Tensor();
  }
}

torch::Tensor TorchModel::forward(const torch::Tensor& input) {
  bind_parameters();
  torch::Tensor x = input;
  for (auto& child : *module_) x = child.forward(x);
  return x;
}

StepStats TorchModel::step() {
  const Layout& layout = engine_->layout();
  const int micro_batches = engine_->config().micro_batches;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    if (due_[u] == 0 || (ready_[u] == micro_batches && pending_[u] == due_[u])) continue;
    std::string missing;
    for (int p : layout.units()[u].params) {
      if (!arrived_[p]) missing += (missing.empty() ? "'" : ", '") + layout.params()[p].name + "'";
    }
    ZERO_FAIL("step() after " << ready_[u] << " complete backward(s) of unit " << u << " ("
                              << micro_batches << " micro-batches expected); no gradient yet for "
                              << missing << ": every trainable parameter must get a gradient in "
                              << "each backward");
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  const StepStats stats = engine_->step();
  // Stages 1-2 all-gather the updated shards after the step: wait for them, so the module's
  // parameters hold the new values when step() returns, as after an optimizer's step.
  for (size_t u = 0; u < layout.units().size(); ++u) engine_->gather(static_cast<int>(u));
  return stats;
}

}  // namespace zero
