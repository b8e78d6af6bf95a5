// The flight recorder's ring: order, wraparound, state changes, entries that left the ring, the
// printed table, and concurrent use by an enqueueing thread, a worker and a reader.
#include "zero/collectives/flight_recorder.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "zero/core/check.h"

namespace zero {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The line split at runs of spaces.
std::vector<std::string> columns_of(const std::string& line) {
  std::vector<std::string> columns;
  std::istringstream in(line);
  for (std::string column; in >> column;) columns.push_back(column);
  return columns;
}

// "14:03:07.412"
bool is_time_of_day(const std::string& text) {
  if (text.size() != 12 || text[2] != ':' || text[5] != ':' || text[8] != '.') return false;
  for (size_t i : {0, 1, 3, 4, 6, 7, 9, 10, 11}) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  return true;
}

TEST(FlightRecorder, StartsEmpty) {
  FlightRecorder recorder;
  EXPECT_EQ(recorder.capacity(), 64u);
  EXPECT_TRUE(recorder.entries().empty());
  const std::vector<std::string> lines = lines_of(recorder.format(0));
  ASSERT_EQ(lines.size(), 2u);  // heading and column names only
  EXPECT_EQ(lines[0], "[rank 0] flight record: the last 0 of 0 collectives, most recent last");
}

TEST(FlightRecorder, RejectsZeroCapacity) {
  EXPECT_THROW(FlightRecorder(0), Error);
}

TEST(FlightRecorder, FollowsEachEntryThroughItsStates) {
  FlightRecorder recorder(4);
  recorder.enqueued(1, CollectiveOp::kAllReduce, DType::kFloat32, 1000);
  recorder.enqueued(2, CollectiveOp::kAllGather, DType::kBFloat16, 250);
  recorder.enqueued(3, CollectiveOp::kBarrier, DType::kFloat32, 0);
  recorder.started(1);
  recorder.finished(1, true);
  recorder.started(2);
  recorder.finished(2, false);
  recorder.started(3);

  const std::vector<FlightEntry> entries = recorder.entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].sequence, 1u);
  EXPECT_EQ(entries[0].op, CollectiveOp::kAllReduce);
  EXPECT_EQ(entries[0].dtype, DType::kFloat32);
  EXPECT_EQ(entries[0].count, 1000u);
  EXPECT_EQ(entries[0].state, CollectiveState::kDone);
  EXPECT_EQ(entries[1].state, CollectiveState::kFailed);
  EXPECT_EQ(entries[1].dtype, DType::kBFloat16);
  EXPECT_EQ(entries[2].state, CollectiveState::kRunning);
  EXPECT_EQ(entries[2].ended, FlightEntry::Clock::time_point{});
  // Times only move forward through an entry's life.
  EXPECT_LE(entries[0].enqueued, entries[0].started);
  EXPECT_LE(entries[0].started, entries[0].ended);
  EXPECT_NE(entries[2].started, FlightEntry::Clock::time_point{});
}

TEST(FlightRecorder, WrapsAroundKeepingTheNewest) {
  FlightRecorder recorder(8);
  for (uint64_t seq = 1; seq <= 21; ++seq) {
    recorder.enqueued(seq, CollectiveOp::kReduceScatter, DType::kFloat16, seq * 10);
    recorder.started(seq);
    if (seq != 21) recorder.finished(seq, true);
  }
  const std::vector<FlightEntry> entries = recorder.entries();
  ASSERT_EQ(entries.size(), 8u);
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i].sequence, 14 + i) << "oldest first";
    EXPECT_EQ(entries[i].count, (14 + i) * 10);
    EXPECT_EQ(entries[i].state,
              i + 1 == entries.size() ? CollectiveState::kRunning : CollectiveState::kDone);
  }
  const std::vector<std::string> lines = lines_of(recorder.format(3));
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_EQ(lines[0], "[rank 3] flight record: the last 8 of 21 collectives, most recent last");
}

TEST(FlightRecorder, IgnoresEntriesThatLeftTheRing) {
  // A worker far behind the enqueueing thread starts a collective whose entry was overwritten:
  // nothing in the ring may change.
  FlightRecorder recorder(2);
  recorder.enqueued(1, CollectiveOp::kAllReduce, DType::kFloat32, 1);
  recorder.enqueued(2, CollectiveOp::kAllReduce, DType::kFloat32, 2);
  recorder.enqueued(3, CollectiveOp::kAllReduce, DType::kFloat32, 3);
  recorder.started(1);
  recorder.finished(1, false);
  const std::vector<FlightEntry> entries = recorder.entries();
  ASSERT_EQ(entries.size(), 2u);
  for (const FlightEntry& e : entries) {
    EXPECT_NE(e.sequence, 1u);
    EXPECT_EQ(e.state, CollectiveState::kEnqueued);
    EXPECT_EQ(e.started, FlightEntry::Clock::time_point{});
  }
}

