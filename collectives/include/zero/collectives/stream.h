// The CPU stream and event. A stream runs enqueued work in order on one worker thread; an event
// is a completion flag that a stream sets when the work enqueued before it has run. Waiting on
// an event sleeps on a condition variable, never spins: ranks often outnumber cores here.
//
// The engine orders its two streams (compute, communication) only through these: a stream can
// be told to wait for another stream's event before it runs the next item, and the host can
// wait for any event. The calling thread itself acts as the compute stream on the CPU.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace zero {

class Event {
 public:
  // A default-constructed event is already complete (like an event recorded on an idle stream).
  Event();

  // Blocks until the event completes. If the work before it threw, rethrows that error.
  void wait() const;
  // True once complete (never blocks).
  bool done() const;

  struct State;
  explicit Event(std::shared_ptr<State> state);
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

class Stream {
 public:
  explicit Stream(std::string name);
  // Drains the queue, then joins the worker.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Runs `work` on the worker after everything enqueued before it; the returned event completes
  // when it has run. An exception thrown by work is stored in the event (and in every later
  // event of this stream, which stops running work: a failed stream stays failed).
  Event enqueue(std::function<void()> work);

  // The next item on this stream starts only after `event` completes (cross-stream ordering).
  void wait(const Event& event);

  // An event that completes when everything enqueued so far has run.
  Event record();

  // Blocks until everything enqueued so far has run; rethrows a stored error.
  void synchronize();

  // Test-only: sleep this long before each item, to expose missing waits between streams.
  void set_delay_for_testing(std::chrono::microseconds delay);

  const std::string& name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zero
