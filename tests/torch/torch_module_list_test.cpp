// TorchModel on a module that is not a Sequential: an embedding layer, a ModuleList of blocks
// and a head, listed as units (units_of gives one per block). Training at stages 1 and 3
// matches the same module trained by plain LibTorch through its own forward(); the parameters
// keep their named_parameters() names in the layout, in checkpoints and in zero-checkpoint's
// export, whose file loads back into a fresh module by those names. Units that do not cover
// the module's parameters exactly once are errors naming the parameter.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "tests/run_program.h"
#include "tests/runtime/checkpoint_util.h"
#include "tests/torch/torch_test_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/checkpoint.h"
#include "zero/torch/torch_model.h"

namespace zero {
namespace {

using namespace zero::testing;

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(16, 16))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + torch::tanh(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl()
      : embed(register_module("embed", torch::nn::Linear(6, 16))),
        blocks(register_module("blocks", torch::nn::ModuleList(Block(), Block()))),
        head(register_module("head", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = embed(x);
    for (size_t i = 0; i < blocks->size(); ++i) x = blocks->ptr<BlockImpl>(i)->forward(x);
    return head(x);
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

Net make_net(uint64_t seed) {
  torch::manual_seed(seed);
  return Net();
}

std::vector<TorchUnit> units_of_net(Net net) {
  std::vector<TorchUnit> units{
      {"embed", [embed = net->embed.ptr()](const torch::Tensor& x) { return embed->forward(x); }}};
  for (TorchUnit& block : units_of<BlockImpl>("blocks", net->blocks)) units.push_back(block);
  units.push_back(
      {"head", [head = net->head.ptr()](const torch::Tensor& x) { return head->forward(x); }});
  return units;
}

// Trains `model` for `steps` steps on this rank's rows of each global batch.
void train(TorchModel& model, int rank, int world, int first_step, int steps) {
  const int64_t rows = kGlobalRows / world;
  for (int step = first_step; step < first_step + steps; ++step) {
    const auto [x, y] = batch(step);
    const torch::Tensor out = model.forward(x.narrow(0, rank * rows, rows));
    torch::mse_loss(out, y.narrow(0, rank * rows, rows)).backward();
    model.step();
  }
}

std::vector<std::string> names_of(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& named : module.named_parameters()) names.push_back(named.key());
  return names;
}

TEST(TorchModuleList, BlocksAsUnitsMatchPlainLibTorch) {
  const std::vector<std::vector<torch::Tensor>> plain = train_plain([] { return make_net(1); });
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (int stage : {1, 3}) {
    Net net = make_net(1);
    TorchModel model(*comm, net.ptr(), units_of_net(net), config_at(stage));
    std::vector<std::string> registered;
    for (const ParamPlacement& p : model.engine().layout().params()) registered.push_back(p.name);
    EXPECT_EQ(registered, names_of(*net));
    EXPECT_EQ(model.engine().layout().units().size(), 4u);
    train(model, comm->rank(), comm->world_size(), 0, kSteps);
    const std::vector<torch::Tensor> trained =
        tensors_of(model.engine().gather_full_params(), model.engine().layout());
    for (size_t p = 0; p < trained.size(); ++p) {
      const torch::Tensor error = (trained[p] - plain.back()[p]).abs();
      // As in torch_model_test: fp32 on both sides, sums in another order.
      EXPECT_TRUE(error.le(1e-5 * plain.back()[p].abs() + 1e-6).all().item<bool>())
          << "stage " << stage << ", " << registered[p] << ": max error "
          << error.max().item<float>();
    }
  }
}

TEST(TorchModuleList, UnitsMustCoverEveryParameterOnce) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  Net net = make_net(1);
  std::vector<TorchUnit> units = units_of_net(net);
  const auto with = [&](std::vector<TorchUnit> changed) {
    return [&comm, net, changed] { TorchModel(*comm, net.ptr(), changed, config_at(3)); };
  };
  std::vector<TorchUnit> unknown = units;
  unknown[1].name = "blocks.7";
  expect_error_naming(with(unknown), "unit 'blocks.7' is not a submodule");
  std::vector<TorchUnit> no_head(units.begin(), units.end() - 1);
  expect_error_naming(with(no_head), "parameter 'head.weight' belongs to no unit");
  std::vector<TorchUnit> twice = units;
  twice.insert(twice.begin() + 2, units[1]);
  expect_error_naming(with(twice), "'blocks.0.fc.weight' belongs to unit 'blocks.0' and to unit");
  expect_error_naming([&] { units_of<torch::nn::LinearImpl>("blocks", net->blocks); },
                      "BlockImpl, not of the block type given");
  // A child used twice in a Sequential is the same parameters in two units.
  torch::nn::Linear shared(16, 16);
  torch::nn::Sequential reused(torch::nn::Linear(6, 16), shared, torch::nn::Tanh(), shared);
  expect_error_naming([&] { TorchModel(*comm, reused, config_at(3)); },
                      "belongs to unit '1' and to unit '3'");
}

// A stage-3 checkpoint of the wrapped module, exported by zero-checkpoint, holds the module's
// own names and the trained values, loads into a fresh module by named_parameters(), and loads
// back into a wrapped module of other initial values that then trains on as the original does.
TEST(TorchModuleList, CheckpointsAndExportsUseTheModuleNames) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int rank = comm->rank();
  const int world = comm->world_size();
  const std::string dir = shared_temp_dir(*comm);
  Net net = make_net(1);
  TorchModel model(*comm, net.ptr(), units_of_net(net), config_at(3));
  train(model, rank, world, 0, 2);
  save_checkpoint(model.engine(), dir, TrainerState{2, 1});
  const std::vector<std::vector<float>> saved = model.engine().gather_full_master();

  const std::string exported = dir + "/model.safetensors";
  if (rank == 0) {
    const ProgramOutcome outcome =
        run_program(ZERO_CHECKPOINT_PATH, {"export", dir, "--to", exported});
    EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
    const LoadedSafetensors file = load_safetensors(exported);
    Net fresh = make_net(9);
    auto params = fresh->named_parameters();
    ASSERT_EQ(file.tensors.size(), params.size());
    torch::NoGradGuard no_grad;
    for (const LoadedTensor& tensor : file.tensors) {
      ASSERT_TRUE(params.contains(tensor.name)) << tensor.name;
      params[tensor.name].copy_(torch::tensor(tensor.values).reshape(tensor.shape));
    }
    const std::vector<torch::Tensor> loaded = snapshot(*fresh);
    for (size_t p = 0; p < saved.size(); ++p) {
      EXPECT_TRUE(loaded[p].flatten().equal(torch::tensor(saved[p]))) << p;
    }
  }
  comm->barrier().wait();

  Net other = make_net(5);
  TorchModel resumed(*comm, other.ptr(), units_of_net(other), config_at(3));
  TrainerState trainer;
  load_checkpoint(resumed.engine(), dir, &trainer);
  EXPECT_EQ(trainer.step, 2);
  train(model, rank, world, 2, 1);
  train(resumed, rank, world, 2, 1);
  EXPECT_EQ(resumed.engine().gather_full_master(), model.engine().gather_full_master());
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zero
