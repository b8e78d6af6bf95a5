// The CPU stream and event: order, cross-stream waits, errors, record/synchronize, the
// stamps and completion callbacks of items, shutdown.
#include "zero/collectives/stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace zero {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(Event, DefaultConstructedIsComplete) {
  Event e;
  EXPECT_TRUE(e.done());
  e.wait();
}

TEST(Stream, RunsItemsInEnqueueOrder) {
  std::vector<int> seen;
  Stream stream("order");
  for (int i = 0; i < 1000; ++i) stream.enqueue([&seen, i] { seen.push_back(i); });
  stream.synchronize();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], i);
}

TEST(Stream, EventCompletesOnlyAfterItsWork) {
  Stream stream("gate");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  Event blocked = stream.enqueue([gate] { gate.wait(); });
  Event recorded = stream.record();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(blocked.done());
  EXPECT_FALSE(recorded.done());  // done() must answer without blocking
  release.set_value();
  recorded.wait();
  EXPECT_TRUE(blocked.done());
  EXPECT_TRUE(recorded.done());
}

TEST(Stream, RecordOnIdleStreamCompletes) {
  Stream stream("idle");
  stream.record().wait();
  stream.synchronize();
}

TEST(Stream, RecordAddsNoItem) {
  // With a delay before every item, an item of its own would make the recorded point (and
  // every wait for it) a delay later than the work before it.
  Stream stream("record");
  stream.set_delay_for_testing(milliseconds(30));
  Event work = stream.enqueue([] {});
  Event recorded = stream.record();
  recorded.wait();
  EXPECT_TRUE(work.done());
  EXPECT_EQ(recorded.finished_us(), work.finished_us());
  Stream idle("idle");
  EXPECT_TRUE(idle.record().done());
}

TEST(Stream, StampsWhenEachItemRan) {
  Stream stream("stamps");
  stream.set_delay_for_testing(milliseconds(20));
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  Event first = stream.enqueue([gate] { gate.wait(); });
  Event second = stream.enqueue([] {});
  EXPECT_EQ(second.started_us(), 0.0);  // not taken up yet
  std::this_thread::sleep_for(milliseconds(40));
  release.set_value();
  second.wait();
  // Taken up before its delay (the delay stands for the work being slower), and only after the
  // item before it had finished.
  EXPECT_GE(second.finished_us() - second.started_us(), 20000.0);
  EXPECT_GE(second.started_us(), first.finished_us());
  EXPECT_GE(first.finished_us() - first.started_us(), 40000.0);
  EXPECT_EQ(Event().started_us(), 0.0);
}

