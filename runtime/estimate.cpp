// The ZeRO memory formulas of estimate.h, written as what each stage keeps whole and what it
// keeps as a 1/N shard, so each line reads like a row of the paper's table.
#include "zero/runtime/estimate.h"

#include "zero/core/check.h"
#include "zero/core/checked_size.h"

namespace zero {

ModelStateBytes estimate_model_state(uint64_t numel, int ranks, DType dtype, int stage) {
  ZERO_CHECK(ranks >= 1, "the number of ranks must be at least 1, got " << ranks);
  ZERO_CHECK(stage >= 0 && stage <= 3, "ZeRO stage must be 0, 1, 2 or 3, got " << stage);
  const uint64_t shard = (numel + static_cast<uint64_t>(ranks) - 1) / static_cast<uint64_t>(ranks);
  const uint64_t working_bytes = dtype_size(dtype);
  // Mixed precision keeps an fp32 master copy next to the moments; fp32 updates in place.
  const uint64_t master_bytes = dtype == DType::kFloat32 ? 0 : 4;
  const uint64_t optimizer_bytes = master_bytes + 8;  // K: master + Adam's m and v in fp32

  ModelStateBytes bytes;
  // Stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the parameters too.
  bytes.optimizer =
      size_product(optimizer_bytes, stage >= 1 ? shard : numel, "the optimizer state");
  bytes.grads = size_product(working_bytes, stage >= 2 ? shard : numel, "the gradients");
  bytes.params = size_product(working_bytes, stage >= 3 ? shard : numel, "the parameters");
  size_sum(size_sum(bytes.optimizer, bytes.grads, "the model state"), bytes.params,
           "the model state");
  return bytes;
}

}  // namespace zero
