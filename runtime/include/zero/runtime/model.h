// The model-wrapping API. A user writes each module's parameters, forward and backward;
// ZeroModel runs forward and backward over the modules in order and schedules, through the
// engine's primitives, the gathers, prefetches, releases and gradient reductions of the stage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zero/runtime/engine.h"
#include "zero/runtime/unit_schedule.h"

namespace zero {

// An activation: a row-major fp32 array with its shape, in host memory or in a device's memory
// (the device of the engine the model runs on). Copies are deep and stay on the same device.
// A tensor made from an Allocator is counted there in its category (a model's activations in the
// engine's allocator: Engine::allocator()); so are its copies.
class Tensor {
 public:
  Tensor() = default;
  // Zero-filled, in host memory.
  explicit Tensor(std::vector<int64_t> shape);
  // Zero-filled, in the memory of `device` (host memory for a null or CPU context).
  Tensor(std::vector<int64_t> shape, std::shared_ptr<DeviceContext> device);
  // Zero-filled, from `allocator` (counted as `category`), which must allocate the memory of
  // `device` (host memory for a null or CPU context): a zero::Error otherwise. The allocator must
  // outlive the tensor.
  Tensor(std::vector<int64_t> shape, std::shared_ptr<DeviceContext> device, Allocator& allocator,
         MemoryCategory category);
  // `values` (one per element, row-major) copied into the memory of `device`.
  Tensor(std::vector<int64_t> shape, const std::vector<float>& values,
         std::shared_ptr<DeviceContext> device = nullptr);
  ~Tensor();
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;

  const std::vector<int64_t>& shape() const { return shape_; }
  size_t numel() const { return numel_; }
  // The elements, in host memory or the device's.
  float* data() { return const_cast<float*>(static_cast<const Tensor*>(this)->data()); }
  const float* data() const {
    if (!counted_.empty()) return counted_.as<float>();
    return device_ ? device_data_ : host_.data();
  }
  // The allocator counting the elements and their category; null for an uncounted tensor.
  Allocator* allocator() const { return counted_.allocator(); }
  MemoryCategory category() const { return counted_.category(); }
  // The device holding the elements; null in host memory.
  const std::shared_ptr<DeviceContext>& device() const { return device_; }
  // The elements copied into host memory.
  std::vector<float> to_host() const;
  // A copy in the memory of `device` (host memory for a null or CPU context).
  Tensor to(std::shared_ptr<DeviceContext> device) const;

 private:
  std::vector<int64_t> shape_;
  size_t numel_ = 0;
  std::vector<float> host_;                // host memory
  std::shared_ptr<DeviceContext> device_;  // a CUDA device, or null
  float* device_data_ = nullptr;           // an uncounted tensor's device memory
  Buffer counted_;                         // a counted tensor's memory
};

// A parameter (or its gradient) as a module sees it during forward or backward: storage in the
// engine's working dtype, on the engine's device. Modules that compute in fp32 read through
// as_f32 and add their gradients through add_f32, which round once into the storage dtype.
struct ParamRef {
  void* data;
  DType dtype;
  const std::vector<int64_t>* shape;
  size_t numel;
  std::shared_ptr<DeviceContext> device;

  // The values in fp32 on the same device: the storage itself when it is fp32, else a converted
  // copy in scratch (resized to hold them).
  const float* as_f32(Tensor& scratch) const;
  // storage[i] += values[i] (values: numel floats on the same device), computed in fp32 and
  // rounded once to the storage dtype.
  void add_f32(const float* values) const;
};

// What one module's forward kept for its backward (inputs, intermediate results), moved out of
// the module so that another micro-batch's forward can run before that backward: a pipeline
// keeps several micro-batches in flight.
using KeptActivations = std::vector<Tensor>;

class Module {
 public:
  virtual ~Module() = default;
  // Parameters with names local to the module ("weight"); the model prefixes the module name
  // and a "." ("h.0" + "." + "weight"), or nothing when the module's name is empty.
  virtual std::vector<ParamDecl> parameters() const = 0;
  // Full names ("wte.weight") of parameters declared by earlier modules that this module uses
  // too (GPT-2's LM head reuses the token embedding). Their refs follow the module's own in
  // params and grads, in this order; the gradients of every use sum into the one parameter.
  virtual std::vector<std::string> tied_parameters() const { return {}; }
  // out = f(in). Keeps whatever backward needs (its input, say) until backward runs. Inputs,
  // outputs, parameters and gradients are all on the engine's device.
  virtual void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) = 0;
  // grad_in = df/din · grad_out; adds df/dparam · grad_out into grads (accumulating, so
  // micro-batches sum up). A frozen parameter's grad has null data: add nothing to it, but
  // still compute grad_in.
  virtual void backward(const Tensor& grad_out, Tensor& grad_in,
                        const std::vector<ParamRef>& params,
                        const std::vector<ParamRef>& grads) = 0;
  // Whether backward reads the values of the module's own parameters. An embedding's does not
  // (its gradient comes from the token ids and grad_out alone): at stage 3 a unit whose modules
  // all say so is not gathered again for backward, and their own params have null data there.
  virtual bool backward_reads_params() const { return true; }
  // Moves what forward kept for backward into `kept` (the module is then as before any
  // forward); restore_activations moves it back before that micro-batch's backward. The
  // default throws: a module keeps its activations inside unless it says otherwise.
  virtual void take_activations(KeptActivations& kept);
  virtual void restore_activations(KeptActivations& kept);
  // A zero-bubble schedule (ZB-H1) runs backward in two halves: backward_input computes grad_in
  // alone and keeps what the parameters' gradients need (take_activations then moves that too);
  // backward_weight adds those gradients later, from what it kept (no parameter values). Both
  // together give backward's numbers. The defaults throw: a module splits only if it says so.
  virtual bool splits_backward() const { return false; }
  virtual void backward_input(const Tensor& grad_out, Tensor& grad_in,
                              const std::vector<ParamRef>& params);
  virtual void backward_weight(const std::vector<ParamRef>& grads);
};

