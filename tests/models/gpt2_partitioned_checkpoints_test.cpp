// The GPT-2's partition_activations: each checkpoint kept as a tensor-parallel rank's piece,
// the group being threads of this process (thread_group_communicator.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "tests/models/gpt2_harness.h"
#include "tests/models/thread_group_communicator.h"

namespace zero::models {
namespace {

using gpt2_test::checkpointed_blocks;
using gpt2_test::Harness;
using gpt2_test::label;
using gpt2_test::reference_batch;
using gpt2_test::reference_config;
using gpt2_test::split_config;
using gpt2_test::StepResult;
using gpt2_test::ThreadGroup;
using gpt2_test::ThreadGroupCommunicator;

// partition_activations at t = 2, the tensor-parallel group being two threads of this process:
// each checkpoint is kept as a rank's half and all-gathered back before its block recomputes.
// Per rank, losses, logits and every gradient are bit for bit those of the same checkpointing
// without partitioning (the all-gather rebuilds the exact input) and those without
// checkpointing; the held bytes and the allocator's peaks are the formula's, whose checkpoints
// are half the unpartitioned ones; and backward all-gathers once per checkpointed block.
TEST(Gpt2Checkpointing, PartitionedCheckpointsAreBitwiseAndHoldTheirFormula) {
  constexpr int kRanks = 2;
  struct SplitStep {
    StepResult result;
    uint64_t gathers = 0;  // all-gathers of the step
  };
  // One step of two micro-batches on each rank; `check(rank, harness)` after it.
  auto split_step = [](const Gpt2Checkpointing& c, int B, int T, auto check) {
    ThreadGroup group(kRanks);
    std::vector<SplitStep> steps(kRanks);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < kRanks; ++rank) {
      ranks.emplace_back([&, rank] {
        ThreadGroupCommunicator comm(group, rank);
        Harness h(c, &comm);
        const Tensor tokens = reference_batch(h, B, T);
        SplitStep& step = steps[static_cast<size_t>(rank)];
        for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
          step.result.losses.push_back(h.forward(tokens));
          step.result.logits = gpt2_logits(h.model).to_host();
          h.backward();
        }
        step.result.grads = h.grads;
        step.gathers = comm.counters().calls[static_cast<size_t>(CollectiveOp::kAllGather)];
        check(rank, h);
      });
    }
    for (std::thread& r : ranks) r.join();
    return steps;
  };
  const auto nothing = [](int, Harness&) {};
  const std::vector<SplitStep> none = split_step({}, 4, 32, nothing);
  const Gpt2Checkpointing settings[] = {
      {Recompute::kFull, 0},
      {Recompute::kSelective, 0},
      {Recompute::kFull, 0, true},       // the pieces in one contiguous buffer
      {Recompute::kSelective, 1, true},  // block 0 of 2 partitions, block 1 keeps everything
  };
  for (const Gpt2Checkpointing& whole : settings) {
    Gpt2Checkpointing partitioned = whole;
    partitioned.partition_activations = true;
    const std::string what = label(whole) + " partition_activations";
    const std::vector<SplitStep> kept = split_step(whole, 4, 32, nothing);
    const std::vector<SplitStep> split = split_step(partitioned, 4, 32, nothing);
    const uint64_t blocks = static_cast<uint64_t>(checkpointed_blocks(whole, 2));
    for (size_t rank = 0; rank < kRanks; ++rank) {
      const std::string on = what + ", rank " + std::to_string(rank);
      EXPECT_EQ(split[rank].result.losses, kept[rank].result.losses) << on;
      EXPECT_EQ(split[rank].result.losses, none[rank].result.losses) << on;
      EXPECT_EQ(split[rank].result.logits, kept[rank].result.logits) << on;
      for (const auto& [name, grad] : kept[rank].result.grads) {
        EXPECT_EQ(split[rank].result.grads.at(name), grad) << on << ": " << name;
        EXPECT_EQ(none[rank].result.grads.at(name), grad) << on << ": " << name;
      }
      // Per micro-batch: one all-gather per checkpointed block in backward.
      EXPECT_EQ(split[rank].gathers, kept[rank].gathers + 2 * blocks) << on;
    }
    for (const auto& [B, T] : {std::pair{4, 32}, std::pair{1, 16}}) {
      const Gpt2Config config = split_config(kRanks);
      const Gpt2ActivationBytes formula = gpt2_activation_formula(config, partitioned, B, T);
      const Gpt2ActivationBytes unpartitioned = gpt2_activation_formula(config, whole, B, T);
      const uint64_t piece = static_cast<uint64_t>(B * T * 64 / kRanks) * sizeof(float);
      EXPECT_EQ(formula.checkpoints, blocks * piece) << what;
      EXPECT_EQ(formula.checkpoints * kRanks, unpartitioned.checkpoints) << what;
      EXPECT_EQ(formula.recompute, unpartitioned.recompute + kRanks * piece) << what;
      split_step(partitioned, B, T, [&](int, Harness& h) {
        const Gpt2ActivationBytes held = gpt2_held_activations(h.model);
        EXPECT_EQ(held.blocks, formula.blocks) << what;
        EXPECT_EQ(held.checkpoints, formula.checkpoints) << what;
        EXPECT_EQ(held.recompute, formula.recompute) << what;
        EXPECT_EQ(held.total(), formula.total()) << what;
        const MemoryStats& measured = h.allocator.stats();
        EXPECT_EQ(measured.window_peak_activations, formula.total()) << what;
        EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                  formula.checkpoints)
            << what;
        EXPECT_EQ(measured.allocations[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                  whole.contiguous_memory ? 1u : blocks)
            << what;
      });
    }
  }
  // Over a group of one a partition is the whole checkpoint: the formula is the one without.
  const Gpt2Checkpointing alone{Recompute::kFull, 0, false, false, false, true};
  EXPECT_EQ(gpt2_activation_formula(reference_config(), alone, 4, 32).total(),
            gpt2_activation_formula(reference_config(), {Recompute::kFull, 0}, 4, 32).total());
  try {
    check_gpt2_checkpointing({Recompute::kFull, 0, false, false, true, true}, 2);
    FAIL() << "cpu_checkpointing with partition_activations was accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("cpu_checkpointing with partition_activations is not built yet"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero::models
