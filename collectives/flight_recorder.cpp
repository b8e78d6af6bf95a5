// The flight recorder's ring of the last collectives, and the table it prints.
#include "zero/collectives/flight_recorder.h"

#include <cinttypes>
#include <cstdio>
#include <ctime>

#include "zero/core/check.h"

namespace zero {

const char* collective_state_name(CollectiveState state) {
  switch (state) {
    case CollectiveState::kEnqueued:
      return "enqueued";
    case CollectiveState::kRunning:
      return "running";
    case CollectiveState::kDone:
      return "done";
    case CollectiveState::kFailed:
      return "failed";
  }
  return "?";
}

const char* element_type_name(DType dtype, bool bytes) {
  return bytes ? "byte" : dtype_name(dtype);
}

std::string describe_collective(CollectiveOp op, size_t count, DType dtype, bool bytes) {
  if (op == CollectiveOp::kBarrier) return "barrier()";
  return std::string(collective_op_name(op)) + "(" + std::to_string(count) + " x " +
         element_type_name(dtype, bytes) + ")";
}

FlightRecorder::FlightRecorder(size_t capacity)
    : steady_origin_(Clock::now()), wall_origin_(std::chrono::system_clock::now()) {
  ZERO_CHECK(capacity > 0, "a flight recorder needs room for at least one collective");
  ring_.resize(capacity);
}

void FlightRecorder::enqueued(uint64_t sequence, CollectiveOp op, DType dtype, size_t count,
                              bool bytes) {
  FlightEntry entry;
  entry.sequence = sequence;
  entry.op = op;
  entry.dtype = dtype;
  entry.count = count;
  entry.bytes = bytes;
  entry.enqueued = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  ring_[next_] = entry;
  next_ = (next_ + 1) % ring_.size();
  if (held_ < ring_.size()) ++held_;
  ++total_;
}

void FlightRecorder::started(uint64_t sequence) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightEntry* entry = find(sequence)) {
    entry->state = CollectiveState::kRunning;
    entry->started = now;
  }
}

void FlightRecorder::finished(uint64_t sequence, bool ok) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightEntry* entry = find(sequence)) {
    entry->state = ok ? CollectiveState::kDone : CollectiveState::kFailed;
    entry->ended = now;
  }
}

FlightEntry* FlightRecorder::find(uint64_t sequence) {
  // Newest first: the entry a worker starts or finishes is almost always among the latest.
  for (size_t k = 1; k <= held_; ++k) {
    FlightEntry& entry = ring_[(next_ + ring_.size() - k) % ring_.size()];
    if (entry.sequence == sequence) return &entry;
  }
  return nullptr;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return oldest_first();
}

std::vector<FlightEntry> FlightRecorder::oldest_first() const {
  std::vector<FlightEntry> oldest_first;
  oldest_first.reserve(held_);
  for (size_t k = held_; k >= 1; --k) {
    oldest_first.push_back(ring_[(next_ + ring_.size() - k) % ring_.size()]);
  }
  return oldest_first;
}

namespace {

// "14:03:07.412", or "-" for a time that has not happened.
std::string time_of_day(FlightEntry::Clock::time_point t,
                        FlightEntry::Clock::time_point steady_origin,
                        std::chrono::system_clock::time_point wall_origin) {
  if (t == FlightEntry::Clock::time_point{}) return "-";
  const auto wall = wall_origin + std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                      t - steady_origin);
  const std::time_t seconds = std::chrono::system_clock::to_time_t(wall);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(wall.time_since_epoch()).count() % 1000;
  std::tm parts{};
  if (localtime_r(&seconds, &parts) == nullptr) return "?";
  char text[32];
  std::snprintf(text, sizeof(text), "%02d:%02d:%02d.%03d", parts.tm_hour, parts.tm_min,
                parts.tm_sec, static_cast<int>(ms));
  return text;
}

// Seconds from start to end (to now while running), or "-" before the collective starts.
std::string duration(const FlightEntry& entry, FlightEntry::Clock::time_point now) {
  if (entry.state == CollectiveState::kEnqueued) return "-";
  const auto end = entry.state == CollectiveState::kRunning ? now : entry.ended;
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f s",
                std::chrono::duration<double>(end - entry.started).count());
  return text;
}

}  // namespace

std::string FlightRecorder::format(int rank) const {
  std::vector<FlightEntry> rows;
  uint64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    rows = oldest_first();
    total = total_;
  }
  const Clock::time_point now = Clock::now();
  char line[256];
  std::string table;
  std::snprintf(line, sizeof(line),
                "[rank %d] flight record: the last %zu of %" PRIu64
                " collectives, most recent last\n",
                rank, rows.size(), total);
  table += line;
  std::snprintf(line, sizeof(line),
                "[rank %d] %8s  %-14s  %-5s  %12s  %-8s  %-12s  %-12s  %-12s  %s\n", rank, "seq",
                "op", "dtype", "count", "state", "enqueued", "started", "ended", "duration");
  table += line;
  for (const FlightEntry& e : rows) {
    const bool moves_data = e.op != CollectiveOp::kBarrier;
    std::snprintf(line, sizeof(line),
                  "[rank %d] %8" PRIu64 "  %-14s  %-5s  %12zu  %-8s  %-12s  %-12s  %-12s  %s\n",
                  rank, e.sequence, collective_op_name(e.op),
                  moves_data ? element_type_name(e.dtype, e.bytes) : "-", e.count,
                  collective_state_name(e.state),
                  time_of_day(e.enqueued, steady_origin_, wall_origin_).c_str(),
                  time_of_day(e.started, steady_origin_, wall_origin_).c_str(),
                  time_of_day(e.ended, steady_origin_, wall_origin_).c_str(),
                  duration(e, now).c_str());
    table += line;
  }
  return table;
}

}  // namespace zero