struct NamedModule {
  std::string name;
  std::unique_ptr<Module> module;
};

class ZeroModel {
 public:
  // Throws zero::Error for a null module, a duplicate full parameter name, a module with both
  // frozen and trainable parameters, and a tied name that is unknown (close names are listed)
  // or not of an earlier module.
  // chunk_first_modules: an interleaved pipeline stage's model chunks, each given by the index
  // of its first module (0 first, increasing; empty: one chunk, the whole model). One engine
  // holds them all (one optimizer step, gradient norm and ZeRO state); no unit spans two
  // chunks, and the chunk versions of forward and backward below run one chunk's modules.
  ZeroModel(Communicator& comm, std::vector<NamedModule> modules, const EngineConfig& config,
            std::vector<int> chunk_first_modules = {});

  // Runs every module in order, scheduled by a UnitSchedule: at stage 3 each unit is gathered
  // before its first module and released after its last (or, with the config's
  // pipeline.hold_gathered, at step()), while the next unit's all-gather runs on the
  // communication stream. The units holding parameters a unit's modules tie to are
  // gathered with it (and released with it, unless they were gathered already).
  // The input must be on the engine's device (Tensor::to(engine().device_context())).
  Tensor forward(const Tensor& input);
  // Runs the modules in reverse; each unit's gradients are handed to the engine as soon as the
  // unit is done, so its reduction overlaps the backward of the units before it. grad_output is
  // d(loss)/d(output); with fp16 it is multiplied by the loss scale here.
  Tensor backward(const Tensor& grad_output);
  // ZB-H1: backward in two halves, when every module splits (splits_backward()). backward_input
  // runs the modules in reverse for the input's gradient only (at stage 3 gathering and
  // releasing as backward does); backward_weight later adds every parameter's gradient and hands
  // each unit to the engine, as backward does as it goes.
  bool splits_backward() const;
  Tensor backward_input(const Tensor& grad_output);
  void backward_weight();
  // The optimizer step; at stage 3 it also starts gathering the first unit for the next forward.
  StepStats step();

  // Several micro-batches in flight (a pipeline stage): after a forward, what every module kept
  // for its backward, moved out of the modules; restore_activations puts it back before that
  // micro-batch's backward. A zero::Error naming the module if one cannot.
  std::vector<KeptActivations> take_activations();
  void restore_activations(std::vector<KeptActivations> kept);

  // The same for one model chunk (chunk_first_modules; chunk 0 of a model of one chunk is the
  // whole model), a pipeline stage's. A micro-batch's backwards run from its last chunk to chunk
  // 0, as the gradient flows: the persistent unit's gradient is handed to the engine after chunk
  // 0's. The chunks' backward and backward_input do not scale grad_output: with fp16 it carries
  // the loss scale already, put on once where the loss is (scaled_loss_gradient) and carried
  // through every later chunk and stage.
  int chunks() const { return static_cast<int>(chunk_first_modules_.size()); }
  Tensor forward(const Tensor& input, int chunk);
  Tensor backward(const Tensor& grad_output, int chunk);
  Tensor backward_input(const Tensor& grad_output, int chunk);
  void backward_weight(int chunk);
  std::vector<KeptActivations> take_activations(int chunk);
  void restore_activations(std::vector<KeptActivations> kept, int chunk);

  // d(loss)/d(output) times the loss scale (fp16; 1 otherwise), on the engine's device: what
  // backward starts from, so that small gradients survive the 16-bit storage (step() divides
  // the scale out).
  Tensor scaled_loss_gradient(const Tensor& grad_output) const;

  Engine& engine() { return *engine_; }

 private:
  // Chunk c's modules, [first, end).
  std::pair<int, int> chunk_modules(int chunk) const;
  Tensor forward_modules(const Tensor& input, int first, int end);
  Tensor backward_modules(const Tensor& grad_output, int first, int end, bool micro_batch_done);
  Tensor backward_input_modules(const Tensor& grad_output, int first, int end);
  void backward_weight_modules(int first, int end, bool micro_batch_done);
  void check_on_engine_device(const Tensor& tensor, const char* what) const;
  void persistent_grads_ready();
  // The module's parameters: its own (null data when `own_values` is false), then its tied ones.
  std::vector<ParamRef> params_of(int module, bool own_values = true);
  std::vector<ParamRef> grads_of(int module);

  // Declared before the modules, so destroyed after them: their tensors may be counted in the
  // engine's allocator.
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<UnitSchedule> schedule_;
  std::vector<NamedModule> modules_;
  std::vector<std::vector<int>> module_params_;  // registration indices per module: its own,
                                                 // then those it ties to
  std::vector<size_t> own_params_;               // per module: how many are its own
  std::vector<int> chunk_first_modules_;         // {0} for a model of one chunk
};

}  // namespace zero
