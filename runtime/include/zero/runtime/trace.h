// Timeline of one rank's work: compute spans recorded by the calling thread (each module's
// forward and backward, the optimizer step) and collective spans recorded by the communication
// stream as each collective starts and ends. Written as one Chrome trace (chrome://tracing,
// Perfetto) holding every rank, and used by the benchmarks to measure how much communication
// overlaps compute. Off by default; recording costs two clock reads per span.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"

namespace zero {

struct TraceSpan {
  std::string name;
  bool comm = false;    // a collective (communication stream) or compute (calling thread)
  double begin_us = 0;  // microseconds on the monotonic clock, shared by all ranks of a node
  double end_us = 0;
  uint64_t bytes = 0;  // collectives: the buffer's bytes
};

// A sample of a counter track (Chrome's "C" events): `name`'s value from `time_us` on, such as
// the bytes a memory category holds.
struct TraceCounter {
  std::string name;
  double time_us = 0;
  uint64_t value = 0;
};

class Trace {
 public:
  explicit Trace(bool enabled = false) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  static double now_us();
  // Thread-safe; ignored when disabled or after kMaxSpans (a note in the trace says so).
  void add(TraceSpan span);
  std::vector<TraceSpan> spans() const;
  // Thread-safe; ignored when disabled or after kMaxSpans counters.
  void add_counter(TraceCounter counter);
  std::vector<TraceCounter> counters() const;
  void clear();

  // Collective: gathers every rank's spans and counters; rank 0 writes the Chrome trace JSON to
  // path (pid = rank, one track for compute and one for communication, and a counter track per
  // counter name). Throws zero::Error when the file cannot be written.
  void write_chrome_trace(Communicator& comm, const std::string& path) const;

  static constexpr size_t kMaxSpans = 1u << 20;

 private:
  bool enabled_;
  mutable std::mutex mutex_;
  std::vector<TraceSpan> spans_;
  std::vector<TraceCounter> counters_;
  bool truncated_ = false;
};

// Records a compute span for the lifetime of the object (no-op when tracing is off).
class ScopedSpan {
 public:
  ScopedSpan(Trace& trace, std::string name);
  ~ScopedSpan();
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

 private:
  Trace& trace_;
  std::string name_;
  double begin_us_ = 0;
};

}  // namespace zero
