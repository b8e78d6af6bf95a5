// The GPT-2 as pipeline stages: micro-batches in flight (each module's kept activations moved out
// after its forward and back before its backward) give the gradients of one micro-batch at a
// time, bit for bit; the stages' partitions and the settings that cannot have several
// micro-batches in flight.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "models/token_data.h"
#include "tests/expect_error.h"
#include "tests/models/gpt2_harness.h"
#include "zero/kernels/transformer_kernels.h"
#include "zero/runtime/nvme_file.h"

namespace zero::models::gpt2_test {
namespace {

constexpr int kT = 16;

// Sequences [first, first + 2) of the reference batch, their targets set in h's model.
Tensor micro_batch(Harness& h, int first) {
  const TokenData data(kData + "tokens.bin");
  Tensor tokens({2, kT});
  h.model.targets->ids.resize(2 * kT);
  data.read_sequences(0, 4, kT, first, 2, tokens.data(), h.model.targets->ids.data());
  return tokens;
}

std::vector<KeptActivations> take(Harness& h) {
  std::vector<KeptActivations> kept(h.model.modules.size());
  for (size_t m = 0; m < kept.size(); ++m) h.model.modules[m].module->take_activations(kept[m]);
  return kept;
}

void restore(Harness& h, std::vector<KeptActivations>& kept) {
  for (size_t m = 0; m < kept.size(); ++m) h.model.modules[m].module->restore_activations(kept[m]);
}

// ZB-H1's order on one stage for micro-batches 0 and 1: both forwards (forward(k) returns k's
// loss), both input halves, then both weight halves, each micro-batch's tensors moved out
// between its halves. The losses in order.
std::vector<float> in_zb_h1_order(Harness& h, const std::function<float(int)>& forward,
                                  const std::function<void(int)>& backward_input,
                                  const std::function<void()>& backward_weight) {
  std::vector<float> losses;
  losses.push_back(forward(0));
  std::vector<KeptActivations> first = take(h);
  losses.push_back(forward(1));
  std::vector<KeptActivations> second = take(h);
  restore(h, first);
  backward_input(0);
  first = take(h);
  restore(h, second);
  backward_input(1);
  second = take(h);
  restore(h, first);
  backward_weight();
  restore(h, second);
  backward_weight();
  return losses;
}

// The contiguous checkpoint buffer with a set per micro-batch in flight (forward k in set k mod
// 2): bitwise too.
Gpt2Checkpointing contiguous(Recompute recompute, int generations) {
  Gpt2Checkpointing c{recompute};
  c.contiguous_memory = true;
  c.checkpoint_generations = generations;
  return c;
}

TEST(Gpt2Pipeline, MicroBatchesInFlightGiveTheGradientsOfOneAtATime) {
  for (const Gpt2Checkpointing& c :
       {Gpt2Checkpointing{}, Gpt2Checkpointing{Recompute::kSelective},
        Gpt2Checkpointing{Recompute::kFull}, contiguous(Recompute::kFull, 2),
        contiguous(Recompute::kSelective, 2)}) {
    SCOPED_TRACE(label(c));
    Harness one_at_a_time(c), in_flight(c);
    std::vector<float> expected_losses;
    for (int first : {0, 2}) {
      expected_losses.push_back(one_at_a_time.forward(micro_batch(one_at_a_time, first)));
      one_at_a_time.backward();
    }
    // GPipe's order on one stage: both forwards, then both backwards.
    std::vector<float> losses;
    losses.push_back(in_flight.forward(micro_batch(in_flight, 0)));
    std::vector<KeptActivations> first = take(in_flight);
    losses.push_back(in_flight.forward(micro_batch(in_flight, 2)));
    std::vector<KeptActivations> second = take(in_flight);
    restore(in_flight, first);
    in_flight.backward();
    restore(in_flight, second);
    in_flight.backward();
    EXPECT_EQ(losses, expected_losses);
    for (const auto& [name, grad] : one_at_a_time.grads) {
      EXPECT_EQ(in_flight.grads.at(name), grad) << name;
    }
  }
}

// ZB-H1's order on one stage: both forwards, both input halves, then both weight halves, each
// micro-batch's tensors moved out between its halves. A recomputing block recomputes in
// backward_input and keeps what backward_weight reads (the shared buffers hold the next block's
// and the next micro-batch's by then; with the spill, its buffer other checkpoints), so the
// gradients are bitwise the fused backward's.
TEST(Gpt2Pipeline, SplitBackwardWithRecomputationGivesTheFusedGradients) {
  Gpt2Checkpointing spilled_full = spilled(Gpt2Checkpointing{Recompute::kFull});
  spilled_full.checkpoint_generations = 2;  // both micro-batches' checkpoints in the file at once
  for (const Gpt2Checkpointing& c : {Gpt2Checkpointing{}, Gpt2Checkpointing{Recompute::kSelective},
                                     Gpt2Checkpointing{Recompute::kFull}, spilled_full}) {
    SCOPED_TRACE(label(c));
    Harness fused(c), split(c);
    std::vector<float> expected_losses;
    for (int first : {0, 2}) {
      expected_losses.push_back(fused.forward(micro_batch(fused, first)));
      fused.backward();
    }
    auto backward_input = [&split](int) {
      Tensor current({1}, {1.0f});
      for (size_t m = split.model.modules.size(); m-- > 0;) {
        Tensor grad_in;
        split.model.modules[m].module->backward_input(current, grad_in,
                                                      split.refs(m, split.values));
        current = std::move(grad_in);
      }
    };
    auto backward_weight = [&split] {
      for (size_t m = split.model.modules.size(); m-- > 0;) {
        split.model.modules[m].module->backward_weight(split.refs(m, split.grads));
      }
    };
    const std::vector<float> losses = in_zb_h1_order(
        split, [&split](int k) { return split.forward(micro_batch(split, 2 * k)); }, backward_input,
        backward_weight);
    EXPECT_EQ(losses, expected_losses);
    for (const auto& [name, grad] : fused.grads) EXPECT_EQ(split.grads.at(name), grad) << name;
  }
}

// In bf16 the head makes the loss's gradient in forward and each backward half scales it by the
// loss's gradient given to backward_input; the weight half runs later, after the other
// micro-batch's input half, so that scale travels with its micro-batch. Two micro-batches
// whose losses weigh 1 and 0.5: ZB-H1's order gives the bits of the whole backward's.
TEST(Gpt2Pipeline, Bf16SplitBackwardScalesEachMicroBatchByItsOwnLossGradient) {
  if (!kernels::bf16_products_in_bf16()) {
    GTEST_SKIP() << "the head makes the loss's gradient in forward only with bf16 products in "
                    "bf16: "
                 << kernels::bf16_products_description();
  }
  Harness fused, split;
  Bf16Params fused_params(fused), split_params(split);
  const std::vector<float> weights = {1.0f, 0.5f};
  std::vector<float> expected_losses;
  for (int k : {0, 1}) {
    expected_losses.push_back(fused_params.forward(fused, micro_batch(fused, 2 * k)));
    Tensor current({1}, {weights[k]});
    for (size_t m = fused.model.modules.size(); m-- > 0;) {
      Tensor grad_in;
      fused.model.modules[m].module->backward(current, grad_in,
                                              fused_params.refs(fused, m, fused_params.values),
                                              fused_params.refs(fused, m, fused_params.grads));
      current = std::move(grad_in);
    }
  }
  const auto backward_input = [&](int k) {
    Tensor current({1}, {weights[k]});
    for (size_t m = split.model.modules.size(); m-- > 0;) {
      Tensor grad_in;
      split.model.modules[m].module->backward_input(
          current, grad_in, split_params.refs(split, m, split_params.values));
      current = std::move(grad_in);
    }
  };
  const auto backward_weight = [&] {
    for (size_t m = split.model.modules.size(); m-- > 0;) {
      split.model.modules[m].module->backward_weight(
          split_params.refs(split, m, split_params.grads));
    }
  };
  const std::vector<float> losses = in_zb_h1_order(
      split, [&](int k) { return split_params.forward(split, micro_batch(split, 2 * k)); },
      backward_input, backward_weight);
  EXPECT_EQ(losses, expected_losses);
  for (const auto& [name, grad] : fused_params.grads) {
    EXPECT_EQ(split_params.grads.at(name), grad) << name;
  }
}

// More micro-batches in flight than the contiguous buffer has sets: the second forward takes
// the first's slot, and the first's backward stops naming both forwards instead of recomputing
// from the wrong input. cpu_checkpointing's one host copy per block is refused at once.
TEST(Gpt2Pipeline, ACheckpointOverwrittenInItsSlotIsAnError) {
  Harness h(contiguous(Recompute::kFull, 1));
  h.forward(micro_batch(h, 0));
  std::vector<KeptActivations> first = take(h);
  h.forward(micro_batch(h, 2));
  std::vector<KeptActivations> second = take(h);
  restore(h, first);
  testing::expect_error_naming([&] { h.backward(); },
                               "a GPT-2 block's checkpoint of its forward 0 was overwritten by its "
                               "forward 1 before its backward: more micro-batches in flight than "
                               "the 1 set(s) of the contiguous checkpoint buffer");
  Gpt2Checkpointing moved{Recompute::kFull};
  moved.cpu_checkpointing = true;
  Harness host(moved);
  host.forward(micro_batch(host, 0));
  KeptActivations kept;
  testing::expect_error_naming([&] { host.model.modules[1].module->take_activations(kept); },
                               "cannot have several micro-batches in flight");
}

TEST(Gpt2Pipeline, StagesSplitTheBlocksAndKeepEmbeddingsFirstAndTheHeadLast) {
  const Gpt2Config config = reference_config();
  const std::vector<int> bounds = gpt2_pipeline_partition(config, 2, "uniform");
  EXPECT_EQ(bounds, (std::vector<int>{0, 1, 2}));
  std::vector<std::string> first, last;
  for (const ParamSpec& s : gpt2_param_specs(config, gpt2_pipeline_stage(config, bounds, 0))) {
    first.push_back(s.name);
  }
  for (const ParamSpec& s : gpt2_param_specs(config, gpt2_pipeline_stage(config, bounds, 1))) {
    last.push_back(s.name);
  }
  EXPECT_EQ(first.front(), "wte.weight");
  EXPECT_EQ(first[1], "wpe.weight");
  EXPECT_EQ(first.back(), "h.0.mlp.c_proj.bias");
  // The last stage holds its own wte, which the head reads, then h.1 and ln_f.
  EXPECT_EQ(last.front(), "wte.weight");
  EXPECT_EQ(last[1], "h.1.ln_1.weight");
  EXPECT_EQ(last.back(), "ln_f.bias");
}

// Megatron's layout: with p stages of v chunks, virtual stage c * p + s is stage s's chunk c;
// the embeddings go with virtual stage 0, ln_f and the head (and the stage's wte) with the last.
TEST(Gpt2Pipeline, InterleavedStagesHoldTheirChunksInMegatronsLayout) {
  Gpt2Config config = reference_config();
  config.n_layer = 4;
  const std::vector<int> bounds = gpt2_pipeline_partition(config, 4, "uniform");
  const Gpt2PipelineStage first = gpt2_pipeline_stage(config, bounds, 0, 2);
  const Gpt2PipelineStage last = gpt2_pipeline_stage(config, bounds, 1, 2);
  EXPECT_EQ(first.stages, 2);
  EXPECT_EQ(first.chunks, (std::vector<std::pair<int, int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(last.chunks, (std::vector<std::pair<int, int>>{{1, 2}, {3, 4}}));
  EXPECT_EQ(first.describe_layers(4), "0-0, 2-2");
  EXPECT_TRUE(first.embeds(0) && !first.embeds(1) && !first.heads(1));
  EXPECT_TRUE(last.heads(1) && !last.heads(0));
  std::vector<std::pair<std::string, int>> held;  // (name, chunk) of the last stage's
  for (const ParamSpec& s : gpt2_param_specs(config, last)) held.emplace_back(s.name, s.chunk);
  EXPECT_EQ(held.front(), std::make_pair(std::string("h.1.ln_1.weight"), 0));
  const auto wte =
      std::find(held.begin(), held.end(), std::make_pair(std::string("wte.weight"), 1));
  ASSERT_NE(wte, held.end());
  EXPECT_EQ((wte - 1)->first, "h.1.mlp.c_proj.bias");
  EXPECT_EQ((wte + 1)->first, "h.3.ln_1.weight");
  EXPECT_EQ(held.back(), std::make_pair(std::string("ln_f.bias"), 1));
  // The modules ZeroModel runs per chunk: chunk 1 starts with the stage's wte.
  const Gpt2 model = make_gpt2(config, 1, {}, {}, last);
  EXPECT_EQ(model.chunk_first_modules, (std::vector<int>{0, 1}));
  testing::expect_error_naming(
      [&] {
        gpt2_pipeline_stage(config, {0, 1, 2, 4}, 0, 2);
      },
      "a GPT-2 pipeline partition into 3 parts is not 2 chunks per stage");
}

TEST(Gpt2Pipeline, PartitionByParametersBalancesTheEmbeddingsAndTheHead) {
  Gpt2Config config;
  ASSERT_TRUE(gpt2_preset("gpt2-124M", &config));
  // wte (38.6M) and wpe on the first stage and wte again on the last weigh about five blocks of
  // 7.1M each: the end stages get one block, the middle ones five.
  EXPECT_EQ(gpt2_pipeline_partition(config, 4, "parameters"), (std::vector<int>{0, 1, 6, 11, 12}));
  EXPECT_EQ(gpt2_pipeline_partition(config, 4, "uniform"), (std::vector<int>{0, 3, 6, 9, 12}));
  EXPECT_EQ(gpt2_pipeline_partition(config, 1, "parameters"), (std::vector<int>{0, 12}));
  // DeepSpeed's type:REGEX counts the matching layers: blocks alone balance as uniform does, and
  // an embedding and a head that count too take a block's place on the end stages.
  EXPECT_EQ(gpt2_pipeline_partition(config, 4, "type:block"), (std::vector<int>{0, 3, 6, 9, 12}));
  EXPECT_EQ(gpt2_pipeline_partition(config, 4, "type:gpt2"), (std::vector<int>{0, 2, 5, 9, 12}));
}

TEST(Gpt2Pipeline, PartitionByFlopsWeighsTheHeadsProductOverTheVocabulary) {
  Gpt2Config config;
  ASSERT_TRUE(gpt2_preset("gpt2-124M", &config));
  // Per token a block does 72 C^2 + 12 C T = 51.9M FLOPs at T 1024, the head 6 V C = 231.6M,
  // 4.5 blocks, and the embeddings nothing: the last stage gets one block, the others the rest.
  EXPECT_EQ(gpt2_pipeline_partition(config, 4, "flops"), (std::vector<int>{0, 3, 7, 11, 12}));
  // The benchmark's 6 x 384 at T 256: the head weighs 9.8 blocks, so 5 go first.
  Gpt2Config small = config;
  small.n_layer = 6;
  small.n_embd = 384;
  small.n_head = 6;
  EXPECT_EQ(gpt2_pipeline_partition(small, 2, "flops", 256), (std::vector<int>{0, 5, 6}));
  // Over a vocabulary of 256 the head weighs a fifth of a block: the blocks split evenly.
  small.vocab_size = 256;
  EXPECT_EQ(gpt2_pipeline_partition(small, 2, "flops", 256), (std::vector<int>{0, 3, 6}));
}

TEST(Gpt2Pipeline, CutsThatCannotBeAreErrors) {
  const Gpt2Config config = reference_config();
  testing::expect_error_naming([&] { gpt2_pipeline_partition(config, 3, "parameters"); },
                               "cannot be cut into 3 pipeline stages");
  Gpt2Config four = config;
  four.n_layer = 4;
  testing::expect_error_naming([&] { gpt2_pipeline_partition(four, 3, "uniform"); },
                               "3 pipeline stages do not divide the 4 layers");
  testing::expect_error_naming([&] { gpt2_pipeline_partition(config, 2, "blocks"); },
                               "unknown pipeline partition method 'blocks'");
  testing::expect_error_naming([&] { gpt2_pipeline_partition(config, 2, "type:Linear"); },
                               "matches no layer type");
  testing::expect_error_naming([&] { gpt2_pipeline_partition(config, 2, "type:(("); },
                               "not a regular expression");
  testing::expect_error_naming(
      [&] {
        gpt2_pipeline_stage(config, {0, 2, 1}, 0);
      },
      "runs from layer 0 to n_layer");
}

// A stage's formula is its share of the whole model's: over the stages, one micro-batch each,
// the kept bytes add up to the whole's; the recompute buffers are on every stage with a
// checkpointed block (and only there); k in flight keep k times as much beside one set of them.
TEST(Gpt2Pipeline, StageFormulasShareTheWholeModelsActivations) {
  Gpt2Config config = reference_config();
  config.n_layer = 4;
  const std::vector<int> bounds = gpt2_pipeline_partition(config, 2, "uniform");
  for (const Gpt2Checkpointing& c :
       {Gpt2Checkpointing{}, Gpt2Checkpointing{Recompute::kSelective},
        Gpt2Checkpointing{Recompute::kFull}, Gpt2Checkpointing{Recompute::kFull, 1}}) {
    SCOPED_TRACE(label(c) + " on " + std::to_string(c.number_checkpoints) + " block(s)");
    const Gpt2ActivationBytes whole = gpt2_activation_formula(config, c, 2, kT);
    uint64_t kept = 0, checkpoints = 0;
    for (int s = 0; s < 2; ++s) {
      const Gpt2PipelineStage stage = gpt2_pipeline_stage(config, bounds, s);
      const Gpt2StageActivationBytes one =
          gpt2_stage_activation_formula(config, c, stage, 1, 2, kT);
      const Gpt2StageActivationBytes three =
          gpt2_stage_activation_formula(config, c, stage, 3, 2, kT);
      kept += one.per_micro_batch();
      checkpoints += one.micro_batch.checkpoints;
      // Full on one block checkpoints block 0 only: the second stage has no recompute buffers.
      const bool recomputes =
          c.recompute != Recompute::kNone && (c.number_checkpoints == 0 || s == 0);
      EXPECT_EQ(one.micro_batch.recompute, recomputes ? whole.recompute : 0) << s;
      EXPECT_EQ(three.peak(), 3 * one.per_micro_batch() + one.micro_batch.recompute) << s;
      EXPECT_EQ(three.peak_checkpoints(), 3 * one.micro_batch.checkpoints) << s;
    }
    EXPECT_EQ(kept, whole.total() - whole.recompute);
    EXPECT_EQ(checkpoints, whole.checkpoints);
    const Gpt2StageActivationBytes alone =
        gpt2_stage_activation_formula(config, c, Gpt2PipelineStage{}, 1, 2, kT);
    EXPECT_EQ(alone.peak(), whole.total());
    // Interleaved (2 stages x 2 chunks, 2 micro-batches: all forwards first): every set of
    // each chunk in flight at the first backward, beside the recompute buffers.
    const std::vector<int> virtual_bounds = gpt2_pipeline_partition(config, 4, "uniform");
    const std::vector<std::vector<PipelineAction>> lists =
        make_pipeline_schedule(PipelineScheduleKind::kInterleaved, 2, 2, 2);
    for (int s = 0; s < 2; ++s) {
      const Gpt2PipelineStage stage = gpt2_pipeline_stage(config, virtual_bounds, s, 2);
      const Gpt2StageActivationBytes chunked =
          gpt2_chunked_stage_activation_formula(config, c, stage, lists[s], 2, kT);
      ASSERT_EQ(chunked.chunk_bytes.size(), 2u);
      EXPECT_EQ(chunked.chunk_sets, (std::vector<int>{2, 2})) << s;
      EXPECT_EQ(chunked.in_flight, 4) << s;
      EXPECT_EQ(chunked.chunk_bytes[0] + chunked.chunk_bytes[1], chunked.per_micro_batch()) << s;
      EXPECT_EQ(chunked.peak(), 2 * chunked.per_micro_batch() + chunked.micro_batch.recompute) << s;
      EXPECT_EQ(chunked.peak_checkpoints(), 2 * chunked.micro_batch.checkpoints) << s;
    }
  }
  // The contiguous buffer with a set per micro-batch in flight holds what the blocks would keep
  // each, shared by the micro-batches; with one set, one micro-batch's checkpoints less.
  // cpu_checkpointing's one host copy per block is refused.
  const Gpt2PipelineStage first = gpt2_pipeline_stage(config, bounds, 0);
  const Gpt2StageActivationBytes kept =
      gpt2_stage_activation_formula(config, Gpt2Checkpointing{Recompute::kFull}, first, 2, 2, kT);
  const Gpt2StageActivationBytes in_buffer =
      gpt2_stage_activation_formula(config, contiguous(Recompute::kFull, 2), first, 2, 2, kT);
  EXPECT_EQ(in_buffer.peak(), kept.peak());
  EXPECT_EQ(in_buffer.peak_checkpoints(), kept.peak_checkpoints());
  EXPECT_EQ(in_buffer.micro_batch.checkpoint_buffer, 2 * kept.micro_batch.checkpoints);
  EXPECT_EQ(in_buffer.per_micro_batch(), kept.per_micro_batch() - kept.micro_batch.checkpoints);
  const Gpt2StageActivationBytes one_set =
      gpt2_stage_activation_formula(config, contiguous(Recompute::kFull, 1), first, 2, 2, kT);
  EXPECT_EQ(one_set.peak() + kept.micro_batch.checkpoints, kept.peak());
  Gpt2Checkpointing moved{Recompute::kFull};
  moved.cpu_checkpointing = true;
  testing::expect_error_naming(
      [&] { gpt2_stage_activation_formula(config, moved, first, 2, 2, kT); },
      "cpu_checkpointing keeps one host copy per block");
  testing::expect_error_naming(
      [&] {
        gpt2_stage_activation_formula(config, Gpt2Checkpointing{},
                                      gpt2_pipeline_stage(config, bounds, 0), 0, 2, kT);
      },
      "at least 1 micro-batch in flight, not 0");
}

// The checkpoint spill on a pipeline stage (4 layers, 2 stages, B = 2 x 16 tokens: a checkpoint
// of 8192 bytes, its own region): the generations are the most micro-batches one chunk holds in
// flight (1F1B p - s; interleaved walked per chunk); a stage's file holds its checkpointed
// blocks x generations regions, and its checkpoints in memory are the spill's buffer (two
// regions and the alignment slack), held once beside the recompute buffers, not per micro-batch.
TEST(Gpt2Pipeline, SpillPlansRegionsPerMicroBatchInFlightAndOneBuffer) {
  Gpt2Config config = reference_config();
  config.n_layer = 4;
  constexpr uint64_t region = 2 * kT * 64 * sizeof(float);
  const uint64_t buffer = 2 * region + kNvmeBufferSlack;
  const std::vector<int> bounds = gpt2_pipeline_partition(config, 2, "uniform");
  for (int s = 0; s < 2; ++s) {
    const int in_flight =
        pipeline_micro_batches_in_flight(PipelineScheduleKind::kOneFOneB, 2, s, 4, 1);
    EXPECT_EQ(gpt2_checkpoint_generations(in_flight, {}), 2 - s);
    Gpt2Checkpointing c = spilled({Recompute::kFull, 0});
    c.checkpoint_generations = in_flight;
    const Gpt2StageActivationBytes kept = gpt2_stage_activation_formula(
        config, {Recompute::kFull, 0}, gpt2_pipeline_stage(config, bounds, s), in_flight, 2, kT);
    const Gpt2StageActivationBytes spill = gpt2_stage_activation_formula(
        config, c, gpt2_pipeline_stage(config, bounds, s), in_flight, 2, kT);
    EXPECT_EQ(spill.micro_batch.nvme_checkpoints, 2 * region * static_cast<uint64_t>(2 - s)) << s;
    EXPECT_EQ(spill.micro_batch.spill_buffer, buffer) << s;
    EXPECT_EQ(spill.peak_checkpoints(), buffer) << s;
    EXPECT_EQ(spill.per_micro_batch(), kept.per_micro_batch() - 2 * region) << s;
    EXPECT_EQ(spill.peak(), kept.peak() - in_flight * 2 * region + buffer) << s;
  }
  // Interleaved, 4 micro-batches: stage 0's chunk 0 holds 4 in flight at most, stage 1's 3 (the
  // lists decide; the in-flight count is not used).
  const std::vector<std::vector<PipelineAction>> interleaved =
      make_pipeline_schedule(PipelineScheduleKind::kInterleaved, 2, 4, 2);
  EXPECT_EQ(gpt2_checkpoint_generations(0, interleaved[0]), 4);
  EXPECT_EQ(gpt2_checkpoint_generations(0, interleaved[1]), 3);
  // A split backward reads the checkpoint in its input half: ZB-H1's lists count as 1F1B's.
  const auto zb = make_pipeline_schedule(PipelineScheduleKind::kZeroBubbleH1, 2, 4);
  const auto one_f_one_b = make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, 2, 4);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(gpt2_checkpoint_generations(0, zb[s]), gpt2_checkpoint_generations(0, one_f_one_b[s]))
        << s;
  }
}

}  // namespace
}  // namespace zero::models::gpt2_test
