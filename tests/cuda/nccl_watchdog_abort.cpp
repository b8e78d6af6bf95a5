// Meant to die: rank 1 never joins rank 0's all_reduce, so rank 0's NCCL watchdog must report
// it in the MPI backend's format and abort the job. Needs a GPU per rank; otherwise it says it
// skips and exits 0 (CTest's SKIP_REGULAR_EXPRESSION).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "cuda_test_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/collectives/nccl_communicator.h"

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  int devices = 0;
  const std::string no_device = zero::testing::why_no_cuda_device();
  if (no_device.empty()) cudaGetDeviceCount(&devices);
  if (devices < mpi.world_size()) {
    if (mpi.world_rank() == 0) {
      std::printf("no CUDA device for every rank: skipping (%d GPUs for %d ranks%s%s)\n", devices,
                  mpi.world_size(), no_device.empty() ? "" : ": ", no_device.c_str());
    }
    return 0;
  }
  auto comm = zero::make_nccl_communicator();
  comm->set_timeout(std::chrono::milliseconds(1500));
  zero::testing::DeviceBuffer buffer(1000 * sizeof(float));
  comm->barrier_sync();  // #1, on every rank
  if (comm->rank() == 0) {
    comm->all_reduce_sync(buffer.data(), buffer.data(), 1000, zero::DType::kFloat32);  // #2
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(60));
  }
  std::fprintf(stderr, "rank %d: the watchdog did not fire\n", comm->rank());
  return 1;
}
