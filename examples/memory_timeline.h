// zero-train --memory-timeline FILE: every allocation and release of the engine's allocator on
// this rank, with its category, the memory it came from (the tier) and the step and phase
// (the compute span: "forward <module>", "backward <module>", "optimizer", ...) it happened in.
// Every rank records, for the counter tracks of the Chrome trace; rank 0 writes FILE (one event
// a line, tab-separated), FILE.gp and, through gnuplot, FILE.png: a stacked area per category
// over one step, marking the peak and what was live at it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zero/runtime/memory.h"
#include "zero/runtime/trace.h"

namespace zero::examples {

class MemoryTimeline {
 public:
  // Records `allocator`'s events from now on, after a first event per category for the bytes it
  // already holds (step 0, phase "start"). `tier` names the memory ("host memory").
  MemoryTimeline(Allocator& allocator, std::string tier);
  ~MemoryTimeline();
  MemoryTimeline(const MemoryTimeline&) = delete;
  MemoryTimeline& operator=(const MemoryTimeline&) = delete;

  // The step the events from now on belong to.
  void set_step(long step);

  // Counter tracks "memory <category>" and "memory total" (bytes) in `trace`.
  void add_counters(Trace& trace) const;

  // Writes `path` (the events, their phases found in `spans`, this rank's compute spans),
  // path.gp and, running gnuplot, path.png of step `plot_step`. Throws zero::Error naming the
  // file that cannot be written, or gnuplot's failure.
  void write(const std::string& path, const std::vector<TraceSpan>& spans, long plot_step) const;

  // The most bytes the allocator held while recording.
  uint64_t peak_bytes() const;

  // At most this many events are kept; the files say when more were dropped.
  static constexpr size_t kMaxEvents = size_t{1} << 22;

 private:
  struct Event {
    double time_us;
    long step;
    AllocationEvent allocation;
  };
  void record(const AllocationEvent& event) noexcept;

  Allocator& allocator_;
  std::string tier_;
  long step_ = 0;
  std::vector<std::pair<long, double>> step_starts_;  // (step, time_us)
  std::vector<Event> events_;
  bool truncated_ = false;
};

// Why gnuplot cannot be run (not found on PATH), or "".
std::string gnuplot_problem();

}  // namespace zero::examples
