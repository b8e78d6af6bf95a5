// ZeRO++'s qgZ (private to runtime/): a reduce-scatter whose gradients cross the wire as int8
// with one fp32 scale per kWeightQuantizationBlock elements, in two hops as DeepSpeed's
// all_to_all_quant_reduce: each rank quantizes the chunks of every destination, an all-to-all
// inside the node hands each local rank the chunks of the ranks at its place on every node,
// which it dequantizes and sums in fp32; it quantizes those partial sums, an all-to-all across
// the nodes hands each rank the partial sums of its own chunk, and it dequantizes and sums them.
// Each sum adds its terms in rank order, so the result does not depend on timing. Across nodes
// each rank sends (nodes - 1) quantized chunks where the exact ring reduce-scatter sends
// (N - 1) chunks in the wire dtype.
//
// The node layout is the communicator's (ranks_per_node; ZERO_NODE_SIZE declares nodes for
// tests); where the ranks do not form equal nodes of consecutive ranks, one hop over all ranks.
// Chunks smaller than one block go the exact way (DeepSpeed's fallback for small tensors).
#pragma once

#include <memory>

#include "comm_timeline.h"
#include "zero/collectives/communicator.h"
#include "zero/runtime/device.h"
#include "zero/runtime/memory.h"

namespace zero {

// Bytes of one chunk of `count` elements quantized: int8 values rounded up to 4 bytes, then an
// fp32 scale per block.
size_t quantized_chunk_bytes(size_t count);

// Whether a reduce-scatter of `count` elements per rank goes quantized: at least one block.
bool reduces_quantized(size_t count);

// The scratch one quantized reduce-scatter of at most `max_count` elements per rank over
// `ranks` ranks needs: both hops' quantized chunks out and in, and the fp32 partial sums; sized
// for the most nodes there can be (one per rank), so that the plan does not depend on where the
// ranks run.
size_t quantized_reduction_bytes(size_t max_count, int ranks);

class QuantizedReduceScatter {
 public:
  // Splits `comm`'s ranks into node groups and groups across nodes (collective over the world,
  // as make_mpi_communicator_split is), and takes `scratch` (quantized_reduction_bytes) for its
  // chunks.
  QuantizedReduceScatter(Communicator& comm, DeviceContext& device, CommTimeline& timeline);
  ~QuantizedReduceScatter();

  void set_scratch(void* scratch, size_t bytes);

  // recv (count, dtype) = the sum over ranks of send[rank * count, (rank + 1) * count) (dtype),
  // enqueued on comm.stream() behind what is queued there; recv may be this rank's block of
  // send. Returns the point after which send may be written again and recv is read.
  CommPoint reduce_scatter(const void* send, void* recv, size_t count, DType dtype);

  int nodes() const { return nodes_; }
  // Bytes this rank sent on the two hops' communicators (CommCounters).
  uint64_t sent_within_nodes() const;
  uint64_t sent_across_nodes() const;

 private:
  Communicator& comm_;
  DeviceContext& device_;
  CommTimeline& timeline_;
  int nodes_ = 1;
  int per_node_ = 1;
  std::unique_ptr<Communicator> within_;  // the ranks of this rank's node
  std::unique_ptr<Communicator> across_;  // the ranks at this rank's place on every node
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
};

}  // namespace zero
