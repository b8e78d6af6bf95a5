#include "zero/runtime/model.h"

#include <algorithm>
#include <cstring>
#include <map>
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

// Whether `allocator` gives the memory of `device` (host memory when null): a CPU context's
// memory is host memory.
bool allocates_memory_of(const Allocator& allocator, const DeviceContext* device) {
  if (device != nullptr) return &allocator.memory() == device;
  const auto* context = dynamic_cast<const DeviceContext*>(&allocator.memory());
  return &allocator.memory() == &host_memory() || (context && !context->device().is_cuda());
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

Tensor::Tensor(std::vector<int64_t> shape, std::shared_ptr<DeviceContext> device,
               Allocator& allocator, MemoryCategory category)
    : shape_(std::move(shape)),
      numel_(numel_of(shape_)),
      device_(device_memory(std::move(device))) {
  ZERO_CHECK(allocates_memory_of(allocator, device_.get()),
             "a tensor in " << (device_ ? device_->memory_name() : "host memory")
                            << " cannot be allocated from an allocator of "
                            << allocator.memory().memory_name());
  counted_ = allocator.allocate(numel_ * sizeof(float), category);
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

Tensor::Tensor(const Tensor& other)
    : Tensor(other.allocator() != nullptr
                 ? Tensor(other.shape_, other.device_, *other.allocator(), other.category())
                 : Tensor(other.shape_, other.device_)) {
  if (device_) {
    device_->copy(data(), other.data(), numel_ * sizeof(float));
  } else if (numel_ > 0) {
    std::memcpy(data(), other.data(), numel_ * sizeof(float));
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
      device_data_(std::exchange(other.device_data_, nullptr)),
      counted_(std::move(other.counted_)) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    if (device_data_ != nullptr) device_->deallocate(device_data_, numel_ * sizeof(float));
    shape_ = std::move(other.shape_);
    numel_ = std::exchange(other.numel_, 0);
    host_ = std::move(other.host_);
    device_ = std::move(other.device_);
    device_data_ = std::exchange(other.device_data_, nullptr);
    counted_ = std::move(other.counted_);
  }
  return *this;
}

std::vector<float> Tensor::to_host() const {
  if (!device_) return std::vector<float>(data(), data() + numel_);
  std::vector<float> values(numel_);
  device_->copy_to_host(values.data(), data(), numel_ * sizeof(float));
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

namespace {

std::string module_label(const NamedModule& module, size_t index) {
  return "module #" + std::to_string(index) + " ('" + module.name + "')";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Up to five registered names within a few edits of `name`, nearest first, for a message.
std::string close_names(const std::string& name, const std::map<std::string, int>& names) {
  std::vector<std::pair<size_t, std::string>> close;
  const size_t limit = std::max<size_t>(2, name.size() / 3);
  for (const auto& entry : names) {
    const size_t distance = edit_distance(name, entry.first);
    if (distance <= limit) close.emplace_back(distance, entry.first);
  }
  std::sort(close.begin(), close.end());
  if (close.empty()) return "";
  std::string text = "; close names: ";
  for (size_t i = 0; i < close.size() && i < 5; ++i) {
    text += (i == 0 ? "'" : ", '") + close[i].second + "'";
  }
  return text;
}

}  // namespace

ZeroModel::ZeroModel(Communicator& comm, std::vector<NamedModule> modules,
                     const EngineConfig& config, std::vector<int> chunk_first_modules)
    : modules_(std::move(modules)), chunk_first_modules_(std::move(chunk_first_modules)) {
  if (chunk_first_modules_.empty()) chunk_first_modules_ = {0};
  ZERO_CHECK(chunk_first_modules_.front() == 0,
             "the first model chunk starts at module 0, not " << chunk_first_modules_.front());
  for (size_t c = 1; c < chunk_first_modules_.size(); ++c) {
    ZERO_CHECK(chunk_first_modules_[c] > chunk_first_modules_[c - 1] &&
                   chunk_first_modules_[c] < static_cast<int>(modules_.size()),
               "model chunk " << c << " starts at module " << chunk_first_modules_[c]
                              << ": each chunk starts after the one before, at one of the "
                              << modules_.size() << " modules");
  }
  std::vector<int> chunk_of(modules_.size(), 0);
  for (size_t m = 0, c = 0; m < modules_.size(); ++m) {
    while (c + 1 < chunk_first_modules_.size() &&
           static_cast<int>(m) >= chunk_first_modules_[c + 1]) {
      ++c;
    }
    chunk_of[m] = static_cast<int>(c);
  }
  std::vector<ParamDecl> decls;
  std::map<std::string, int> index_of;  // full name -> registration index
  module_params_.resize(modules_.size());
  own_params_.resize(modules_.size());
  for (size_t m = 0; m < modules_.size(); ++m) {
    ZERO_CHECK(modules_[m].module != nullptr, module_label(modules_[m], m) << " is null");
    const std::string& prefix = modules_[m].name;
    for (ParamDecl d : modules_[m].module->parameters()) {
      d.spec.name = prefix.empty() ? d.spec.name : prefix + "." + d.spec.name;
      d.spec.module = static_cast<int>(m);
      d.spec.chunk = chunk_of[m];
      if (!module_params_[m].empty()) {
        const ParamDecl& first = decls[module_params_[m].front()];
        ZERO_CHECK(first.trainable == d.trainable,
                   module_label(modules_[m], m)
                       << " has frozen and trainable parameters: '"
                       << (d.trainable ? first.spec.name : d.spec.name) << "' is frozen, '"
                       << (d.trainable ? d.spec.name : first.spec.name)
                       << "' trainable; freeze all of a module's parameters or none");
      }
      index_of.emplace(d.spec.name, static_cast<int>(decls.size()));
      module_params_[m].push_back(static_cast<int>(decls.size()));
      decls.push_back(std::move(d));
    }
    own_params_[m] = module_params_[m].size();
  }
  for (size_t m = 0; m < modules_.size(); ++m) {
    for (const std::string& name : modules_[m].module->tied_parameters()) {
      const auto found = index_of.find(name);
      ZERO_CHECK(found != index_of.end(), module_label(modules_[m], m)
                                              << " ties to '" << name
                                              << "', which no module declares"
                                              << close_names(name, index_of));
      const size_t owner = static_cast<size_t>(decls[found->second].spec.module);
      ZERO_CHECK(owner < m, module_label(modules_[m], m)
                                << " ties to '" << name << "' of "
                                << (owner == m ? "itself" : module_label(modules_[owner], owner))
                                << "; a module ties only to parameters of earlier modules, "
                                   "which declare them");
      // A chunk's forward and backward run apart from the others' (other micro-batches'
      // in between), so a tie's gradient must be complete within one chunk's backward.
      ZERO_CHECK(chunk_of[owner] == chunk_of[m],
                 module_label(modules_[m], m)
                     << " of model chunk " << chunk_of[m] << " ties to '" << name << "' of "
                     << module_label(modules_[owner], owner) << " in chunk " << chunk_of[owner]
                     << "; a module ties only to parameters of its own chunk");
      std::vector<int>& params = module_params_[m];
      ZERO_CHECK(std::find(params.begin(), params.end(), found->second) == params.end(),
                 module_label(modules_[m], m) << " ties to '" << name << "' twice");
      params.push_back(found->second);
      decls[found->second].spec.tied = true;
    }
  }
  engine_ = std::make_unique<Engine>(comm, decls, config);
  std::vector<std::vector<int>> tied_params(modules_.size());
  std::vector<bool> backward_reads(modules_.size());
  for (size_t m = 0; m < modules_.size(); ++m) {
    tied_params[m].assign(module_params_[m].begin() + static_cast<std::ptrdiff_t>(own_params_[m]),
                          module_params_[m].end());
    backward_reads[m] = modules_[m].module->backward_reads_params();
  }
  schedule_ = std::make_unique<UnitSchedule>(*engine_, tied_params, std::move(backward_reads));
  schedule_->set_module_chunks(chunk_of);
  schedule_->set_hold_through_step(config.grid.pipeline.hold_gathered);
}

std::vector<ParamRef> ZeroModel::params_of(int module, bool own_values) {
  std::vector<ParamRef> refs;
  const std::vector<int>& params = module_params_[module];
  for (size_t i = 0; i < params.size(); ++i) {
    const int p = params[i];
    const ParamPlacement& pl = engine_->layout().params()[p];
    void* data = own_values || i >= own_params_[module] ? engine_->param(p) : nullptr;
    refs.push_back(
        ParamRef{data, engine_->dtype(), &pl.shape, pl.numel, engine_->device_context()});
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

std::pair<int, int> ZeroModel::chunk_modules(int chunk) const {
  ZERO_CHECK(chunk >= 0 && chunk < chunks(),
             "model chunk " << chunk << " of a model of " << chunks() << " chunk(s)");
  const size_t c = static_cast<size_t>(chunk);
  const int end = c + 1 < chunk_first_modules_.size() ? chunk_first_modules_[c + 1]
                                                      : static_cast<int>(modules_.size());
  return {chunk_first_modules_[c], end};
}

Tensor ZeroModel::forward(const Tensor& input) {
  return forward_modules(input, 0, static_cast<int>(modules_.size()));
}

Tensor ZeroModel::forward(const Tensor& input, int chunk) {
  const std::pair<int, int> range = chunk_modules(chunk);
  return forward_modules(input, range.first, range.second);
}

Tensor ZeroModel::forward_modules(const Tensor& input, int first, int end) {
  check_on_engine_device(input, "the input of forward()");
  schedule_->release_left_over();
  Tensor current = input;
  for (int m = first; m < end; ++m) {
    schedule_->before_forward(m);
    Tensor out;
    {
      ScopedSpan span(engine_->trace(), "forward " + modules_[m].name);
      modules_[m].module->forward(current, out, params_of(m));
    }
    current = std::move(out);
    schedule_->after_forward(m);
  }
  return current;
}

void Module::take_activations(KeptActivations&) {
  ZERO_FAIL(
      "this module keeps its activations inside and cannot have several micro-batches in "
      "flight (a pipeline stage needs take_activations and restore_activations)");
}

void Module::restore_activations(KeptActivations&) {
  ZERO_FAIL("this module cannot restore activations it never gave out");
}

void Module::backward_input(const Tensor&, Tensor&, const std::vector<ParamRef>&) {
  ZERO_FAIL("this module does not split its backward into input and weight gradients");
}

void Module::backward_weight(const std::vector<ParamRef>&) {
  ZERO_FAIL("this module does not split its backward into input and weight gradients");
}

std::vector<KeptActivations> ZeroModel::take_activations() {
  std::vector<KeptActivations> kept;
  for (int c = 0; c < chunks(); ++c) {
    std::vector<KeptActivations> chunk = take_activations(c);
    for (KeptActivations& module : chunk) kept.push_back(std::move(module));
  }
  return kept;
}

std::vector<KeptActivations> ZeroModel::take_activations(int chunk) {
  const std::pair<int, int> range = chunk_modules(chunk);
  std::vector<KeptActivations> kept(static_cast<size_t>(range.second - range.first));
  for (int m = range.first; m < range.second; ++m) {
    try {
      modules_[m].module->take_activations(kept[static_cast<size_t>(m - range.first)]);
    } catch (const Error& e) {
      ZERO_FAIL(module_label(modules_[m], static_cast<size_t>(m)) << ": " << e.what());
    }
  }
  return kept;
}

void ZeroModel::restore_activations(std::vector<KeptActivations> kept) {
  ZERO_CHECK(kept.size() == modules_.size(), "restore_activations() got the activations of "
                                                 << kept.size() << " modules; the model has "
                                                 << modules_.size());
  for (size_t m = 0; m < modules_.size(); ++m) modules_[m].module->restore_activations(kept[m]);
}

void ZeroModel::restore_activations(std::vector<KeptActivations> kept, int chunk) {
  const std::pair<int, int> range = chunk_modules(chunk);
  ZERO_CHECK(kept.size() == static_cast<size_t>(range.second - range.first),
             "restore_activations() got the activations of "
                 << kept.size() << " modules; model chunk " << chunk << " has "
                 << range.second - range.first);
  for (int m = range.first; m < range.second; ++m) {
    modules_[m].module->restore_activations(kept[static_cast<size_t>(m - range.first)]);
  }
}

StepStats ZeroModel::step() {
  schedule_->release_held();
  schedule_->release_left_over();
  StepStats stats = engine_->step();
  schedule_->after_step();
  return stats;
}

Tensor ZeroModel::scaled_loss_gradient(const Tensor& grad_output) const {
  check_on_engine_device(grad_output, "the loss's gradient");
  Tensor scaled = grad_output;
  const float scale = engine_->loss_scale();
  if (scale != 1.0f) {
    engine_->device_context()->scale(scaled.data(), DType::kFloat32, scale, scaled.numel());
  }
  return scaled;
}

// The persistent unit's gradient is complete once every module's backward has added to it.
void ZeroModel::persistent_grads_ready() {
  const int n = static_cast<int>(engine_->layout().units().size());
  if (n > 0 && engine_->layout().units()[n - 1].persistent) engine_->grads_ready(n - 1);
}

Tensor ZeroModel::backward(const Tensor& grad_output) {
  return backward_modules(scaled_loss_gradient(grad_output), 0, static_cast<int>(modules_.size()),
                          true);
}

Tensor ZeroModel::backward(const Tensor& grad_output, int chunk) {
  check_on_engine_device(grad_output, "the gradient given to backward()");
  const std::pair<int, int> range = chunk_modules(chunk);
  return backward_modules(grad_output, range.first, range.second, chunk == 0);
}

// micro_batch_done: the micro-batch's last backward on this model (chunk 0's), after which the
// persistent unit's gradient, which every module adds to, is complete.
Tensor ZeroModel::backward_modules(const Tensor& grad_output, int first, int end,
                                   bool micro_batch_done) {
  const Layout& layout = engine_->layout();
  Tensor current = grad_output;
  for (int m = end - 1; m >= first; --m) {
    const int u = layout.unit_of_module(m);
    const bool own_values = schedule_->before_backward(m);
    Tensor grad_in;
    {
      ScopedSpan span(engine_->trace(), "backward " + modules_[m].name);
      modules_[m].module->backward(current, grad_in, params_of(m, own_values), grads_of(m));
    }
    current = std::move(grad_in);
    // A tied parameter's gradient stays in its owner's buffer until the owner's grads_ready.
    if (u >= 0 && layout.units()[u].first_module == m) {
      engine_->grads_ready(u);
      schedule_->unit_backward_done(u);
    }
    schedule_->after_backward(m);
  }
  if (micro_batch_done) persistent_grads_ready();
  return current;
}

bool ZeroModel::splits_backward() const {
  return std::all_of(modules_.begin(), modules_.end(),
                     [](const NamedModule& m) { return m.module->splits_backward(); });
}

Tensor ZeroModel::backward_input(const Tensor& grad_output) {
  return backward_input_modules(scaled_loss_gradient(grad_output), 0,
                                static_cast<int>(modules_.size()));
}

Tensor ZeroModel::backward_input(const Tensor& grad_output, int chunk) {
  check_on_engine_device(grad_output, "the gradient given to backward_input()");
  const std::pair<int, int> range = chunk_modules(chunk);
  return backward_input_modules(grad_output, range.first, range.second);
}

Tensor ZeroModel::backward_input_modules(const Tensor& grad_output, int first, int end) {
  const Layout& layout = engine_->layout();
  Tensor current = grad_output;
  for (int m = end - 1; m >= first; --m) {
    ZERO_CHECK(modules_[m].module->splits_backward(),
               module_label(modules_[m], m) << " does not split its backward (ZB-H1 needs every "
                                               "module to)");
    const int u = layout.unit_of_module(m);
    const bool own_values = schedule_->before_backward(m);
    Tensor grad_in;
    {
      ScopedSpan span(engine_->trace(), "backward_input " + modules_[m].name);
      modules_[m].module->backward_input(current, grad_in, params_of(m, own_values));
    }
    current = std::move(grad_in);
    // The weight gradients need no parameter values: the unit goes as after backward.
    if (u >= 0 && layout.units()[u].first_module == m) schedule_->unit_backward_done(u);
    schedule_->after_backward(m);
  }
  return current;
}

void ZeroModel::backward_weight() {
  backward_weight_modules(0, static_cast<int>(modules_.size()), true);
}

void ZeroModel::backward_weight(int chunk) {
  const std::pair<int, int> range = chunk_modules(chunk);
  backward_weight_modules(range.first, range.second, chunk == 0);
}

void ZeroModel::backward_weight_modules(int first, int end, bool micro_batch_done) {
  const Layout& layout = engine_->layout();
  for (int m = end - 1; m >= first; --m) {
    {
      ScopedSpan span(engine_->trace(), "backward_weight " + modules_[m].name);
      modules_[m].module->backward_weight(grads_of(m));
    }
    const int u = layout.unit_of_module(m);
    if (u >= 0 && layout.units()[u].first_module == m) engine_->grads_ready(u);
  }
  if (micro_batch_done) persistent_grads_ready();
}

}  // namespace zero
