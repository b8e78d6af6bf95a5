// The node layout of a communicator (node_groups.h).
#include "node_groups.h"

#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"

namespace zero::backend {
namespace {

// ZERO_NODE_SIZE as a positive count, or 0 when unset or empty.
long declared_node_size() {
  const char* text = std::getenv("ZERO_NODE_SIZE");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long k = std::strtol(text, &end, 10);
  ZERO_CHECK(*end == '\0' && k >= 1,
             "ZERO_NODE_SIZE must be a positive number of ranks per node, got '" << text << "'");
  return k;
}

// A node's name that every rank computes alike: the lowest world rank on it.
int64_t real_node_key(MPI_Comm comm, int world_rank) {
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
  int lowest = world_rank;
  const int status = MPI_Allreduce(&world_rank, &lowest, 1, MPI_INT, MPI_MIN, node);
  const int freed = MPI_Comm_free(&node);
  ZERO_MPI_CHECK(status);
  ZERO_MPI_CHECK(freed);
  return lowest;
}

}  // namespace

NodeGroups find_node_groups(MPI_Comm comm) {
  int rank = 0, size = 1, world_rank = 0, world_size = 1;
  ZERO_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  ZERO_MPI_CHECK(MPI_Comm_size(comm, &size));
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  const long declared = declared_node_size();
  ZERO_CHECK(declared == 0 || world_size % declared == 0,
             "ZERO_NODE_SIZE=" << declared << " does not divide the " << world_size
                               << " ranks into whole nodes");

  // Per rank: its real node and the node it counts as (the declared one, else the real one).
  const int64_t real = real_node_key(comm, world_rank);
  const int64_t mine[2] = {real, declared ? world_rank / declared : real};
  std::vector<int64_t> keys(2 * static_cast<size_t>(size));
  ZERO_MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT64_T, keys.data(), 2, MPI_INT64_T, comm));
  auto real_of = [&](int r) { return keys[2 * static_cast<size_t>(r)]; };
  auto node_of = [&](int r) { return keys[2 * static_cast<size_t>(r) + 1]; };

  NodeGroups groups;
  groups.declared = declared != 0;
  // The ranks of a node are one run of equal keys; a key seen in an earlier run is a node
  // whose ranks are not consecutive.
  std::set<int64_t> finished;
  int run_start = 0, run_length = 0, nodes = 0;
  auto close_run = [&](int end) {
    const int length = end - run_start;
    if (run_length == 0) run_length = length;
    if (length != run_length && groups.irregular.empty()) {
      groups.irregular = "nodes hold different numbers of ranks (rank 0's node " +
                         std::to_string(run_length) + ", rank " + std::to_string(run_start) +
                         "'s " + std::to_string(length) + ")";
    }
    finished.insert(node_of(run_start));
    ++nodes;
  };
  for (int r = 0; r < size; ++r) {
    if (r > 0 && node_of(r) != node_of(r - 1)) {
      close_run(r);
      run_start = r;
      if (finished.count(node_of(r)) != 0 && groups.irregular.empty()) {
        groups.irregular = "the ranks of a node are not consecutive (rank " + std::to_string(r) +
                           " is on the node of an earlier rank, after ranks of another node)";
      }
    }
    ZERO_CHECK(!groups.declared || real_of(r) == real_of(run_start),
               "ZERO_NODE_SIZE=" << declared << " declares a node across two machines (ranks "
                                 << run_start << " and " << r << " share no memory)");
  }
  close_run(size);
  groups.nodes = nodes;
  if (groups.regular()) {
    groups.ranks_per_node = run_length;
    groups.node_index = rank / run_length;
    groups.local_index = rank % run_length;
  }
  return groups;
}

}  // namespace zero::backend
