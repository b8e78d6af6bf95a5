// TorchModel: registering a module's parameters with the engine, pointing them at its buffers,
// the autograd hooks that tell the engine where backward has got to, forward() and step(). The
// full parameters (with_full_parameters, state_dict) are in torch_full_parameters.cpp.
#include "zero/torch/torch_model.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <set>
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

}  // namespace

std::vector<TorchUnit> units_of(const torch::nn::Sequential& sequential, const TorchTies& ties,
                                const std::string& prefix) {
  std::vector<TorchUnit> units;
  const auto children = sequential->named_children();
  for (const auto& tie : ties) {
    const bool known = std::any_of(children.begin(), children.end(),
                                   [&](const auto& child) { return child.key() == tie.first; });
    ZERO_CHECK(known, "units_of: the ties name child '" << tie.first
                                                        << "', which the Sequential does not have ("
                                                        << children.size() << " children)");
  }
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string& child = children[i].key();
    const auto tied = ties.find(child);
    units.push_back({prefix.empty() ? child : prefix + "." + child,
                     [held = torch::nn::Sequential(sequential), i](const torch::Tensor& x) mutable {
                       return (held->begin() + static_cast<std::ptrdiff_t>(i))->forward(x);
                     },
                     tied == ties.end() ? std::vector<std::string>() : tied->second});
  }
  return units;
}

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

  // At the output of a stage-3 unit's last module (or of a module without a unit that ties):
  // its backward runs before any of the module's own and gathers what the schedule says, the
  // unit again (DeepSpeed's pre-backward hook) and the units it ties to.
  using BeforeBackward = OnBackward<&TorchModel::before_module_backward>;
  // At the input of a stage-3 unit's first module that ties (or of such a module without a
  // unit): the gradient reaching it means the backward that read the tied parameters is done.
  using AfterBackward = OnBackward<&TorchModel::after_module_backward>;

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
    : TorchModel(comm, module, TorchTies(), config, weight_decay) {}

TorchModel::TorchModel(Communicator& comm, torch::nn::Sequential module, const TorchTies& ties,
                       const EngineConfig& config, const TorchWeightDecay& weight_decay)
    : TorchModel(comm, module.ptr(), units_of(module, ties), config, weight_decay) {}

TorchModel::TorchModel(Communicator& comm, std::shared_ptr<torch::nn::Module> root,
                       std::vector<TorchUnit> units, const EngineConfig& config,
                       const TorchWeightDecay& weight_decay)
    : root_(std::move(root)), units_(std::move(units)) {
  ZERO_CHECK(root_ != nullptr, "TorchModel: the module is null");
  ZERO_CHECK(!config.device.is_cuda(), "TorchModel supports the CPU path only so far");
  ZERO_CHECK(config.stage != 3 || config.schedule.persistence_threshold == 0,
             "TorchModel does not support stage3_param_persistence_threshold yet (got "
                 << config.schedule.persistence_threshold << "); set it to 0");
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
      ZERO_CHECK(inserted,
                 "TorchModel: parameter '"
                     << name << "' belongs to unit '" << units_[first->second].name
                     << "' and to unit '" << units_[m].name
                     << "'; a parameter (or a child) is used by one unit only, unless "
                        "the later unit declares the tie (TorchUnit::tied, or the ties of "
                        "the Sequential constructor)");
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
  std::vector<int> every_param(params_.size());
  for (size_t p = 0; p < params_.size(); ++p) every_param[p] = static_cast<int>(p);
  write_master(every_param, values);

  const size_t num_units = layout.units().size();
  due_.assign(num_units, 0);
  ready_.assign(num_units, 0);
  shaped_without_values_.assign(num_units, false);
  arrived_.assign(params_.size(), false);
  released_ = torch::empty({0}, torch::TensorOptions().dtype(torch_dtype(config.precision.dtype)));
  for (const ParamPlacement& pl : layout.params()) {
    storages_.emplace_back(c10::Storage::use_byte_size_t(),
                           pl.numel * dtype_size(config.precision.dtype), host_pointer(nullptr));
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
      accumulator_params_.emplace(accumulator.get(), p);
      accumulators_.push_back(std::move(accumulator));
    }
    if (config.stage == 3) {
      unbind_unit(static_cast<int>(u));
      engine_->release(static_cast<int>(u));
    }
  }
  pending_ = due_;
  // Until forward has seen a module's graph, its backward is taken to read its parameters.
  schedule_ = std::make_unique<UnitSchedule>(
      *engine_, tied_params, std::vector<bool>(units_.size(), true),
      UnitSchedule::Listener{[this](int unit) { bind_unit(unit, /*wrapping=*/false); },
                             [this](int unit) { unbind_unit(unit); }});
  // As after a step: the first unit's all-gather starts behind whatever comes before forward.
  if (config.stage == 3) schedule_->after_step();
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

// Stage 3, where the gradient reaches the module's output. A unit the schedule did not gather
// (its backward reads no values) still needs its parameters' shapes: autograd's saved
// variables are the parameters themselves, and an embedding's backward reads the weight's size.
void TorchModel::before_module_backward(int module) {
  if (schedule_->before_backward(module)) return;
  const int unit = engine_->layout().unit_of_module(module);
  for (int p : engine_->layout().units()[unit].params) shape_without_values(p);
  shaped_without_values_[unit] = true;
}

void TorchModel::after_module_backward(int module) {
  schedule_->after_backward(module);
}

// A released parameter takes its full shape over its storage, which holds no buffer.
void TorchModel::shape_without_values(int param) {
  if (!params_[param].storage().is_alias_of(released_.storage())) return;
  torch::NoGradGuard no_grad;
  torch::Tensor view = torch::empty({0}, released_.options());
  view.set_(storages_[param], 0, engine_->layout().params()[param].shape, {});
  params_[param].set_data(view);
}

