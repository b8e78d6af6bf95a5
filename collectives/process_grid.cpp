#include "zero/collectives/process_grid.h"

#include <mpi.h>

#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"

namespace zero {

GridPlace grid_place(int world_rank, int world_size, int tp_size) {
  ZERO_CHECK(tp_size >= 1, "the tensor-parallel size must be at least 1, got " << tp_size);
  ZERO_CHECK(tp_size <= world_size, "a tensor-parallel size of "
                                        << tp_size << " needs at least " << tp_size
                                        << " ranks, and the job has " << world_size);
  ZERO_CHECK(world_size % tp_size == 0,
             "the " << world_size << " ranks do not divide into tensor-parallel groups of "
                    << tp_size << " (the world size must be a multiple of the tensor-parallel "
                    << "size)");
  ZERO_CHECK(world_rank >= 0 && world_rank < world_size,
             "rank " << world_rank << " is outside a world of " << world_size);
  GridPlace place;
  place.tp_size = tp_size;
  place.tp_rank = world_rank % tp_size;
  place.dp_size = world_size / tp_size;
  place.dp_rank = world_rank / tp_size;
  return place;
}

ProcessGrid make_mpi_process_grid(int tp_size) {
  int rank = 0, size = 1;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  ProcessGrid grid;
  grid.place = grid_place(rank, size, tp_size);
  if (tp_size == 1) {
    grid.data_parallel = make_mpi_communicator();
    return grid;
  }
  // Both splits are collective over the world: every rank makes them in the same order.
  grid.tensor_parallel = make_mpi_communicator_split(grid.place.dp_rank, grid.place.tp_rank);
  grid.data_parallel = make_mpi_communicator_split(grid.place.tp_rank, grid.place.dp_rank);
  ZERO_CHECK(grid.tensor_parallel->world_size() == tp_size &&
                 grid.data_parallel->world_size() == grid.place.dp_size,
             "the grid split gave tensor-parallel groups of "
                 << grid.tensor_parallel->world_size() << " and data-parallel groups of "
                 << grid.data_parallel->world_size() << " ranks, not " << tp_size << " and "
                 << grid.place.dp_size);
  return grid;
}

}  // namespace zero
