// The parts of the Communicator interface that every backend shares.
#include "zero/collectives/communicator.h"

namespace zero {

uint64_t CommCounters::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  return total;
}

std::vector<uint64_t> all_gather_u64(Communicator& comm, uint64_t value) {
  std::vector<uint64_t> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather_bytes_sync(&value, all.data(), sizeof(value));
  return all;
}

}  // namespace zero
