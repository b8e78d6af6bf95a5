// What each stage holds (private to runtime/; memory_plan.cpp): the single source for
// plan_memory() and for the engine's allocations, so the estimate and the measurement cannot
// drift apart, and the packs the engine's collectives are fused into.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/layout.h"

namespace zero {

// The packs of one kind of collective, and where each unit sits in its pack: the fusion buffer
// holds a pack as N rank regions (region r: shard r of every unit of the pack, in pack order),
// so one reduce-scatter or all-gather of the regions serves every unit at once.
struct PackedCollectives {
  std::vector<std::vector<int>> packs;
  std::vector<int> pack_of;       // unit -> its pack (-1: a frozen unit, in no pack)
  std::vector<size_t> offset_of;  // unit -> its offset inside a rank region, in elements
  std::vector<size_t> region;     // pack -> elements of one rank region
  int filling = -1;               // the pack whose units are being copied in, if any
  size_t filled = 0;              // and how many of them are in

  PackedCollectives() = default;
  PackedCollectives(const Layout& layout, size_t limit, bool backward);
  bool fused(int u) const { return pack_of[u] >= 0 && packs[pack_of[u]].size() > 1; }
};

// Bytes of staging memory a collective needs in the communicator: what the MPI backend sums
// 16-bit gradients in (fp32), given to it from the engine's allocator so that it is counted
// and under the memory limit.
using StagingBytes = std::function<size_t(CollectiveOp, size_t, DType)>;

// Bytes of each buffer one unit holds at a stage; the single source for plan_memory() and for
// the engine's allocations, so the estimate and the measurement cannot drift apart.
struct UnitBytes {
  size_t params_full = 0;       // working dtype, whole unit (stages 0-2; persistent units at 3)
  size_t params_shard = 0;      // working dtype, this rank's slice (stage 3)
  size_t params_secondary = 0;  // hpZ: working dtype, this rank's 1/k of the unit (stage 3)
  size_t master = 0;            // fp32 master when the working dtype is not fp32
  size_t grads_full = 0;        // accumulation dtype, whole unit (stages 0-1; working dtype for
                                // stage 3's persistent unit)
  size_t grads_shard = 0;       // accumulation dtype, slice (stages 2-3)
  size_t state = 0;             // each optimizer state array (fp32)
  int state_arrays = 0;
  // offload_optimizer cpu: master and state are in host memory (the master of fp32 working
  // parameters too). Where the update runs on the host (steps_on_host: also nvme on a GPU),
  // pinned host copies of the gradient shard (accumulation dtype) and of the updated parameters
  // (but fp32's when its master is kept and pinned) beside them.
  bool optimizer_on_host = false;
  size_t host_grads = 0;
  size_t host_params = 0;
};

// The dtype gradients are accumulated in over micro-batches (data_types.grad_accum_dtype):
// DeepSpeed's bf16 optimizer accumulates in fp32, so bf16 does here unless told otherwise.
DType accumulation_dtype(const EngineConfig& config);

// Stages 2-3 reduce each micro-batch's gradient into the rank's shard, unless a pipeline has
// them reduce once per step (EngineConfig::grid.pipeline.reduce_once); otherwise a whole
// gradient is kept and reduced after the last micro-batch.
bool reduces_every_micro_batch(const EngineConfig& config);

// Backward writes a micro-batch's gradient into a pooled bucket of the working dtype when what
// the rank keeps is a shard reduced every micro-batch or is accumulated in another dtype;
// otherwise straight into the kept full gradient.
bool uses_grad_buckets(const EngineConfig& config);

// Gradient buckets: two, so that backward fills one while the other's reduction reads it,
// and one more for each unit a later module ties to (ParamSpec::tied), whose bucket is taken at
// the tying module's backward and held until the unit's own: without it, every unit between
// them would wait for the one before's reduction.
size_t grad_bucket_count(const Layout& layout, const EngineConfig& config);

// A bucket reduced in the working dtype needs fp32 scratch when the reduction runs in fp32.
bool needs_fp32_scratch(const EngineConfig& config);

// The dtype a gradient reduction puts on the wire, the same at every stage: fp32 when asked
// (communication_data_type), the working dtype otherwise (DeepSpeed's default). Stages 0-1
// accumulating in another dtype round the micro-batches' sum to it once, before the reduction.
DType reduction_dtype(const EngineConfig& config);

// Gathered-parameter buffers of stage 3: the unit computing, the next one in flight, and as
// many more as stage3_prefetch_bucket_size asks to have gathered ahead, and never more than
// the units there are to gather. Prefetches never take more, so the plan holds.
size_t param_buffer_count(const Layout& layout, const EngineConfig& config);

// allgather_bucket_size packs the post-step all-gathers of stages 1-2; stage 3 gathers each
// unit when it is needed, so nothing is packed there (0).
size_t gather_bucket_elements(const EngineConfig& config);

// The fusion buffer packed collectives go through: the larger of the gradient packs (in the
// reduction dtype) and the stage 1-2 parameter packs (working dtype).
size_t fusion_bytes(const Layout& layout, const EngineConfig& config);

// Pipeline ties (EngineConfig::pipeline): the fp32 buffer, the size of the largest tied
// parameter, in which the two stages' gradients are summed (engine_pipeline.cpp); 0 without
// ties. A tied name the layout does not hold counts nothing here (the engine refuses it).
size_t pipeline_tie_bytes(const Layout& layout, const EngineConfig& config);

// The most staging any of the engine's step collectives needs: each reduction (alone or
// packed) and the norm's all-reduce; all-gathers stage nothing.
size_t max_staging_bytes(const Layout& layout, const EngineConfig& config,
                         const StagingBytes& staging);

// qwZ's blocks: one fp32 scale per this many elements of a rank's shard, the first block at
// the shard's start, so shards split at block boundaries and each rank quantizes its own. 4096
// is at the low end of DeepSpeed's groups (about 4k-16k elements): the scales add 4 bytes per
// 4096 int8 bytes (0.1%), and a smaller block keeps the error of a block with one large value
// local; a power of two keeps every full block on cache-line and vector boundaries.
constexpr size_t kWeightQuantizationBlock = 4096;

// How a rank's shard of `shard` elements crosses a quantized all-gather: its int8 values
// (rounded up to 4 bytes, so the scales that follow stay aligned), then one fp32 scale per
// block; every rank's region has the same size, as an all-gather needs.
struct QuantizedShard {
  size_t values_bytes = 0;
  size_t scales = 0;
  size_t region_bytes = 0;
};
QuantizedShard quantized_shard(size_t shard);

// Whether stage 3's all-gather of `unit` goes quantized (EngineConfig::precision.quantized_weights:
// trainable, non-persistent units at stage 3).
bool quantizes_gather(const Unit& unit, const EngineConfig& config);

// The staging buffer quantized all-gathers go through: every rank's region of the largest unit
// quantized (0 without qwZ). One serves every gather: they run in order on the communication
// stream, each dequantized before the next is quantized.
size_t quantized_gather_bytes(const Layout& layout, const EngineConfig& config);

// Whether stage 3's gradient reduce-scatters may go quantized (precision.quantized_gradients),
// and the scratch they need: a quantized reduction of the largest pack's region
// (quantized_reduction_bytes; 0 without qgZ or when no region reaches one block).
bool quantizes_reductions(const EngineConfig& config);
size_t quantized_reduction_scratch(const Layout& layout, const EngineConfig& config);

// hpZ (EngineConfig::grid.hpz_partition_size > 1): every stage-3 unit but the persistent one,
// which is never gathered, keeps a secondary shard for its gathers after the first of a step.
bool keeps_secondary_shard(const Unit& unit, const EngineConfig& config);

// Stage 3 keeps the persistent unit (the parameters under stage3_param_persistence_threshold)
// whole on every rank, and its gradient whole until the step, where it is reduced.
bool is_persistent(const Unit& unit, const EngineConfig& config);

UnitBytes unit_bytes(const Unit& unit, const EngineConfig& config, int state_arrays);
}  // namespace zero
