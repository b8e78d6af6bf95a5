// comms_logger: the engine's collectives per kind and message size, as DeepSpeed's comms logger
// reports them. The counts and bytes sent come from the communicator's counters (so they add
// up to the step records' comm_bytes); the latencies from the collectives' spans on the
// communication stream (the CPU path's; on a GPU the table has counts and bytes only).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "driver/metrics_writer.h"
#include "zero/collectives/communicator.h"
#include "zero/runtime/config.h"
#include "zero/runtime/trace.h"

namespace zero::examples {

class CommsLog {
 public:
  CommsLog(const CommsLoggerConfig& config, int ranks) : config_(config), ranks_(ranks) {}

  // One step: the communicator's counters `before` and `after` it, `spans` the trace's spans so
  // far (those already taken are skipped). Returns the step record's "comm_ops": per logged op, the
  // collectives issued and the bytes this rank sent. With verbose, `lines` gets DeepSpeed's line
  // per collective.
  driver::JsonRecord add_step(const CommCounters& before, const CommCounters& after,
                              const std::vector<TraceSpan>& spans, std::vector<std::string>* lines);

  // DeepSpeed's log_summary table: per op and message size, the count, total, mean and p99
  // latency and the mean algbw and busbw (Gbps), then the bytes sent per op.
  std::string summary() const;

 private:
  struct Call {
    double latency_ms;
    double algbw_gbps;
    double busbw_gbps;
  };
  Call call_of(const TraceSpan& span) const;

  CommsLoggerConfig config_;
  int ranks_;
  size_t spans_taken_ = 0;
  std::map<std::pair<std::string, uint64_t>, std::vector<Call>> calls_;  // (op, bytes)
  CommCounters total_;
};

// DeepSpeed's convert_size: "8.0 MB", "512 B" (1024-based, rounded to 2 places).
std::string deepspeed_size(uint64_t bytes);

}  // namespace zero::examples
