#include "thread_pool.h"

namespace zero::kernels::detail {

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

size_t ThreadPool::workers() {
  std::lock_guard<std::mutex> lock(mutex_);
  return threads_.size();
}

void ThreadPool::run_erased(size_t tasks, Erased fn, void* context) {
  std::unique_lock<std::mutex> call(call_mutex_, std::try_to_lock);
  if (tasks <= 1 || !call.owns_lock()) {
    for (size_t index = 0; index < tasks; ++index) fn(context, index);
    return;
  }
  const size_t participants = tasks - 1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (threads_.size() < participants) {
      threads_.emplace_back(&ThreadPool::worker_main, this, threads_.size());
    }
    fn_ = fn;
    context_ = context;
    participants_ = participants;
    pending_ = participants;
    errors_.assign(tasks, nullptr);
    ++generation_;
  }
  wake_.notify_all();
  try {
    fn(context, 0);
  } catch (...) {
    errors_[0] = std::current_exception();  // the workers write only errors_[1..]
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return pending_ == 0; });
  for (std::exception_ptr& error : errors_) {
    if (error) std::rethrow_exception(error);
  }
}

void ThreadPool::worker_main(size_t worker) {
  size_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || (generation_ != seen && worker < participants_); });
    if (stop_) return;
    seen = generation_;
    Erased fn = fn_;
    void* context = context_;
    lock.unlock();
    std::exception_ptr error;
    try {
      fn(context, worker + 1);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    errors_[worker + 1] = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

ThreadPool& kernel_thread_pool() {
  static ThreadPool pool;
  return pool;
}

}  // namespace zero::kernels::detail
