// One row per collective: its name and the share of its buffer each rank sends.
#include "zero/collectives/collective_table.h"

#include "zero/core/check.h"

namespace zero {
namespace {

struct CollectiveRow {
  const char* name;
  // Each rank sends `multiple` times (N-1)/N of the buffer when `ring`, else `multiple` times
  // the buffer whatever N is.
  uint64_t multiple;
  bool ring;
};

// Indexed by CollectiveOp.
constexpr CollectiveRow kCollectives[kNumCollectiveOps] = {
    {"all_gather", 1, true}, {"reduce_scatter", 1, true}, {"all_reduce", 2, true},
    {"broadcast", 1, false}, {"barrier", 0, false},       {"all_to_all", 1, true},
};

const CollectiveRow& row(CollectiveOp op) {
  const auto index = static_cast<int>(op);
  ZERO_CHECK(index >= 0 && index < kNumCollectiveOps, "unknown collective op " << index);
  return kCollectives[index];
}

}  // namespace

const char* collective_op_name(CollectiveOp op) {
  return row(op).name;
}

RingShare ring_share(CollectiveOp op, int ranks) {
  ZERO_CHECK(ranks >= 1, "a collective needs at least one rank, got " << ranks);
  const CollectiveRow& r = row(op);
  const auto n = static_cast<uint64_t>(ranks);
  if (!r.ring) return {r.multiple, 1};
  return {r.multiple * (n - 1), n};
}

uint64_t bytes_sent_per_rank(CollectiveOp op, uint64_t buffer_bytes, int ranks) {
  const RingShare share = ring_share(op, ranks);
  return buffer_bytes * share.numerator / share.denominator;
}

}  // namespace zero
