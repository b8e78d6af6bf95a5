// The collectives by name and by how much of their buffer each rank sends: one table, read by
// both backends' byte counters and by the collective benchmark's busbw, so the two can never
// disagree on a factor.
#pragma once

#include <cstdint>

namespace zero {

enum class CollectiveOp : uint8_t {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
  kAllToAll
};
constexpr int kNumCollectiveOps = 6;

// all_gather, reduce_scatter, all_reduce, broadcast, barrier, all_to_all.
const char* collective_op_name(CollectiveOp op);

// The share of a collective's buffer (S bytes) that each of N ranks sends: numerator /
// denominator. For all-reduce 2(N-1)/N, reduce-scatter and all-gather (N-1)/N: the ring
// algorithm's figures, which are also the least any algorithm can send per rank (a lower bound,
// not what a given MPI library's algorithm sends). Broadcast 1 (pipelined from the root),
// barrier 0. S is the whole buffer: all ranks' blocks for all-gather and reduce-scatter.
// All-to-all (N-1)/N of its send buffer (S: the blocks for every rank), exactly: a rank keeps its
// own block and sends each of the others once.
struct RingShare {
  uint64_t numerator;
  uint64_t denominator;
  double factor() const { return static_cast<double>(numerator) / denominator; }
};
RingShare ring_share(CollectiveOp op, int ranks);

// S times the ring share, rounded down: the bytes one rank sends for a buffer of S bytes.
uint64_t bytes_sent_per_rank(CollectiveOp op, uint64_t buffer_bytes, int ranks);

}  // namespace zero
