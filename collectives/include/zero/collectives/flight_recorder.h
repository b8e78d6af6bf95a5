// The flight recorder: the last few collectives of one communicator (64 by default), each with
// its sequence number, op, element type and count, its state, and when it was enqueued, started
// and ended. When a job hangs or aborts, each rank prints its record, so the ranks' tables can
// be laid side by side: the rank whose last entry differs from the others is the one to look at.
//
// Any backend can use it: the thread that enqueues a collective calls enqueued(), the thread
// that runs it calls started() and finished(), and a watchdog may format() it at any moment.
// One mutex guards the ring; each call holds it for a few stores, so nothing ever waits long.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/core/dtype.h"

namespace zero {

enum class CollectiveState : uint8_t { kEnqueued, kRunning, kDone, kFailed };

// enqueued, running, done, failed.
const char* collective_state_name(CollectiveState state);

// The element type a collective carries: dtype_name(dtype), or "byte" for the raw bytes of
// Communicator::all_gather_bytes (dtype then unused).
const char* element_type_name(DType dtype, bool bytes);

// "all_reduce(1000 x fp32)", "all_gather(16 x byte)" (bytes); "barrier()" for the op that moves
// no data.
std::string describe_collective(CollectiveOp op, size_t count, DType dtype, bool bytes = false);

// One collective as the recorder saw it. A time that has not happened yet (started or ended)
// is the clock's epoch, time_point{}.
struct FlightEntry {
  using Clock = std::chrono::steady_clock;
  uint64_t sequence = 0;
  CollectiveOp op = CollectiveOp::kBarrier;
  DType dtype = DType::kFloat32;
  size_t count = 0;
  bool bytes = false;  // all_gather_bytes: count is bytes, dtype unused
  CollectiveState state = CollectiveState::kEnqueued;
  Clock::time_point enqueued, started, ended;
};

class FlightRecorder {
 public:
  using Clock = FlightEntry::Clock;
  static constexpr size_t kDefaultCapacity = 64;

  explicit FlightRecorder(size_t capacity = kDefaultCapacity);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // A new entry, state enqueued; when the ring is full it replaces the oldest entry.
  // `bytes`: a byte all-gather of `count` bytes (dtype unused).
  void enqueued(uint64_t sequence, CollectiveOp op, DType dtype, size_t count, bool bytes = false);
  // State running, start time now. A sequence number no longer in the ring (more than
  // capacity() collectives were enqueued after it) is ignored: there is nowhere to record it.
  void started(uint64_t sequence);
  // State done (ok) or failed, end time now. Ignored like started() when the entry is gone.
  void finished(uint64_t sequence, bool ok);

  // The entries held, oldest first.
  std::vector<FlightEntry> entries() const;
  size_t capacity() const { return ring_.size(); }

  // A table of the entries, most recent last, one line each, every line starting with
  // "[rank R] " so the tables of ranks that print at the same moment stay apart. Times are the
  // wall-clock time of day (comparable across the ranks of one machine); the duration of a
  // running collective is measured up to now.
  std::string format(int rank) const;

 private:
  // The entry for `sequence`, or nullptr when it has left the ring. Call with mutex_ held.
  FlightEntry* find(uint64_t sequence);
  // A copy of the entries, oldest first. Call with mutex_ held.
  std::vector<FlightEntry> oldest_first() const;

  mutable std::mutex mutex_;
  std::vector<FlightEntry> ring_;
  size_t next_ = 0;     // slot the next entry goes to
  size_t held_ = 0;     // entries in the ring, up to capacity
  uint64_t total_ = 0;  // entries ever recorded, for the table's heading
  // The same moment on both clocks: steady times are shown as wall-clock times through it.
  Clock::time_point steady_origin_;
  std::chrono::system_clock::time_point wall_origin_;
};

}  // namespace zero
