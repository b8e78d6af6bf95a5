// zero-train's agreement on which ranks failed a start-up step (run_checks.h's failed_ranks):
// every rank gets the same ranks, in rank order, whichever of them failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "examples/run_checks.h"

namespace zero::examples {
namespace {

TEST(FailedRanks, EveryRankGetsTheSameRanksInOrder) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> every(static_cast<size_t>(size));
  std::vector<int> odd;
  for (int r = 0; r < size; ++r) {
    every[static_cast<size_t>(r)] = r;
    if (r % 2 == 1) odd.push_back(r);
  }
  EXPECT_EQ(failed_ranks(false), std::vector<int>{});
  EXPECT_EQ(failed_ranks(true), every);
  EXPECT_EQ(failed_ranks(rank % 2 == 1), odd);
  EXPECT_EQ(failed_ranks(rank == size - 1), std::vector<int>{size - 1});
}

}  // namespace
}  // namespace zero::examples
