// The adapter's calls for what a user needs around training: the trained weights in full at
// any stage (with_full_parameters, state_dict), written back when asked; ties declared with the
// Sequential constructor; a floating input of another dtype than the module's refused; and the
// global mean of a loss over the ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "tests/torch/torch_test_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/torch/torch_model.h"

namespace zero {
namespace {

using namespace zero::testing;
using Dict = torch::OrderedDict<std::string, torch::Tensor>;

constexpr double kRel = 1e-5;
constexpr double kAbs = 1e-6;

// One step of the adapter on this rank's slice of the global batch of `step`.
void train_step(TorchModel& model, Communicator& comm, int step) {
  const int64_t rows = kGlobalRows / comm.world_size();
  const auto [x, y] = batch(step);
  torch::mse_loss(model.forward(x.narrow(0, comm.rank() * rows, rows)),
                  y.narrow(0, comm.rank() * rows, rows))
      .backward();
  model.step();
}

void expect_near(const torch::Tensor& seen, const torch::Tensor& expected,
                 const std::string& what) {
  const torch::Tensor error = (seen - expected).abs();
  EXPECT_TRUE(error.le(kRel * expected.abs() + kAbs).all().item<bool>())
      << what << ": max error " << error.max().item<float>();
}

// At stage 3 the module holds empty tensors between uses; the full parameters are the engine's
// fp32 masters, bit for bit the values the module gets back when the model is destroyed, on
// every rank or on rank 0 only.
TEST(TorchUserCalls, FullParametersAreTheTrainedWeights) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const std::vector<std::vector<torch::Tensor>> plain = train_plain();
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    torch::nn::Sequential net = make_mlp(1);
    Dict all, on_rank0, listed;
    {
      TorchModel model(*comm, net, config_at(stage));
      for (int step = 0; step < 2; ++step) train_step(model, *comm, step);
      all = model.state_dict();
      TorchFullParameters rank0;
      rank0.rank0_only = true;
      model.with_full_parameters(rank0, [&](Dict& full) { on_rank0 = full; });
      TorchFullParameters two;
      two.names = {"4.bias", "0.weight"};
      model.with_full_parameters(two, [&](Dict& full) { listed = full; });
    }
    const auto named = net->named_parameters();
    ASSERT_EQ(all.size(), named.size());
    EXPECT_EQ(on_rank0.size(), comm->rank() == 0 ? named.size() : 0u);
    ASSERT_EQ(listed.size(), 2u);
    EXPECT_EQ(listed.keys(), (std::vector<std::string>{"4.bias", "0.weight"}));
    for (size_t p = 0; p < named.size(); ++p) {
      const std::string& name = named[p].key();
      EXPECT_TRUE(torch::equal(all[name], named[p].value())) << name;
      if (comm->rank() == 0) {
        EXPECT_TRUE(torch::equal(on_rank0[name], all[name])) << name;
      }
      expect_near(all[name], plain[1][p], name);
    }
    EXPECT_TRUE(torch::equal(listed["0.weight"], all["0.weight"]));
    // As the docs show: a plain module takes them, and torch::save writes them.
    torch::nn::Sequential copy = make_mlp(5);
    {
      torch::NoGradGuard no_grad;
      for (auto& param : copy->named_parameters()) param.value().copy_(all[param.key()]);
    }
    const std::string path = ::testing::TempDir() + "user_calls_" + std::to_string(comm->rank()) +
                             "_" + std::to_string(stage) + ".pt";
    torch::save(copy, path);
    torch::nn::Sequential loaded = make_mlp(6);
    torch::load(loaded, path);
    std::remove(path.c_str());
    for (const auto& param : loaded->named_parameters()) {
      EXPECT_TRUE(torch::equal(param.value(), all[param.key()])) << param.key();
    }
  }
}

