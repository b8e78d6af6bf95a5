// The watchdog of a Communicator backend: a thread that looks at the collectives in flight
// whenever it wakes, and the timeout it holds them to. What it looks at and what it does about a
// late collective are the backend's (its `look` function); the thread, its lock, its wake-ups,
// the timeout and the stop are here, so every backend drives them alike.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace zero::backend {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kDefaultTimeout{300 * 1000};
// Longer timeouts are cut to this (about 31 years), so deadlines never overflow the clock.
constexpr std::chrono::milliseconds kLongestTimeout{1000LL * 1000 * 1000 * 1000};

class Watchdog {
 public:
  // Called on the watchdog thread with the lock held, at every wake-up: looks at what is in
  // flight (state the backend shares with it under lock()), ends the job if something has run
  // past `timeout`, and returns when to look next; kUntilNotified sleeps until notify().
  using Look =
      std::function<Clock::time_point(Clock::time_point now, std::chrono::milliseconds timeout)>;
  static constexpr Clock::time_point kUntilNotified = Clock::time_point::max();

  explicit Watchdog(std::chrono::milliseconds timeout);
  // Stops the thread if the owner has not (stop() is the owner's to call, before it destroys
  // what `look` reads).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts the thread: `prepare` once on it (e.g. to pick a CUDA device), then the loop of
  // `look`. Once per watchdog.
  void start(std::function<void()> prepare, Look look);
  // Ends the loop and joins the thread.
  void stop();

  // Positive; longer than kLongestTimeout is cut to it. Wakes the thread: a shorter timeout may
  // already have passed.
  void set_timeout(std::chrono::milliseconds timeout);

  // The lock that guards what the backend shares with `look`.
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }
  // Wakes the thread to look again (e.g. after the first collective of an idle spell).
  void notify() { changed_.notify_one(); }

 private:
  void run(const std::function<void()>& prepare, const Look& look);

  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;                  // under mutex_
  std::chrono::milliseconds timeout_;  // under mutex_
  std::thread thread_;
};

}  // namespace zero::backend
