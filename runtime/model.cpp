#include "zero/runtime/model.h"

#include <utility>

#include "zero/kernels/check.h"

namespace zero {

Tensor::Tensor(std::vector<int64_t> s) : shape(std::move(s)) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  data.assign(n, 0.0f);
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
    refs.push_back(ParamRef{engine_->param(p), &pl.shape, pl.numel});
  }
  return refs;
}

std::vector<ParamRef> ZeroModel::grads_of(int module) {
  std::vector<ParamRef> refs;
  for (int p : module_params_[module]) {
    const ParamPlacement& pl = engine_->layout().params()[p];
    refs.push_back(ParamRef{engine_->grad(p), &pl.shape, pl.numel});
  }
  return refs;
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
      if (u + 1 < num_units) engine_->prefetch(u + 1);
    }
    Tensor out;
    modules_[m].module->forward(current, out, u >= 0 ? params_of(m) : std::vector<ParamRef>{});
    current = std::move(out);
    if (last_of_unit) {
      engine_->release(u);
      // Backward starts with the last unit: start its gather now, behind the forward.
      if (u == num_units - 1) engine_->prefetch(u);
    }
  }
  return current;
}

Tensor ZeroModel::backward(const Tensor& grad_output) {
  const Layout& layout = engine_->layout();
  Tensor current = grad_output;
  for (int m = static_cast<int>(modules_.size()) - 1; m >= 0; --m) {
    const int u = layout.unit_of_module(m);
    const bool first_of_unit = u >= 0 && layout.units()[u].first_module == m;
    const bool last_of_unit = u >= 0 && layout.units()[u].last_module == m;
    if (last_of_unit) {
      engine_->gather(u);
      if (u > 0) engine_->prefetch(u - 1);
    }
    Tensor grad_in;
    if (u >= 0) {
      modules_[m].module->backward(current, grad_in, params_of(m), grads_of(m));
    } else {
      modules_[m].module->backward(current, grad_in, {}, {});
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
