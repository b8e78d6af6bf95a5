// The LibTorch adapter: a LibTorch module trained by the engine, as FSDP wraps a PyTorch
// module. The module's units run in order; each is a module of the engine's layout (a unit of
// its own, unless merge_bytes merges neighbours). The engine owns the storage: every parameter
// is a view into the engine's gathered buffer, autograd accumulates its gradient in place into
// the engine's gradient buffer, and a unit's grads_ready fires as soon as autograd has
// accumulated all of the unit's gradients, so its reduction overlaps the rest of backward.
//
//   zero::TorchModel model(comm, net, config);          // net: a torch::nn::Sequential
//   torch::Tensor loss = loss_fn(model.forward(x), y);  // local mean over this rank's rows
//   loss.backward();
//   model.step();
//
// Stage 3 runs ZeroModel's schedule (UnitSchedule): a unit's parameters are gathered before its
// forward and released after, and an autograd function at the unit's output gathers them again
// before the unit's backward (as DeepSpeed's pre-backward hook does); they are released once
// the unit's gradients are handed to the engine (a frozen unit, which has none, at the next
// forward() or step()). Between uses a stage-3 parameter is an empty tensor: the module holds no
// full copy. The next units are prefetched in both directions (stage3_prefetch_bucket_size),
// each after the units it ties to; stage3_max_reuse_distance keeps the last units gathered
// from forward into backward. A unit whose backward reads none of its parameters' values is
// not gathered again for backward: forward finds this in the graph autograd recorded, where
// each of the unit's parameters reaches only embeddings and additions (whose backward saves
// no tensor input) and none is frozen.
//
// bf16/fp16: the module computes in the working dtype (its parameters are 16-bit views, its
// input is cast to it), the fp32 master weights stay in the engine's shards, and forward()
// returns the output in fp32; the gradient entering the model is multiplied by the fp16 loss
// scale (in fp32, before it is rounded to fp16), which is what scaling the loss would do.
// CPU path only.
#pragma once

