// The rank grid of pipeline x data x tensor parallelism (Megatron's layout). Of N ranks,
// each tp_size consecutive ones form a tensor-parallel group (so a group shares a node and its
// per-layer all-reduces stay on the fast links), the ranks at the same position in every
// tensor-parallel group of one pipeline stage form a data-parallel group, over which ZeRO shards
// that stage's model state, and each pipeline stage is N / pp_size consecutive ranks (so a
// stage's collectives stay on its nodes and only activations cross between stages). World rank
// r is tensor-parallel rank r % tp_size, data-parallel rank (r / tp_size) % dp_size and
// pipeline stage r / (tp_size * dp_size).
#pragma once

#include <functional>
#include <memory>

#include "zero/collectives/communicator.h"

namespace zero {

// Where one rank sits in the grid.
struct GridPlace {
  int tp_size = 1;
  int tp_rank = 0;
  int dp_size = 1;
  int dp_rank = 0;
  int pp_size = 1;
  int pp_rank = 0;  // the pipeline stage
};

// The place of world_rank in a world of world_size ranks split into pp_size pipeline stages of
// tensor-parallel groups of tp_size. Throws zero::Error naming the values when a size is below
// 1, or tp_size x pp_size is above the world or does not divide it.
GridPlace grid_place(int world_rank, int world_size, int tp_size, int pp_size = 1);

// A rank's communicators: one over its tensor-parallel group, one over its data-parallel group.
// With tp_size 1 there is no tensor-parallel communicator (null), and with pp_size 1 too the
// data-parallel one is the whole world, made as the backend's world communicator is made.
struct ProcessGrid {
  GridPlace place;
  std::unique_ptr<Communicator> tensor_parallel;
  std::unique_ptr<Communicator> data_parallel;
  // With pp_size > 1: the pipeline, the ranks at this rank's data- and tensor-parallel place in
  // every stage (rank = stage); and on the first and last stages the tie group, both stages'
  // ranks at this rank's tensor-parallel place (the first stage's first), over which the
  // parameters both hold (the GPT-2's wte) sum their gradients. Null otherwise.
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> pipeline_ties;
  // On NCCL, MPI communicators over the same two groups (host memory), for the host-side
  // exchanges (EngineConfig::host_communicator and host_tensor_parallel); null on MPI, whose
  // communicators above are host ones.
  std::unique_ptr<Communicator> host_tensor_parallel;
  std::unique_ptr<Communicator> host_data_parallel;
  // The world rank of the first rank of a tensor-parallel group that spans several nodes (its
  // all-reduces, two per layer each way, then cross the network), the same on every rank; -1
  // when every group lies within one node (MPI_COMM_TYPE_SHARED), as zerorun --tp places them.
  int tensor_parallel_group_across_nodes = -1;
};

// The grid from a backend's communicator factories: `whole` makes the world's communicator (for
// tp_size 1), `split(color, key)` one over the ranks of the same color, ordered by key. Checks
// the groups' sizes and finds a tensor-parallel group across nodes. Collective over the world.
ProcessGrid make_process_grid(int tp_size,
                              const std::function<std::unique_ptr<Communicator>()>& whole,
                              const std::function<std::unique_ptr<Communicator>(int, int)>& split,
                              int pp_size = 1);

// The grid on the MPI backend (host memory): communicators split from MPI_COMM_WORLD
// (MPI_Comm_split). Collective over the whole world: every rank calls it with the same sizes.
ProcessGrid make_mpi_process_grid(int tp_size, int pp_size = 1);

// The grid on NCCL (device memory): one NCCL communicator per group, each on the GPU the rank's
// world communicator would use (make_nccl_communicator_split), and the MPI grid's
// communicators beside them as host_tensor_parallel and host_data_parallel. Builds with NCCL
// only.
ProcessGrid make_nccl_process_grid(int tp_size);

}  // namespace zero
