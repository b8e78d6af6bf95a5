// The GPT-2's activation checkpoints spilled to NVMe (a directory of the build tree): bit for
// bit the run that keeps them, two in memory at a time and each moved once, errors that name the
// file, and the settings the spill is not built with refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "models/token_data.h"
#include "tests/models/gpt2_harness.h"
#include "zero/runtime/nvme_file.h"

namespace zero::models {
namespace {

using gpt2_test::Harness;
using gpt2_test::kSpillDir;
using gpt2_test::label;
using gpt2_test::reference_batch;
using gpt2_test::run_step;
using gpt2_test::spilled;
using gpt2_test::StepResult;

// The NVMe spill on 4 blocks with full recomputation, one micro-batch of 20 positions (a
// checkpoint of 5 KiB in a region of 8 KiB): bit for bit the run without the spill; the
// checkpoints in memory at peak (the allocator's kCheckpoint) are the spill's buffer of two
// regions, not the four checkpoints; each micro-batch writes and reads every region once, the
// last block's backward reading the next one's ahead; a forward alone writes them, reads none.
TEST(Gpt2Checkpointing, NvmeSpillHoldsTwoCheckpointsAndMovesEachOnce) {
  constexpr int kLayers = 4, B = 1, T = 20;
  const Gpt2Checkpointing full{Recompute::kFull, 0};
  const StepResult kept = run_step(full, B, T, kLayers);
  const StepResult spill = run_step(spilled(full), B, T, kLayers);
  EXPECT_EQ(spill.losses, kept.losses);
  EXPECT_EQ(spill.logits, kept.logits);
  for (const auto& [name, grad] : kept.grads) EXPECT_EQ(spill.grads.at(name), grad) << name;

  Harness h(spilled(full), nullptr, kLayers);
  const Tensor tokens = reference_batch(h, B, T);
  const uint64_t checkpoint = B * T * 64 * sizeof(float), region = 8192;
  const Gpt2ActivationBytes formula = gpt2_activation_formula(h.config, spilled(full), B, T);
  EXPECT_EQ(formula.spill_buffer, 2 * region + kNvmeBufferSlack);
  EXPECT_EQ(formula.checkpoints, formula.spill_buffer);
  EXPECT_EQ(formula.nvme_checkpoints, kLayers * region);
  EXPECT_EQ(formula.total(), gpt2_activation_formula(h.config, full, B, T).total() -
                                 kLayers * checkpoint + formula.spill_buffer);
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    h.allocator.start_window();
    h.forward(tokens);
    h.backward();
    const MemoryStats& measured = h.allocator.stats();
    EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kCheckpoint)],
              formula.checkpoints);
    EXPECT_LT(formula.checkpoints, kLayers * checkpoint);
    EXPECT_EQ(measured.window_peak_activations, formula.total());
    const Gpt2SpillTraffic traffic = take_gpt2_spill_traffic(h.model);
    EXPECT_EQ(traffic.write_bytes, kLayers * region) << "micro-batch " << micro_batch;
    EXPECT_EQ(traffic.read_bytes, kLayers * region) << "micro-batch " << micro_batch;
  }
  EXPECT_EQ(gpt2_held_activations(h.model).nvme_checkpoints, kLayers * region);
  // Read ahead: the last block's backward reads its own checkpoint and starts the next one's
  // (modules: the embedding, the blocks, the head).
  h.forward(tokens);
  take_gpt2_spill_traffic(h.model);
  Tensor grad({1}, {1.0f});
  size_t next = h.model.modules.size();  // the module whose backward runs next, plus one
  auto backward_to = [&](size_t first) {
    for (; next > first; --next) {
      const size_t m = next - 1;
      Tensor grad_in;
      h.model.modules[m].module->backward(grad, grad_in, h.refs(m, h.values), h.refs(m, h.grads));
      grad = std::move(grad_in);
    }
  };
  backward_to(kLayers);
  EXPECT_EQ(take_gpt2_spill_traffic(h.model).read_bytes, 2 * region);
  backward_to(0);
  EXPECT_EQ(take_gpt2_spill_traffic(h.model).read_bytes, 2 * region);
  h.forward(tokens);
  const Gpt2SpillTraffic forward_only = take_gpt2_spill_traffic(h.model);
  EXPECT_EQ(forward_only.write_bytes, kLayers * region);
  EXPECT_EQ(forward_only.read_bytes, 0u);
}

// Sequence `index` of the reference batch's first two, T tokens, with its targets set in h.
Tensor sequence(Harness& h, int index, int T) {
  const TokenData data(gpt2_test::kData + "tokens.bin");
  Tensor tokens({1, T});
  h.model.targets->ids.resize(static_cast<size_t>(T));
  data.read_sequences(0, 2, T, index, 1, tokens.data(), h.model.targets->ids.data());
  return tokens;
}