#include <c10/core/Storage.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/ordered_dict.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/core/check.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/unit_schedule.h"

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace zero {

// One unit of a wrapped module: a submodule, named by its path under the root as
// named_modules() names it ("h.0"), and how to run it (one tensor in, one out).
//
// `tied`: the full names ("wte.weight") of parameters of earlier units that this unit's forward
// uses too, as a GPT's LM head reads the token embedding. Autograd sums the gradients of every
// use into the one parameter, which its own unit hands to the engine. At stage 3 the units
// holding them are gathered around this unit's forward, and again from the start of its
// backward until the gradient reaches its input. The unit's submodule may also hold such a
// parameter itself (a head registered with the embedding's weight): a tied one is skipped there.
struct TorchUnit {
  std::string name;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::vector<std::string> tied = {};
};

// The units of a list of blocks of type Block (the module class: BlockImpl for a
// TORCH_MODULE(Block)) held at `prefix` under the root ("h" gives "h.0", "h.1", ...; "" when
// the list is the root itself). Throws zero::Error for a block of another type.
template <typename Block>
std::vector<TorchUnit> units_of(const std::string& prefix, const torch::nn::ModuleList& blocks) {
  std::vector<TorchUnit> units;
  for (size_t i = 0; i < blocks->size(); ++i) {
    std::shared_ptr<Block> block = blocks->ptr<Block>(i);
    const std::string index = std::to_string(i);
    const std::string name = prefix.empty() ? index : prefix + "." + index;
    ZERO_CHECK(block != nullptr, "units_of: block '" << name << "' is a " << blocks->ptr(i)->name()
                                                     << ", not of the block type given");
    units.push_back({name, [block](const torch::Tensor& x) { return block->forward(x); }});
  }
  return units;
}

// The ties of a Sequential's children: child name ("3") -> the full names of parameters of
// earlier children that it uses too ({"0.weight"}), as TorchUnit::tied declares them.
using TorchTies = std::map<std::string, std::vector<std::string>>;

// The units of a Sequential: each child (named as named_children() names it, under `prefix`
// when the Sequential is a submodule of the root: "body" gives "body.0", ...), run by its own
// forward, with the ties `ties` declares for it. Throws zero::Error for a tie of a child the
// Sequential does not have.
std::vector<TorchUnit> units_of(const torch::nn::Sequential& sequential, const TorchTies& ties = {},
                                const std::string& prefix = "");

// What TorchModel::with_full_parameters gathers, and for whom.
struct TorchFullParameters {
  std::vector<std::string> names = {};  // named_parameters() names; empty: every parameter
  bool rank0_only = false;  // only rank 0's function sees them (an empty dict elsewhere)
  // Values written into the tensors (in place) go back into the fp32 master weights and the
  // working parameters when the function returns (rank 0's, with rank0_only).
  bool writable = false;
};

// Per-parameter weight decay, as a PyTorch parameter group sets it (GPT-2 decays matrices only):
// the decay of the parameter of this named_parameters() name, or nullopt for the optimizer's.
using TorchWeightDecay =
    std::function<std::optional<float>(const std::string& name, const torch::Tensor& param)>;

namespace detail {
struct TorchModelAutograd;
}  // namespace detail

class TorchModel {
 public:
  // Each child of the Sequential is a unit; `ties` declares, per child, the parameters of
  // earlier children it uses too (units_of(module, ties)).
  TorchModel(Communicator& comm, torch::nn::Sequential module, const EngineConfig& config,
             const TorchWeightDecay& weight_decay = {});
  TorchModel(Communicator& comm, torch::nn::Sequential module, const TorchTies& ties,
             const EngineConfig& config, const TorchWeightDecay& weight_decay = {});
  // A module whose units are the listed submodules of `root` (say its embedding, each block of
  // a ModuleList through units_of, its head), run in the listed order. Every parameter of the
  // root must belong to exactly one unit, apart from the ties units declare.
  //
  // Both register the parameters under their named_parameters() names ("h.0.weight"), which
  // checkpoints and exports keep; start every rank from rank 0's values; and bind the
  // parameters to the engine's buffers. Throws zero::Error for a unit name the root does not
  // have, a parameter in no unit or in two (unless the later one declares the tie), a tie to a
  // parameter no earlier unit has, a parameter that is not an fp32 CPU tensor, a
  // CUDA device, and stage3_param_persistence_threshold (not supported yet).
  TorchModel(Communicator& comm, std::shared_ptr<torch::nn::Module> root,
             std::vector<TorchUnit> units, const EngineConfig& config,
             const TorchWeightDecay& weight_decay = {});
  // Gives the module its own fp32 copy of the current values (the fp32 master weights for a
  // 16-bit working dtype): it trains on with LibTorch alone. Collective at stage 3 and with a
  // 16-bit dtype (every rank destroys its model at the same point); if an exception is
  // unwinding, those parameters are left empty instead. No backward may run through a graph
  // built by forward() after this.
  ~TorchModel();
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  // Runs the units in order. Returns the output in fp32. A floating-point input must be fp32
  // (the module's parameters' dtype) or the working dtype: with bf16 or fp16 an fp32 input is
  // converted to it, and nothing else is converted. Throws zero::Error for an input of another
  // floating dtype (naming both), and naming a parameter added to the module, or whose data was
  // replaced (set_data), after wrapping.
  torch::Tensor forward(const torch::Tensor& input);
  // The optimizer step, after loss.backward(). At stages 0-2 the module holds the updated
  // values when it returns (stages 1-2 wait for their post-step all-gathers here); at stage 3
  // it starts gathering the first unit for the next forward. Throws zero::Error when a
  // trainable parameter's gradient did not arrive in the backward since the last step.
  StepStats step();

  // The mean of `value` (a loss) over the engine's ranks, in fp32, detached: with equal
  // per-rank batch sizes (each rank one equal slice of the global batch) the mean of the
  // ranks' means is the mean over the global batch. Collective: every rank calls it.
  torch::Tensor global_mean(const torch::Tensor& value);

  // Calls `use` with the parameters `which` names as full fp32 tensors by name (the fp32 master
  // weights), as DeepSpeed's GatheredParameters and FSDP's summon_full_params give them; with
  // `which.writable`, values written into them in place go back into the shards' fp32 master
  // weights and the working parameters when `use` returns. Collective, between step() and the
  // next forward(): a zero::Error while a backward's gradients await their step, and for a
  // writable call after a forward() that recorded a graph. Throws zero::Error for a name the
  // module does not have, or named twice; if `use` throws, nothing is written back (and on a
  // writable call the other ranks wait in the write-back, as in any collective).
  void with_full_parameters(
      const TorchFullParameters& which,
      const std::function<void(torch::OrderedDict<std::string, torch::Tensor>&)>& use);
  // Every parameter as a full fp32 tensor by its named_parameters() name (copies; empty on
  // ranks other than 0 with rank0_only), for a plain module's copy_ (then torch::save).
  // Collective, as with_full_parameters.
  torch::OrderedDict<std::string, torch::Tensor> state_dict(bool rank0_only = false);

  Engine& engine() { return *engine_; }
  torch::nn::Module& module() { return *root_; }

 private:
  friend struct detail::TorchModelAutograd;

  void register_parameters(Communicator& comm, const EngineConfig& config,
                           const TorchWeightDecay& weight_decay);
  void check_no_parameter_added() const;
  void bind_unit(int unit, bool wrapping);
  void unbind_unit(int unit);
  void release_left_over();
  void write_master(const std::vector<int>& params, const std::vector<torch::Tensor>& values);
  void before_module_backward(int module);
  void after_module_backward(int module);
  bool backward_reads_own_params(int module, const torch::Tensor& input,
                                 const torch::Tensor& output) const;
  void shape_without_values(int param);
  void before_accumulate(int param);
  void accumulated(int param);

  std::shared_ptr<torch::nn::Module> root_;
  std::vector<TorchUnit> units_;
  std::vector<torch::Tensor> params_;  // registration order: the engine's parameter indices
  // Per parameter: the storage its views share (so views autograd saved in forward see the
  // buffer a later gather puts there), pointed at the engine's buffer while its unit is bound.
  std::vector<c10::Storage> storages_;
  torch::Tensor released_;  // what a released stage-3 parameter's data is: empty, shared
  std::unique_ptr<Engine> engine_;
  std::vector<int> due_;           // per unit: its trainable parameters
  std::vector<int> pending_;       // per unit: those whose gradient this backward has not yet added
  std::vector<int> ready_;         // per unit: grads_ready calls since the last step
  std::vector<bool> arrived_;      // per parameter: its gradient was added in this backward
  bool graph_since_step_ = false;  // a forward() since the last step() recorded a graph
  // Per unit (stage 3): its parameters have their shapes for a backward that reads none of
  // their values, over no buffer (an embedding's backward reads the weight's size).
  std::vector<bool> shaped_without_values_;
  // The gradient accumulators carrying our hooks: a parameter holds its accumulator weakly,
  // and a new one (without hooks) would replace it once the last graph using it is gone.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::map<const torch::autograd::Node*, int> accumulator_params_;  // accumulator -> parameter
  // Declared after the engine, which it drives: destroyed first.
  std::unique_ptr<UnitSchedule> schedule_;
};

}  // namespace zero
