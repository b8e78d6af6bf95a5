// The CPU stream: one worker thread running a queue of work items in order, and the events
// that report their completion. Everything that waits (the worker on an empty queue, a host
// thread on an event, the worker on another stream's event) sleeps on a condition variable.
#include "zero/collectives/stream.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace zero {

// Shared between the stream that completes the event and every copy of the Event handle.
struct Event::State {
  std::mutex mutex;
  std::condition_variable completed;
  bool done = false;
  std::exception_ptr error;  // set when the work before the event threw

  void complete(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      error = std::move(e);
    }
    completed.notify_all();
  }
};

Event::Event() : state_(std::make_shared<State>()) {
  state_->done = true;
}

Event::Event(std::shared_ptr<State> state) : state_(std::move(state)) {}

void Event::wait() const {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->completed.wait(lock, [&] { return state_->done; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Event::done() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->done;
}

struct Stream::Impl {
  struct Item {
    std::function<void()> work;
    std::shared_ptr<Event::State> event;
  };

  std::string name;
  std::mutex mutex;  // guards queue, stopping and delay
  std::condition_variable queue_changed;
  std::deque<Item> queue;
  bool stopping = false;
  std::chrono::microseconds delay{0};
  std::thread worker;

  // Touched by the worker thread only: the first error thrown on this stream.
  std::exception_ptr failure;

  void run() {
    for (;;) {
      Item item;
      std::chrono::microseconds item_delay;
      {
        std::unique_lock<std::mutex> lock(mutex);
        queue_changed.wait(lock, [&] { return stopping || !queue.empty(); });
        // Stopping still drains: the destructor promises that enqueued work runs.
        if (queue.empty()) return;
        item = std::move(queue.front());
        queue.pop_front();
        item_delay = delay;
      }
      // A failed stream stays failed: what follows may depend on the work that threw, so it
      // is not run, and its event reports the original error.
      if (!failure) {
        if (item_delay.count() > 0) std::this_thread::sleep_for(item_delay);
        try {
          item.work();
        } catch (...) {
          failure = std::current_exception();
        }
      }
      item.event->complete(failure);
    }
  }
};

Stream::Stream(std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  impl_->worker = std::thread([impl = impl_.get()] { impl->run(); });
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->queue_changed.notify_one();
  impl_->worker.join();
}

Event Stream::enqueue(std::function<void()> work) {
  auto state = std::make_shared<Event::State>();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->queue.push_back({std::move(work), state});
  }
  impl_->queue_changed.notify_one();
  return Event(std::move(state));
}

void Stream::wait(const Event& event) {
  // The marker blocks the worker (sleeping) until the event completes. If the awaited work
  // failed, this stream fails too: its next items would read what that work never produced.
  enqueue([event] { event.wait(); });
}

Event Stream::record() {
  return enqueue([] {});
}

void Stream::synchronize() {
  record().wait();
}

void Stream::set_delay_for_testing(std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->delay = delay;
}

const std::string& Stream::name() const {
  return impl_->name;
}

}  // namespace zero
