// zero-train --memory-timeline FILE: every allocation and release of the engine's allocators on
// this rank (its own, and its pinned and pageable host memory), with its category, the memory it
// came from (the tier) and the step and phase (the compute span: "forward <module>", "backward
// <module>", "optimizer", ...) it happened in; on a GPU also the device's free and total memory
// as the driver reports them. Every rank records, for the counter tracks of the Chrome trace;
// rank 0 writes FILE (one event a line, tab-separated), FILE.gp and, through gnuplot, FILE.png:
// a stacked area per category of the first tier over one step, marking the peak and what was
// live at it, with the other tiers' totals and the driver's figure as lines.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zero/runtime/device.h"
#include "zero/runtime/memory.h"
#include "zero/runtime/trace.h"

namespace zero::examples {

class MemoryTimeline {
 public:
  // Records `allocator`'s events from now on, after a first event per category for the bytes it
  // already holds (step 0, phase "start"). `tier` names the memory ("host memory"). With a
  // `device` whose driver reports its memory (DeviceContext::driver_memory: a GPU), every event
  // of every tier and every step start also samples the driver's free and total bytes.
  MemoryTimeline(Allocator& allocator, std::string tier,
                 std::shared_ptr<DeviceContext> device = nullptr);
  ~MemoryTimeline();
  MemoryTimeline(const MemoryTimeline&) = delete;
  MemoryTimeline& operator=(const MemoryTimeline&) = delete;

  // Records `allocator` too, in the same way, under `tier` (a name no other tier has).
  void add(Allocator& allocator, std::string tier);

  // The step the events from now on belong to.
  void set_step(long step);

  // Whose memory this is, for the plot's title and a note in the events file: "rank 0" unless
  // named ("rank 0, pipeline stage 0 of 2").
  void set_owner(std::string owner) { owner_ = std::move(owner); }

  // Counter tracks in `trace` (bytes): "memory <category>" and "memory total" for the first
  // tier, "memory <category> (<tier>)" and "memory total (<tier>)" for the others, and with the
  // driver's samples "device free (driver)" and "device total (driver)".
  void add_counters(Trace& trace) const;

  // write_events, write_plot_script, then gnuplot on path.gp, which draws path.png.
  void write(const std::string& path, const std::vector<TraceSpan>& spans, long plot_step) const;
  // `path`: the events, their phases found in `spans` (this rank's compute spans). Throws
  // zero::Error naming the file that cannot be written.
  void write_events(const std::string& path, const std::vector<TraceSpan>& spans) const;
  // path.gp, the gnuplot script that draws step `plot_step` into path.png (the peak's phase
  // found in `spans`).
  void write_plot_script(const std::string& path, const std::vector<TraceSpan>& spans,
                         long plot_step) const;

  // The most bytes `tier` held while recording (0 for a tier not recorded).
  uint64_t peak_bytes(const std::string& tier) const;

  // At most this many events are kept; the files say when more were dropped.
  static constexpr size_t kMaxEvents = size_t{1} << 22;

 private:
  struct Event {
    double time_us;
    long step;
    size_t tier;
    AllocationEvent allocation;
    std::optional<DriverMemory> driver;
  };
  struct StepStart {
    long step;
    double time_us;
    std::optional<DriverMemory> driver;
  };
  struct Source {
    Allocator* allocator;
    std::string tier;
  };
  void record(size_t tier, const AllocationEvent& event) noexcept;
  std::optional<DriverMemory> sample_driver() noexcept;

  std::vector<Source> sources_;
  std::shared_ptr<DeviceContext> device_;
  std::string owner_;  // empty: "rank 0", and no note in the events file
  long step_ = 0;
  std::vector<StepStart> step_starts_;
  std::vector<Event> events_;
  bool truncated_ = false;
  std::string driver_error_;  // the first failed query of the driver, for the files
};

// Why gnuplot cannot be run (not found on PATH), or "".
std::string gnuplot_problem();

}  // namespace zero::examples
