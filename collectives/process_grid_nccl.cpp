// The process grid on NCCL: the same places and splits as the MPI grid (process_grid.cpp).
#include <mpi.h>

#include "zero/collectives/mpi_check.h"
#include "zero/collectives/nccl_communicator.h"
#include "zero/collectives/process_grid.h"
#include "zero/core/check.h"

namespace zero {

ProcessGrid make_nccl_process_grid(int tp_size) {
  int rank = 0, size = 1;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  ProcessGrid grid;
  grid.place = grid_place(rank, size, tp_size);
  if (tp_size == 1) {
    grid.data_parallel = make_nccl_communicator();
    return grid;
  }
  grid.tensor_parallel = make_nccl_communicator_split(grid.place.dp_rank, grid.place.tp_rank);
  grid.data_parallel = make_nccl_communicator_split(grid.place.tp_rank, grid.place.dp_rank);
  return grid;
}

}  // namespace zero
