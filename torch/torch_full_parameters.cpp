// TorchModel's full parameters: with_full_parameters() and state_dict() gather the fp32 master
// weights of every rank into whole tensors and, when asked, write the caller's changes back as the
// engine's training state (write_master, which the constructor also uses to load rank 0's values).
#include <algorithm>
#include <string>
#include <vector>

#include "zero/core/check.h"
#include "zero/torch/torch_model.h"

namespace zero {

// The values of `params` (registration indices; values[p] the full fp32 tensor of parameter p)
// go in as the engine's training state, the fp32 master weights of this rank's part of each
// unit; state_loaded() then writes and gathers the working parameters. Collective.
void TorchModel::write_master(const std::vector<int>& params,
                              const std::vector<torch::Tensor>& values) {
  const Layout& layout = engine_->layout();
  std::vector<bool> written(params_.size(), false);
  for (int p : params) written[p] = true;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Engine::StateView view = engine_->state_view(static_cast<int>(u));
    for (int p : layout.units()[u].params) {
      if (!written[p]) continue;
      const ParamPlacement& pl = layout.params()[p];
      const size_t begin = std::max(pl.offset, view.begin);
      const size_t end = std::min(pl.offset + pl.numel, view.end);
      if (begin >= end) continue;
      const float* from = values[p].data_ptr<float>() + (begin - pl.offset);
      std::copy(from, from + (end - begin), view.master + (begin - view.begin));
    }
  }
  engine_->state_loaded();
}

void TorchModel::with_full_parameters(
    const TorchFullParameters& which,
    const std::function<void(torch::OrderedDict<std::string, torch::Tensor>&)>& use) {
  const Layout& layout = engine_->layout();
  for (size_t u = 0; u < layout.units().size(); ++u) {
    ZERO_CHECK(ready_[u] == 0 && pending_[u] == due_[u],
               "TorchModel: full parameters are gathered between step() and the next forward(); "
               "a backward's gradients await their step()");
  }
  std::vector<int> selected;
  if (which.names.empty()) {
    for (size_t p = 0; p < params_.size(); ++p) selected.push_back(static_cast<int>(p));
  }
  for (const std::string& name : which.names) {
    const auto found = std::find_if(layout.params().begin(), layout.params().end(),
                                    [&](const ParamPlacement& pl) { return pl.name == name; });
    ZERO_CHECK(found != layout.params().end(),
               "TorchModel: the module has no parameter '" << name << "'");
    const int param = static_cast<int>(found - layout.params().begin());
    ZERO_CHECK(std::find(selected.begin(), selected.end(), param) == selected.end(),
               "TorchModel: parameter '" << name << "' is named twice");
    selected.push_back(param);
  }
  release_left_over();
  const std::vector<std::vector<float>> master = engine_->gather_full_master();
  std::vector<torch::Tensor> values(params_.size());
  for (int p : selected) values[p] = torch::tensor(master[p]).reshape(layout.params()[p].shape);
  Communicator& comm = engine_->host_communicator();
  const bool shown = !which.rank0_only || comm.rank() == 0;
  torch::OrderedDict<std::string, torch::Tensor> by_name;
  if (shown) {
    for (int p : selected) by_name.insert(layout.params()[p].name, values[p]);
  }
  // A graph built since the step saved views of the parameters (at stages 0-2, their buffers):
  // its backward would read values autograd does not know were changed.
  ZERO_CHECK(!which.writable || !graph_since_step_,
             "TorchModel: full parameters are written back between step() and the next "
             "forward(); a forward() since the last step() built a graph that would read them");
  use(by_name);
  if (!which.writable) return;
  for (int p : selected) {
    ZERO_CHECK(values[p].sizes() == torch::IntArrayRef(layout.params()[p].shape) &&
                   values[p].scalar_type() == torch::kFloat32 && values[p].is_contiguous(),
               "TorchModel: full parameter '"
                   << layout.params()[p].name
                   << "' was resized or replaced; write into it in place");
    if (which.rank0_only) {
      comm.broadcast(values[p].data_ptr(), static_cast<size_t>(values[p].numel()), DType::kFloat32,
                     0)
          .wait();
    }
  }
  write_master(selected, values);
  // Stages 0-2 keep every unit gathered: the module's views point at the rewritten buffers.
  if (engine_->config().stage == 3) return;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    engine_->gather(static_cast<int>(u));
    bind_unit(static_cast<int>(u), /*wrapping=*/false);
  }
}

torch::OrderedDict<std::string, torch::Tensor> TorchModel::state_dict(bool rank0_only) {
  torch::OrderedDict<std::string, torch::Tensor> copies;
  TorchFullParameters every;
  every.rank0_only = rank0_only;
  with_full_parameters(
      every, [&](torch::OrderedDict<std::string, torch::Tensor>& full) { copies = full; });
  return copies;
}

}  // namespace zero
