#include "zero/runtime/model.h"

#include <utility>

#include "zero/core/check.h"
#include "zero/runtime/device.h"

namespace zero {

namespace {

size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    ZERO_CHECK(d >= 0, "tensor dimensions must be >= 0, got " << d);
    n *= static_cast<size_t>(d);
  }
  return n;
}

// Device tensors only on a device with memory of its own; a CPU context means host memory.
std::shared_ptr<DeviceContext> device_memory(std::shared_ptr<DeviceContext> device) {
  return device && device->device().is_cuda() ? std::move(device) : nullptr;
}

}  // namespace

Tensor::Tensor(std::vector<int64_t> shape) : Tensor(std::move(shape), nullptr) {}

Tensor::Tensor(std::vector<int64_t> shape, std::shared_ptr<DeviceContext> device)
    : shape_(std::move(shape)),
      numel_(numel_of(shape_)),
      device_(device_memory(std::move(device))) {
  if (!device_) {
    host_.assign(numel_, 0.0f);
    return;
  }
  if (numel_ == 0) return;
  device_data_ = static_cast<float*>(device_->allocate(numel_ * sizeof(float)));
  if (device_data_ == nullptr) {
    throw OutOfMemoryError("out of " + device_->memory_name() + ": a tensor of " +
                           human_bytes(numel_ * sizeof(float)) + " does not fit");
  }
}

Tensor::Tensor(std::vector<int64_t> shape, const std::vector<float>& values,
               std::shared_ptr<DeviceContext> device)
    : Tensor(std::move(shape), std::move(device)) {
  ZERO_CHECK(values.size() == numel_,
             "a tensor of " << numel_ << " elements cannot take " << values.size() << " values");
  if (device_) {
    device_->copy_from_host(device_data_, values.data(), numel_ * sizeof(float));
  } else {
    host_ = values;
  }
}

Tensor::~Tensor() {
  if (device_data_ != nullptr) device_->deallocate(device_data_, numel_ * sizeof(float));
}

Tensor::Tensor(const Tensor& other) : Tensor(other.shape_, other.device_) {
  if (device_) {
    device_->copy(device_data_, other.device_data_, numel_ * sizeof(float));
  } else {
    host_ = other.host_;
  }
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : shape_(std::move(other.shape_)),
      numel_(std::exchange(other.numel_, 0)),
      host_(std::move(other.host_)),
      device_(std::move(other.device_)),
      device_data_(std::exchange(other.device_data_, nullptr)) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    if (device_data_ != nullptr) device_->deallocate(device_data_, numel_ * sizeof(float));
    shape_ = std::move(other.shape_);
    numel_ = std::exchange(other.numel_, 0);
    host_ = std::move(other.host_);
    device_ = std::move(other.device_);
    device_data_ = std::exchange(other.device_data_, nullptr);
  }
  return *this;
}

std::vector<float> Tensor::to_host() const {
  if (!device_) return host_;
  std::vector<float> values(numel_);
  device_->copy_to_host(values.data(), device_data_, numel_ * sizeof(float));
  return values;
}

Tensor Tensor::to(std::shared_ptr<DeviceContext> device) const {
  device = device_memory(std::move(device));
  if (device == device_) return *this;
  return Tensor(shape_, to_host(), std::move(device));
}

const float* ParamRef::as_f32(Tensor& scratch) const {
  if (dtype == DType::kFloat32) return static_cast<const float*>(data);
  ZERO_CHECK(device != nullptr, "ParamRef::as_f32: the parameter has no device");
  if (scratch.numel() != numel || scratch.device() != device_memory(device)) {
    scratch = Tensor({static_cast<int64_t>(numel)}, device);
  }
  device->cast(data, dtype, scratch.data(), DType::kFloat32, numel);
  return scratch.data();
}

void ParamRef::add_f32(const float* values) const {
  ZERO_CHECK(device != nullptr, "ParamRef::add_f32: the parameter has no device");
  device->add(data, dtype, values, DType::kFloat32, numel);
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
    refs.push_back(ParamRef{engine_->param(p), engine_->dtype(), &pl.shape, pl.numel,
                            engine_->device_context()});
  }
  return refs;
}

std::vector<ParamRef> ZeroModel::grads_of(int module) {
  std::vector<ParamRef> refs;
  for (int p : module_params_[module]) {
    const ParamPlacement& pl = engine_->layout().params()[p];
    refs.push_back(ParamRef{engine_->grad(p), engine_->dtype(), &pl.shape, pl.numel,
                            engine_->device_context()});
  }
  return refs;
}

namespace {

// The unit of the last module that has one: the last unit, unless the persistent unit (which
// is always gathered) follows it.
int last_module_unit(const Layout& layout) {
  const int n = static_cast<int>(layout.units().size());
  return n > 0 && layout.units()[n - 1].persistent ? n - 2 : n - 1;
}

}  // namespace

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

// Modules compute on the engine's device: a tensor elsewhere would be read as the wrong memory.
void ZeroModel::check_on_engine_device(const Tensor& tensor, const char* what) const {
  const std::shared_ptr<DeviceContext>& engine_device = engine_->device_context();
  const bool on_engine_device = engine_device->device().is_cuda() ? tensor.device() == engine_device
                                                                  : tensor.device() == nullptr;
  if (on_engine_device) return;
  // Another context of the same GPU has its own compute stream, unordered with the engine's.
  const bool same_gpu = tensor.device() && tensor.device()->device() == engine_device->device();
  ZERO_CHECK(!same_gpu, what << " belongs to another device context of "
                             << device_name(engine_device->device())
                             << " (another compute stream); make it with "
                                "engine().device_context()");
  ZERO_FAIL(what << " is in " << (tensor.device() ? tensor.device()->memory_name() : "host memory")
                 << " but the model runs on " << device_name(engine_device->device())
                 << "; move it there with Tensor::to(engine().device_context())");
}

Tensor ZeroModel::forward(const Tensor& input) {
  check_on_engine_device(input, "the input of forward()");
  const Layout& layout = engine_->layout();
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
      modules_[m].module->forward(current, out, params_of(m));
    }
    current = std::move(out);
    if (last_of_unit && !keep_for_backward(u)) engine_->release(u);
    // Backward starts with the last module's unit: start its gather now, behind the rest of
    // forward (the persistent unit, if any, comes after it and is always gathered).
    if (last_of_unit && u == last_module_unit(layout)) engine_->prefetch(u);
  }
  return current;
}

StepStats ZeroModel::step() {
  StepStats stats = engine_->step();
  if (!engine_->layout().units().empty()) engine_->prefetch(0);
  return stats;
}

Tensor ZeroModel::backward(const Tensor& grad_output) {
  check_on_engine_device(grad_output, "the gradient given to backward()");
  const Layout& layout = engine_->layout();
  Tensor current = grad_output;
  // fp16: scale the loss so small gradients survive the 16-bit storage; step() divides it out.
  const float scale = engine_->loss_scale();
  if (scale != 1.0f) {
    engine_->device_context()->scale(current.data(), DType::kFloat32, scale, current.numel());
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
      modules_[m].module->backward(current, grad_in, params_of(m), grads_of(m));
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
