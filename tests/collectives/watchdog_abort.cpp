// The watchdog, end to end: rank 0 enters an all-reduce that rank 1 never joins. The watchdog
// must print the rank, op, sequence number and size, and abort the whole job; CTest checks the
// message. Run at 2 ranks, with ZERO_COLLECTIVE_TIMEOUT_S set or with --timeout-ms N (set_timeout).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "zero/collectives/mpi_communicator.h"

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  if (mpi.world_size() != 2) {
    std::fprintf(stderr, "watchdog_abort: run with 2 ranks, got %d\n", mpi.world_size());
    return 1;
  }
  auto comm = zero::make_mpi_communicator();
  if (argc == 3 && std::strcmp(argv[1], "--timeout-ms") == 0) {
    comm->set_timeout(std::chrono::milliseconds(std::atoi(argv[2])));
  }
  comm->barrier_sync();  // collective #1, joined by both ranks

  if (mpi.world_rank() == 0) {
    std::vector<float> data(1000, 1.0f);
    // Collective #2: rank 1 never issues it, so it can only end by the watchdog's abort.
    comm->all_reduce_sync(data.data(), data.data(), data.size(), zero::DType::kFloat32);
    std::fprintf(stderr, "watchdog_abort: rank 0's all_reduce returned without rank 1\n");
    return 1;
  }
  // Rank 1 stays alive well past the timeout; rank 0's abort ends it.
  std::this_thread::sleep_for(std::chrono::seconds(30));
  std::fprintf(stderr, "watchdog_abort: the watchdog did not abort the job within 30 s\n");
  return 1;
}
