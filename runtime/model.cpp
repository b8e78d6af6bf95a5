#include "zero/runtime/model.h"

#include <utility>

#include "zero/kernels/check.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero {

Tensor::Tensor(std::vector<int64_t> s) : shape(std::move(s)) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  data.assign(n, 0.0f);
}

const float* ParamRef::as_f32(std::vector<float>& scratch) const {
  if (dtype == DType::kFloat32) return static_cast<const float*>(data);
  scratch.resize(numel);
  kernels::cast(data, dtype, scratch.data(), DType::kFloat32, numel);
  return scratch.data();
}

void ParamRef::add_f32(const float* values) const {
  if (dtype == DType::kFloat32) {
    kernels::accumulate(static_cast<float*>(data), values, numel);
    return;
  }
  for (size_t i = 0; i < numel; ++i) {
    store_from_float(data, dtype, i, load_as_float(data, dtype, i) + values[i]);
  }
}

ZeroModel::ZeroModel(Communicator& comm, std::vector<NamedModule> modules,
                     const EngineConfig& config)
    : modules_(std::move(modules)) {
  std::vector<ParamDecl> decls;
  module_params_.resize(modules_.size());
  for (size_t m = 0; m < modules_.size(); ++m) {
    ZERO_CHECK(modules_[m].module != nullptr,
               "module #" << m << " ('" << modules_[m].name << "') is null");
    for (ParamDecl d : modules_[m].module->parameters()) {
      d.spec.name = modules_[m].name + "." + d.spec.name;
      d.spec.module = static_cast<int>(m);
      module_params_[m].push_back(static_cast<int>(decls.size()));
      decls.push_back(std::move(d));
    }
  }
  engine_ = std::make_unique<Engine>(comm, decls, config);
}

std::vector<ParamRef> ZeroModel::params_of(int module) {
  std::vector<ParamRef> refs;
  for (int p : module_params_[module]) {
    const ParamPlacement& pl = engine_->layout().params()[p];
    refs.push_back(ParamRef{engine_->param(p), engine_->dtype(), &pl.shape, pl.numel});
  }
  return refs;
}

std::vector<ParamRef> ZeroModel::grads_of(int module) {
  std::vector<ParamRef> refs;
  for (int p : module_params_[module]) {
    const ParamPlacement& pl = engine_->layout().params()[p];
    refs.push_back(ParamRef{engine_->grad(p), engine_->dtype(), &pl.shape, pl.numel});
  }
  return refs;
}

// Starts the all-gathers of the units after `u`: at least the next one, and more while they fit
// in stage3_prefetch_bucket_size elements (the engine also holds them to the live budget).
void ZeroModel::prefetch_after(int u, int direction) {
  const Layout& layout = engine_->layout();
  const int num_units = static_cast<int>(layout.units().size());
  size_t ahead = 0;
  for (int v = u + direction; v >= 0 && v < num_units; v += direction) {
    ahead += layout.units()[v].numel;
    if (v != u + direction && ahead > engine_->config().prefetch_elements) break;
    engine_->prefetch(v);
  }
}

// stage3_max_reuse_distance: at the end of forward, backward needs the last units again first;
// a unit whose reuse comes within that many gathered elements stays gathered (within the live
// budget) instead of being released and gathered again.
bool ZeroModel::keep_for_backward(int u) const {
  const EngineConfig& config = engine_->config();
  const Layout& layout = engine_->layout();
  if (config.stage != 3 || config.max_reuse_distance == 0) return false;
  size_t distance = 0;
  for (size_t v = static_cast<size_t>(u) + 1; v < layout.units().size(); ++v) {
    distance += layout.units()[v].numel;
  }
  const bool in_budget =
      config.max_live_elements == 0 || engine_->live_elements() <= config.max_live_elements;
  return distance < config.max_reuse_distance && in_budget;
}

Tensor ZeroModel::forward(const Tensor& input) {
  const Layout& layout = engine_->layout();
  const int num_units = static_cast<int>(layout.units().size());
  Tensor current = input;
  for (int m = 0; m < static_cast<int>(modules_.size()); ++m) {
    const int u = layout.unit_of_module(m);
    const bool first_of_unit = u >= 0 && layout.units()[u].first_module == m;
    const bool last_of_unit = u >= 0 && layout.units()[u].last_module == m;
    if (first_of_unit) {
      engine_->gather(u);
      prefetch_after(u, +1);
    }
    Tensor out;
    {
      ScopedSpan span(engine_->trace(), "forward " + modules_[m].name);
      modules_[m].module->forward(current, out, u >= 0 ? params_of(m) : std::vector<ParamRef>{});
    }
    current = std::move(out);
    if (last_of_unit && !keep_for_backward(u)) engine_->release(u);
    // Backward starts with the last unit: start its gather now, behind the rest of forward.
    if (last_of_unit && u == num_units - 1) engine_->prefetch(u);
  }
  return current;
}

StepStats ZeroModel::step() {
  StepStats stats = engine_->step();
  if (!engine_->layout().units().empty()) engine_->prefetch(0);
  return stats;
}

Tensor ZeroModel::backward(const Tensor& grad_output) {
  const Layout& layout = engine_->layout();
  Tensor current = grad_output;
  // fp16: scale the loss so small gradients survive the 16-bit storage; step() divides it out.
  const float scale = engine_->loss_scale();
  if (scale != 1.0f) {
    for (float& v : current.data) v *= scale;
  }
  for (int m = static_cast<int>(modules_.size()) - 1; m >= 0; --m) {
    const int u = layout.unit_of_module(m);
    const bool first_of_unit = u >= 0 && layout.units()[u].first_module == m;
    const bool last_of_unit = u >= 0 && layout.units()[u].last_module == m;
    if (last_of_unit) {
      engine_->gather(u);
      prefetch_after(u, -1);
    }
    Tensor grad_in;
    {
      ScopedSpan span(engine_->trace(), "backward " + modules_[m].name);
      if (u >= 0) {
        modules_[m].module->backward(current, grad_in, params_of(m), grads_of(m));
      } else {
        modules_[m].module->backward(current, grad_in, {}, {});
      }
    }
    current = std::move(grad_in);
    if (first_of_unit) {
      engine_->grads_ready(u);
      engine_->release(u);
    }
  }
  return current;
}

}  // namespace zero
