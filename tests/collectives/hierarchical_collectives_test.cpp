// The hierarchical path of the CPU communicator (collectives/hierarchical_transport.h) on one
// machine, its nodes declared by ZERO_NODE_SIZE (the test is registered with it set): results
// against a reference that adds each node's ranks in rank order, then the nodes in node order,
// in fp32, rounded once, bit for bit, for every op and dtype, in place or not, at odd sizes,
// sizes not divisible by the ranks and sizes spanning several shared-memory chunks, with MPI
// calls whole or split into pieces; each chunk in its world-rank place, as on the flat path.
// And how the path is chosen: by itself for even, consecutive nodes, MPI for others.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tests/collectives/collective_inputs.h"
#include "tests/expect_error.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"

namespace zero {
namespace {

using testing::Bytes;
using testing::contribution;

// Ranks per declared node: ZERO_NODE_SIZE, which the test's registration sets.
int node_size() {
  const char* text = std::getenv("ZERO_NODE_SIZE");
  ZERO_CHECK(text != nullptr, "this test runs with ZERO_NODE_SIZE set (see its CMakeLists)");
  return std::atoi(text);
}

// Elements [first, first + n) summed as the hierarchy promises: each node's ranks in rank
// order in fp32, then the nodes' sums in node order, rounded once to dtype.
Bytes reference_sum(int ranks, int per_node, size_t first, size_t n, DType dtype) {
  std::vector<Bytes> all;
  for (int r = 0; r < ranks; ++r) all.push_back(contribution(r, first, n, dtype));
  Bytes out(n * dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) {
    float total = 0.0f;
    for (int node = 0; node < ranks / per_node; ++node) {
      const int lead = node * per_node;
      float partial = load_as_float(all[static_cast<size_t>(lead)].data(), dtype, i);
      for (int r = lead + 1; r < lead + per_node; ++r) {
        partial += load_as_float(all[static_cast<size_t>(r)].data(), dtype, i);
      }
      total = node == 0 ? partial : total + partial;
    }
    store_from_float(out.data(), dtype, i, total);
  }
  return out;
}

// Odd sizes, sizes below and above the ranks, and past one shared-memory chunk (a 256 KiB slot
// holds 32768 fp32 elements of each of 2 ranks' reduce-scatter blocks).
const size_t kCounts[] = {1, 3, 7, 65, 1001, 70001};

struct Case {
  DType dtype;
  size_t max_elements_per_call;  // INT_MAX: whole MPI calls; 1000: split into pieces
};

class HierarchicalTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    dtype = GetParam().dtype;
    comm = make_mpi_communicator(GetParam().max_elements_per_call, CpuTransport::kHierarchical);
    rank = comm->rank();
    n = comm->world_size();
    per_node = node_size();
  }
  size_t elem() const { return dtype_size(dtype); }

  DType dtype = DType::kFloat32;
  std::unique_ptr<Communicator> comm;
  int rank = 0;
  int n = 1;
  int per_node = 1;
};

TEST_P(HierarchicalTest, NamesItsShape) {
  EXPECT_EQ(comm->transport(), "hierarchical (" + std::to_string(n / per_node) + " nodes x " +
                                   std::to_string(per_node) + " ranks)");
}

TEST_P(HierarchicalTest, ReduceScatterAddsNodesInOrder) {
  for (size_t count : kCounts) {
    testing::expect_exact_reduce_scatter(*comm, count, dtype,
                                         reference_sum(n, per_node, rank * count, count, dtype));
  }
}

TEST_P(HierarchicalTest, AllReduceAddsNodesInOrder) {
  for (size_t count : kCounts) {
    testing::expect_exact_all_reduce(*comm, count, dtype,
                                     reference_sum(n, per_node, 0, count, dtype));
  }
}

TEST_P(HierarchicalTest, AllGatherPutsEveryChunkInWorldRankOrder) {
  for (size_t count : kCounts) {
    const Bytes expected = testing::expect_exact_all_gather(*comm, count, dtype);
    const Bytes send = contribution(rank, 0, count, dtype);
    Bytes as_bytes(count * n * elem());
    comm->all_gather_bytes_sync(send.data(), as_bytes.data(), send.size());
    EXPECT_TRUE(as_bytes == expected) << "bytes, count " << count;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, HierarchicalTest,
                         ::testing::Values(Case{DType::kFloat32, INT_MAX},
                                           Case{DType::kBFloat16, INT_MAX},
                                           Case{DType::kFloat16, INT_MAX},
                                           Case{DType::kFloat32, 1000},
                                           Case{DType::kBFloat16, 1000}),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           return std::string(dtype_name(param.param.dtype)) +
                                  (param.param.max_elements_per_call == INT_MAX ? "" : "_split");
                         });

