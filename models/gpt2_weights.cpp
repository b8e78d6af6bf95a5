// Hugging Face GPT-2 checkpoints into the model: their names are the model's own, once the
// wrapper's prefix and the buffers that are not parameters are set aside.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_tensor_parallel.h"
#include "zero/core/check.h"
#include "zero/core/text.h"
#include "zero/runtime/safetensors.h"
#include "zero/runtime/weights.h"

namespace zero::models {

void load_gpt2_weights(Engine& engine, const std::string& path, int tensor_parallel_size,
                       int tensor_parallel_rank, const std::vector<std::string>& held_elsewhere) {
  LoadedSafetensors file = load_safetensors(path);
  std::vector<LoadedTensor> weights;
  std::vector<float> lm_head;
  for (LoadedTensor& t : file.tensors) {
    // GPT2LMHeadModel saves the body under "transformer." and its head, tied to wte, as
    // "lm_head.weight"; the attention's causal mask is saved as "attn.bias" or "masked_bias".
    const std::string prefix = "transformer.";
    if (t.name.compare(0, prefix.size(), prefix) == 0) t.name.erase(0, prefix.size());
    if (t.name == "lm_head.weight") {
      lm_head = std::move(t.values);
      continue;
    }
    if (ends_with(t.name, ".attn.bias") || ends_with(t.name, ".attn.masked_bias")) continue;
    if (std::find(held_elsewhere.begin(), held_elsewhere.end(), t.name) != held_elsewhere.end()) {
      continue;
    }
    weights.push_back(gpt2_tensor_parallel_slice(t, tensor_parallel_size, tensor_parallel_rank));
  }
  // A head saved beside wte must be wte itself: this model has no head of its own to load it in.
  if (!lm_head.empty() && std::find(held_elsewhere.begin(), held_elsewhere.end(), "wte.weight") ==
                              held_elsewhere.end()) {
    bool tied = false;
    for (const LoadedTensor& t : weights) {
      if (t.name == "wte.weight") tied = t.values == lm_head;
    }
    ZERO_CHECK(tied, path << ": lm_head.weight differs from wte.weight, but this GPT-2 ties its "
                             "LM head to the token embedding");
  }
  import_weights(engine, weights, path);
}

}  // namespace zero::models
