// The process grid on NCCL: the same places and splits as the MPI grid (process_grid.cpp), each
// group a NCCL communicator on the GPU the rank's world communicator would use.
#include "zero/collectives/nccl_communicator.h"
#include "zero/collectives/process_grid.h"

namespace zero {

ProcessGrid make_nccl_process_grid(int tp_size) {
  return make_process_grid(
      tp_size, []() -> std::unique_ptr<Communicator> { return make_nccl_communicator(); },
      [](int color, int key) -> std::unique_ptr<Communicator> {
        return make_nccl_communicator_split(color, key);
      });
}

}  // namespace zero
