// The kernels' persistent thread pool: every task runs once per call, each task index on the
// same thread every call, idle workers sleep, exceptions reach the caller, concurrent and
// nested calls complete, and destruction joins the workers.
#include "kernels/cpu/thread_pool.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "zero/kernels/cpu_kernels.h"

namespace {

using zero::kernels::detail::ThreadPool;

// Threads of this process, from /proc/self/task.
size_t process_threads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  size_t count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

// CPU seconds a thread has run, by its CPU-time clock.
double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

TEST(ThreadPool, RunsEveryTaskOnceOnTheSameThreadEveryCall) {
  ThreadPool pool;
  constexpr size_t kTasks = 4;
  std::vector<std::thread::id> first_ids(kTasks);
  for (int call = 0; call < 50; ++call) {
    std::vector<int> runs(kTasks, 0);
    std::vector<std::thread::id> ids(kTasks);
    auto task = [&](size_t index) {
      ++runs[index];
      ids[index] = std::this_thread::get_id();
    };
    pool.run(kTasks, task);
    for (size_t i = 0; i < kTasks; ++i) EXPECT_EQ(runs[i], 1) << "task " << i;
    EXPECT_EQ(ids[0], std::this_thread::get_id());
    if (call == 0) first_ids = ids;
    EXPECT_EQ(ids, first_ids) << "call " << call;
    EXPECT_EQ(pool.workers(), kTasks - 1);
  }
  for (size_t i = 1; i < kTasks; ++i) EXPECT_NE(first_ids[i], first_ids[0]);
  EXPECT_NE(first_ids[1], first_ids[2]);
}

TEST(ThreadPool, FewerTasksThanWorkersLeaveTheRestAsleep) {
  ThreadPool pool;
  std::atomic<int> runs{0};
  auto task = [&](size_t) { ++runs; };
  pool.run(5, task);
  for (size_t tasks : {1, 2, 3, 5, 2}) {
    runs = 0;
    pool.run(tasks, task);
    EXPECT_EQ(runs.load(), static_cast<int>(tasks));
  }
  EXPECT_EQ(pool.workers(), 4u);
}

// A spinning worker would burn a core for the whole pause; a sleeping one costs nothing. Only
// the workers' own clocks are read (each task records the clock of the thread it runs on): the
// process's clock would also count other threads, such as a sanitizer's runtime.
TEST(ThreadPool, IdleWorkersSleep) {
  ThreadPool pool;
  constexpr size_t kTasks = 3;
  std::vector<clockid_t> clocks(kTasks);
  auto task = [&](size_t index) { pthread_getcpuclockid(pthread_self(), &clocks[index]); };
  pool.run(kTasks, task);
  auto workers_cpu = [&] {
    double seconds = 0.0;
    for (size_t i = 1; i < kTasks; ++i) seconds += cpu_seconds(clocks[i]);  // task 0: the caller
    return seconds;
  };
  const double before = workers_cpu();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(workers_cpu() - before, 0.05);
}

TEST(ThreadPool, RethrowsTheLowestTaskExceptionAndStaysUsable) {
  ThreadPool pool;
  auto failing = [](size_t index) {
    if (index >= 2) throw std::runtime_error("task " + std::to_string(index));
  };
  try {
    pool.run(4, failing);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "task 2");
  }
  std::atomic<int> runs{0};
  auto counting = [&](size_t) { ++runs; };
  pool.run(4, counting);
  EXPECT_EQ(runs.load(), 4);
}

// A task that calls the pool again, and two threads calling at once, run without waiting for
// each other (the call that finds the pool busy runs its tasks itself).
TEST(ThreadPool, NestedAndConcurrentCallsComplete) {
  ThreadPool pool;
  std::atomic<int> inner_runs{0};
  auto inner = [&](size_t) { ++inner_runs; };
  auto outer = [&](size_t) { pool.run(3, inner); };
  pool.run(2, outer);
  EXPECT_EQ(inner_runs.load(), 6);

  std::atomic<long> total{0};
  auto caller = [&] {
    for (int call = 0; call < 200; ++call) {
      auto task = [&](size_t index) { total += static_cast<long>(index) + 1; };
      pool.run(3, task);
    }
  };
  std::thread other(caller);
  caller();
  other.join();
  EXPECT_EQ(total.load(), 2 * 200 * (1 + 2 + 3));
}

TEST(ThreadPool, DestructionJoinsTheWorkers) {
  size_t before = process_threads();
  ASSERT_GT(before, 0u);
  {
    ThreadPool pool;
    auto task = [](size_t) {};
    pool.run(4, task);
    EXPECT_EQ(process_threads(), before + 3);
  }
  EXPECT_EQ(process_threads(), before);
}

// The kernels themselves start no thread per call: after a first call on 3 threads, the two
// workers stay alive between calls, and further calls of every kind start no other thread.
TEST(ThreadPool, KernelsReuseThePool) {
  namespace k = zero::kernels;
  const size_t n = size_t{1} << 18;
  std::vector<float> master(n, 0.5f), m(n, 0.0f), v(n, 0.0f), grad(n, 0.01f), out(n);
  k::KernelOptions opt;
  opt.threads = 3;
  const zero::AdamWStepConstants c = zero::adamw_step_constants(1e-3f, 0.9, 0.999, 1e-8f, 0.01f, 1);
  k::fused_adamw(master.data(), m.data(), v.data(), grad.data(), zero::DType::kFloat32, 1.0f,
                 nullptr, zero::DType::kFloat32, n, c, opt);
  size_t threads = process_threads();
  EXPECT_GE(threads, 3u);  // this test's thread and two idle workers
  for (int call = 0; call < 20; ++call) {
    k::fused_adamw(master.data(), m.data(), v.data(), grad.data(), zero::DType::kFloat32, 1.0f,
                   nullptr, zero::DType::kFloat32, n, c, opt);
    k::cast(master.data(), zero::DType::kFloat32, out.data(), zero::DType::kFloat32, n, opt);
    k::accumulate(out.data(), grad.data(), n, opt);
    EXPECT_GT(k::sum_squares(out.data(), zero::DType::kFloat32, n, opt), 0.0);
  }
  EXPECT_EQ(process_threads(), threads);
}

}  // namespace