TEST(FlightRecorder, FormatsOneRowPerEntryMostRecentLast) {
  FlightRecorder recorder;
  recorder.enqueued(7, CollectiveOp::kBarrier, DType::kFloat32, 0);
  recorder.started(7);
  // Long enough that a duration printed as 0 or from the wrong ends cannot pass.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  recorder.finished(7, true);
  const FlightEntry finished = recorder.entries().front();
  const double seconds = std::chrono::duration<double>(finished.ended - finished.started).count();
  recorder.enqueued(8, CollectiveOp::kAllReduce, DType::kFloat32, 1000);
  recorder.started(8);
  recorder.enqueued(9, CollectiveOp::kBroadcast, DType::kBFloat16, 12);

  const std::vector<std::string> lines = lines_of(recorder.format(1));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0], "[rank 1] flight record: the last 3 of 3 collectives, most recent last");
  EXPECT_EQ(lines[1],
            "[rank 1]      seq  op              dtype         count  state     enqueued      "
            "started       ended         duration");
  // Columns: "[rank" "1]", seq, op, dtype ("-" for a barrier), count, state, then three
  // times of day and the duration ("0.002" "s"); a time not reached yet is "-".
  const std::vector<std::string> done = columns_of(lines[2]);
  ASSERT_EQ(done.size(), 12u) << lines[2];
  EXPECT_EQ(std::vector<std::string>(done.begin(), done.begin() + 7),
            (std::vector<std::string>{"[rank", "1]", "7", "barrier", "-", "0", "done"}));
  EXPECT_TRUE(is_time_of_day(done[7]) && is_time_of_day(done[8]) && is_time_of_day(done[9]))
      << lines[2];
  // The duration, to the printed millisecond, is the span from start to end.
  EXPECT_GE(seconds, 0.030);
  EXPECT_NEAR(std::stod(done[10]), seconds, 0.001) << lines[2];
  EXPECT_EQ(done[11], "s");

  const std::vector<std::string> running = columns_of(lines[3]);
  ASSERT_EQ(running.size(), 12u) << lines[3];
  EXPECT_EQ(std::vector<std::string>(running.begin() + 2, running.begin() + 7),
            (std::vector<std::string>{"8", "all_reduce", "fp32", "1000", "running"}));
  EXPECT_TRUE(is_time_of_day(running[7]) && is_time_of_day(running[8])) << lines[3];
  EXPECT_EQ(running[9], "-");
  EXPECT_EQ(running[11], "s");

  const std::vector<std::string> queued = columns_of(lines[4]);
  ASSERT_EQ(queued.size(), 11u) << lines[4];
  EXPECT_EQ(std::vector<std::string>(queued.begin() + 2, queued.begin() + 7),
            (std::vector<std::string>{"9", "broadcast", "bf16", "12", "enqueued"}));
  EXPECT_TRUE(is_time_of_day(queued[7])) << lines[4];
  EXPECT_EQ(std::vector<std::string>(queued.begin() + 8, queued.end()),
            (std::vector<std::string>{"-", "-", "-"}));
}

TEST(FlightRecorder, NamesStatesAndCollectives) {
  EXPECT_STREQ(collective_state_name(CollectiveState::kEnqueued), "enqueued");
  EXPECT_STREQ(collective_state_name(CollectiveState::kRunning), "running");
  EXPECT_STREQ(collective_state_name(CollectiveState::kDone), "done");
  EXPECT_STREQ(collective_state_name(CollectiveState::kFailed), "failed");
  EXPECT_EQ(describe_collective(CollectiveOp::kAllReduce, 1000, DType::kFloat32),
            "all_reduce(1000 x fp32)");
  EXPECT_EQ(describe_collective(CollectiveOp::kAllGather, 250, DType::kFloat16),
            "all_gather(250 x fp16)");
  EXPECT_EQ(describe_collective(CollectiveOp::kBarrier, 0, DType::kFloat32), "barrier()");
}

TEST(FlightRecorder, ConcurrentWritersAndReader) {
  // The communicator's three threads at once: the enqueueing thread adds entries, the worker
  // starts and finishes them (behind it), the watchdog formats the table. Under ThreadSanitizer
  // this is the test that sees a missing lock.
  FlightRecorder recorder(16);
  constexpr uint64_t kCollectives = 2000;
  std::atomic<uint64_t> enqueued{0};
  std::thread enqueuer([&] {
    for (uint64_t seq = 1; seq <= kCollectives; ++seq) {
      recorder.enqueued(seq, CollectiveOp::kAllGather, DType::kFloat32, seq);
      enqueued.store(seq, std::memory_order_release);
    }
  });
  std::thread worker([&] {
    for (uint64_t seq = 1; seq <= kCollectives; ++seq) {
      while (enqueued.load(std::memory_order_acquire) < seq) std::this_thread::yield();
      recorder.started(seq);
      recorder.finished(seq, true);
    }
  });
  do {
    EXPECT_FALSE(recorder.format(0).empty());
  } while (enqueued.load(std::memory_order_acquire) < kCollectives);
  enqueuer.join();
  worker.join();
  const std::vector<FlightEntry> entries = recorder.entries();
  ASSERT_EQ(entries.size(), 16u);
  EXPECT_EQ(entries.back().sequence, kCollectives);
  EXPECT_EQ(entries.back().state, CollectiveState::kDone);
}

}  // namespace
}  // namespace zero
