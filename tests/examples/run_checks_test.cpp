// zero-train's host checks on their own: a GPU run's host threads per rank.
#include <gtest/gtest.h>

#include <thread>

#include "examples/run_checks.h"

namespace zero::examples {
namespace {

// The node's cores are shared out among its ranks, the remainder left over, and no rank gets
// fewer than one, however many share the node.
TEST(HostThreads, EachRankTakesItsShareOfTheCores) {
  EXPECT_EQ(threads_per_rank(16, 1), 16);
  EXPECT_EQ(threads_per_rank(16, 8), 2);
  EXPECT_EQ(threads_per_rank(16, 3), 5);
  EXPECT_EQ(threads_per_rank(2, 4), 1);
  EXPECT_EQ(threads_per_rank(1, 0), 1);
}

// The cores are the ones this process may run on: at least one, never more than the machine's.
TEST(HostThreads, CountsTheCoresThisProcessMayUse) {
  const int alone = host_threads_per_rank(1);
  EXPECT_GE(alone, 1);
  const unsigned machine = std::thread::hardware_concurrency();
  if (machine > 0) {
    EXPECT_LE(alone, static_cast<int>(machine));
  }
  EXPECT_EQ(host_threads_per_rank(alone), 1);
}

}  // namespace
}  // namespace zero::examples
