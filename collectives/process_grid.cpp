#include "zero/collectives/process_grid.h"

#include <mpi.h>

#include <climits>

#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"

namespace zero {

GridPlace grid_place(int world_rank, int world_size, int tp_size, int pp_size) {
  ZERO_CHECK(tp_size >= 1, "the tensor-parallel size must be at least 1, got " << tp_size);
  ZERO_CHECK(pp_size >= 1, "the pipeline-parallel size must be at least 1, got " << pp_size);
  const long model_parallel = static_cast<long>(tp_size) * pp_size;
  if (pp_size == 1) {
    ZERO_CHECK(tp_size <= world_size, "a tensor-parallel size of "
                                          << tp_size << " needs at least " << tp_size
                                          << " ranks, and the job has " << world_size);
    ZERO_CHECK(world_size % tp_size == 0,
               "the " << world_size << " ranks do not divide into tensor-parallel groups of "
                      << tp_size << " (the world size must be a multiple of the tensor-parallel "
                      << "size)");
  } else {
    ZERO_CHECK(model_parallel <= world_size && world_size % model_parallel == 0,
               "the " << world_size << " ranks do not divide into " << pp_size
                      << " pipeline stages of tensor-parallel groups of " << tp_size
                      << " (the world size must be a multiple of pp x tp = " << model_parallel
                      << ")");
  }
  ZERO_CHECK(world_rank >= 0 && world_rank < world_size,
             "rank " << world_rank << " is outside a world of " << world_size);
  GridPlace place;
  place.tp_size = tp_size;
  place.pp_size = pp_size;
  place.dp_size = static_cast<int>(world_size / model_parallel);
  place.tp_rank = world_rank % tp_size;
  place.dp_rank = (world_rank / tp_size) % place.dp_size;
  place.pp_rank = world_rank / (tp_size * place.dp_size);
  return place;
}

namespace {

// The first world rank of a tensor-parallel group whose ranks do not all share one node, or -1.
// Collective over the world.
int group_across_nodes(const GridPlace& place, int world_rank) {
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm on_node = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, place.pp_rank * place.dp_size + place.dp_rank,
                                place.tp_rank, &group));
  ZERO_MPI_CHECK(
      MPI_Comm_split_type(group, MPI_COMM_TYPE_SHARED, place.tp_rank, MPI_INFO_NULL, &on_node));
  int local = 0;
  ZERO_MPI_CHECK(MPI_Comm_size(on_node, &local));
  ZERO_MPI_CHECK(MPI_Comm_free(&on_node));
  ZERO_MPI_CHECK(MPI_Comm_free(&group));
  // The minimum over the world of each spanning group's first rank (INT_MAX for the others).
  int mine = local == place.tp_size ? INT_MAX : world_rank - place.tp_rank;
  int first = INT_MAX;
  ZERO_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return first == INT_MAX ? -1 : first;
}

}  // namespace

ProcessGrid make_process_grid(int tp_size,
                              const std::function<std::unique_ptr<Communicator>()>& whole,
                              const std::function<std::unique_ptr<Communicator>(int, int)>& split,
                              int pp_size) {
  int rank = 0, size = 1;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  ProcessGrid grid;
  const GridPlace& place = grid.place = grid_place(rank, size, tp_size, pp_size);
  if (tp_size == 1 && pp_size == 1) {
    grid.data_parallel = whole();
    return grid;
  }
  // Every split is collective over the world: every rank makes them in the same order. Colors
  // number the groups: a tensor-parallel group by its (stage, data-parallel rank), a
  // data-parallel group by its (stage, tensor-parallel rank), a pipeline by its place in a stage.
  const int stage_ranks = place.dp_size * tp_size;
  if (tp_size > 1) {
    grid.tensor_parallel = split(place.pp_rank * place.dp_size + place.dp_rank, place.tp_rank);
  }
  grid.data_parallel = split(place.pp_rank * tp_size + place.tp_rank, place.dp_rank);
  if (pp_size > 1) {
    grid.pipeline = split(place.dp_rank * tp_size + place.tp_rank, place.pp_rank);
    // The first and last stages' ranks of one tensor-parallel place tie; a middle stage's rank
    // is a group of its own, which it drops.
    const bool ties = place.pp_rank == 0 || place.pp_rank == pp_size - 1;
    std::unique_ptr<Communicator> tie_group =
        split(ties ? place.tp_rank : tp_size + rank, place.pp_rank * stage_ranks + place.dp_rank);
    if (ties) grid.pipeline_ties = std::move(tie_group);
  }
  ZERO_CHECK(grid.data_parallel->world_size() == place.dp_size,
             "the grid split gave data-parallel groups of " << grid.data_parallel->world_size()
                                                            << " ranks, not " << place.dp_size);
  if (tp_size == 1) return grid;
  ZERO_CHECK(grid.tensor_parallel->world_size() == tp_size &&
                 grid.data_parallel->world_size() == grid.place.dp_size,
             "the grid split gave tensor-parallel groups of "
                 << grid.tensor_parallel->world_size() << " and data-parallel groups of "
                 << grid.data_parallel->world_size() << " ranks, not " << tp_size << " and "
                 << grid.place.dp_size);
  grid.tensor_parallel_group_across_nodes = group_across_nodes(grid.place, rank);
  return grid;
}

ProcessGrid make_mpi_process_grid(int tp_size, int pp_size) {
  return make_process_grid(
      tp_size, []() -> std::unique_ptr<Communicator> { return make_mpi_communicator(); },
      [](int color, int key) -> std::unique_ptr<Communicator> {
        return make_mpi_communicator_split(color, key);
      },
      pp_size);
}

}  // namespace zero