// A write through writable full parameters changes the next step as the same write between
// steps does in plain LibTorch (the moments of AdamW carry on in both).
TEST(TorchUserCalls, WrittenFullParametersTrainOnAsInPlainLibTorch) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  auto plain = make_mlp(1);
  torch::optim::AdamW adamw(plain->parameters(),
                            torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
  for (int step = 0; step < 3; ++step) {
    if (step == 1) {
      torch::NoGradGuard no_grad;
      // The first unit's too: at stage 3 it is prefetched for the next forward by then.
      plain->named_parameters()["0.weight"].fill_(0.25);
      plain->named_parameters()["2.weight"].fill_(0.25);
    }
    const auto [x, y] = batch(step);
    adamw.zero_grad();
    torch::mse_loss(plain->forward(x), y).backward();
    adamw.step();
  }
  for (int stage : {2, 3}) {
    for (bool rank0_only : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (rank0_only ? ", rank 0 only" : ""));
      TorchModel model(*comm, make_mlp(1), config_at(stage));
      train_step(model, *comm, 0);
      TorchFullParameters which;
      which.names = {"0.weight", "2.weight"};
      which.writable = true;
      which.rank0_only = rank0_only;
      model.with_full_parameters(which, [&](Dict& full) {
        // Only rank 0 writes with rank0_only: its values reach every rank.
        for (auto& item : full) item.value().fill_(comm->rank() == 0 || !rank0_only ? 0.25 : 9.0);
      });
      train_step(model, *comm, 1);
      train_step(model, *comm, 2);
      const Dict trained = model.state_dict();
      for (const auto& item : plain->named_parameters()) {
        expect_near(trained[item.key()], item.value(), item.key());
      }
    }
  }
  TorchModel model(*comm, make_mlp(1), config_at(3));
  TorchFullParameters unknown;
  unknown.names = {"2.wieght"};
  expect_error_naming([&] { model.with_full_parameters(unknown, [](Dict&) {}); },
                      "the module has no parameter '2.wieght'");
  TorchFullParameters twice;
  twice.names = {"2.weight", "2.weight"};
  expect_error_naming([&] { model.with_full_parameters(twice, [](Dict&) {}); },
                      "parameter '2.weight' is named twice");
  // Reading is fine after a forward, under no_grad or not; writing under a live graph is not.
  TorchFullParameters writable;
  writable.writable = true;
  const torch::Tensor out = model.forward(batch(0).first);
  model.with_full_parameters({}, [](Dict&) {});
  expect_error_naming([&] { model.with_full_parameters(writable, [](Dict&) {}); },
                      "a forward() since the last step() built a graph that would read them");
  // The backward's gradients await their step: no full parameters until then.
  out.sum().backward();
  expect_error_naming([&] { model.with_full_parameters({}, [](Dict&) {}); },
                      "a backward's gradients await their step()");
  model.step();
  model.with_full_parameters(writable, [](Dict&) {});
}

// A head that reads the embedding's weight, registered under its own name as well.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const torch::Tensor& shared) {
    weight = register_parameter("weight", shared);
  }
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(weight.t()); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);

torch::nn::Sequential make_tied_sequential() {
  torch::manual_seed(3);
  torch::nn::Embedding embed(16, 8);
  return torch::nn::Sequential(embed, torch::nn::Linear(8, 8), torch::nn::Tanh(),
                               TiedHead(embed->weight));
}

// The listed-units form of the same model, each forward written by hand.
std::vector<TorchUnit> listed_units(const torch::nn::Sequential& net) {
  auto embed = net->ptr<torch::nn::EmbeddingImpl>(0);
  auto linear = net->ptr<torch::nn::LinearImpl>(1);
  return {
      {"0", [embed](const torch::Tensor& ids) { return embed->forward(ids); }},
      {"1", [linear](const torch::Tensor& x) { return linear->forward(x); }},
      {"2", [](const torch::Tensor& x) { return torch::tanh(x); }},
      {"3", [embed](const torch::Tensor& x) { return x.matmul(embed->weight.t()); }, {"0.weight"}}};
}

