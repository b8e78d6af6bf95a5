// The backends' watchdog thread (watchdog.h).
#include "watchdog.h"

#include <algorithm>
#include <utility>

#include "zero/core/check.h"

namespace zero::backend {

Watchdog::Watchdog(std::chrono::milliseconds timeout) : timeout_(timeout) {}

Watchdog::~Watchdog() {
  if (thread_.joinable()) stop();
}

void Watchdog::start(std::function<void()> prepare, Look look) {
  ZERO_CHECK(!thread_.joinable(), "the collective watchdog is already running");
  thread_ = std::thread(
      [this, prepare = std::move(prepare), look = std::move(look)] { run(prepare, look); });
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stop_ = true;
  }
  changed_.notify_one();
  thread_.join();
}

void Watchdog::set_timeout(std::chrono::milliseconds timeout) {
  ZERO_CHECK(timeout.count() > 0,
             "collective timeout must be positive, got " << timeout.count() << " ms");
  {
    std::lock_guard<std::mutex> guard(mutex_);
    timeout_ = std::min(timeout, kLongestTimeout);
  }
  changed_.notify_one();  // a shorter timeout may already have passed
}

void Watchdog::run(const std::function<void()>& prepare, const Look& look) {
  if (prepare) prepare();
  std::unique_lock<std::mutex> guard(mutex_);
  while (!stop_) {
    const Clock::time_point wake = look(Clock::now(), timeout_);
    if (wake == kUntilNotified) {
      changed_.wait(guard);
    } else {
      changed_.wait_until(guard, wake);
    }
  }
}

}  // namespace zero::backend
