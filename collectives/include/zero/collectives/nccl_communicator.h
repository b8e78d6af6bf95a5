// The NCCL backend of the Communicator, on device memory. Built only when CUDA and NCCL are
// found (ZERO_HAVE_NCCL). Needs no CUDA or NCCL headers.
//
// Collectives are issued at once on the communicator's CUDA stream (stream(), a CUDA stream:
// cuda_stream.h) and return events that complete on the device. Validation, counters, sequence
// numbers and the timeout report are those of the MPI backend. bf16 and fp16 are reduced by NCCL
// natively: each ring step adds in fp32 and rounds, so above two ranks a sum may round more than
// once (the MPI backend rounds once).
#pragma once

#include <memory>

#include "zero/collectives/communicator.h"

namespace zero {

class NcclCommunicator : public Communicator {
 public:
  // Several collectives as one NCCL group (ncclGroupStart/End): between begin_group() and
  // end_group() collectives are only collected, and end_group() issues them together, which
  // saves launches and lets NCCL run them side by side. Their events complete once the group
  // has run; waiting on one before end_group() is an error. Groups do not nest.
  virtual void begin_group() = 0;
  virtual void end_group() = 0;

  // The CUDA device this rank's collectives run on (also made current by the factory).
  virtual int device() const = 0;
};

// Creates the NCCL communicator over all ranks of MPI_COMM_WORLD (MPI must be initialized: see
// MpiSession). Rank 0 makes the ncclUniqueId and broadcasts it over MPI. The GPU is the rank's
// node-local rank (MPI_Comm_split_type shared) unless `device` >= 0, and becomes the calling
// thread's current device. A collective running longer than the timeout (ZERO_COLLECTIVE_TIMEOUT_S,
// else 300 s; set_timeout) or failing inside NCCL is reported with rank, op, sequence number and
// size, the NCCL communicator is aborted (ncclCommAbort) and so is the job.
std::unique_ptr<NcclCommunicator> make_nccl_communicator(int device = -1);

// The same over the ranks of MPI_COMM_WORLD that pass the same `color` (>= 0), ranked by `key`
// (MPI_Comm_split; the group's rank 0 makes the ncclUniqueId), on the GPU the rank's world
// communicator uses. Collective over the whole world.
std::unique_ptr<NcclCommunicator> make_nccl_communicator_split(int color, int key, int device = -1);

}  // namespace zero
