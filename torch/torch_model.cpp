#include "zero/torch/torch_model.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <map>
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

torch::ScalarType torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return torch::kFloat32;
    case DType::kBFloat16:
      return torch::kBFloat16;
    case DType::kFloat16:
      return torch::kFloat16;
  }
  ZERO_FAIL("no LibTorch dtype for working dtype " << dtype_name(dtype));
}

c10::DataPtr host_pointer(void* data) {
  return c10::DataPtr(data, c10::Device(c10::DeviceType::CPU));
}

std::vector<TorchUnit> children_of(torch::nn::Sequential sequential) {
  std::vector<TorchUnit> units;
  const auto children = sequential->named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    units.push_back({children[i].key(), [sequential, i](const torch::Tensor& x) mutable {
                       return (sequential->begin() + static_cast<std::ptrdiff_t>(i))->forward(x);
                     }});
  }
  return units;
}

}  // namespace

namespace detail {

// The autograd functions at the model's seams, run by autograd during loss.backward().
struct TorchModelAutograd {
  // An identity in forward whose backward first calls `Hook` of the model with an index (a
  // unit or a module), so the model learns where autograd has got to.
  template <void (TorchModel::*Hook)(int)>
  struct OnBackward : torch::autograd::Function<OnBackward<Hook>> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                 int64_t model, int64_t index) {
      ctx->saved_data["model"] = model;
      ctx->saved_data["index"] = index;
      return x;
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
      TorchModel* model = reinterpret_cast<TorchModel*>(ctx->saved_data["model"].toInt());
      (model->*Hook)(static_cast<int>(ctx->saved_data["index"].toInt()));
      return {grads[0], torch::Tensor(), torch::Tensor()};
    }
  };

  // At a stage-3 unit's output: its backward runs before any of the unit's own backward and
  // gathers the unit's parameters again (DeepSpeed's pre-backward hook).
  using GatherBeforeBackward = OnBackward<&TorchModel::before_unit_backward>;
  // At the output of a stage-3 unit that ties to parameters of other units: gathers those
  // units before the unit's own backward, held until ReleaseTiedAfterBackward.
  using GatherTiedBeforeBackward = OnBackward<&TorchModel::hold_tied>;
  // At the input of such a unit: the gradient reaching it means the unit's backward, which read
  // the tied parameters, is done; the units held for them are released.
  using ReleaseTiedAfterBackward = OnBackward<&TorchModel::let_go_tied>;

  // At a 16-bit model's output: the output in fp32; backward multiplies the incoming gradient
  // by the loss scale in fp32 and then rounds it to the working dtype, so small gradients
  // survive the rounding (scaling the loss does the same, since backward is linear in it).
  struct ScaledOutput : torch::autograd::Function<ScaledOutput> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                 int64_t model) {
      ctx->saved_data["model"] = model;
      ctx->saved_data["dtype"] = static_cast<int64_t>(x.scalar_type());
      return x.to(torch::kFloat32);
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
      TorchModel* model = reinterpret_cast<TorchModel*>(ctx->saved_data["model"].toInt());
      const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
      const float scale = model->engine().loss_scale();
      torch::Tensor grad = grads[0].to(torch::kFloat32);
      if (scale != 1.0f) grad = grad * scale;
      return {grad.to(dtype), torch::Tensor()};
    }
  };
};

}  // namespace detail

TorchModel::TorchModel(Communicator& comm, torch::nn::Sequential module, const EngineConfig& config,
                       const TorchWeightDecay& weight_decay)
    : TorchModel(comm, module.ptr(), children_of(module), config, weight_decay) {}

TorchModel::TorchModel(Communicator& comm, std::shared_ptr<torch::nn::Module> root,
                       std::vector<TorchUnit> units, const EngineConfig& config,
                       const TorchWeightDecay& weight_decay)
    : root_(std::move(root)), units_(std::move(units)) {
  ZERO_CHECK(root_ != nullptr, "TorchModel: the module is null");
  ZERO_CHECK(!config.device.is_cuda(), "TorchModel supports the CPU path only so far");
  ZERO_CHECK(config.stage != 3 || config.persistence_threshold == 0,
             "TorchModel does not support stage3_param_persistence_threshold yet (got "
                 << config.persistence_threshold << "); set it to 0");
  register_parameters(comm, config, weight_decay);
}

