// A LibTorch MLP wrapped by TorchModel at stages 0-3, at 1 and 2 ranks, against the same MLP
// trained by plain LibTorch with torch::optim::AdamW on the whole global batch: the parameters
// the module sees after every step agree. Each rank takes its rows of the batch and its loss
// is the mean over them, so the engine's average over ranks is the global mean.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "tests/torch/torch_test_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/torch/torch_model.h"

namespace zero {
namespace {

using namespace zero::testing;

// The trained values: the module's own at stages 0-2; at stage 3, where the module holds no
// full copy between uses, the engine's gathered parameters (collective).
std::vector<torch::Tensor> trained_values(TorchModel& model) {
  if (model.engine().config().stage < 3) return snapshot(model.module());
  return tensors_of(model.engine().gather_full_params(), model.engine().layout());
}

// Tolerance: fp32 on both sides, but the sums differ in order (the ranks' halves averaged by
// the reduction, not one mean over the batch, and the engine's own AdamW kernel), so results
// agree to rounding, not bit for bit: the largest difference seen is 6e-8 on values near 0.5.
// A wrong gradient or a missed update is off by about lr (1e-2) after one step.
constexpr double kRel = 1e-5;
constexpr double kAbs = 1e-6;

// Each micro-batch's loss is the mean over its rows; the engine averages over micro-batches
// and ranks, which is the global mean. make(seed) builds the model (make_mlp unless said).
using MakeModel = std::function<torch::nn::Sequential(uint64_t seed)>;
void expect_matches_plain(int stage, int micro_batches = 1, const MakeModel& make = make_mlp) {
  const std::vector<std::vector<torch::Tensor>> plain = train_plain([&] { return make(1); });
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int rank = comm->rank();
  const int64_t rows = kGlobalRows / comm->world_size() / micro_batches;
  // Other ranks start elsewhere: the wrap must start every rank from rank 0's values.
  TorchModel model(*comm, make(1 + static_cast<uint64_t>(rank) * 7),
                   config_at(stage, micro_batches));
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch(step);
    for (int k = 0; k < micro_batches; ++k) {
      const int64_t first = (rank * micro_batches + k) * rows;
      torch::mse_loss(model.forward(x.narrow(0, first, rows)), y.narrow(0, first, rows)).backward();
    }
    model.step();
    const std::vector<torch::Tensor> seen = trained_values(model);
    ASSERT_EQ(seen.size(), plain[step].size());
    for (size_t p = 0; p < seen.size(); ++p) {
      const torch::Tensor error = (seen[p] - plain[step][p]).abs();
      const torch::Tensor bound = kRel * plain[step][p].abs() + kAbs;
      EXPECT_TRUE(error.le(bound).all().item<bool>())
          << "stage " << stage << ", " << micro_batches << " micro-batch(es), step " << step + 1
          << ", parameter " << p << ": max error " << error.max().item<float>();
    }
  }
  // The comparison means something only if training moved the parameters well past it.
  const std::vector<torch::Tensor> initial = snapshot(*make_mlp(1));
  EXPECT_GT((plain.back()[0] - initial[0]).abs().max().item<float>(), 100 * kAbs);
}

TEST(TorchModel, Stage0MatchesPlainLibTorch) {
  expect_matches_plain(0);
}
TEST(TorchModel, Stage1MatchesPlainLibTorch) {
  expect_matches_plain(1);
}
TEST(TorchModel, Stage2MatchesPlainLibTorch) {
  expect_matches_plain(2);
}
TEST(TorchModel, Stage3MatchesPlainLibTorch) {
  expect_matches_plain(3);
}
TEST(TorchModel, TwoMicroBatchesMatchPlainLibTorch) {
  for (int stage = 0; stage <= 3; ++stage) expect_matches_plain(stage, 2);
}
// A frozen unit in the middle: never updated, but gathered for its backward at stage 3, which
// the earlier units' gradients pass through.
TEST(TorchModel, FrozenUnitMatchesPlainLibTorch) {
  const MakeModel frozen_middle = [](uint64_t seed) {
    torch::nn::Sequential net = make_mlp(seed);
    for (torch::Tensor& param : net[2]->parameters()) param.requires_grad_(false);
    return net;
  };
  for (int stage : {2, 3}) expect_matches_plain(stage, 1, frozen_middle);
}

// The module's parameters are views of the engine's buffers: the engine's full parameters
// are the module's values, with no copy.
TEST(TorchModel, ParametersAreViewsOfTheEngineBuffers) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  TorchModel model(*comm, make_mlp(1), config_at(2));
  const std::vector<torch::Tensor> params = model.module().parameters();
  for (size_t p = 0; p < params.size(); ++p) {
    EXPECT_EQ(params[p].data_ptr(), model.engine().param(static_cast<int>(p))) << p;
  }
}

