// The gradient reducer (private to runtime/): what backward writes each unit's gradient into,
// its reduction over the ranks as soon as the unit's backward is done, the accumulation over
// micro-batches in grad_accum_dtype, and the sum across replicas with hybrid sharding. It owns
// the gradient buffers (whole, bucket, shard), the bucket pool, the fp32 scratch and their
// events; the fusion buffer it shares with the engine's post-step all-gathers, which use it
// between steps, in stream order.
//
// One path reduces a unit alone and a reduce_bucket_size pack of units: a pack is laid out as
// N rank regions (region r: shard r of each of its units), of which a unit alone is the
// special case that needs no copy when its gradient is already in the wire dtype. The wire
// dtype is reduction_dtype(config), so another encoding on the wire is one more cast here.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "buffer_pool.h"
#include "comm_timeline.h"
#include "memory_plan.h"
#include "quantized_reduction.h"
#include "unit_state.h"
#include "zero/collectives/communicator.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/layout.h"

namespace zero {

class GradientReducer {
 public:
  // `replicas`: hybrid sharding's replica group (null without); `fusion`: the engine's fusion
  // buffer, allocated later.
  GradientReducer(const Layout& layout, const EngineConfig& config, Communicator& comm,
                  Communicator* replicas, DeviceContext& device, Allocator& allocator,
                  CommTimeline& timeline, const Buffer& fusion);

  // The buffers, allocated where the engine allocates in its order (its memory report and an
  // out-of-memory message follow it): unit u's kept gradients, the bucket pool, the fp32
  // scratch.
  void allocate_unit(size_t u, const UnitBytes& bytes);
  void allocate_buckets();
  void allocate_scratch();

  // Called with unit u and the point its step's last reduction is done, that point's
  // replacement: the host optimizer's copy of the reduced shard (engine_host_optimizer.cpp).
  using AfterLastReduction = std::function<CommPoint(int u, const CommPoint& reduced)>;
  void set_after_last_reduction(AfterLastReduction after) { after_last_ = std::move(after); }

  // Where backward writes (adds) unit u's gradient for this micro-batch, at element `offset`.
  void* gradient(int u, size_t offset);

  // Unit u's backward of this micro-batch is done: its gradient is reduced behind the rest
  // of backward (as DDP does): stages 0-1 after the last micro-batch, stages 2-3 (and stage
  // 3's persistent unit, whose grads_ready comes after the whole backward) after every one.
  void ready(int u);

  // How many micro-batches of this step unit u's gradient has had.
  int micro_batches_done(int u) const { return units_[u].micro_batches_done; }

  // Waits until every unit's reduction of the step is done (the step reads them after).
  void wait_for_reductions();
  // When unit u's last reduction (or the copy after it) is done.
  const CommPoint& reduced(int u) const { return units_[u].reduced; }

  // The rank's reduced and accumulated gradient of what it owns (accumulation dtype): the whole
  // unit at stage 0, its shard otherwise.
  void* owned(size_t u);
  // The rank's shard of the reduced gradient at every stage: the global norm sums shards, so
  // stage 0 (which owns whole units) adds up in the same order as the others.
  void* shard(size_t u);

  // Gradients start from zero for the next step.
  void finish_step();

  // Bytes qgZ's hops sent (0 without qgZ).
  uint64_t quantized_bytes_within_nodes() const;
  uint64_t quantized_bytes_across_nodes() const;

 private:
  struct UnitGrads {
    Buffer full;        // stages 0-1: the reduced and accumulated gradient (accumulation dtype);
                        // stage 3's persistent unit: the micro-batch's gradient (working dtype)
    Buffer bucket;      // a pooled working-dtype gradient during backward (uses_grad_buckets)
    Buffer shard;       // stages 2-3: the reduced and accumulated shard (accumulation dtype;
                        // reduced once per step, the slice of `full` serves instead)
    CommPoint reduced;  // the reduction (and accumulation) of the latest ready() is done
    // The persistent unit: when its reduction has read `full`, which the next micro-batch's
    // first gradient() zeroes after that (full_reused).
    CommPoint full_read;
    bool full_reused = false;
    bool persistent = false;
    int micro_batches_done = 0;
    GradState state = GradState::kEmpty;
  };

  // Reduces unit u's gradient `source` (`dtype`) into what the rank keeps of it (added to it
  // when `accumulate`), alone or when its pack is complete; `last`: the step's last
  // micro-batch. Returns the point after which `source` may be written again.
  CommPoint reduce(int u, void* source, DType dtype, bool accumulate, bool last);

  // Hybrid sharding: sums `count` elements at `data`, just reduced inside the shard group,
  // across the replica group, in place, and returns the stream that whatever reads the sum
  // must be enqueued on: the replica group's, so that the shard group's stream goes on with its
  // next collective instead of queueing behind the slower one across replicas. Without hybrid
  // sharding: the communication stream, unchanged.
  Stream& sum_across_replicas(void* data, size_t count, DType dtype);

  const Layout& layout_;
  const EngineConfig& config_;
  Communicator& comm_;
  Communicator* replicas_;
  DeviceContext& device_;
  Allocator& allocator_;
  CommTimeline& timeline_;
  const Buffer& fusion_;
  int rank_;
  int world_;
  DType accum_dtype_;
  DType wire_;
  BufferPool pool_;
  Buffer fp32_scratch_;  // a unit alone reduced in fp32 from a 16-bit gradient (reduce_in_fp32)
  // qgZ: the quantized reduce-scatter of regions of at least a block, and its scratch.
  std::unique_ptr<QuantizedReduceScatter> quantized_;
  Buffer quantized_scratch_;
  // Hybrid sharding: the replica stream's last read of the fusion buffer or the scratch (a sum
  // across replicas of a region of them, and the cast out). Complete without hybrid sharding.
  Event staging_read_by_replicas_;
  PackedCollectives packs_;
  std::vector<UnitGrads> units_;
  AfterLastReduction after_last_;
};

}  // namespace zero
