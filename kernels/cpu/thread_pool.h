// The worker threads every CPU kernel splits its range over. Starting a std::thread costs tens
// of microseconds, paid on every call when each call starts its own; the pool starts each
// worker once, on first need, and keeps it asleep on a condition variable between calls (never
// spinning: ranks outnumber cores on the machines we run on, and a spinning worker would take
// a core from another rank).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace zero::kernels::detail {

class ThreadPool {
 public:
  ThreadPool() = default;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  // Wakes the workers, lets them finish, and joins them.
  ~ThreadPool();

  // Calls task(i) once for every i in [0, tasks) and returns when all have returned: task 0 on
  // the calling thread, task i > 0 on worker i - 1, the same worker for the same i on every
  // call (each thread keeps touching the same part of a buffer from one step to the next).
  // When the pool is already running another call (a second thread calling kernels, or a task
  // calling a kernel), this call runs its tasks one after the other on the calling thread
  // instead of waiting. Rethrows the exception of the lowest-numbered task that threw.
  template <typename Task>
  void run(size_t tasks, Task& task) {
    run_erased(
        tasks, [](void* context, size_t index) { (*static_cast<Task*>(context))(index); }, &task);
  }

  // Workers started so far (tests: the count must not grow across calls of the same size).
  size_t workers();

 private:
  using Erased = void (*)(void* context, size_t index);

  void run_erased(size_t tasks, Erased fn, void* context);
  void worker_main(size_t worker);

  // Held for a whole call of run: one call uses the workers at a time.
  std::mutex call_mutex_;
  // Guards everything below.
  std::mutex mutex_;
  std::condition_variable wake_;  // workers wait here for a call or for stop_
  std::condition_variable done_;  // the caller waits here for pending_ to reach 0
  std::vector<std::thread> threads_;
  size_t generation_ = 0;    // incremented per call, so a worker runs each call once
  size_t participants_ = 0;  // workers 0 .. participants_ - 1 take part in this call
  size_t pending_ = 0;       // participants still running
  Erased fn_ = nullptr;
  void* context_ = nullptr;
  std::vector<std::exception_ptr> errors_;  // per task
  bool stop_ = false;
};

// The process's pool, started on first use and joined at exit.
ThreadPool& kernel_thread_pool();

// Runs fn(begin, end) over [0, items) cut into `threads` contiguous chunks, each starting on a
// multiple of `granule` (fewer when the rounding leaves nothing for the last ones), on the
// kernel pool. Each chunk is processed exactly as a single call over those items would be.
template <typename Fn>
void run_chunks_on_pool(size_t items, size_t threads, size_t granule, Fn&& fn) {
  if (threads <= 1) {
    fn(size_t{0}, items);
    return;
  }
  size_t chunk = (items + threads - 1) / threads;
  chunk = (chunk + granule - 1) / granule * granule;
  const size_t chunks = (items + chunk - 1) / chunk;
  auto task = [&](size_t index) {
    const size_t begin = index * chunk;
    fn(begin, std::min(items, begin + chunk));
  };
  kernel_thread_pool().run(chunks, task);
}

}  // namespace zero::kernels::detail
