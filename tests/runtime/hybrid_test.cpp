// Hybrid sharding (mics_shard_size k): ZeRO-3 sharded over groups of k consecutive ranks and
// replicated across them must train exactly as plain ZeRO-3 over all ranks and as unsharded
// training, hold 16Ψ/k of model state per rank, and refuse what it cannot do by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/expect_error.h"
#include "tests/runtime/checkpoint_util.h"
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
  o.tweak = [k](EngineConfig& c) { c.grid.mics_shard_size = k; };
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

// Per step, fp32, Ψ padded parameters: stage 3 all-gathers every unit for forward, the fraction
// b of Ψ that backward does not find still gathered for backward, and reduce-scatters every
// gradient, (2 + b) (k-1)/k Ψ over the shard group; hybrid sharding adds the all-reduce of each
// Ψ/k shard over the R = N/k replicas, 2 (R-1)/R Ψ/k. Plain stage 3 is the same formula with
// k = N, which checks that the formula holds here.
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
    const double gathers = 2.0 + stage3_backward_gathered_fraction(run);
    const double expected =
        gathers * (k - 1) / k * psi + 2.0 * (replicas - 1.0) / replicas * psi / k;
    EXPECT_EQ(run.comm_bytes[1], run.comm_bytes[2]) << "k " << k;
    EXPECT_NEAR(static_cast<double>(run.comm_bytes[2]) / expected, 1.0, 0.02)
        << "k " << k << ": " << run.comm_bytes[2] << " bytes, formula " << expected;
  }
}

