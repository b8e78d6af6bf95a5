// The process grid on NCCL: the same places and splits as the MPI grid (process_grid.cpp), each
// group a NCCL communicator on the GPU the rank's world communicator would use.
#include <utility>

#include "zero/collectives/nccl_communicator.h"
#include "zero/collectives/process_grid.h"

namespace zero {

ProcessGrid make_nccl_process_grid(int tp_size) {
  ProcessGrid host = make_mpi_process_grid(tp_size);
  ProcessGrid grid = make_process_grid(
      tp_size, []() -> std::unique_ptr<Communicator> { return make_nccl_communicator(); },
      [](int color, int key) -> std::unique_ptr<Communicator> {
        return make_nccl_communicator_split(color, key);
      });
  grid.host_tensor_parallel = std::move(host.tensor_parallel);
  grid.host_data_parallel = std::move(host.data_parallel);
  return grid;
}

}  // namespace zero
