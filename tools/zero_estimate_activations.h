// zero-estimate --micro-batch: the GPT-2's activations per rank beside the engine's bytes, for
// each activation-checkpointing setting, and with --memory-limit which setting fits.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tools/zero_estimate_options.h"

namespace zero_estimate {

// The GPT-2's activations per rank for each checkpointing setting, beside the engine's bytes of
// each planned stage, and with a budget which setting fits at each stage and the largest
// micro-batch each setting fits.
void print_activations(const Options& options,
                       const std::vector<std::pair<int, uint64_t>>& engine_bytes);

}  // namespace zero_estimate