// Registers every unit's parameters under the root's names, loads rank 0's values into the
// engine and hooks each trainable parameter's gradient accumulator.
void TorchModel::register_parameters(Communicator& comm, const EngineConfig& config,
                                     const TorchWeightDecay& weight_decay) {
  const auto root_params = root_->named_parameters(/*recurse=*/true);
  std::map<const c10::TensorImpl*, std::string> name_of;  // every parameter of the root
  for (const auto& named : root_params) {
    name_of.emplace(named.value().unsafeGetTensorImpl(), named.key());
  }
  std::map<std::string, std::shared_ptr<torch::nn::Module>> modules;
  for (const auto& named : root_->named_modules("", /*include_self=*/false)) {
    modules.emplace(named.key(), named.value());
  }
  std::map<const c10::TensorImpl*, size_t> unit_of;  // parameter -> the unit that declared it
  std::map<const c10::TensorImpl*, int> index_of;    // parameter -> its registration index
  std::map<std::string, int> index_by_name;
  std::vector<std::vector<int>> tied_params(units_.size());
  std::vector<ParamDecl> decls;
  for (size_t m = 0; m < units_.size(); ++m) {
    const auto found = modules.find(units_[m].name);
    ZERO_CHECK(found != modules.end(),
               "TorchModel: unit '" << units_[m].name << "' is not a submodule of the module");
    ZERO_CHECK(units_[m].forward != nullptr,
               "TorchModel: unit '" << units_[m].name << "' has no forward");
    for (const std::string& tied_name : units_[m].tied) {
      const auto tied = index_by_name.find(tied_name);
      ZERO_CHECK(tied != index_by_name.end(), "TorchModel: unit '"
                                                  << units_[m].name << "' ties to '" << tied_name
                                                  << "', which no earlier unit has");
      std::vector<int>& ties = tied_params[m];
      ZERO_CHECK(std::find(ties.begin(), ties.end(), tied->second) == ties.end(),
                 "TorchModel: unit '" << units_[m].name << "' ties to '" << tied_name << "' twice");
      ties.push_back(tied->second);
    }
    for (const auto& named : found->second->named_parameters(/*recurse=*/true)) {
      const torch::Tensor& param = named.value();
      const c10::TensorImpl* impl = param.unsafeGetTensorImpl();
      const std::string name = name_of.at(impl);
      const auto [first, inserted] = unit_of.emplace(impl, m);
      if (!inserted && first->second != m) {
        const std::vector<int>& ties = tied_params[m];
        if (std::find(ties.begin(), ties.end(), index_of.at(impl)) != ties.end()) continue;
      }
      ZERO_CHECK(inserted, "TorchModel: parameter '"
                               << name << "' belongs to unit '" << units_[first->second].name
                               << "' and to unit '" << units_[m].name
                               << "'; a parameter (or a child) is used by one unit only, unless "
                                  "the later unit declares the tie (TorchUnit::tied)");
      index_of.emplace(impl, static_cast<int>(params_.size()));
      index_by_name.emplace(name, static_cast<int>(params_.size()));
      ZERO_CHECK(param.scalar_type() == torch::kFloat32 && param.device().is_cpu(),
                 "parameter '" << name << "' must be an fp32 CPU tensor");
      ParamDecl decl;
      decl.spec.name = name;
      decl.spec.shape = std::vector<int64_t>(param.sizes().begin(), param.sizes().end());
      decl.spec.module = static_cast<int>(m);
      decl.init = ParamInit{InitKind::kZeros, 0.0f};
      decl.trainable = param.requires_grad();
      if (weight_decay) decl.weight_decay = weight_decay(name, param);
      decls.push_back(std::move(decl));
      params_.push_back(param);
    }
  }
  for (const auto& named : root_params) {
    ZERO_CHECK(unit_of.count(named.value().unsafeGetTensorImpl()) == 1,
               "TorchModel: parameter '" << named.key() << "' belongs to no unit");
  }
  for (const std::vector<int>& ties : tied_params) {
    for (int p : ties) decls[static_cast<size_t>(p)].spec.tied = true;
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
  // The values go in as the engine's training state (the fp32 master weights of this rank's
  // part of each unit); state_loaded() then writes and gathers the working parameters.
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

  const size_t num_units = layout.units().size();
  due_.assign(num_units, 0);
  ready_.assign(num_units, 0);
  gathered_for_backward_.assign(num_units, false);
  tied_holds_.assign(num_units, 0);
  tied_units_.resize(units_.size());
  for (size_t m = 0; m < units_.size(); ++m) {
    for (int p : tied_params[m]) {
      const int owner = layout.params()[p].unit;
      std::vector<int>& owners = tied_units_[m];
      if (owner == layout.unit_of_module(static_cast<int>(m)) ||
          std::find(owners.begin(), owners.end(), owner) != owners.end()) {
        continue;
      }
      owners.push_back(owner);
    }
  }
  arrived_.assign(params_.size(), false);
  released_ = torch::empty({0}, torch::TensorOptions().dtype(torch_dtype(config.dtype)));
  for (const ParamPlacement& pl : layout.params()) {
    storages_.emplace_back(c10::Storage::use_byte_size_t(), pl.numel * dtype_size(config.dtype),
                           host_pointer(nullptr));
  }
  // The accumulators are made while the parameters are bound to their full working-dtype
  // views: autograd casts each gradient to the dtype and shape it sees here.
  for (size_t u = 0; u < num_units; ++u) {
    engine_->gather(static_cast<int>(u));
    bind_unit(static_cast<int>(u), /*wrapping=*/true);
    for (int p : layout.units()[u].params) {
      if (!layout.params()[p].trainable) continue;
      ++due_[u];
      std::shared_ptr<torch::autograd::Node> accumulator =
          torch::autograd::impl::grad_accumulator(params_[p]);
      accumulator->add_pre_hook(
          std::make_unique<BeforeAccumulate>([this, p] { before_accumulate(p); }));
      accumulator->add_post_hook(std::make_unique<AfterAccumulate>([this, p] { accumulated(p); }));
      accumulators_.push_back(std::move(accumulator));
    }
    if (config.stage == 3) {
      unbind_unit(static_cast<int>(u));
      engine_->release(static_cast<int>(u));
    }
  }
  pending_ = due_;
  if (config.stage == 3 && num_units > 0) engine_->prefetch(0);
}

// The module keeps the values in storage of its own once the engine's buffers are gone. The
// hooks go with the accumulators, which only this object and live graphs hold.
TorchModel::~TorchModel() {
  torch::NoGradGuard no_grad;
  const bool collective = engine_->config().stage == 3 || engine_->dtype() != DType::kFloat32;
  if (collective && std::uncaught_exceptions() > 0) {
    for (torch::Tensor& param : params_) param.set_data(torch::empty({0}, torch::kFloat32));
  } else if (collective) {
    const std::vector<std::vector<float>> master = engine_->gather_full_master();
    for (size_t p = 0; p < params_.size(); ++p) {
      const std::vector<int64_t>& shape = engine_->layout().params()[p].shape;
      params_[p].set_data(torch::tensor(master[p]).reshape(shape));
    }
  } else {
    for (torch::Tensor& param : params_) param.set_data(param.detach().clone());
  }
  for (torch::Tensor& param : params_) param.mutable_grad() = torch::Tensor();
}

// Points the unit's parameters at its gathered buffer. Each parameter's storage is its own and
// lasts the run: a view made of it in forward (a weight's transpose that autograd saved) reads
// whatever buffer the storage points at, which is the right one again after the gather before
// backward.
// A parameter whose data is neither ours nor the released placeholder was replaced by the user
// (set_data, a dtype change): an error, since the engine's values would silently win.
void TorchModel::bind_unit(int unit, bool wrapping) {
  torch::NoGradGuard no_grad;
  const torch::ScalarType dtype = torch_dtype(engine_->dtype());
  for (int p : engine_->layout().units()[unit].params) {
    storages_[p].set_data_ptr_noswap(host_pointer(engine_->param(p)));
    if (params_[p].storage().is_alias_of(storages_[p])) continue;
    ZERO_CHECK(wrapping || params_[p].storage().is_alias_of(released_.storage()),
               "TorchModel: parameter '"
                   << engine_->layout().params()[p].name << "' was replaced after wrapping (now "
                   << params_[p].sizes() << ", " << params_[p].scalar_type()
                   << "); the engine owns the parameters: change the module before wrapping it");
    torch::Tensor view = torch::empty({0}, torch::TensorOptions().dtype(dtype));
    view.set_(storages_[p], 0, engine_->layout().params()[p].shape, {});
    params_[p].set_data(view);
  }
}

// Stage 3, before a release: the parameters become empty, so the module holds no full copy and
// a use outside forward() is a shape error, not a read of a buffer the engine reuses.
void TorchModel::unbind_unit(int unit) {
  torch::NoGradGuard no_grad;
  for (int p : engine_->layout().units()[unit].params) {
    params_[p].set_data(released_);
    storages_[p].set_data_ptr_noswap(host_pointer(nullptr));
  }
}

// Starts the all-gathers of the units after `unit` in `direction`: at least the next one, and
// more while they fit in stage3_prefetch_bucket_size elements (as ZeroModel does).
void TorchModel::prefetch_after(int unit, int direction) {
  const Layout& layout = engine_->layout();
  const int num_units = static_cast<int>(layout.units().size());
  size_t ahead = 0;
  for (int v = unit + direction; v >= 0 && v < num_units; v += direction) {
    ahead += layout.units()[v].numel;
    if (v != unit + direction && ahead > engine_->config().prefetch_elements) break;
    engine_->prefetch(v);
  }
}

// Units gathered for a backward and not released by their gradients (frozen units, a backward
// that did not reach them, a tied user whose input needs no gradient) are released before the
// next forward or step.
void TorchModel::release_left_over() {
  for (size_t u = 0; u < gathered_for_backward_.size(); ++u) {
    if (!gathered_for_backward_[u] && tied_holds_[u] == 0) continue;
    gathered_for_backward_[u] = false;
    tied_holds_[u] = 0;
    unbind_unit(static_cast<int>(u));
    engine_->release(static_cast<int>(u));
  }
}

// Stage 3, forward: gathers and binds the units `module` ties to; returns those it gathered
// (one gathered already, by a prefetch, stays so).
std::vector<int> TorchModel::gather_tied(int module) {
  std::vector<int> gathered;
  for (int owner : tied_units_[module]) {
    if (!engine_->is_gathered(owner)) gathered.push_back(owner);
    engine_->gather(owner);
    bind_unit(owner, /*wrapping=*/false);
  }
  return gathered;
}

void TorchModel::release_units(const std::vector<int>& units) {
  for (int u : units) {
    unbind_unit(u);
    engine_->release(u);
  }
}

// Stage 3, backward: the units `module` ties to stay gathered until its backward is done. A unit
// gathered for its own backward meanwhile is released by whichever lets go of it last.
void TorchModel::hold_tied(int module) {
  for (int owner : tied_units_[module]) {
    if (tied_holds_[owner]++ > 0 || gathered_for_backward_[owner]) continue;
    engine_->gather(owner);
    bind_unit(owner, /*wrapping=*/false);
  }
}

void TorchModel::let_go_tied(int module) {
  for (int owner : tied_units_[module]) {
    if (tied_holds_[owner] == 0 || --tied_holds_[owner] > 0 || gathered_for_backward_[owner]) {
      continue;
    }
    unbind_unit(owner);
    engine_->release(owner);
  }
}

void TorchModel::before_unit_backward(int unit) {
  engine_->gather(unit);
  bind_unit(unit, /*wrapping=*/false);
  gathered_for_backward_[unit] = true;
  prefetch_after(unit, -1);
}

// Autograd adds into .grad in place when it is defined (backward runs without grad mode), so
// pointing it at the engine's buffer makes the accumulation the engine's, with no copy. At
// stages 2-3 the buffer is a pooled bucket acquired on first use, hence here and not earlier.
void TorchModel::before_accumulate(int param) {
  void* grad = engine_->grad(param);
  torch::Tensor& current = params_[param].mutable_grad();
  if (current.defined() && current.data_ptr() == grad) return;
  current = torch::from_blob(grad, engine_->layout().params()[param].shape,
                             torch::TensorOptions().dtype(torch_dtype(engine_->dtype())));
}

// The last of a unit's gradients in this backward: hand the unit to the engine, which reduces
// it behind the rest of backward. The buffer then belongs to the reduction (and at stages 2-3
// goes back to the pool), so .grad lets go of it; at stage 3 the parameters are released too.
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
  if (gathered_for_backward_[unit]) {
    gathered_for_backward_[unit] = false;
    if (tied_holds_[unit] > 0) return;  // a tied user's backward still reads it
    unbind_unit(unit);
    engine_->release(unit);
  }
}

