// The model-wrapping API. A user writes each module's parameters, forward and backward;
// ZeroModel runs forward and backward over the modules in order and schedules, through the
// engine's primitives, the gathers, prefetches, releases and gradient reductions of the stage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/runtime/engine.h"

namespace zero {

// A host activation: a row-major fp32 array with its shape.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s);
  size_t numel() const { return data.size(); }
};

// A parameter (or its gradient) as a module sees it during forward or backward: storage in the
// engine's working dtype. Modules that compute in fp32 read through as_f32 and add their
// gradients through add_f32, which round once into the storage dtype.
struct ParamRef {
  void* data;
  DType dtype;
  const std::vector<int64_t>* shape;
  size_t numel;

  // The values in fp32: the storage itself when it is fp32, else a converted copy in scratch.
  const float* as_f32(std::vector<float>& scratch) const;
  // storage[i] += values[i], computed in fp32 and rounded once to the storage dtype.
  void add_f32(const float* values) const;
};

class Module {
 public:
  virtual ~Module() = default;
  // Parameters with names local to the module ("weight"); the model prefixes the module name.
  virtual std::vector<ParamDecl> parameters() const = 0;
  // out = f(in). Keeps whatever backward needs (its input, say) until backward runs.
  virtual void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) = 0;
  // grad_in = df/din · grad_out; adds df/dparam · grad_out into grads (accumulating, so
  // micro-batches sum up).
  virtual void backward(const Tensor& grad_out, Tensor& grad_in,
                        const std::vector<ParamRef>& params,
                        const std::vector<ParamRef>& grads) = 0;
};

struct NamedModule {
  std::string name;
  std::unique_ptr<Module> module;
};

class ZeroModel {
 public:
  ZeroModel(Communicator& comm, std::vector<NamedModule> modules, const EngineConfig& config);

  // Runs every module in order; at stage 3 each unit is gathered before its first module and
  // released after its last, while the next unit's all-gather runs on the communication stream.
  Tensor forward(const Tensor& input);
  // Runs the modules in reverse; each unit's gradients are handed to the engine as soon as the
  // unit is done, so its reduction overlaps the backward of the units before it. grad_output is
  // d(loss)/d(output); with fp16 it is multiplied by the loss scale here.
  Tensor backward(const Tensor& grad_output);
  // The optimizer step; at stage 3 it also starts gathering the first unit for the next forward.
  StepStats step();

  Engine& engine() { return *engine_; }

 private:
  void prefetch_after(int unit, int direction);
  bool keep_for_backward(int unit) const;
  std::vector<ParamRef> params_of(int module);
  std::vector<ParamRef> grads_of(int module);

  std::vector<NamedModule> modules_;
  std::vector<std::vector<int>> module_params_;  // registration indices per module
  std::unique_ptr<Engine> engine_;
};

}  // namespace zero
