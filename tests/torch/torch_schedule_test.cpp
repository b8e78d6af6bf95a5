// The stage-3 schedule as the LibTorch adapter runs it, the same as ZeroModel's: a tied unit is
// prefetched ahead of the unit that ties to it, a unit whose backward reads none of its values
// (an embedding) is not gathered again for backward, and stage3_max_reuse_distance keeps the
// last units gathered from the end of forward into backward. Each is observed through the
// engine (is_gathered), not through timing, and training still gives the same values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/torch/torch_test_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/torch/torch_model.h"

namespace zero {
namespace {

using namespace zero::testing;

// emb, mid, and a head that also reads emb's weight (tied), as a GPT's LM head reads the token
// embedding.
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl()
      : emb(register_module("emb", torch::nn::Linear(6, 16))),
        mid(register_module("mid", torch::nn::Linear(16, 16))),
        head(register_module("head", torch::nn::Linear(16, 6))) {}
  torch::nn::Linear emb;
  torch::nn::Linear mid;
  torch::nn::Linear head;
};
TORCH_MODULE(TiedNet);

TEST(TorchSchedule, TiedUnitIsPrefetchedAheadOfItsUser) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  torch::manual_seed(1);
  TiedNet net;
  Engine* engine = nullptr;
  int mid_runs = 0;
  bool tied_unit_gathered_during_mid = false;
  std::vector<TorchUnit> units = {
      {"emb", [net](const torch::Tensor& x) mutable { return net->emb->forward(x); }},
      {"mid",
       [&, net](const torch::Tensor& x) mutable {
         ++mid_runs;
         tied_unit_gathered_during_mid = engine->is_gathered(0);
         return torch::tanh(net->mid->forward(x));
       }},
      {"head",
       [net](const torch::Tensor& x) mutable {
         return net->head->forward(x) + x.matmul(net->emb->weight);
       },
       {"emb.weight"}}};
  TorchModel model(*comm, net.ptr(), units, config_at(3));
  engine = &model.engine();
  const auto [x, y] = batch(0);
  torch::mse_loss(model.forward(x), torch::zeros({kGlobalRows, 6})).backward();
  model.step();
  EXPECT_EQ(mid_runs, 1);
  EXPECT_TRUE(tied_unit_gathered_during_mid)
      << "the unit the head ties to is not prefetched while the unit before the head runs";
}

// An embedding, then a linear layer. The embedding's backward needs only the token ids and the
// incoming gradient: stage 3 does not gather it again there.
torch::nn::Sequential make_embedding_net(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Embedding(10, 6), torch::nn::Linear(6, 3));
}

torch::Tensor tokens(int step) {
  torch::manual_seed(2000 + step);
  return torch::randint(0, 10, {kGlobalRows}, torch::kLong);
}

TEST(TorchSchedule, EmbeddingIsNotGatheredForBackward) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int rank = comm->rank();
  const int64_t rows = kGlobalRows / comm->world_size();
  TorchModel model(*comm, make_embedding_net(1), config_at(3));
  Engine& engine = model.engine();
  torch::Tensor weight = model.module().parameters()[0];
  int hooks_run = 0;
  bool gathered_in_backward = false;
  weight.register_hook([&](const torch::Tensor&) {
    ++hooks_run;
    gathered_in_backward = gathered_in_backward || engine.is_gathered(0);
  });
  auto plain = make_embedding_net(1);
  torch::optim::AdamW adamw(plain->parameters(),
                            torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor ids = tokens(step);
    const torch::Tensor y = batch(step).second;
    torch::mse_loss(model.forward(ids.narrow(0, rank * rows, rows)), y.narrow(0, rank * rows, rows))
        .backward();
    model.step();
    adamw.zero_grad();
    torch::mse_loss(plain->forward(ids), y).backward();
    adamw.step();
  }
  EXPECT_EQ(hooks_run, 3);
  EXPECT_FALSE(gathered_in_backward) << "the embedding was gathered for a backward that reads "
                                        "none of its values";
  const std::vector<torch::Tensor> trained =
      tensors_of(engine.gather_full_params(), engine.layout());
  const std::vector<torch::Tensor> expected = snapshot(*plain);
  ASSERT_EQ(trained.size(), expected.size());
  for (size_t p = 0; p < trained.size(); ++p) {
    EXPECT_TRUE(torch::allclose(trained[p], expected[p], 1e-5, 1e-6)) << "parameter " << p;
  }
  EXPECT_GT((expected[0] - snapshot(*make_embedding_net(1))[0]).abs().max().item<float>(), 1e-3);
}

// The engine's parameters after three steps of the MLP at stage 3 with `reuse_distance`, and
// whether the first unit was still gathered when forward returned.
struct ReuseRun {
  std::vector<torch::Tensor> trained;
  bool first_unit_kept = false;
};

ReuseRun train_with_reuse(size_t reuse_distance) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int rank = comm->rank();
  const int64_t rows = kGlobalRows / comm->world_size();
  EngineConfig config = config_at(3);
  config.schedule.max_reuse_distance = reuse_distance;
  TorchModel model(*comm, make_mlp(1), config);
  ReuseRun run;
  for (int step = 0; step < 3; ++step) {
    const auto [x, y] = batch(step);
    const torch::Tensor out = model.forward(x.narrow(0, rank * rows, rows));
    run.first_unit_kept = model.engine().is_gathered(0);
    torch::mse_loss(out, y.narrow(0, rank * rows, rows)).backward();
    model.step();
  }
  run.trained = tensors_of(model.engine().gather_full_params(), model.engine().layout());
  return run;
}

TEST(TorchSchedule, ReuseDistanceKeepsUnitsGatheredForBackward) {
  const ReuseRun released = train_with_reuse(0);
  const ReuseRun kept = train_with_reuse(size_t{1} << 30);
  EXPECT_FALSE(released.first_unit_kept);
  EXPECT_TRUE(kept.first_unit_kept) << "stage3_max_reuse_distance is ignored";
  ASSERT_EQ(kept.trained.size(), released.trained.size());
  for (size_t p = 0; p < kept.trained.size(); ++p) {
    EXPECT_TRUE(torch::equal(kept.trained[p], released.trained[p])) << "parameter " << p;
  }
}

}  // namespace
}  // namespace zero
