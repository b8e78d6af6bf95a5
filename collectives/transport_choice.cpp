#include "transport_choice.h"

#include <cstdlib>
#include <string>

#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"

namespace zero::backend {
namespace {

// ZERO_COLLECTIVES as a request, or the reason it is none.
CpuTransport transport_from_environment(std::string* problem) {
  const char* text = std::getenv("ZERO_COLLECTIVES");
  const std::string value = text == nullptr ? "" : text;
  if (value.empty() || value == "auto") return CpuTransport::kFromEnvironment;
  if (value == "mpi") return CpuTransport::kMpi;
  if (value == "shm") return CpuTransport::kSharedMemory;
  if (value == "hierarchical") return CpuTransport::kHierarchical;
  *problem = "ZERO_COLLECTIVES must be auto, mpi, shm or hierarchical, got '" + value + "'";
  return CpuTransport::kMpi;
}

// What this rank wants on `groups`, or (in `problem`) why it cannot have what it asked for.
CpuPath wanted_path(CpuTransport requested, const NodeGroups& groups, std::string* problem) {
  if (requested == CpuTransport::kFromEnvironment) {
    requested = transport_from_environment(problem);
  }
  switch (requested) {
    case CpuTransport::kMpi:
      return CpuPath::kMpi;
    case CpuTransport::kSharedMemory:
      if (groups.nodes == 1 && !groups.declared) return CpuPath::kSharedMemory;
      *problem =
          "the shared-memory transport (ZERO_COLLECTIVES=shm) needs every rank on one "
          "node; this job spans " +
          std::to_string(groups.nodes) + (groups.declared ? " declared (ZERO_NODE_SIZE)" : "") +
          " nodes";
      return CpuPath::kMpi;
    case CpuTransport::kHierarchical:
      if (groups.regular()) return CpuPath::kHierarchical;
      *problem =
          "the hierarchical collectives (ZERO_COLLECTIVES=hierarchical) need the same "
          "number of consecutive ranks on every node: " +
          groups.irregular;
      return CpuPath::kMpi;
    case CpuTransport::kFromEnvironment:
      // Unequal or interleaved nodes fall back to MPI: correct everywhere, only slower.
      if (groups.nodes == 1) return CpuPath::kSharedMemory;
      return groups.regular() ? CpuPath::kHierarchical : CpuPath::kMpi;
  }
  return CpuPath::kMpi;
}

}  // namespace

CpuPath choose_cpu_path(CpuTransport requested, MPI_Comm comm, const NodeGroups& groups) {
  std::string problem;
  const CpuPath wanted = wanted_path(requested, groups, &problem);
  // One reduction agrees on both: the smallest path, and (negated, so MPI_MIN finds it) whether
  // any rank has a problem.
  const int mine[2] = {static_cast<int>(wanted), problem.empty() ? 0 : -1};
  int agreed[2] = {0, 0};
  ZERO_MPI_CHECK(MPI_Allreduce(mine, agreed, 2, MPI_INT, MPI_MIN, comm));
  ZERO_CHECK(problem.empty(), problem);
  ZERO_CHECK(agreed[1] == 0,
             "another rank cannot use the collectives it was asked for (see its "
             "message): ZERO_COLLECTIVES must be possible on every rank");
  return static_cast<CpuPath>(agreed[0]);
}

}  // namespace zero::backend