// grads_ready fires as autograd finishes each unit, not at the end of backward: when the first
// layer's gradient arrives (it comes last), the later layers' reductions have been issued, and
// their .grad views have been let go of (the buffer belongs to the reduction).
TEST(TorchModel, LaterUnitsAreReducedDuringBackward) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  TorchModel model(*comm, make_mlp(1), config_at(2));
  const std::vector<torch::Tensor> params = model.module().parameters();
  const auto calls = [&] {
    uint64_t total = 0;
    for (uint64_t n : comm->counters().calls) total += n;
    return total;
  };
  uint64_t before = 0;
  uint64_t during = 0;
  bool last_layer_released = false;
  params[0].register_hook([&](const torch::Tensor&) {
    during = calls();
    last_layer_released = !params.back().grad().defined();
  });
  const auto [x, y] = batch(0);
  const torch::Tensor loss = torch::mse_loss(model.forward(x), y);
  before = calls();
  loss.backward();
  EXPECT_GT(during, before);
  EXPECT_TRUE(last_layer_released);
  model.step();
}

// Once the model is gone, the module keeps the trained values (the fp32 master) in fp32
// storage of its own and trains with LibTorch alone: gradients land in .grad again.
void expect_module_outlives_model(int stage, DType dtype) {
  torch::nn::Sequential net = make_mlp(1);
  std::vector<torch::Tensor> trained;
  std::vector<const void*> engine_buffers;
  {
    std::unique_ptr<Communicator> comm = make_mpi_communicator();
    EngineConfig config = config_at(stage);
    config.precision.dtype = dtype;
    TorchModel model(*comm, net, config);
    const auto [x, y] = batch(0);
    torch::mse_loss(model.forward(x), y).backward();
    model.step();
    trained = tensors_of(model.engine().gather_full_master(), model.engine().layout());
    for (size_t p = 0; p < trained.size() && stage < 3; ++p) {
      engine_buffers.push_back(model.engine().param(static_cast<int>(p)));
    }
  }
  const std::vector<torch::Tensor> initial = snapshot(*make_mlp(1));
  for (size_t p = 0; p < trained.size(); ++p) {
    if (!engine_buffers.empty()) {
      EXPECT_NE(net->parameters()[p].data_ptr(), engine_buffers[p]) << p << ": freed storage";
    }
    EXPECT_TRUE(net->parameters()[p].equal(trained[p])) << p;
    EXPECT_FALSE(trained[p].equal(initial[p])) << p;
  }
  // The same values in a module never wrapped: the gradients must be the same, in .grad.
  torch::nn::Sequential plain = make_mlp(1);
  {
    torch::NoGradGuard no_grad;
    for (size_t p = 0; p < trained.size(); ++p) plain->parameters()[p].copy_(trained[p]);
  }
  const auto [x, y] = batch(1);
  torch::mse_loss(net->forward(x), y).backward();
  torch::mse_loss(plain->forward(x), y).backward();
  for (size_t p = 0; p < trained.size(); ++p) {
    const torch::Tensor grad = net->parameters()[p].grad();
    ASSERT_TRUE(grad.defined()) << p;
    EXPECT_TRUE(grad.equal(plain->parameters()[p].grad())) << p;
  }
}

TEST(TorchModel, ModuleOutlivesTheModel) {
  expect_module_outlives_model(2, DType::kFloat32);
  expect_module_outlives_model(3, DType::kFloat32);
  expect_module_outlives_model(3, DType::kBFloat16);
}

TEST(TorchModel, StepWithoutBackwardNamesTheParameters) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  TorchModel model(*comm, make_mlp(1), config_at(1));
  expect_error_naming([&] { model.step(); }, "'0.weight', '0.bias'");
}

