// The CPU stream and event. A stream runs enqueued work in order on one worker thread; an event
// is a completion flag that a stream sets when the work enqueued before it has run. Waiting on
// an event sleeps on a condition variable, never spins: ranks often outnumber cores here.
//
// The engine orders its two streams (compute, communication) only through these: a stream can
// be told to wait for another stream's event before it runs the next item, and the host can
// wait for any event. The calling thread itself acts as the compute stream on the CPU.
//
// A stream may also stand for a device stream (a CUDA stream: zero/collectives/cuda_stream.h).
// Its events then complete with device work; waiting on one from the host sleeps in the device
// runtime, and another device stream waits for it on the device, without the host.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace zero {

// Completion of work on a device stream (on CUDA, a recorded cudaEvent_t). Device backends
// implement it; CPU-only code never sees one.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Blocks, sleeping, until the device work before the event has run; throws zero::Error when
  // that work failed.
  virtual void synchronize() const = 0;
  // True once the device work has run (never blocks).
  virtual bool query() const = 0;
};

class Event {
 public:
  // A default-constructed event is already complete (like an event recorded on an idle stream).
  Event();
  // An event that completes with device work (what a device stream's record() returns).
  explicit Event(std::shared_ptr<const DeviceEvent> device);

  // Blocks until the event completes. If the work before it threw, rethrows that error.
  void wait() const;
  // True once complete (never blocks).
  bool done() const;

  // For the event of an item run by a CPU stream's worker: when the worker took the item up
  // (before any test delay, which stands for the work being slower) and when it finished, in
  // microseconds of std::chrono::steady_clock since its epoch. 0 until then, and always 0 for a
  // default-constructed or device event. What a collective cost its stream, without a marker.
  double started_us() const;
  double finished_us() const;

  // Runs callback(started_us(), finished_us()) once the item has run: on the CPU stream's
  // worker before the event completes (whoever wakes from wait() sees what the callback did),
  // or at once on this thread when it is complete already. Never for an item that failed or
  // was skipped after a failure. CPU stream events only (a device event is an error). A
  // callback must not throw, nor wait for its own stream.
  void on_complete(std::function<void(double started_us, double finished_us)> callback) const;

  // The device completion behind this event, or null for a CPU event.
  const DeviceEvent* device_event() const;

  struct State;
  explicit Event(std::shared_ptr<State> state);
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

class Stream {
 public:
  // What runs a stream's work: the CPU worker thread (the constructor with a name alone), or a
  // device stream (cuda_stream.h). The methods mean what the Stream methods of the same name say.
  class Backend {
   public:
    virtual ~Backend() = default;
    virtual Event enqueue(std::function<void()> work) = 0;
    virtual void wait(const Event& event) = 0;
    virtual Event record() = 0;
    virtual void synchronize() = 0;
    virtual void set_delay_for_testing(std::chrono::microseconds delay) = 0;
    virtual void* native_handle() const = 0;
  };

  // A CPU stream with its own worker thread.
  explicit Stream(std::string name);
  // A stream run by `backend`.
  Stream(std::string name, std::unique_ptr<Backend> backend);
  // Drains the queue, then joins the worker (a device stream: waits for its work).
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Runs `work` on the worker after everything enqueued before it; the returned event completes
  // when it has run. An exception thrown by work is stored in the event (and in every later
  // event of this stream, which stops running work: a failed stream stays failed).
  // On a device stream, `work` runs at once on the calling thread and must only issue
  // asynchronous device work on native_handle(); the event completes when that work has run,
  // and an exception thrown by work propagates to the caller.
  Event enqueue(std::function<void()> work);

  // The next item on this stream starts only after `event` completes (cross-stream ordering).
  // A device stream waits for a device event on the device; for a CPU event it blocks the
  // calling thread until the event completes, which keeps the order just the same.
  void wait(const Event& event);

  // An event that completes when everything enqueued so far has run. On a CPU stream it is the
  // last item's own event (or a complete one on a stream never used): recording adds no item.
  Event record();

  // Blocks until everything enqueued so far has run; rethrows a stored error.
  void synchronize();

  // Test-only: sleep this long before each item, to expose missing waits between streams.
  void set_delay_for_testing(std::chrono::microseconds delay);

  const std::string& name() const;

  // The device stream behind this stream (a cudaStream_t), or null for a CPU stream.
  void* native_handle() const;

 private:
  std::string name_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace zero
