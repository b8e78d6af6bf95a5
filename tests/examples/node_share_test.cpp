// zero-train's division of a node's cores among its ranks through MPI: the masks of the node's
// ranks are gathered and each rank takes its share (run_checks.h's node_share).
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>

#include "examples/run_checks.h"

namespace zero::examples {
namespace {

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// Every rank claiming one 32-core mask divides it (these tests run on one node), where each
// taking all of it would start 32 threads per rank.
TEST(NodeShare, RanksSharingAMaskDivideIt) {
  CoreSet socket(32);
  std::iota(socket.begin(), socket.end(), 0);
  const NodeShare share = node_share(socket);
  EXPECT_EQ(share.ranks, world_size());
  EXPECT_EQ(share.host_threads, 32 / world_size());
}

// Masks apart: each rank keeps its own 4 cores, whatever the others hold.
TEST(NodeShare, RanksBoundApartKeepTheirCores) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CoreSet own(4);
  std::iota(own.begin(), own.end(), 4 * rank);
  EXPECT_EQ(node_share(own).host_threads, 4);
}

// The real masks (under taskset, the one every rank inherits): all ranks' threads together
// take no more than the cores of the mask, unless every rank has its minimum of one.
TEST(NodeShare, RealMasksAreNotOversubscribed) {
  const CoreSet mine = this_process_cores();
  const NodeShare share = node_share(mine);
  EXPECT_GE(share.host_threads, 1);
  int total = 0;
  MPI_Allreduce(&share.host_threads, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_LE(total, std::max(static_cast<int>(mine.size()), share.ranks));
}

}  // namespace
}  // namespace zero::examples
