// A point on the communication stream (private to runtime/).
#pragma once

#include <memory>

#include "zero/collectives/stream.h"

namespace zero {

// A point on the communication stream and when the stream passed it, stamped by the stream
// itself (null for a compute event, or where the stream cannot stamp): a wait for it then
// knows how long compute was exposed to the communication before it.
struct CommPoint {
  Event event;
  std::shared_ptr<const double> done_us;
};

}  // namespace zero
