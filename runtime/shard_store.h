// Where the update finds each piece's fp32 master and optimizer state (private to runtime/):
// the unit's own buffers (in device memory, or host memory with offload_optimizer cpu) or the
// NVMe records streamed through staging slots. The update (Engine::Impl::update) is one loop
// over the passes that asks a ShardStore for each pass's arrays; where it steps them (the
// device or the host) and where the parameters' shards live (ParamSwap) are the loop's, not
// the store's.
#pragma once

#include <cstddef>

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
};

}  // namespace zero