Dict train_tied(TorchModel& model, Communicator& comm) {
  torch::manual_seed(4);  // the same batch on every rank
  const torch::Tensor ids = torch::randint(16, {4, 6}, torch::kLong);
  const torch::Tensor targets = (ids * 5 + 3) % 16;
  const int64_t rows = ids.size(0) / comm.world_size();
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor logits = model.forward(ids.narrow(0, comm.rank() * rows, rows));
    torch::nn::functional::cross_entropy(logits.reshape({-1, 16}),
                                         targets.narrow(0, comm.rank() * rows, rows).reshape({-1}))
        .backward();
    model.step();
  }
  return model.state_dict();
}

TEST(TorchUserCalls, SequentialWithADeclaredTieTrainsAsListedUnits) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    TorchModel sequential(*comm, make_tied_sequential(), TorchTies{{"3", {"0.weight"}}},
                          config_at(stage));
    const Dict tied = train_tied(sequential, *comm);
    torch::nn::Sequential net = make_tied_sequential();
    TorchModel listed(*comm, net.ptr(), listed_units(net), config_at(stage));
    const Dict expected = train_tied(listed, *comm);
    ASSERT_EQ(tied.keys(), expected.keys());
    for (const auto& item : expected) {
      EXPECT_TRUE(torch::equal(tied[item.key()], item.value())) << item.key();
    }
  }
  expect_error_naming(
      [&] { TorchModel(*comm, make_tied_sequential(), config_at(3)); },
      "the later unit declares the tie (TorchUnit::tied, or the ties of the Sequential");
  expect_error_naming(
      [&] {
        TorchModel(*comm, make_tied_sequential(), TorchTies{{"7", {"0.weight"}}}, config_at(3));
      },
      "the ties name child '7', which the Sequential does not have (4 children)");
  const std::vector<TorchUnit> units =
      units_of(make_tied_sequential(), {{"3", {"0.weight"}}}, "body");
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[3].name, "body.3");
  EXPECT_EQ(units[3].tied, std::vector<std::string>{"0.weight"});
}

// Plain LibTorch refuses a double input to an fp32 module; so does the adapter, rather than
// converting it silently. With a 16-bit working dtype an fp32 input is converted, as said.
TEST(TorchUserCalls, InputOfAnotherFloatingDtypeIsRefused) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const torch::Tensor x = batch(0).first;
  TorchModel fp32(*comm, make_mlp(1), config_at(3));
  expect_error_naming([&] { fp32.forward(x.to(torch::kDouble)); },
                      "forward() got a Double input, but the module's parameters are Float");
  expect_error_naming([&] { fp32.forward(x.to(torch::kBFloat16)); },
                      "forward() got a BFloat16 input, but the module's parameters are Float");
  EngineConfig config = config_at(3);
  config.precision.dtype = DType::kBFloat16;
  TorchModel bf16(*comm, make_mlp(1), config);
  expect_error_naming([&] { bf16.forward(x.to(torch::kDouble)); },
                      "got a Double input, but the module's parameters are Float (computed in "
                      "BFloat16)");
  EXPECT_EQ(bf16.forward(x).scalar_type(), torch::kFloat32);
  EXPECT_EQ(bf16.forward(x.to(torch::kBFloat16)).scalar_type(), torch::kFloat32);
}

TEST(TorchUserCalls, GlobalMeanIsTheAllReducedMean) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  TorchModel model(*comm, make_mlp(1), config_at(2));
  const int64_t rows = kGlobalRows / comm->world_size();
  const auto [x, y] = batch(0);
  const torch::Tensor loss = torch::mse_loss(model.forward(x.narrow(0, comm->rank() * rows, rows)),
                                             y.narrow(0, comm->rank() * rows, rows));
  float local = loss.item<float>(), sum = 0.0f;
  comm->all_reduce_sync(&local, &sum, 1, DType::kFloat32);
  const torch::Tensor mean = model.global_mean(loss);
  EXPECT_EQ(mean.item<float>(), sum / static_cast<float>(comm->world_size()));
  EXPECT_FALSE(mean.requires_grad());
  // Equal slices of one global batch: the mean of the ranks' means is the global mean.
  auto plain = make_mlp(1);
  expect_near(mean, torch::mse_loss(plain->forward(x), y).detach(), "global mean");
}

}  // namespace
}  // namespace zero