// Stage 3 keeps no full copy: between uses every parameter is empty and the engine holds only
// the prefetched unit; in forward and backward at most the unit at work and the next one are
// gathered, and the parameters a unit's backward sees are views of its gathered buffer. The
// next unit is prefetched in both directions: between the first two units' forwards the first
// is released and the second already on its way; in a unit's backward the one before it is.
// At the end of forward the last unit, which backward starts with, and the one before it,
// which backward prefetches first, stay gathered.
TEST(TorchModel, Stage3ReleasesParameters) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  Engine* engine_seen = nullptr;
  int between_checks = 0;
  const torch::nn::Functional between_first_units([&](const torch::Tensor& x) {
    ++between_checks;
    EXPECT_FALSE(engine_seen->is_gathered(0));
    EXPECT_TRUE(engine_seen->is_gathered(1)) << "the second unit is not prefetched";
    return x;
  });
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Linear(6, 16), between_first_units, torch::nn::Tanh(),
                            torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 3));
  TorchModel model(*comm, net, config_at(3));
  Engine& engine = model.engine();
  engine_seen = &engine;
  const Layout& layout = engine.layout();
  EXPECT_EQ(engine.model_state_bytes(), plan_memory(layout, engine.config()).model_state);
  const std::vector<torch::Tensor> params = model.module().parameters();
  const auto expect_released = [&](const char* when) {
    for (size_t p = 0; p < params.size(); ++p) {
      EXPECT_EQ(params[p].numel(), 0) << when << ": parameter " << p;
    }
    EXPECT_LE(engine.live_elements(), layout.units()[0].numel) << when;
  };
  const size_t two_units = 2 * layout.max_unit_numel();
  expect_released("after wrapping");
  int hooks_run = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    params[p].register_hook([&, p](const torch::Tensor&) {
      ++hooks_run;
      EXPECT_EQ(params[p].data_ptr(), engine.param(static_cast<int>(p))) << p;
      EXPECT_LE(engine.live_elements(), two_units) << "backward of parameter " << p;
      const int unit = layout.params()[p].unit;
      EXPECT_TRUE(unit == 0 || engine.is_gathered(unit - 1))
          << "unit " << unit - 1 << " is not prefetched in the backward of unit " << unit;
    });
  }
  const auto [x, y] = batch(0);
  const torch::Tensor out = model.forward(x);
  const int kept_from = static_cast<int>(layout.units().size()) - 2;
  for (size_t p = 0; p < params.size(); ++p) {
    const bool kept = layout.params()[p].unit >= kept_from;
    EXPECT_EQ(params[p].numel() > 0, kept) << "after forward: parameter " << p;
  }
  EXPECT_LE(engine.live_elements(), two_units) << "after forward";
  torch::mse_loss(out, y).backward();
  EXPECT_EQ(hooks_run, static_cast<int>(params.size()));
  EXPECT_EQ(between_checks, 1);
  model.step();
  expect_released("after step");
}

// A parameter added, or one whose data is replaced, after wrapping would be used by forward
// but not trained (or overwritten by the engine): forward() says so, naming it.
TEST(TorchModel, ChangesAfterWrappingAreErrors) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (int stage : {2, 3}) {
    torch::nn::Sequential grown = make_mlp(1);
    TorchModel grown_model(*comm, grown, config_at(stage));
    grown[2]->register_parameter("extra", torch::zeros({2}));
    expect_error_naming([&] { grown_model.forward(batch(0).first); },
                        "parameter '2.extra' was added to the module after wrapping");
    torch::nn::Sequential replaced = make_mlp(1);
    TorchModel replaced_model(*comm, replaced, config_at(stage));
    replaced->parameters()[2].set_data(torch::zeros({4, 4}));
    expect_error_naming([&] { replaced_model.forward(batch(0).first); },
                        "parameter '2.weight' was replaced after wrapping (now [4, 4], Float)");
  }
}

TEST(TorchModel, PersistentParametersAreRefused) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config = config_at(3);
  config.schedule.persistence_threshold = 100;
  expect_error_naming([&] { TorchModel(*comm, make_mlp(1), config); },
                      "stage3_param_persistence_threshold");
}

}  // namespace
}  // namespace zero
