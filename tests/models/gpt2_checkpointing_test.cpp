// The GPT-2's activation checkpointing against the model without it: recomputation is bit for
// bit, the bytes held are the formula of gpt2_memory.h, which blocks are checkpointed, the
// per-block profile and the synchronization at checkpoint boundaries. The spill to NVMe:
// gpt2_checkpoint_spill_test.cpp; partitioned checkpoints: gpt2_partitioned_checkpoints_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "tests/models/gpt2_harness.h"

namespace zero::models {
namespace {

using gpt2_test::checkpointed_blocks;
using gpt2_test::Harness;
using gpt2_test::kSettings;
using gpt2_test::label;
using gpt2_test::reference_batch;
using gpt2_test::reference_config;
using gpt2_test::run_step;
using gpt2_test::StepResult;

// Recomputation runs the same kernels on the same inputs: the losses, the logits and every
// gradient are bit for bit those without checkpointing.
TEST(Gpt2Checkpointing, BitwiseEqualToNoCheckpointing) {
  const StepResult none = run_step({}, 4, 32);
  for (const Gpt2Checkpointing& c : kSettings) {
    const StepResult r = run_step(c, 4, 32);
    EXPECT_EQ(r.losses, none.losses) << label(c);
    EXPECT_EQ(r.logits, none.logits) << label(c);
    for (const auto& [name, grad] : none.grads) {
      EXPECT_EQ(r.grads.at(name), grad) << label(c) << ": " << name;
    }
  }
}

// The bytes the modules hold, counted from their tensors, are the formula of gpt2_memory.h, at
// two micro-batch sizes and two sequence lengths, for every setting; so is the peak the
// allocator measured over the step, activations and checkpoints each.
TEST(Gpt2Checkpointing, HeldActivationsEqualTheFormula) {
  std::vector<Gpt2Checkpointing> settings = {{Recompute::kNone, 0}};
  settings.insert(settings.end(), std::begin(kSettings), std::end(kSettings));
  for (const auto& [B, T] : {std::pair{4, 32}, std::pair{2, 64}, std::pair{1, 16}}) {
    std::vector<uint64_t> kept;
    for (const Gpt2Checkpointing& c : settings) {
      Harness h(c);
      const Tensor tokens = reference_batch(h, B, T);
      h.forward(tokens);
      h.backward();
      const Gpt2ActivationBytes held = gpt2_held_activations(h.model);
      const Gpt2ActivationBytes formula = gpt2_activation_formula(h.config, c, B, T);
      const std::string what = label(c) + " B " + std::to_string(B) + " T " + std::to_string(T);
      EXPECT_EQ(held.embedding, formula.embedding) << what;
      EXPECT_EQ(held.blocks, formula.blocks) << what;
      EXPECT_EQ(held.recompute, formula.recompute) << what;
      EXPECT_EQ(held.head, formula.head) << what;
      // With cpu_checkpointing the checkpoints are on the device only while they move: none
      // after backward; every one in the host's memory.
      const uint64_t moving = formula.moving_checkpoints;
      EXPECT_EQ(held.checkpoints + moving, formula.checkpoints) << what;
      EXPECT_EQ(held.host_checkpoints, formula.host_checkpoints) << what;
      EXPECT_EQ(held.spill_buffer, formula.spill_buffer) << what;
      EXPECT_EQ(held.nvme_checkpoints, formula.nvme_checkpoints) << what;
      EXPECT_EQ(held.total() + moving, formula.total()) << what;
      const MemoryStats& measured = h.allocator.stats();
      EXPECT_EQ(measured.window_peak_activations, formula.total()) << what;
      EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                formula.checkpoints)
          << what;
      EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kActivation)],
                formula.total() - formula.checkpoints)
          << what;
      // One allocation per checkpoint, or one for all of them with contiguous_memory (and the
      // spill's buffer); with cpu_checkpointing one in forward and one to bring it back.
      const int blocks = checkpointed_blocks(c, h.config.n_layer);
      const bool one_buffer = c.contiguous_memory || !c.nvme_path.empty();
      const int expected_allocations = one_buffer && blocks > 0 ? 1
                                       : c.cpu_checkpointing    ? 2 * blocks
                                                                : blocks;
      EXPECT_EQ(measured.allocations[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                static_cast<uint64_t>(expected_allocations))
          << what;
      // A second step reuses every buffer: its window peaks at the same bytes.
      h.allocator.start_window();
      h.forward(tokens);
      h.backward();
      EXPECT_EQ(measured.window_peak_activations, formula.total()) << what << ", second step";
      kept.push_back(held.kept());
    }
    // none > selective > full, and a block in full keeps its input alone: B T C floats.
    EXPECT_GT(kept[0], kept[1]);
    EXPECT_GT(kept[1], kept[2]);
    EXPECT_EQ(kept[2], 2u * B * T * 64 * sizeof(float));
  }
  // Without checkpointing nothing is a checkpoint; with full recomputation of both blocks the
  // checkpoints are their inputs.
  EXPECT_EQ(gpt2_activation_formula(reference_config(), {}, 2, 16).checkpoints, 0u);
  EXPECT_EQ(gpt2_activation_formula(reference_config(), {Recompute::kFull, 0}, 2, 16).checkpoints,
            2u * 2 * 16 * 64 * sizeof(float));
  // cpu_checkpointing on a model of 3 full blocks: two of the three inputs on the device at once.
  Gpt2Config three = reference_config();
  three.n_layer = 3;
  const uint64_t one = 2u * 16 * 64 * sizeof(float);
  const Gpt2ActivationBytes kept = gpt2_activation_formula(three, {Recompute::kFull, 0}, 2, 16);
  const Gpt2ActivationBytes moved =
      gpt2_activation_formula(three, {Recompute::kFull, 0, false, false, true}, 2, 16);
  EXPECT_EQ(moved.host_checkpoints, 3 * one);
  EXPECT_EQ(moved.moving_checkpoints, 2 * one);
  EXPECT_EQ(moved.total(), kept.total() - one);
}

