// Which path the CPU communicator's collectives take (mpi_communicator.cpp): MPI alone, the
// shared-memory window of one node, or hierarchically across nodes. Every rank states what it
// wants (from the caller or ZERO_COLLECTIVES) and all take the smallest any of them can: a rank
// told "mpi" makes the whole job use MPI.
#pragma once

#include <mpi.h>

#include "node_groups.h"
#include "zero/collectives/mpi_communicator.h"

namespace zero::backend {

enum class CpuPath : int { kMpi = 0, kHierarchical = 1, kSharedMemory = 2 };

// Collective over `comm`, whose layout is `groups` (the same on every rank). Throws on every
// rank when any rank asked for a path its layout cannot take (that rank names the reason, the
// others say another rank did) or when ZERO_COLLECTIVES is not a known value, so no rank is left
// waiting for the others.
CpuPath choose_cpu_path(CpuTransport requested, MPI_Comm comm, const NodeGroups& groups);

}  // namespace zero::backend
