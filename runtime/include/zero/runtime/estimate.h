// Model-state memory per rank before a run: the ZeRO paper's formulas (Rajbhandari et al.,
// 2020, section 5 and Figure 1), which the engine's allocator reproduces byte for byte when Ψ
// is the layout's padded parameter count.
//
// Per parameter, with Adam: the working-dtype parameter and gradient (2 bytes each in bf16 or
// fp16, 4 in fp32) and K bytes of optimizer state: an fp32 master copy (mixed precision only)
// and the two fp32 moments, so K = 12 in bf16/fp16 and 8 in fp32. Per rank, Ψ params, N ranks:
//
//   stage      bf16 / fp16        fp32
//     0        16Ψ                16Ψ
//     1        4Ψ + 12Ψ/N         8Ψ + 8Ψ/N
//     2        2Ψ + 14Ψ/N         4Ψ + 12Ψ/N
//     3        16Ψ/N              16Ψ/N
#pragma once

#include <cstdint>

#include "zero/core/dtype.h"

namespace zero {

// Bytes of each kind of model state one rank holds.
struct ModelStateBytes {
  uint64_t params = 0;     // working-dtype parameters, whole or the rank's shard
  uint64_t grads = 0;      // working-dtype gradients, whole or the rank's shard
  uint64_t optimizer = 0;  // fp32 master (bf16/fp16 only) and Adam's two moments, whole or shard

  uint64_t total() const { return params + grads + optimizer; }
};

// Model-state bytes per rank at `stage` (0-3) for `numel` parameters (Ψ) on `ranks` ranks with
// working dtype `dtype`. A shard holds ceil(Ψ/N) elements, as a padded layout gives every rank
// the same shard. Pass the raw count for the paper's figures, or a layout's padded_numel() (a
// multiple of N, so the division is exact) for what the engine allocates for a real model.
// Throws zero::Error for ranks < 1 or a stage outside 0-3.
ModelStateBytes estimate_model_state(uint64_t numel, int ranks, DType dtype, int stage);

}  // namespace zero
