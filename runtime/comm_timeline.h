// When the communication stream runs what the engine issues on it, and how long compute waits
// for it (private to runtime/): the step's collective count, comm_busy_ms and comm_wait_ms,
// and the trace's communication spans. The engine and its gradient reducer issue through one.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "comm_point.h"
#include "zero/runtime/device.h"
#include "zero/runtime/trace.h"

namespace zero {

class CommTimeline {
 public:
  CommTimeline(DeviceContext& device, Trace& trace, bool overlap_comm)
      : device_(device), trace_(trace), overlap_comm_(overlap_comm) {}

  // A collective issued on stream `on`: the step's comm_busy_ms counts what its item took on
  // the stream, from when the worker took it up until it finished, and the trace holds when it
  // really ran, not when it was queued. The stream stamps both ends itself, so no marker item
  // sits beside the collective (an item costs the stream a turn of its worker, and the test
  // delay, as much as a small collective). The callback that counts them runs before the event
  // completes: whoever waits for the collective finds its span closed, so a compute span that
  // starts after the wait cannot look overlapped. (CUDA runs enqueued host work at issue, so
  // there the figures would be issue times: only the CPU stream measures.)
  template <typename Issue>
  CommPoint traced(Stream& on, const char* name, uint64_t bytes, Issue issue) {
    ++collectives_issued_;
    Event done = issue();
    if (on.native_handle() == nullptr) {
      Trace* t = trace_.enabled() ? &trace_ : nullptr;
      std::shared_ptr<std::atomic<int64_t>> busy = busy_us_;
      std::string span_name = name;
      done.on_complete([t, busy, span_name, bytes](double begin_us, double end_us) {
        busy->fetch_add(static_cast<int64_t>(end_us - begin_us));
        if (t) t->add(TraceSpan{span_name, true, begin_us, end_us, bytes});
      });
    }
    return CommPoint{std::move(done)};
  }

  // The current end of stream `on`: its last item, which the stream stamps when it has run.
  CommPoint point(Stream& on) { return CommPoint{on.record()}; }

  // The one place compute waits for communication. comm_wait_ms adds how long compute was
  // exposed to it, by the wall clock: from when compute needed the result (`needed_us`; now,
  // by default) until this thread goes on, when the stream had not got there yet.
  void wait(const CommPoint& point, double needed_us = -1.0);

  // An issued collective: with overlap_comm off, compute needs it from the moment it was
  // issued (`issue_us`) and waits for it right away.
  CommPoint issued(CommPoint point, double issue_us);

  // The figures since the last call, which starts the next step's.
  struct Figures {
    int collectives = 0;
    double busy_ms = 0.0;
    double wait_ms = 0.0;
  };
  Figures take();

 private:
  DeviceContext& device_;
  Trace& trace_;
  bool overlap_comm_;
  int collectives_issued_ = 0;
  double wait_us_ = 0.0;
  // Added on the communication streams' workers, hence shared with their callbacks and atomic.
  std::shared_ptr<std::atomic<int64_t>> busy_us_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace zero