// The last rank starts every backward late, so the sums across replicas that need it wait.
RunOptions with_a_slow_last_rank(RunOptions o, int sleep_ms) {
  o.before_backward = [sleep_ms](int rank) {
    if (rank == world_size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  };
  return o;
}

// While a sum across replicas waits for a slow replica, the shard group's stream goes on: the
// next unit's reduce-scatter, issued after the sum, starts before the sum ends. Were the shard
// stream to wait for each sum (as it once did), it could start only after that end. Each
// reduction issues one reduce-scatter and then one sum, and each stream runs its work in
// order, so the i-th of each belong together.
TEST(HybridSharding, TheShardGroupDoesNotWaitForSumsAcrossReplicas) {
  const int n = world_size();
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks, two or more";
  // Shard groups of n/2: rank 0's group never holds the slow last rank.
  const int k = n == 2 ? 1 : n / 2;
  RunOptions o = with_a_slow_last_rank(hybrid(k), 100);
  o.steps = 2;
  o.micro_batches = 1;
  o.tweak = [k](EngineConfig& c) {
    c.grid.mics_shard_size = k;
    c.trace = true;
  };
  const TrainResult run = train(o);
  if (make_mpi_communicator()->rank() != 0) return;
  const auto spans_named = [&run](const std::string& name) {
    std::vector<TraceSpan> spans;
    for (const TraceSpan& s : run.trace) {
      if (s.comm && s.name == name) spans.push_back(s);
    }
    std::sort(spans.begin(), spans.end(),
              [](const TraceSpan& a, const TraceSpan& b) { return a.begin_us < b.begin_us; });
    return spans;
  };
  const std::vector<TraceSpan> scatters = spans_named("reduce_scatter");
  const std::vector<TraceSpan> sums = spans_named("replica_all_reduce");
  ASSERT_EQ(scatters.size(), sums.size()) << "one sum across replicas per reduce-scatter";
  ASSERT_GT(sums.size(), 1u);
  int started_before_the_previous_sum_ended = 0;
  for (size_t i = 1; i < sums.size(); ++i) {
    if (scatters[i].begin_us < sums[i - 1].end_us) ++started_before_the_previous_sum_ended;
  }
  EXPECT_GT(started_before_the_previous_sum_ended, 0)
      << "every reduce-scatter waited for the sum across replicas issued before it";
}

// With one micro-batch, sums across replicas read a slot of fp32_scratch (bf16 reduced in
// fp32, kept in bf16) or of the fusion buffer (reduce_bucket_size) on the replica stream after
// the shard stream has moved on; with a slow replica, a missing wait lets the next unit's
// reduction overwrite the slot first. At two ranks (k = 1) each sum is a + b, as plain stage
// 3's is: equal bit for bit.
TEST(HybridSharding, SumsAcrossASlowReplicaReadScratchBeforeItIsReused) {
  if (world_size() != 2) GTEST_SKIP() << "the bitwise comparison is for two ranks";
  for (const bool packed : {false, true}) {
    RunOptions o = with_a_slow_last_rank(hybrid(1), 20);
    o.steps = 3;
    o.micro_batches = 1;
    o.dtype = DType::kBFloat16;
    o.mlp.layers = 6;  // several packs in one backward
    const auto setting = [packed](EngineConfig& c) {
      c.precision.reduce_in_fp32 = true;
      if (packed) {
        c.schedule.reduce_bucket_elements = 1u << 20;
      } else {
        c.precision.grad_accum_dtype = DType::kBFloat16;  // the sum is cast out of the scratch
      }
    };
    o.tweak = [setting](EngineConfig& c) {
      setting(c);
      c.grid.mics_shard_size = 1;
    };
    RunOptions plain = o;
    plain.tweak = setting;
    const TrainResult stage3 = train(plain);
    const TrainResult run = train(o);
    const std::string what = packed ? "packed, " : "unit by unit, ";
    EXPECT_EQ(run.losses, stage3.losses) << what << "losses";
    // The norm adds its per-shard sums in another order (shards of k = 1 are whole units).
    expect_close(run.grad_norms, stage3.grad_norms, 1e-6, what + "gradient norms");
    EXPECT_EQ(run.final_params, stage3.final_params) << what << "parameters";
  }
}

// With gradient accumulation the shard is summed across replicas once per step, at the
// accumulation boundary (as DeepSpeed's MiCS does), while the shard group reduce-scatters and
// gathers every micro-batch: m ((2 + b) (k-1)/k Ψ) + 2 (R-1)/R Ψ/k bytes per step, fp32 (b as
// in the formula above).
TEST(HybridSharding, GradientAccumulationSumsAcrossReplicasOncePerStep) {
  if (world_size() < 2) GTEST_SKIP() << "hybrid sharding needs two ranks or more";
  const int n = world_size();
  for (int k : shard_sizes()) {
    RunOptions o = hybrid(k);
    o.steps = 2;
    o.micro_batches = 3;
    const TrainResult run = train(o);
    const double psi = static_cast<double>(run.padded_params) * sizeof(float);
    const double replicas = static_cast<double>(n / k);
    const double gathers = 2.0 + stage3_backward_gathered_fraction(run);
    const double expected =
        3.0 * gathers * (k - 1) / k * psi + 2.0 * (replicas - 1.0) / replicas * psi / k;
    EXPECT_NEAR(static_cast<double>(run.comm_bytes[1]) / expected, 1.0, 0.02)
        << "k " << k << ": " << run.comm_bytes[1] << " bytes, formula " << expected;
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

// Trains steps [first, last] of a run with shard groups of k (-1: plain stage 3), loading
// `load_from` first and saving into `save_to` after the last step when they are given; returns
// the mean loss of every step and the final parameters.
struct Resumed {
  std::vector<float> losses;
  std::vector<std::vector<float>> final_params;
};

Resumed train_span(int k, long first, long last, const std::string& load_from,
                   const std::string& save_to) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  TrainSetup setup;
  setup.mics_shard_size = k;
  CheckpointTrainer trainer(*comm, setup);
  if (!load_from.empty()) load_checkpoint(trainer.engine(), load_from, nullptr);
  Resumed run;
  for (long step = first; step <= last; ++step) run.losses.push_back(trainer.step(step));
  if (!save_to.empty()) save_checkpoint(trainer.engine(), save_to, TrainerState{last, 0});
  run.final_params = trainer.engine().gather_full_params();
  return run;
}

// A hybrid run's checkpoint holds each shard once, as a world of k ranks would save it: it
// resumes in the same run bit for bit, and in plain stage 3 over every rank (and a plain
// stage-3 checkpoint in the hybrid run) within the reduction-order tolerance.
TEST(HybridSharding, CheckpointsResumeAcrossShardGroupSizes) {
  if (world_size() < 2) GTEST_SKIP() << "hybrid sharding needs two ranks or more";
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (int k : shard_sizes()) {
    const std::string what = "mics_shard_size " + std::to_string(k);
    const std::string dir = shared_temp_dir(*comm);
    const Resumed whole = train_span(k, 1, 6, "", "");
    train_span(k, 1, 3, "", dir + "/hybrid");
    const Resumed same = train_span(k, 4, 6, dir + "/hybrid", "");
    const std::vector<float> later(whole.losses.begin() + 3, whole.losses.end());
    EXPECT_EQ(same.losses, later) << what << ", resumed in the same run";
    EXPECT_EQ(same.final_params, whole.final_params) << what << ", resumed in the same run";
    const Resumed plain = train_span(-1, 4, 6, dir + "/hybrid", "");
    expect_close(plain.losses, later, 1e-6, what + ", resumed in plain stage 3");
    train_span(-1, 1, 3, "", dir + "/plain");
    const Resumed hybrid = train_span(k, 4, 6, dir + "/plain", "");
    expect_close(hybrid.losses, later, 1e-6, what + ", a plain stage-3 checkpoint resumed");
    for (size_t p = 0; p < whole.final_params.size(); ++p) {
      expect_close(plain.final_params[p], whole.final_params[p], 1e-5, what, 1e-7);
      expect_close(hybrid.final_params[p], whole.final_params[p], 1e-5, what, 1e-7);
    }
    if (comm->rank() == 0) std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace zero
