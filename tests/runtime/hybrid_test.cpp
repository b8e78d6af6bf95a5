// Hybrid sharding (mics_shard_size k): ZeRO-3 sharded over groups of k consecutive ranks and
// replicated across them must train exactly as plain ZeRO-3 over all ranks and as unsharded
// training, hold 16Ψ/k of model state per rank, and refuse what it cannot do by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "tests/runtime/train_util.h"
#include "zero/core/check.h"
#include "zero/runtime/checkpoint.h"

namespace zero {
namespace {

using namespace zero::testing;

// Every proper shard group size of this world: 1 <= k < N, k divides N.
std::vector<int> shard_sizes() {
  std::vector<int> sizes;
  for (int k = 1; k < world_size(); ++k) {
    if (world_size() % k == 0) sizes.push_back(k);
  }
  return sizes;
}

RunOptions hybrid(int k) {
  RunOptions o;
  o.stage = 3;
  o.steps = 10;
  o.micro_batches = 2;
  o.clip = 0.05f;
  o.tweak = [k](EngineConfig& c) { c.mics_shard_size = k; };
  return o;
}

TEST(HybridSharding, TrainsAsStageThreeAndAsUnshardedTraining) {
  if (world_size() < 2) GTEST_SKIP() << "hybrid sharding needs two ranks or more";
  RunOptions plain = hybrid(-1);
  plain.tweak = nullptr;
  const TrainResult reference = train_unsharded(plain);
  const TrainResult stage3 = train(plain);
  EXPECT_GT(reference.grad_norms.front(), plain.clip) << "clipping is not exercised";
  for (int k : shard_sizes()) {
    const TrainResult run = train(hybrid(k));
    const std::string what = "mics_shard_size " + std::to_string(k);
    expect_close(run.losses, stage3.losses, 1e-6, what + " vs stage 3, losses");
    expect_close(run.grad_norms, stage3.grad_norms, 1e-6, what + " vs stage 3, gradient norms");
    expect_close(run.losses, reference.losses, 1e-4, what + " vs unsharded, losses");
    ASSERT_EQ(run.final_params.size(), reference.final_params.size()) << what;
    for (size_t p = 0; p < run.final_params.size(); ++p) {
      const std::string param = ", parameter " + std::to_string(p);
      expect_close(run.final_params[p], stage3.final_params[p], 1e-5, what + param, 1e-7);
      expect_close(run.final_params[p], reference.final_params[p], 1e-5, what + param, 1e-7);
    }
  }
}

TEST(HybridSharding, ModelStatePerRankIsSixteenPsiOverK) {
  if (world_size() < 2) GTEST_SKIP() << "hybrid sharding needs two ranks or more";
  for (int k : shard_sizes()) {
    RunOptions o = hybrid(k);
    o.steps = 1;
    const TrainResult run = train(o);
    const uint64_t psi = run.padded_params;
    EXPECT_EQ(psi % static_cast<uint64_t>(k), 0u) << "k " << k;
    // fp32 AdamW: 4 bytes of parameters, 4 of gradients, 8 of moments, each sharded k ways.
    EXPECT_EQ(run.model_state_bytes, 16 * psi / static_cast<uint64_t>(k)) << "k " << k;
    EXPECT_EQ(run.plan.model_state, run.model_state_bytes) << "k " << k;
  }
}

// Per step, fp32, Ψ padded parameters: stage 3 all-gathers every unit twice (forward and
// backward) and reduce-scatters its gradient, 3 (k-1)/k Ψ over the shard group; hybrid
// sharding adds the all-reduce of each Ψ/k shard over the R = N/k replicas, 2 (R-1)/R Ψ/k.
// Plain stage 3 is the same formula with k = N, which checks that the formula holds here.
TEST(HybridSharding, CommunicationPerStepFollowsTheFormula) {
  if (world_size() < 2) GTEST_SKIP() << "one rank communicates nothing";
  const int n = world_size();
  std::vector<int> sizes = shard_sizes();
  sizes.push_back(n);
  for (int k : sizes) {
    RunOptions o = hybrid(k == n ? -1 : k);
    o.steps = 3;
    o.micro_batches = 1;
    const TrainResult run = train(o);
    const double psi = static_cast<double>(run.padded_params) * sizeof(float);
    const double replicas = static_cast<double>(n / k);
    const double expected = 3.0 * (k - 1) / k * psi + 2.0 * (replicas - 1.0) / replicas * psi / k;
    EXPECT_EQ(run.comm_bytes[1], run.comm_bytes[2]) << "k " << k;
    EXPECT_NEAR(static_cast<double>(run.comm_bytes[2]) / expected, 1.0, 0.02)
        << "k " << k << ": " << run.comm_bytes[2] << " bytes, formula " << expected;
  }
}

TEST(HybridSharding, BadShardSizesAreNamedErrors) {
  const int n = world_size();
  const auto run_with = [](int k, int stage) {
    RunOptions o = hybrid(k);
    o.stage = stage;
    o.steps = 1;
    train(o);
  };
  expect_error_naming([&] { run_with(0, 3); }, "mics_shard_size must be -1 (off)");
  expect_error_naming([&] { run_with(n + 1, 3); }, "got " + std::to_string(n + 1));
  if (n == 4) expect_error_naming([&] { run_with(3, 3); }, "divides them, got 3");
  if (n >= 2) expect_error_naming([&] { run_with(1, 2); }, "needs ZeRO stage 3, not stage 2");
}

TEST(HybridSharding, CheckpointsAreRefusedNotHalfWritten) {
  if (world_size() < 2) GTEST_SKIP() << "hybrid sharding needs two ranks or more";
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config;
  config.stage = 3;
  config.mics_shard_size = 1;
  ZeroModel model(*comm, models::make_mlp(MlpConfig{4, 8, 2, 2}), config);
  const std::string dir = "hybrid_checkpoint_" + std::to_string(world_size());
  expect_error_naming([&] { save_checkpoint(model.engine(), dir, TrainerState{}); },
                      "checkpoint save with hybrid sharding (mics_shard_size 1 on");
  expect_error_naming([&] { load_checkpoint(model.engine(), dir, nullptr); },
                      "checkpoint load with hybrid sharding");
}

}  // namespace
}  // namespace zero
