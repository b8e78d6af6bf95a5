// The parts of the Communicator interface that every backend shares.
#include "zero/collectives/communicator.h"

namespace zero {

uint64_t CommCounters::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b;
  return total;
}

}  // namespace zero
