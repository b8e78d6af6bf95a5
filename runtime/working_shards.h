// Where each unit's working-dtype shard lives (private to runtime/): the slice of its parameters
// this rank owns, which the all-gathers read, the optimizer writes, and a checkpoint's view reads
// and a load writes. It is resident in the unit's own buffers (its params_shard at stage 3, its
// slice of params_full at stages 0-2), or, with offload_param nvme, in the rank's parameter file
// (ParamSwap) for every stage-3 unit but the persistent one. Each phase asks here for the shard
// instead of branching on where it lives; the master and the optimizer state are the
// ShardStore's (shard_store.h).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "comm_point.h"
#include "param_swap.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/memory.h"

namespace zero {

struct UnitState;  // engine_internal.h

class WorkingShards {
 public:
  // `rank` of `world`: whose shards (the whole unit at stage 0); `swap`: the parameter file, null
  // without offload_param nvme.
  WorkingShards(const Layout& layout, int stage, int rank, int world, size_t elem,
                std::vector<UnitState>& units, Allocator& allocator,
                std::unique_ptr<ParamSwap> swap);

  bool swapped(int u) const { return swap_ && swap_->swapped(u); }
  // The parameter file (stats, its size, the initial values), null without one.
  ParamSwap* swap() { return swap_.get(); }

  // The shard where it is now: its buffer, or, for a swapped unit, the checkpoint copy handed
  // out or else the buffer holding it (in an update, after update_target).
  void* current(int u);

  // Gather (stage 3): a swapped shard's read into a buffer starts behind compute; an optional
  // gather (a prefetch) finds no free buffer and says so (false). Then the shard the all-gather
  // reads, a swapped one's read waited for on `stream` (and on a GPU uploaded there) right
  // before the all-gather, whose end (`read`) gathered() is told: the buffer is free after it.
  bool start_gather_read(int u, bool required);
  const void* gather_source(int u, Stream& stream);
  void gathered(int u, const CommPoint& read);
  // The post-step all-gather of stages 1-3's gathered units: the shard read in where it is
  // swapped, given back after `read` (gathered()).
  const void* post_step_source(int u);

  // Update: the shard the optimizer writes, on the host (`on_host`, its host buffer) or the
  // device. With `overwritten` the update writes every element from a master kept elsewhere, so
  // a swapped shard is not read; otherwise it is read in, and the next trainable unit's read
  // started behind it. updated(u) after u's last piece writes a swapped shard back; end_update()
  // after the last pass waits for those writes (the next forward reads them).
  void* update_target(int u, bool overwritten, bool on_host);
  void updated(int u);
  void end_update();

  // Checkpoint: a swapped shard is handed out in a copy (in the engine's memory), read on first
  // use; store_checkpoint_copies() writes the copies back to the file (after `before_store(u)`,
  // which may still write into them) and release_checkpoint_copies() drops them.
  void* checkpoint_shard(int u);
  template <typename BeforeStore>
  void store_checkpoint_copies(const BeforeStore& before_store) {
    for (const auto& [u, copy] : copies_) {
      before_store(u);
      swap_->store(u, copy.data(), copy.bytes(), ParamSwap::Side::kDevice);
    }
    copies_.clear();
  }
  void release_checkpoint_copies() { copies_.clear(); }

 private:
  void* resident(int u);

  const Layout& layout_;
  int stage_;
  int rank_;
  int world_;
  size_t elem_;
  std::vector<UnitState>& units_;
  Allocator& allocator_;
  std::unique_ptr<ParamSwap> swap_;
  std::map<int, Buffer> copies_;  // checkpoint_shard()'s copies of swapped shards, by unit
};

}  // namespace zero
