// zero-train's host checks on their own: a GPU run's host threads per rank.
#include <gtest/gtest.h>

#include <thread>

#include "examples/run_checks.h"

namespace zero::examples {
namespace {

// Unbound, the node's online cores are shared out among its ranks, the remainder left over,
// and no rank gets fewer than one, however many share the node.
TEST(HostThreads, AnUnboundRankTakesItsShareOfTheCores) {
  EXPECT_EQ(threads_per_rank(16, 16, 1), 16);
  EXPECT_EQ(threads_per_rank(16, 16, 8), 2);
  EXPECT_EQ(threads_per_rank(16, 16, 3), 5);
  EXPECT_EQ(threads_per_rank(2, 2, 4), 1);
  EXPECT_EQ(threads_per_rank(1, 1, 0), 1);
  EXPECT_EQ(threads_per_rank(0, 16, 4), 4) << "an unreadable mask counts as unbound";
}

// A rank a launcher bound to some cores (mpirun --bind-to core or socket) has its share in
// its mask already: it takes all of them, not a share of them.
TEST(HostThreads, ABoundRankTakesTheCoresItWasGiven) {
  EXPECT_EQ(threads_per_rank(1, 16, 8), 1);
  EXPECT_EQ(threads_per_rank(8, 16, 2), 8);
  EXPECT_EQ(threads_per_rank(4, 16, 8), 4);
}

// Read from this process: at least one, never more than the machine's.
TEST(HostThreads, CountsTheCoresThisProcessMayUse) {
  const int alone = host_threads_per_rank(1);
  EXPECT_GE(alone, 1);
  const unsigned machine = std::thread::hardware_concurrency();
  if (machine > 0) {
    EXPECT_LE(alone, static_cast<int>(machine));
  }
}

}  // namespace
}  // namespace zero::examples