TEST(Stream, CompletionCallbackRunsBeforeWaitersWake) {
  Stream stream("callbacks");
  stream.set_delay_for_testing(milliseconds(10));
  for (int round = 0; round < 20; ++round) {
    Event e = stream.enqueue([] {});
    std::atomic<double> seen_begin{-1.0};
    std::atomic<double> seen_end{-1.0};
    e.on_complete([&](double begin_us, double end_us) {
      seen_begin = begin_us;
      seen_end = end_us;
    });
    e.wait();
    // Run on the worker before the event completed, with the item's own stamps.
    EXPECT_EQ(seen_begin.load(), e.started_us());
    EXPECT_EQ(seen_end.load(), e.finished_us());
  }
  // On a complete event the callback runs at once, on this thread.
  Event done = stream.enqueue([] {});
  done.wait();
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id ran_on;
  done.on_complete([&](double, double) { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, me);
}

TEST(Stream, CompletionCallbackRegisteredWhileOthersRunStillRunsBeforeWaitersWake) {
  Stream stream("late callback");
  std::atomic<bool> first_running{false};
  std::atomic<bool> second_ran{false};
  Event e = stream.enqueue([] { std::this_thread::sleep_for(milliseconds(10)); });
  e.on_complete([&](double, double) {
    first_running = true;
    std::this_thread::sleep_for(milliseconds(50));
  });
  while (!first_running) std::this_thread::sleep_for(milliseconds(1));
  // The event is not complete yet: this one joins the callbacks still to run before it is.
  e.on_complete([&](double, double) {
    std::this_thread::sleep_for(milliseconds(20));
    second_ran = true;
  });
  e.wait();
  EXPECT_TRUE(second_ran.load());
}

TEST(Stream, CompletionCallbackSkipsItemsThatDidNotRun) {
  Stream stream("failing");
  std::atomic<int> ran{0};
  Event failed = stream.enqueue([] { throw std::runtime_error("boom"); });
  Event skipped = stream.enqueue([] {});
  failed.on_complete([&](double, double) { ran += 1; });
  skipped.on_complete([&](double, double) { ran += 1; });
  EXPECT_THROW(skipped.wait(), std::runtime_error);
  failed.on_complete([&](double, double) { ran += 1; });  // complete already
  EXPECT_EQ(ran.load(), 0);
}

TEST(Stream, WaitOrdersAcrossStreams) {
  // The producer is slowed down; without the wait the consumer would read the old value.
  Stream producer("producer");
  Stream consumer("consumer");
  producer.set_delay_for_testing(milliseconds(5));
  std::vector<int> data(64, 0);
  std::vector<int> read(64, -1);
  for (int round = 1; round <= 5; ++round) {
    producer.enqueue([&data, round] {
      for (int& x : data) x = round;
    });
    consumer.wait(producer.record());
    consumer.enqueue([&data, &read] { read = data; });
    consumer.synchronize();
    for (int x : read) ASSERT_EQ(x, round);
  }
}

TEST(Stream, WaitMarkerBlocksLaterItemsOnly) {
  Stream a("a");
  Stream b("b");
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  Event a_done = a.enqueue([gate] { gate.wait(); });
  std::atomic<int> b_before{0}, b_after{0};
  Event b_first = b.enqueue([&] { b_before = 1; });
  b.wait(a_done);
  Event b_done = b.enqueue([&] { b_after = 1; });
  b_first.wait();  // work before the marker is not held back
  EXPECT_EQ(b_before.load(), 1);
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(b_after.load(), 0);
  EXPECT_FALSE(b_done.done());
  release.set_value();
  b_done.wait();
  EXPECT_EQ(b_after.load(), 1);
}

TEST(Stream, ErrorIsStoredAndStreamStaysFailed) {
  Stream stream("failing");
  std::atomic<int> ran{0};
  Event before = stream.enqueue([&] { ran += 1; });
  Event failing = stream.enqueue([] { throw std::runtime_error("boom"); });
  Event after = stream.enqueue([&] { ran += 100; });
  EXPECT_THROW(after.wait(), std::runtime_error);
  before.wait();  // work before the error is unaffected
  try {
    failing.wait();
    FAIL() << "expected the stored error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
  try {
    stream.synchronize();
    FAIL() << "expected the stored error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
  EXPECT_EQ(ran.load(), 1);  // the item after the failure never ran
  EXPECT_THROW(stream.record().wait(), std::runtime_error);
}

TEST(Stream, WaitingOnFailedEventFailsTheWaiter) {
  Stream producer("producer");
  Stream consumer("consumer");
  Event failed = producer.enqueue([] { throw std::runtime_error("producer failed"); });
  consumer.wait(failed);
  std::atomic<bool> ran{false};
  Event after = consumer.enqueue([&] { ran = true; });
  EXPECT_THROW(after.wait(), std::runtime_error);
  EXPECT_FALSE(ran.load());
}

TEST(Stream, EventCanBeWaitedFromManyThreads) {
  Stream stream("shared");
  stream.set_delay_for_testing(milliseconds(10));
  Event e = stream.enqueue([] {});
  std::vector<std::thread> waiters;
  std::atomic<int> woke{0};
  for (int i = 0; i < 4; ++i)
    waiters.emplace_back([&] {
      e.wait();
      woke += 1;
    });
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 4);
}

TEST(Stream, DestructorDrainsPendingWork) {
  std::atomic<int> ran{0};
  Event last;
  {
    Stream stream("drain");
    stream.set_delay_for_testing(microseconds(2000));
    for (int i = 0; i < 10; ++i) last = stream.enqueue([&] { ran += 1; });
  }
  EXPECT_EQ(ran.load(), 10);
  EXPECT_TRUE(last.done());  // events outlive their stream
  last.wait();
}

TEST(Stream, KeepsItsName) {
  Stream stream("comm");
  EXPECT_EQ(stream.name(), "comm");
}

}  // namespace
}  // namespace zero
