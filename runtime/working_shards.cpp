#include "working_shards.h"

#include "engine_internal.h"

namespace zero {

WorkingShards::WorkingShards(const Layout& layout, int stage, int rank, int world, size_t elem,
                             std::vector<UnitState>& units, Allocator& allocator,
                             std::unique_ptr<ParamSwap> swap)
    : layout_(layout),
      stage_(stage),
      rank_(rank),
      world_(world),
      elem_(elem),
      units_(units),
      allocator_(allocator),
      swap_(std::move(swap)) {}

void* WorkingShards::resident(int u) {
  UnitState& s = units_[static_cast<size_t>(u)];
  if (stage_ == 3) return s.params_shard.data();
  if (stage_ == 0) return s.params_full.data();
  const size_t first = shard_range(layout_.units()[u].numel, rank_, world_).first;
  return byte_offset(s.params_full.data(), first * elem_);
}

void* WorkingShards::current(int u) {
  if (!swapped(u)) return resident(u);
  const auto copy = copies_.find(u);
  if (copy != copies_.end()) return copy->second.data();
  void* buffer = swap_->buffer_of(u);
  ZERO_CHECK(buffer != nullptr, "offload_param: unit " << u << "'s shard is not in memory");
  return buffer;
}

bool WorkingShards::start_gather_read(int u, bool required) {
  return !swapped(u) || swap_->start_read(u, required);
}

const void* WorkingShards::gather_source(int u, Stream& stream) {
  if (!swapped(u)) return resident(u);
  // On a GPU the stream runs this at once, so the host waits for the read here.
  stream.enqueue(swap_->read_waiter(u));
  swap_->upload(u, &stream);
  return swap_->buffer_of(u);
}

void WorkingShards::gathered(int u, const CommPoint& read) {
  if (swapped(u)) swap_->drop(u, read);
}

const void* WorkingShards::post_step_source(int u) {
  return swapped(u) ? swap_->resident(u) : current(u);
}

void* WorkingShards::update_target(int u, bool overwritten, bool on_host) {
  if (!swapped(u)) return resident(u);
  if (overwritten) return swap_->overwritten(u, on_host);
  void* shard = swap_->resident(u);
  // Read the next trainable unit's shard while this one is stepped, if a buffer is free.
  for (int v = u + 1; v < static_cast<int>(units_.size()); ++v) {
    if (!layout_.units()[v].trainable) continue;
    if (swapped(v)) swap_->start_read(v, /*required=*/false);
    break;
  }
  return shard;
}

void WorkingShards::updated(int u) {
  if (swapped(u)) swap_->write_back(u);
}

void WorkingShards::end_update() {
  if (swap_) swap_->flush();
}

void* WorkingShards::checkpoint_shard(int u) {
  if (!swapped(u)) return resident(u);
  Buffer& copy = copies_[u];
  if (copy.empty()) {
    const size_t bytes = layout_.units()[u].shard * elem_;
    copy = allocator_.allocate(bytes, MemoryCategory::kOther);
    swap_->load(u, copy.data(), bytes, ParamSwap::Side::kDevice);
  }
  return copy.data();
}

}  // namespace zero
