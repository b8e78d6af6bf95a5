// Full weights into a running engine: what `--init-from` does with a safetensors file (and what
// a model with its own names, such as the GPT-2, builds on).
#pragma once

#include <string>
#include <vector>

#include "zero/runtime/engine.h"
#include "zero/runtime/safetensors.h"

namespace zero {

// Overwrites every parameter of the engine's model with the tensor of the same name (its fp32
// master where the dtype is 16-bit, then the working copy, gathered where the stage keeps full
// parameters); optimizer state is left as it is. Every parameter needs exactly one tensor of the
// same shape, and every tensor must name a parameter: otherwise a zero::Error that names the
// missing, extra or misshaped tensor and `source`. Collective: every rank calls it with the same
// tensors and keeps its shard.
void import_weights(Engine& engine, const std::vector<LoadedTensor>& tensors,
                    const std::string& source);

}  // namespace zero