// A parameter registered after wrapping would be used by forward but never trained.
void TorchModel::check_no_parameter_added() const {
  const auto named = root_->named_parameters(/*recurse=*/true);
  if (named.size() == params_.size()) return;
  for (const auto& param : named) {
    const bool registered =
        std::any_of(params_.begin(), params_.end(), [&](const torch::Tensor& t) {
          return t.unsafeGetTensorImpl() == param.value().unsafeGetTensorImpl();
        });
    ZERO_CHECK(registered, "TorchModel: parameter '"
                               << param.key()
                               << "' was added to the module after wrapping; wrap the module "
                                  "once it is complete");
  }
}

torch::Tensor TorchModel::forward(const torch::Tensor& input) {
  check_no_parameter_added();
  release_left_over();
  const Layout& layout = engine_->layout();
  const bool stage3 = engine_->config().stage == 3;
  const torch::ScalarType dtype = torch_dtype(engine_->dtype());
  const int64_t self = reinterpret_cast<int64_t>(this);
  torch::Tensor x = input.is_floating_point() ? input.to(dtype) : input;
  for (int m = 0; m < static_cast<int>(units_.size()); ++m) {
    const int u = layout.unit_of_module(m);
    const bool first_of_unit = u >= 0 && layout.units()[u].first_module == m;
    const bool last_of_unit = u >= 0 && layout.units()[u].last_module == m;
    if (first_of_unit) {
      engine_->gather(u);
      bind_unit(u, /*wrapping=*/false);
      if (stage3) prefetch_after(u, +1);
    }
    const bool ties = stage3 && !tied_units_[m].empty();
    std::vector<int> tied;
    if (ties) {
      if (x.requires_grad()) {
        x = detail::TorchModelAutograd::ReleaseTiedAfterBackward::apply(x, self, int64_t{m});
      }
      tied = gather_tied(m);
    }
    try {
      x = units_[m].forward(x);
    } catch (const c10::Error& e) {
      if (!stage3) throw;
      // The likely cause at stage 3 only: a parameter of another unit used without the tie.
      ZERO_FAIL("TorchModel: unit '" << units_[m].name
                                     << "' failed at stage 3: " << e.what_without_backtrace()
                                     << " (while a unit runs, the parameters of other units are "
                                        "empty tensors: declare those it uses in TorchUnit::tied)");
    }
    if (ties) {
      x = detail::TorchModelAutograd::GatherTiedBeforeBackward::apply(x, self, int64_t{m});
      release_units(tied);
      // The tied units may have taken the buffers the next units' prefetch wanted.
      if (!tied.empty() && u >= 0) prefetch_after(u, +1);
    }
    if (!last_of_unit || !stage3) continue;
    x = detail::TorchModelAutograd::GatherBeforeBackward::apply(x, self, int64_t{u});
    unbind_unit(u);
    engine_->release(u);
    // Backward starts with the last unit: start its gather now, behind the rest of forward.
    if (u == static_cast<int>(layout.units().size()) - 1) engine_->prefetch(u);
  }
  if (dtype == torch::kFloat32) return x;
  return detail::TorchModelAutograd::ScaledOutput::apply(x, self);
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
  release_left_over();
  const StepStats stats = engine_->step();
  if (engine_->config().stage == 3) {
    if (!layout.units().empty()) engine_->prefetch(0);
    return stats;
  }
  // Stages 1-2 all-gather the updated shards after the step: wait for them, so the module's
  // parameters hold the new values when step() returns, as after an optimizer's step.
  for (size_t u = 0; u < layout.units().size(); ++u) engine_->gather(static_cast<int>(u));
  return stats;
}

}  // namespace zero
