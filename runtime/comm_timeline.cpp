#include "comm_timeline.h"

#include <algorithm>

namespace zero {

// The wait includes the time this thread takes to be woken (ranks outnumber cores here): the
// step pays it too.
void CommTimeline::wait(const CommPoint& point, double needed_us) {
  if (needed_us < 0.0) needed_us = Trace::now_us();
  if (point.event.device_event() != nullptr) {
    device_.wait(point.event);  // a device stream: no host-side figure
    return;
  }
  const bool had_arrived = point.event.done();
  device_.wait(point.event);  // rethrows a failed collective's error
  const double until_us = had_arrived ? point.event.finished_us() : Trace::now_us();
  wait_us_ += std::max(0.0, until_us - needed_us);
}

CommPoint CommTimeline::issued(CommPoint point, double issue_us) {
  if (!overlap_comm_) wait(point, issue_us);
  return point;
}

CommTimeline::Figures CommTimeline::take() {
  Figures figures;
  figures.collectives = collectives_issued_;
  figures.busy_ms = static_cast<double>(busy_us_->exchange(0)) / 1000.0;
  figures.wait_ms = wait_us_ / 1000.0;
  collectives_issued_ = 0;
  wait_us_ = 0.0;
  return figures;
}

}  // namespace zero