// Two micro-batches in flight as on a pipeline stage (forward of the first, of the second, each
// module's activations taken out after each; then the first's backward, the second's): with two
// generations every block's checkpoint of each has regions of its own, so the gradients are bit
// for bit those of the model keeping its checkpoints in memory, and the file holds two regions
// per block (as the formula has it); with one, the second forward overwrote the first's
// checkpoints and the first backward is refused, naming the cause.
TEST(Gpt2Checkpointing, NvmeSpillGivesEachMicroBatchInFlightItsRegions) {
  constexpr int kLayers = 4, T = 20;
  constexpr uint64_t region = 8192;
  auto two_in_flight = [&](const Gpt2Checkpointing& c, uint64_t* file_bytes) {
    Harness h(c, nullptr, kLayers);
    std::vector<std::vector<KeptActivations>> kept(2);
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      h.forward(sequence(h, micro_batch, T));
      for (NamedModule& m : h.model.modules) {
        kept[micro_batch].emplace_back();
        m.module->take_activations(kept[micro_batch].back());
      }
    }
    if (file_bytes != nullptr) *file_bytes = gpt2_held_activations(h.model).nvme_checkpoints;
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      for (size_t m = 0; m < h.model.modules.size(); ++m) {
        h.model.modules[m].module->restore_activations(kept[micro_batch][m]);
      }
      h.backward();
    }
    return h.grads;
  };
  for (const Recompute recompute : {Recompute::kSelective, Recompute::kFull}) {
    const Gpt2Checkpointing kept{recompute, 0};
    Gpt2Checkpointing spill = spilled(kept);
    spill.checkpoint_generations = 2;
    SCOPED_TRACE(label(spill));
    uint64_t file_bytes = 0;
    const auto expected = two_in_flight(kept, nullptr);
    const auto got = two_in_flight(spill, &file_bytes);
    for (const auto& [name, grad] : expected) EXPECT_EQ(got.at(name), grad) << name;
    EXPECT_EQ(file_bytes, kLayers * 2 * region);
    EXPECT_EQ(gpt2_activation_formula(Harness(spill, nullptr, kLayers).config, spill, 1, T)
                  .nvme_checkpoints,
              file_bytes);
    try {
      two_in_flight(spilled(kept), nullptr);
      ADD_FAILURE() << "one generation for two micro-batches in flight was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "was overwritten before its backward: more micro-batches in flight than its 1 "
                    "generation(s), or backward out of forward order"),
                std::string::npos)
          << e.what();
    }
  }
}

// A failing disk (ZERO_TEST_NVME_FAULT, as the offloads' tests inject it) ends forward or
// backward with the spill file, the offset of the failed transfer and errno.
TEST(Gpt2Checkpointing, NvmeSpillErrorsNameFileOffsetAndErrno) {
  constexpr int kLayers = 4, B = 1, T = 20;
  const Gpt2Checkpointing full = spilled({Recompute::kFull, 0});
  const std::string file = kSpillDir + "/activations_rank_0.bin";
  auto error_of = [&](const char* fault, bool backward) {
    EXPECT_EQ(setenv("ZERO_TEST_NVME_FAULT", fault, 1), 0);
    std::string message;
    try {
      Harness h(full, nullptr, kLayers);
      const Tensor tokens = reference_batch(h, B, T);
      h.forward(tokens);
      if (backward) h.backward();
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_EQ(unsetenv("ZERO_TEST_NVME_FAULT"), 0);
    return message;
  };
  // The second block's write, at its region; in backward the first read is the last block's.
  const std::string write = error_of("write@0#2", false);
  EXPECT_NE(write.find("nvme: write of " + file +
                       " at offset 8192 (8192 bytes) failed: "
                       "Input/output error (errno 5) [injected by ZERO_TEST_NVME_FAULT]"),
            std::string::npos)
      << write;
  const std::string read = error_of("read@0", true);
  EXPECT_NE(read.find("nvme: read of " + file +
                      " at offset 24576 (8192 bytes) failed: "
                      "Input/output error (errno 5)"),
            std::string::npos)
      << read;
}

// What the spill is not built with, or has nothing to do without, is refused by name.
TEST(Gpt2Checkpointing, NvmeSpillRefusesWhatItIsNotBuiltWith) {
  const std::pair<Gpt2Checkpointing, std::string> refused[] = {
      {spilled({Recompute::kNone, 0}), "needs activation checkpointing (selective or full)"},
      {spilled({Recompute::kFull, 0, false, false, true}),
       "spill to NVMe with cpu_checkpointing is not built"},
      {spilled({Recompute::kFull, 0, true}),
       "spill to NVMe with contiguous_memory_optimization is not built"},
      {spilled({Recompute::kFull, 0, false, false, false, true}),
       "spill to NVMe with partition_activations is not built yet"},
  };
  for (const auto& [c, expected] : refused) {
    try {
      check_gpt2_checkpointing(c, 2);
      ADD_FAILURE() << label(c) << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace zero::models
