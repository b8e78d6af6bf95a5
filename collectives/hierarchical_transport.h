// The path of the CPU communicator for jobs that span nodes with the same number of
// consecutive ranks on each (node_groups.h): shared memory inside a node (shm_transport.h), MPI
// across nodes among the ranks with the same place on their node, so that only what a node
// cannot compute alone crosses the network.
//
// With L ranks per node and M nodes, world rank r = m * L + l owns chunk r of a buffer, as on
// the flat path:
//   reduce-scatter: for each node m', the node's ranks reduce-scatter chunks m' * L .. m' * L +
//     L - 1 over shared memory, so local rank l holds its node's partial sum of chunk
//     m' * L + l for every m' (fp32, unrounded); across nodes, an all-to-all among the ranks of
//     local index l hands each node's partials of chunk m * L + l to node m, which adds them in
//     node order and rounds once.
//   all-gather: across nodes, the ranks of local index l all-gather their chunks straight into
//     their places m' * L + l; then, for each m', the node all-gathers chunks m' * L .. m' * L +
//     L - 1 over shared memory.
//   all-reduce: the node reduce-scatters the buffer into L blocks (fp32 partials), the ranks of
//     local index l all-reduce their block across nodes (all-to-all, sum in node order,
//     all-gather), and the node all-gathers the rounded blocks.
// Every sum adds a node's ranks in rank order, then the nodes in node order, in fp32, and
// rounds once: results never depend on timing. What crosses the network per rank is its
// node's partial sums (fp32) or its own chunk, never the other ranks' of its node.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "node_groups.h"
#include "shm_transport.h"
#include "zero/collectives/collective_table.h"
#include "zero/core/dtype.h"

namespace zero::backend {

class HierarchicalTransport {
 public:
  // Collective over `comm`, whose layout `groups` must be regular. MPI calls across nodes
  // carry at most `max_elements_per_call` elements (bytes for all_gather) each.
  HierarchicalTransport(MPI_Comm comm, const NodeGroups& groups, size_t max_elements_per_call);
  // Collective too (the node's shared window is freed with MPI_Win_free), and frees the two
  // groups; skipped once MPI is finalized.
  ~HierarchicalTransport();
  HierarchicalTransport(const HierarchicalTransport&) = delete;
  HierarchicalTransport& operator=(const HierarchicalTransport&) = delete;

  // The Communicator's operations, with its conventions (in place allowed as it describes).
  // Called by one thread at a time, in the same order on every rank. The reductions keep
  // their fp32 partial sums in `staging`, staging_bytes(op, count) long.
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, float* staging);
  void all_gather(const void* send, void* recv, size_t bytes_per_rank);
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, float* staging);

  // Bytes of fp32 staging one reduction of `count` elements needs (of any dtype: the partial
  // sums are fp32), the same on every rank: a node's partials and the other nodes' (2 x M x
  // count for a reduce-scatter, 2 x M pieces of the largest node block for an all-reduce).
  size_t staging_bytes(CollectiveOp op, size_t count) const;

 private:
  // Across nodes: node m receives block m (`block` floats) of every node's `send`, into
  // recv + k * block from node k.
  void exchange_blocks(const float* send, float* recv, size_t block);
  // Across nodes, in place: every node's `block` floats at data + m * block reach every node.
  void gather_blocks(float* data, size_t block);
  // Adds the M blocks of `received` in node order into `sum` (fp32, may be a source).
  void sum_nodes(float* sum, const float* received, size_t block);
  // An all-reduce of `count` elements: the largest piece of a node block that one node sums,
  // and (out) the length of the node blocks but the last.
  size_t all_reduce_piece(size_t count, size_t* aligned) const;

  int nodes_ = 1;
  int per_node_ = 1;
  int node_index_ = 0;
  int local_index_ = 0;
  size_t max_per_call_;
  MPI_Comm node_ = MPI_COMM_NULL;    // this rank's node, ranked by communicator rank
  MPI_Comm across_ = MPI_COMM_NULL;  // the ranks of this local index, ranked by node
  std::unique_ptr<SharedMemoryTransport> in_node_;
  std::vector<size_t> bounds_;
  std::vector<const void*> sources_;
};

}  // namespace zero::backend