// Sets an environment variable for one scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// With declared nodes of equal, consecutive ranks, auto picks the hierarchy; "mpi" still means
// MPI alone; a node size that does not divide the world is an error naming it.
TEST(HierarchicalChoice, FollowsTheLayoutAndTheEnvironment) {
  const int world = make_mpi_communicator(INT_MAX, CpuTransport::kMpi)->world_size();
  const int per_node = node_size();
  {
    ScopedEnv auto_mode("ZERO_COLLECTIVES", "auto");
    const std::string expected = world == per_node
                                     ? "shm"
                                     : "hierarchical (" + std::to_string(world / per_node) +
                                           " nodes x " + std::to_string(per_node) + " ranks)";
    EXPECT_EQ(make_mpi_communicator()->transport(), expected);
  }
  {
    ScopedEnv mpi_mode("ZERO_COLLECTIVES", "mpi");
    EXPECT_EQ(make_mpi_communicator()->transport(), "mpi");
  }
  if (world > 1) {
    const std::string too_big = std::to_string(world + 1);
    ScopedEnv size("ZERO_NODE_SIZE", too_big.c_str());
    testing::expect_error_naming([] { make_mpi_communicator(); },
                                 "ZERO_NODE_SIZE=" + too_big + " does not divide");
  }
}

// Nodes whose ranks are interleaved in the communicator's order (world ranks 0, 2, 1, 3 with
// nodes {0, 1} and {2, 3}), or of unequal sizes (world ranks 0-2), fall back to MPI in auto mode
// and are refused, with the reason, when the hierarchy is insisted on. 4 ranks, 2 per node.
TEST(HierarchicalChoice, IrregularNodesFallBackToMpi) {
  const int world = make_mpi_communicator(INT_MAX, CpuTransport::kMpi)->world_size();
  if (world != 4 || node_size() != 2) GTEST_SKIP() << "needs 4 ranks in 2 nodes of 2";
  const int rank = make_mpi_communicator(INT_MAX, CpuTransport::kMpi)->rank();
  const int interleaved = (rank % 2) * 2 + rank / 2;
  {
    ScopedEnv auto_mode("ZERO_COLLECTIVES", "auto");
    EXPECT_EQ(make_mpi_communicator_split(0, interleaved)->transport(), "mpi");
    EXPECT_EQ(make_mpi_communicator_split(rank < 3 ? 0 : 1, rank)->transport(),
              rank < 3 ? "mpi" : "shm");
  }
  ScopedEnv insist("ZERO_COLLECTIVES", "hierarchical");
  testing::expect_error_naming([&] { make_mpi_communicator_split(0, interleaved); },
                               "the ranks of a node are not consecutive");
  // Only ranks 0-2 would see uneven nodes; rank 3 alone is one node of 1, which is regular, so
  // every rank calls the split (it is collective over the world) and checks its own outcome.
  if (rank < 3) {
    testing::expect_error_naming([&] { make_mpi_communicator_split(0, rank); },
                                 "nodes hold different numbers of ranks");
  } else {
    EXPECT_EQ(make_mpi_communicator_split(1, rank)->transport(),
              "hierarchical (1 nodes x 1 ranks)");
  }
}

// A rank whose ZERO_COLLECTIVES asks for a path its layout cannot take stops every rank, each
// with a message, instead of leaving the others waiting in the agreement: rank 0 insists on the
// one-node shared memory while the job declares 2 nodes.
TEST(HierarchicalChoice, ARankThatCannotHaveItsPathStopsEveryRank) {
  const int world = make_mpi_communicator(INT_MAX, CpuTransport::kMpi)->world_size();
  if (world != 4 || node_size() != 2) GTEST_SKIP() << "needs 4 ranks in 2 nodes of 2";
  const int rank = make_mpi_communicator(INT_MAX, CpuTransport::kMpi)->rank();
  ScopedEnv mode("ZERO_COLLECTIVES", rank == 0 ? "shm" : "auto");
  testing::expect_error_naming(
      [] { make_mpi_communicator(); },
      rank == 0 ? "needs every rank on one node" : "another rank cannot use the collectives");
}

}  // namespace
}  // namespace zero
