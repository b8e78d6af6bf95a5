// The CPU stream: one worker thread running a queue of work items in order, and the events
// that report their completion. Everything that waits (the worker on an empty queue, a host
// thread on an event, the worker on another stream's event) sleeps on a condition variable.
// Stream itself only forwards to its backend, so a device stream (cuda_stream.cpp) can stand in
// its place; an event of a device stream delegates wait() and done() to its DeviceEvent.
#include "zero/collectives/stream.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "zero/core/check.h"

namespace zero {

// Shared between the stream that completes the event and every copy of the Event handle.
struct Event::State {
  std::mutex mutex;
  std::condition_variable completed;
  bool done = false;
  std::exception_ptr error;  // set when the work before the event threw
  // Set for an event of a device stream: then completion is the device's, not `done`.
  std::shared_ptr<const DeviceEvent> device;
  double started_us = 0.0;  // see Event::started_us
  double finished_us = 0.0;
  std::vector<std::function<void(double, double)>> callbacks;  // run once, at completion

  void start() {
    const double now = steady_now_us();
    std::lock_guard<std::mutex> lock(mutex);
    started_us = now;
  }

  // Callbacks run before `done`, so that a waiter woken by it sees what they did; one registered
  // while they run finds the event not done yet and is run in the next round. Done is set in the
  // same critical section that finds no callback left, so none can slip in after it unrun. An
  // item that failed, or was skipped after a failure, did not run: its callbacks are dropped.
  void complete(std::exception_ptr e) {
    const double now = steady_now_us();
    std::unique_lock<std::mutex> lock(mutex);
    finished_us = now;
    while (!e && !callbacks.empty()) {
      std::vector<std::function<void(double, double)>> to_run;
      to_run.swap(callbacks);
      lock.unlock();
      for (const auto& callback : to_run) callback(started_us, now);
      lock.lock();
    }
    callbacks.clear();
    done = true;
    error = std::move(e);
    lock.unlock();
    completed.notify_all();
  }

  static double steady_now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
  }
};

Event::Event() : state_(std::make_shared<State>()) {
  state_->done = true;
}

Event::Event(std::shared_ptr<const DeviceEvent> device) : state_(std::make_shared<State>()) {
  state_->device = std::move(device);
}

Event::Event(std::shared_ptr<State> state) : state_(std::move(state)) {}

void Event::wait() const {
  if (state_->device) {
    state_->device->synchronize();
    return;
  }
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->completed.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

namespace {

// A CPU event that has completed without an error (never blocks).
bool completed_cleanly(const Event& event) {
  const std::shared_ptr<Event::State>& state = event.state();
  if (!state || state->device) return false;
  std::lock_guard<std::mutex> lock(state->mutex);
  return state->done && !state->error;
}

}  // namespace

bool Event::done() const {
  if (state_->device) return state_->device->query();
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

double Event::started_us() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->started_us;
}

double Event::finished_us() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->finished_us;
}

void Event::on_complete(std::function<void(double, double)> callback) const {
  ZERO_CHECK(state_->device == nullptr,
             "Event::on_complete on a device event: it would never run (CPU stream events only)");
  double started = 0.0;
  double finished = 0.0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->done) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
    if (state_->error) return;  // the item did not run
    started = state_->started_us;
    finished = state_->finished_us;
  }
  callback(started, finished);
}

const DeviceEvent* Event::device_event() const {
  return state_->device.get();
}

namespace {

// The CPU stream: a worker thread running a queue of items in order.
class CpuBackend final : public Stream::Backend {
 public:
  CpuBackend() : worker_([this] { run(); }) {}

  // Drains the queue, then joins the worker.
  ~CpuBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queue_changed_.notify_one();
    worker_.join();
  }

  Event enqueue(std::function<void()> work) override {
    auto state = std::make_shared<Event::State>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({std::move(work), state});
      last_ = state;
    }
    queue_changed_.notify_one();
    return Event(std::move(state));
  }

  void wait(const Event& event) override {
    // A complete event (a CPU compute stream's always is) orders nothing: no item, whose
    // wake-up would cost the stream as much as a small collective. Its failure, if any, is
    // still this stream's: a marker rethrows it.
    if (completed_cleanly(event)) return;
    // The marker blocks the worker (sleeping) until the event completes. If the awaited work
    // failed, this stream fails too: its next items would read what that work never produced.
    enqueue([event] { event.wait(); });
  }

  // One worker runs the items in order, so the last one's completion is everyone's. An item
  // that failed, or followed a failure, carries the error: the recorded event rethrows it.
  Event record() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_ ? Event(last_) : Event();
  }

  void synchronize() override { record().wait(); }

  void set_delay_for_testing(std::chrono::microseconds delay) override {
    std::lock_guard<std::mutex> lock(mutex_);
    delay_ = delay;
  }

  void* native_handle() const override { return nullptr; }

 private:
  struct Item {
    std::function<void()> work;
    std::shared_ptr<Event::State> event;
  };

  void run() {
    for (;;) {
      Item item;
      std::chrono::microseconds item_delay;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queue_changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        // Stopping still drains: the destructor promises that enqueued work runs.
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
        item_delay = delay_;
      }
      item.event->start();
      // A failed stream stays failed: what follows may depend on the work that threw, so it
      // is not run, and its event reports the original error.
      if (!failure_) {
        if (item_delay.count() > 0) std::this_thread::sleep_for(item_delay);
        try {
          item.work();
        } catch (...) {
          failure_ = std::current_exception();
        }
      }
      item.event->complete(failure_);
    }
  }

  std::mutex mutex_;  // guards queue_, last_, stopping_ and delay_
  std::condition_variable queue_changed_;
  std::deque<Item> queue_;
  std::shared_ptr<Event::State> last_;  // the event of the item enqueued last
  bool stopping_ = false;
  std::chrono::microseconds delay_{0};

  // Touched by the worker thread only: the first error thrown on this stream.
  std::exception_ptr failure_;

  // Last: the worker starts in the constructor and uses every member above.
  std::thread worker_;
};

}  // namespace

Stream::Stream(std::string name) : Stream(std::move(name), std::make_unique<CpuBackend>()) {}

Stream::Stream(std::string name, std::unique_ptr<Backend> backend)
    : name_(std::move(name)), backend_(std::move(backend)) {}

Stream::~Stream() = default;

Event Stream::enqueue(std::function<void()> work) {
  return backend_->enqueue(std::move(work));
}

void Stream::wait(const Event& event) {
  backend_->wait(event);
}

Event Stream::record() {
  return backend_->record();
}

void Stream::synchronize() {
  backend_->synchronize();
}

void Stream::set_delay_for_testing(std::chrono::microseconds delay) {
  backend_->set_delay_for_testing(delay);
}

const std::string& Stream::name() const {
  return name_;
}

void* Stream::native_handle() const {
  return backend_->native_handle();
}

}  // namespace zero
