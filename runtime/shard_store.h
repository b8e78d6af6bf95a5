// Where each unit's fp32 master and optimizer state live, behind one interface (private to
// runtime/): the unit's own buffers (in device memory, or host memory with offload_optimizer
// cpu) or the NVMe records streamed through staging slots. It hands them out for the two phases
// that read and write them: the update (Engine::Impl::update is one loop over the passes that
// asks for each pass's arrays; where it steps them, the device or the host, and where the
// parameters' shards live, ParamSwap, are the loop's, not the store's) and checkpoint access (a
// save's or a load's view of one unit, Engine::Impl::state_view).
#pragma once

#include <cstddef>
#include <functional>

namespace zero {

// One piece's arrays: the master (null: the working parameters are the master) and the
// optimizer's state arrays (null past the optimizer's count).
struct PieceArrays {
  float* master = nullptr;
  float* state[2] = {nullptr, nullptr};
};

class ShardStore {
 public:
  virtual ~ShardStore() = default;
  virtual void begin_update() {}
  // Pass `pass`'s arrays are where arrays() points from here until end_pass(pass).
  virtual void begin_pass(size_t pass) { static_cast<void>(pass); }
  virtual PieceArrays arrays(size_t pass, size_t piece) = 0;
  // The pass's arrays, updated, go back where they live.
  virtual void end_pass(size_t pass) { static_cast<void>(pass); }
  virtual void end_update() {}
  // After a failure inside the update: every transfer still in flight ends before the memory
  // it reads or writes can go. Errors of those transfers are dropped: the first is reported.
  virtual void abandon() noexcept {}

  // Checkpoint access: the arrays of the `count` elements of unit `unit`'s owned slice (a null
  // master: the working parameters are the master). Where the state lives in memory, the store's
  // own arrays; where it lives in files, host copies kept until write_back_views() or
  // release_views() (hands_out_copies()).
  virtual PieceArrays unit_arrays(int unit, size_t count) = 0;
  virtual bool hands_out_copies() const { return false; }
  // The copies handed out go back where the state lives. `master_written` is called for each
  // unit whose master came back from a copy: its working parameters follow the master.
  virtual void write_back_views(
      const std::function<void(int unit, const float* master)>& master_written) {
    static_cast<void>(master_written);
  }
  virtual void release_view(int unit) { static_cast<void>(unit); }
  virtual void release_views() {}
};

}  // namespace zero
