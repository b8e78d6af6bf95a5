#include "examples/comms_log.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "zero/collectives/collective_table.h"
#include "zero/runtime/monitor.h"

namespace zero::examples {

namespace {

// DeepSpeed's f"{value: <20}" columns.
std::string column(const std::string& text) {
  return text.size() >= 20 ? text : text + std::string(20 - text.size(), ' ');
}

std::string fixed2(double v) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f", v);
  return text;
}

}  // namespace

std::string deepspeed_size(uint64_t bytes) {
  if (bytes == 0) return "0B";
  static const char* const kNames[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int i = 0;
  while (i < 6 && static_cast<double>(bytes) >= std::pow(1024.0, i + 1)) ++i;
  const double scaled = std::round(static_cast<double>(bytes) / std::pow(1024.0, i) * 100) / 100;
  // Python's str of a float, as round() returns one; of an int for bytes (round of an int).
  const std::string number = i == 0 ? std::to_string(bytes) : python_float_text(scaled);
  return number + " " + kNames[i];
}

CommsLog::Call CommsLog::call_of(const TraceSpan& span) const {
  const double us = span.end_us - span.begin_us;
  const double seconds = std::max(us / 1e6, 1e-9);
  Call call{us / 1000.0, 0, 0};
  const double size = static_cast<double>(span.bytes);
  const double n = ranks_;
  // DeepSpeed's calc_bw_log, with the message as the whole buffer (its all_gather's input
  // times the ranks).
  if (span.name == "all_reduce") {
    call.algbw_gbps = size * 2 / seconds;
    call.busbw_gbps = size / seconds * (2 * (n - 1) / n);
  } else if (span.name == "all_gather" || span.name == "reduce_scatter") {
    call.algbw_gbps = size / seconds;
    call.busbw_gbps = size / seconds * ((n - 1) / n);
  } else {
    call.algbw_gbps = call.busbw_gbps = size / seconds;
  }
  call.algbw_gbps *= 8 / 1e9;
  call.busbw_gbps *= 8 / 1e9;
  return call;
}

driver::JsonRecord CommsLog::add_step(const CommCounters& before, const CommCounters& after,
                                      const std::vector<TraceSpan>& spans,
                                      std::vector<std::string>* lines) {
  CommCounters sent;
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    sent.calls[i] = after.calls[i] - before.calls[i];
    sent.bytes[i] = after.bytes[i] - before.bytes[i];
  }
  for (size_t k = std::min(spans_taken_, spans.size()); k < spans.size(); ++k) {
    const TraceSpan& span = spans[k];
    if (!span.comm || !config_.logs(span.name)) continue;
    const Call call = call_of(span);
    calls_[{span.name, span.bytes}].push_back(call);
    if (config_.verbose) {
      lines->push_back("comm op: " + span.name + " | time (ms): " + fixed2(call.latency_ms) +
                       " | msg size: " + deepspeed_size(span.bytes) + " | algbw (Gbps): " +
                       fixed2(call.algbw_gbps) + " | busbw (Gbps): " + fixed2(call.busbw_gbps));
    }
  }
  spans_taken_ = spans.size();
  driver::JsonRecord ops = driver::JsonRecord::object();
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    const std::string name = collective_op_name(static_cast<CollectiveOp>(i));
    if (sent.calls[i] == 0 || !config_.logs(name)) continue;
    ops[name] = {{"count", sent.calls[i]}, {"sent_bytes", sent.bytes[i]}};
    total_.calls[i] += sent.calls[i];
    total_.bytes[i] += sent.bytes[i];
  }
  return ops;
}

std::string CommsLog::summary() const {
  std::string out = column("Comm. Op") + column("Message Size") + column("Count") +
                    column("Total Latency(ms)") + column("Avg Latency(ms)") +
                    column("p99 Latency(ms)") + column("tput_avg (Gbps)") +
                    column("busbw_avg (Gbps)") + "\n";
  std::string op;
  for (const auto& [key, calls] : calls_) {
    if (key.first != op) {
      op = key.first;
      out += op + "\n";
    }
    std::vector<double> latencies;
    double total = 0, algbw = 0, busbw = 0;
    for (const Call& c : calls) {
      latencies.push_back(c.latency_ms);
      total += c.latency_ms;
      algbw += c.algbw_gbps;
      busbw += c.busbw_gbps;
    }
    std::sort(latencies.begin(), latencies.end());
    // Nearest rank: the smallest latency at or above 99 % of the calls.
    const size_t tail =
        static_cast<size_t>(std::ceil(0.99 * static_cast<double>(calls.size()))) - 1;
    const double count = static_cast<double>(calls.size());
    out += column("") + column(deepspeed_size(key.second)) + column(std::to_string(calls.size())) +
           column(fixed2(total)) + column(fixed2(total / count)) + column(fixed2(latencies[tail])) +
           column(fixed2(algbw / count)) + column(fixed2(busbw / count)) + "\n";
  }
  out += "bytes sent by this rank:";
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    if (total_.calls[i] == 0) continue;
    out += std::string(" ") + collective_op_name(static_cast<CollectiveOp>(i)) + " " +
           std::to_string(total_.bytes[i]) + " in " + std::to_string(total_.calls[i]) + " calls;";
  }
  return out + "\n";
}

}  // namespace zero::examples
