// Jobs that go wrong on purpose, one per mode, for the fault tests (run_fault_job.sh checks the
// output, the exit code, the time taken and that no rank is left behind):
//
//   --sigstop      rank 1 stops itself (SIGSTOP) after a few collectives: a stalled rank. The
//                  others' watchdog must abort the job.
//   --sigkill      rank 1 kills itself (SIGKILL) after a few collectives: a dead rank. Either
//                  the watchdog or mpirun must end the job.
//   --desync       rank 1 issues all_gather(250 x fp32) where the others issue
//                  all_reduce(1000 x fp32), as collective #3. Run with ZERO_DEBUG=collectives.
//   --desync-api   the same, with the check turned on through set_desync_check(true).
//
// A second argument --shared-buffers puts the buffers in node-shared memory
// (Communicator::allocate_shared), so the faults hit the shared-memory path's direct collectives.
//
// Whatever the mode, the program returning normally is a failure: it prints why and exits 1.
#include <mpi.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"

namespace {

// A few matched collectives on the first 64 elements of `data`, so the flight record has history
// before the fault.
void warm_up(zero::Communicator& comm, float* data, int collectives) {
  for (int i = 0; i < collectives; ++i) {
    comm.all_reduce_sync(data, data, 64, zero::DType::kFloat32);
  }
}

int run(const std::string& mode, zero::Communicator& comm, bool shared_buffers) {
  const int rank = comm.rank();
  // Which path the faults hit (shared memory, hierarchical or MPI), for the tests to check.
  if (rank == 0) std::fprintf(stderr, "fault_job: collectives over %s\n", comm.transport().c_str());
  const size_t count = 1000 * static_cast<size_t>(comm.world_size());
  std::vector<float> private_data(count, 1.0f);
  float* data = private_data.data();
  if (shared_buffers) {
    ZERO_CHECK(comm.reserve_shared(count * sizeof(float)), "no node-shared memory on this path");
    data = static_cast<float*>(comm.allocate_shared(count * sizeof(float)));
    ZERO_CHECK(data != nullptr, "allocate_shared failed");
    std::fill(data, data + count, 1.0f);
    if (rank == 0) std::fprintf(stderr, "fault_job: buffers in node-shared memory\n");
  }
  if (mode == "--sigstop" || mode == "--sigkill") {
    warm_up(comm, data, 4);
    if (shared_buffers && rank == 0) {
      std::fprintf(stderr, "fault_job: %llu of 4 collectives ran straight on them\n",
                   static_cast<unsigned long long>(comm.direct_collectives()));
    }
    if (rank == 1) ZERO_CHECK(raise(mode == "--sigstop" ? SIGSTOP : SIGKILL) == 0, "raise failed");
    // Rank 1 never gets here (stopped or dead): this collective cannot finish.
    comm.all_reduce_sync(data, data, 1000, zero::DType::kFloat32);
    std::fprintf(stderr, "fault_job: rank %d: all_reduce finished without rank 1\n", rank);
    return 1;
  }
  if (mode == "--desync" || mode == "--desync-api") {
    if (mode == "--desync-api") comm.set_desync_check(true);
    if (!comm.desync_check()) {
      std::fprintf(stderr, "fault_job: the desync check is off (set ZERO_DEBUG=collectives)\n");
      return 1;
    }
    comm.barrier_sync();     // #1
    warm_up(comm, data, 1);  // #2
    // #3: rank 1 disagrees. Its buffers are big enough for either op, so without the check
    // MPI would not crash on our memory; it would only mismatch.
    if (rank == 1) {
      comm.all_gather_sync(data, data + 250, 250, zero::DType::kFloat32);
    } else {
      comm.all_reduce_sync(data, data, 1000, zero::DType::kFloat32);
    }
    std::fprintf(stderr, "fault_job: rank %d: the mismatched collective #3 returned\n", rank);
    return 1;
  }
  std::fprintf(stderr,
               "fault_job: unknown mode '%s' (--sigstop, --sigkill, --desync, --desync-api)\n",
               mode.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const bool shared_buffers = argc == 3 && std::strcmp(argv[2], "--shared-buffers") == 0;
  if (argc != 2 && !shared_buffers) {
    std::fprintf(stderr,
                 "usage: fault_job --sigstop|--sigkill|--desync|--desync-api [--shared-buffers]\n");
    return 2;
  }
  zero::MpiSession mpi(&argc, &argv);
  if (mpi.world_size() < 2) {
    std::fprintf(stderr, "fault_job: needs at least 2 ranks, got %d\n", mpi.world_size());
    return 2;
  }
  try {
    auto comm = zero::make_mpi_communicator();
    return run(argv[1], *comm, shared_buffers);
  } catch (const std::exception& e) {
    // A collective failing (a peer died) is one of the accepted endings. Abort rather than
    // return: MPI_Finalize could wait forever for the dead peer.
    std::fprintf(stderr, "fault_job: rank %d: %s\n", mpi.world_rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