TEST(Gpt2Checkpointing, NumberCheckpointsSpreadsBlocksEvenly) {
  auto chosen = [](Recompute r, int n, int layers) {
    std::vector<int> out;
    for (int i = 0; i < layers; ++i) {
      if (gpt2_block_checkpointed({r, n}, i, layers)) out.push_back(i);
    }
    return out;
  };
  EXPECT_EQ(chosen(Recompute::kFull, 4, 12), (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(chosen(Recompute::kFull, 5, 12), (std::vector<int>{0, 2, 4, 7, 9}));
  EXPECT_EQ(chosen(Recompute::kSelective, 0, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(chosen(Recompute::kNone, 2, 3), std::vector<int>{});
  try {
    make_gpt2(reference_config(), 1, {Recompute::kFull, 0, true, false, true});
    FAIL() << "cpu_checkpointing with contiguous_memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_checkpointing with contiguous_memory_optimization "
                                         "is not built yet"),
              std::string::npos)
        << e.what();
  }
  try {
    make_gpt2(reference_config(), 1, {Recompute::kFull, 3});
    FAIL() << "3 checkpoints of 2 layers were accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("number_checkpoints 3 must be between 1 and the model's 2"),
        std::string::npos)
        << e.what();
  }
}

// profile: every block times its forward and backward, and those that recompute their
// recomputation; without profile nothing is timed.
TEST(Gpt2Checkpointing, ProfileTimesEachBlock) {
  for (const Gpt2Checkpointing& c : {Gpt2Checkpointing{Recompute::kNone, 0, false, true},
                                     Gpt2Checkpointing{Recompute::kFull, 1, false, true},
                                     Gpt2Checkpointing{Recompute::kSelective, 0, true, true}}) {
    Harness h(c);
    const Tensor tokens = reference_batch(h, 4, 32);
    h.forward(tokens);
    h.backward();
    const Gpt2Profile profile = take_gpt2_profile(h.model);
    ASSERT_EQ(profile.forward_ms.size(), 2u);
    for (size_t b = 0; b < 2; ++b) {
      const bool recomputes = gpt2_block_checkpointed(c, static_cast<int>(b), 2);
      EXPECT_EQ(profile.recomputes[b], recomputes) << label(c) << " block " << b;
      EXPECT_GT(profile.forward_ms[b], 0.0) << label(c) << " block " << b;
      EXPECT_GT(profile.backward_ms[b], 0.0) << label(c) << " block " << b;
      if (recomputes) {
        EXPECT_GT(profile.recompute_ms[b], 0.0) << label(c) << " block " << b;
      } else {
        EXPECT_EQ(profile.recompute_ms[b], 0.0) << label(c) << " block " << b;
      }
    }
    // Taking the profile restarts it.
    const Gpt2Profile again = take_gpt2_profile(h.model);
    EXPECT_EQ(again.forward_ms, (std::vector<double>{0.0, 0.0})) << label(c);
  }
  Harness quiet({Recompute::kFull, 0});
  const Tensor tokens = reference_batch(quiet, 4, 32);
  quiet.forward(tokens);
  quiet.backward();
  const Gpt2Profile none = take_gpt2_profile(quiet.model);
  EXPECT_EQ(none.forward_ms, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(none.recompute_ms, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(none.backward_ms, (std::vector<double>{0.0, 0.0}));
}

// synchronize_checkpoint_boundary: a checkpointed block waits for the device as its forward and
// its backward begin and end (here, with every block checkpointed, and one of two); a
// block that keeps everything never does, nor does any block without the option. The results
// are those without it, bit for bit.
TEST(Gpt2Checkpointing, SynchronizeCheckpointBoundaryWaitsAtEachCheckpointedBlock) {
  for (int checkpoints : {0, 1}) {
    Gpt2Checkpointing c{Recompute::kFull, checkpoints};
    c.synchronize_boundary = true;
    Harness h(c);
    Harness plain({Recompute::kFull, checkpoints});
    const Tensor tokens = reference_batch(h, 4, 32);
    h.forward(tokens);
    h.backward();
    plain.forward(reference_batch(plain, 4, 32));
    plain.backward();
    const std::vector<int> waits = {4, checkpoints == 0 ? 4 : 0};
    EXPECT_EQ(take_gpt2_profile(h.model).synchronizations, waits) << label(c);
    EXPECT_EQ(take_gpt2_profile(plain.model).synchronizations, (std::vector<int>{0, 0}));
    EXPECT_EQ(h.grads, plain.grads) << label(c);  // float vectors compared exactly
  }
}

}  // namespace
}  // namespace zero::models
