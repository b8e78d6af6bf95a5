// The MPI backend of the Communicator, on host memory, and the process's MPI session.
#pragma once

#include <climits>

#include <cstddef>
#include <memory>

#include "zero/collectives/communicator.h"

namespace zero {

// Initializes MPI (MPI_THREAD_MULTIPLE: the communication stream's worker calls MPI while the
// watchdog may abort) and finalizes it on destruction. One per process, created first in main.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const;
  int world_size() const;
  // Rank among the ranks on this node (MPI_Comm_split_type shared): picks the local GPU.
  int local_rank() const;

 private:
  bool owns_mpi_ = false;  // false when MPI was initialized before us: then we never finalize
  int world_rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
};

// Bytes of fp32 staging memory one collective of this backend needs (Communicator::
// staging_bytes of an MPI communicator with that world size and per-call limit): 16-bit
// reductions are summed in fp32, and an fp32 reduce-scatter stages its result when in place.
// A pure function, so a memory plan made without MPI agrees with what a run allocates.
size_t mpi_staging_bytes(CollectiveOp op, size_t count, DType dtype, int world_size,
                         size_t max_elements_per_call = static_cast<size_t>(INT_MAX));

// How the CPU communicator moves reduce-scatter, all-gather and all-reduce between its ranks
// (broadcast, barrier and the desync check always go through MPI).
enum class CpuTransport {
  // ZERO_COLLECTIVES in the environment: "mpi", "shm" or "hierarchical" as below; unset, empty
  // or "auto": shared memory when every rank is on one node; hierarchical when the job spans
  // nodes that each hold the same number of consecutive ranks; else MPI.
  kFromEnvironment,
  kMpi,           // MPI calls only: comparisons, and jobs whose nodes are uneven
  kSharedMemory,  // an MPI-3 shared window (shm_transport.h); an error unless on one node
  // Shared memory inside each node, MPI across nodes (hierarchical_transport.h); an error
  // unless every node holds the same number of consecutive ranks. ZERO_NODE_SIZE=k (a testing
  // aid) declares nodes of k consecutive world ranks inside one machine.
  kHierarchical,
};

// Creates the MPI communicator over MPI_COMM_WORLD (duplicated, so our traffic never matches a
// user's). Timeout from the environment ZERO_COLLECTIVE_TIMEOUT_S when set, else 300 s.
// Collective: every rank creates it together (it may allocate a shared window). Its
// transport() is "mpi", "shm" or "hierarchical (M nodes x L ranks)".
std::unique_ptr<Communicator> make_mpi_communicator();

// Same, with every MPI call limited to `max_elements_per_call` elements (1 to INT_MAX; the
// default is INT_MAX, the most an MPI count can hold): longer collectives are split into
// pieces. Tests pass a small limit to exercise the split path without gigabyte buffers. The
// shared-memory path has no such limit (it works in chunks of its own).
std::unique_ptr<Communicator> make_mpi_communicator(
    size_t max_elements_per_call, CpuTransport transport = CpuTransport::kFromEnvironment);

// Creates an MPI communicator over the ranks of MPI_COMM_WORLD that pass the same `color`
// (>= 0), ranked by `key` (MPI_Comm_split), with its own stream, watchdog and, when its ranks
// share a node, shared-memory window. Hybrid sharding runs one over each shard group and one
// over each replica group. Collective over the whole world: every rank calls it together.
std::unique_ptr<Communicator> make_mpi_communicator_split(int color, int key);

// Ranks of `comm` (an MPI communicator of this file) on each node when every node holds the same
// number of consecutive ones (node_groups.h; ZERO_NODE_SIZE declares nodes for tests), else 0:
// the layout ZeRO++'s hierarchical gradient reduction splits into. 0 for another backend.
int ranks_per_node(const Communicator& comm);

// This process's rank in MPI_COMM_WORLD (MPI must be initialized): what names a rank across the
// communicators split from the world.
int mpi_world_rank();

}  // namespace zero