// Whether the backward of what module's forward recorded (from `output` back to `input`) reads
// its own parameters' values. Each must reach the graph only through functions whose backward
// saves no tensor input of theirs or reads only its size (an addition's, an embedding's); a
// frozen parameter is not in the graph, so a module with one is taken to read it.
bool TorchModel::backward_reads_own_params(int module, const torch::Tensor& input,
                                           const torch::Tensor& output) const {
  const Layout& layout = engine_->layout();
  for (const ParamPlacement& pl : layout.params()) {
    if (pl.module == module && !pl.trainable) return true;
  }
  const auto reads_nothing = [](const std::string& name) {
    return name == "EmbeddingBackward0" || name == "AddBackward0" || name == "SubBackward0";
  };
  const torch::autograd::Node* boundary = input.grad_fn().get();
  std::vector<torch::autograd::Node*> stack = {output.grad_fn().get()};
  std::set<const torch::autograd::Node*> seen;
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (node == nullptr || node == boundary || !seen.insert(node).second) continue;
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      const auto param = accumulator_params_.find(edge.function.get());
      if (param == accumulator_params_.end()) {
        stack.push_back(edge.function.get());
      } else if (layout.params()[param->second].module == module && !reads_nothing(node->name())) {
        return true;
      }
    }
  }
  return false;
}

// Autograd adds into .grad in place when it is defined (backward runs without grad mode), so
// pointing it at the engine's buffer makes the accumulation the engine's, with no copy. At
// stages 2-3 the buffer is a pooled bucket acquired on first use, hence here and not earlier.
void TorchModel::before_accumulate(int param) {
  // Autograd compares the gradient's layout with the parameter's: a released one needs its shape.
  shape_without_values(param);
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
  schedule_->unit_backward_done(unit);
  if (engine_->config().stage == 3 && !engine_->is_gathered(unit)) {
    unbind_unit(unit);
    shaped_without_values_[unit] = false;
  }
}

// Releases what a backward left gathered (frozen units, a backward that did not reach a unit,
// a tied user whose input needs no gradient), and empties the parameters shaped for a backward
// without values that did not complete: before the next forward or step.
void TorchModel::release_left_over() {
  schedule_->release_left_over();
  for (size_t u = 0; u < shaped_without_values_.size(); ++u) {
    if (!shaped_without_values_[u]) continue;
    shaped_without_values_[u] = false;
    if (!engine_->is_gathered(static_cast<int>(u))) unbind_unit(static_cast<int>(u));
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
  // Only what the config converts is converted: fp32 to a 16-bit working dtype. Another
  // floating dtype would train silently on other values than the user's.
  ZERO_CHECK(
      !input.is_floating_point() || input.scalar_type() == torch::kFloat32 ||
          input.scalar_type() == dtype,
      "TorchModel: forward() got a "
          << input.scalar_type() << " input, but the module's parameters are Float"
          << (dtype == torch::kFloat32 ? std::string()
                                       : std::string(" (computed in ") + c10::toString(dtype) + ")")
          << "; convert the input to Float");
  torch::Tensor x = input.is_floating_point() ? input.to(dtype) : input;
  for (int m = 0; m < static_cast<int>(units_.size()); ++m) {
    const int u = layout.unit_of_module(m);
    const bool first_of_unit = u >= 0 && layout.units()[u].first_module == m;
    const bool last_of_unit = u >= 0 && layout.units()[u].last_module == m;
    const bool ties = !schedule_->tied_units(m).empty();
    schedule_->before_forward(m);
    if (stage3 && ties && (u < 0 || first_of_unit) && x.requires_grad()) {
      x = detail::TorchModelAutograd::AfterBackward::apply(x, self, int64_t{m});
    }
    const torch::Tensor module_input = x;
    try {
      x = units_[m].forward(x);
    } catch (const c10::Error& e) {
      if (!stage3) throw;
      // The likely cause at stage 3 only: a parameter of another unit used without the tie.
      ZERO_FAIL("TorchModel: unit '"
                << units_[m].name << "' failed at stage 3: " << e.what_without_backtrace()
                << " (while a unit runs, the parameters of other units are "
                   "empty tensors: declare those it uses in TorchUnit::tied, or in "
                   "the ties of the Sequential constructor)");
    }
    if (stage3 && u >= 0 && x.requires_grad()) {
      schedule_->set_backward_reads(m, backward_reads_own_params(m, module_input, x));
    }
    if (stage3 && (last_of_unit || (u < 0 && ties))) {
      x = detail::TorchModelAutograd::BeforeBackward::apply(x, self, int64_t{m});
    }
    schedule_->after_forward(m);
  }
  graph_since_step_ = graph_since_step_ || x.requires_grad();
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
  graph_since_step_ = false;
  release_left_over();
  const StepStats stats = engine_->step();
  schedule_->after_step();
  if (engine_->config().stage == 3) return stats;
  // Stages 1-2 all-gather the updated shards after the step: wait for them, so the module's
  // parameters hold the new values when step() returns, as after an optimizer's step.
  for (size_t u = 0; u < layout.units().size(); ++u) engine_->gather(static_cast<int>(u));
  return stats;
}

torch::Tensor TorchModel::global_mean(const torch::Tensor& value) {
  torch::Tensor local = value.detach().to(torch::kFloat32).contiguous().clone();
  torch::Tensor sum = torch::empty_like(local);
  Communicator& comm = engine_->host_communicator();
  comm.all_reduce_sync(local.data_ptr(), sum.data_ptr(), static_cast<size_t>(local.numel()),
                       DType::kFloat32);
  return sum / static_cast<double>(comm.world_size());
}

}  // namespace zero
