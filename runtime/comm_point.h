// A point on the communication stream (private to runtime/).
#pragma once

#include "zero/collectives/stream.h"

namespace zero {

// A point on the communication stream. On a CPU stream its event carries when the stream
// passed it (Event::finished_us): a wait for it then knows how long compute was exposed to the
// communication before it. A device event carries no time.
struct CommPoint {
  Event event;
};

}  // namespace zero
