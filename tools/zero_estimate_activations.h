// zero-estimate --micro-batch: the GPT-2's activations per rank beside the engine's bytes, for
// each activation-checkpointing setting, and with --memory-limit which setting fits.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "tools/zero_estimate_options.h"

namespace zero_estimate {

// What a plan is for: the whole GPT-2, or one pipeline stage (--pp) with the micro-batches its
// schedule holds in flight on it.
struct StagePlan {
  zero::models::Gpt2PipelineStage stage;
  int in_flight = 1;
  // ZB-H1 (a split backward): the stage's loads, over which its peak is planned; empty for the
  // other schedules.
  std::vector<zero::PipelineStageLoad> split_loads;
  // Interleaved (model chunks): the stage's actions of a step, over which its chunks' peak is
  // planned; empty for the other schedules.
  std::vector<zero::PipelineAction> chunk_actions;
};

// The GPT-2's activations per rank for each checkpointing setting (the stage's peak, with its
// micro-batches in flight), beside the engine's bytes of each planned ZeRO stage, and with a
// budget which setting fits at each ZeRO stage and the largest micro-batch each setting fits.
void print_activations(const Options& options, const StagePlan& plan,
                       const std::vector<std::pair<int, uint64_t>>& engine_bytes);

}  // namespace zero_estimate
