// The LibTorch adapter: a torch::nn::Sequential trained by the engine, as FSDP wraps a PyTorch
// module. Each child is a module of the engine's layout (a unit, unless merge_bytes merges
// neighbours). The engine owns the storage: every parameter's data becomes a view into the
// engine's gathered buffer, autograd accumulates its gradient in place into the engine's
// gradient buffer, and a unit's grads_ready fires as soon as autograd has accumulated all of
// the unit's gradients, so its reduction overlaps the rest of backward.
//
//   zero::TorchModel model(comm, net, config);
//   torch::Tensor loss = loss_fn(model.forward(x), y);  // local mean over this rank's rows
//   loss.backward();
//   model.step();
//
// Stages 0-2 in fp32 on the CPU path. Stage 3 and 16-bit working dtypes are refused.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include <memory>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/runtime/engine.h"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace zero {

class TorchModel {
 public:
  // Registers the children's parameters (named as named_parameters() names them: "0.weight"),
  // starts every rank from rank 0's values and binds the parameters to the engine's buffers.
  // Throws zero::Error for stage 3, a working dtype other than fp32, a CUDA device, or a
  // parameter that is not an fp32 CPU tensor.
  TorchModel(Communicator& comm, torch::nn::Sequential module, const EngineConfig& config);
  // Gives the module its own copy of the current values: it trains on with LibTorch alone.
  // No backward may run through a graph built by forward() before this.
  ~TorchModel();
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  // Runs the children in order on the full parameters.
  torch::Tensor forward(const torch::Tensor& input);
  // The optimizer step, after loss.backward(); the module holds the updated values when it
  // returns (stages 1-2 wait for their post-step all-gathers here). Throws zero::Error when a
  // trainable parameter's gradient did not arrive in the backward since the last step.
  StepStats step();

  Engine& engine() { return *engine_; }
  torch::nn::Sequential& module() { return module_; }

 private:
  void bind_parameters();
  void before_accumulate(int param);
  void accumulated(int param);

  torch::nn::Sequential module_;
  std::vector<torch::Tensor> params_;  // registration order: the engine's parameter indices
  std::unique_ptr<Engine> engine_;
  std::vector<int> due_;       // per unit: its trainable parameters
  std::vector<int> pending_;   // per unit: those whose gradient this backward has not yet added
  std::vector<int> ready_;     // per unit: grads_ready calls since the last step
  std::vector<bool> arrived_;  // per parameter: its gradient was added in this backward
  // The gradient accumulators carrying our hooks: a parameter holds its accumulator weakly,
  // and a new one (without hooks) would replace it once the last graph using it is gone.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
};

}  // namespace zero
