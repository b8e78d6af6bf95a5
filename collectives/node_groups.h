// Which ranks of a communicator share a node, and whether they form the regular layout the
// hierarchical collectives need: every node holds the same number L of ranks, and they are
// consecutive in the communicator's rank order (rank r on node r / L, as mpirun and zerorun
// place ranks by slot).
//
// Testing aid: ZERO_NODE_SIZE=k declares nodes of k consecutive world ranks inside the real
// ones, so the hierarchical path runs on one machine without a cluster. Each declared node must
// lie inside one real node (its ranks share memory); k must divide the world size.
#pragma once

#include <mpi.h>

#include <string>

namespace zero::backend {

struct NodeGroups {
  int nodes = 1;           // nodes the communicator's ranks span
  int ranks_per_node = 1;  // when regular
  int node_index = 0;      // this rank's node, 0..nodes-1, when regular
  int local_index = 0;     // this rank's place on its node, when regular
  bool declared = false;   // the nodes come from ZERO_NODE_SIZE
  // Empty when the layout is regular; else why not, naming the ranks.
  std::string irregular;

  bool regular() const { return irregular.empty(); }
};

// Collective over `comm`: every rank learns the same layout. Throws when ZERO_NODE_SIZE is set
// but not a positive integer, does not divide the world, or splits a declared node across real
// ones.
NodeGroups find_node_groups(MPI_Comm comm);

}  // namespace zero::backend
