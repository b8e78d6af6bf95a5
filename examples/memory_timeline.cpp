#include "examples/memory_timeline.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "zero/core/check.h"
#include "zero/runtime/gnuplot.h"

namespace zero::examples {

namespace {

using Held = std::array<uint64_t, kNumMemoryCategories>;

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// The innermost of `spans` (compute spans, sorted by begin) that holds `time_us`, or "".
std::string phase_at(const std::vector<const TraceSpan*>& spans, double time_us) {
  auto it = std::upper_bound(spans.begin(), spans.end(), time_us,
                             [](double t, const TraceSpan* s) { return t < s->begin_us; });
  // Spans nest only a few deep (a module inside the step's work): a short walk back finds the
  // enclosing one.
  for (int looked = 0; it != spans.begin() && looked < 8; ++looked) {
    --it;
    if ((*it)->end_us >= time_us) return (*it)->name;
  }
  return "";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ZERO_CHECK(out, "cannot open memory timeline file '"
                      << path << "' for writing: " << std::strerror(errno));
  out << text;
  out.close();
  ZERO_CHECK(out, "cannot write memory timeline file '" << path << "': " << std::strerror(errno));
}

}  // namespace

MemoryTimeline::MemoryTimeline(Allocator& allocator, std::string tier)
    : allocator_(allocator), tier_(std::move(tier)) {
  const MemoryStats& stats = allocator.stats();
  uint64_t total = 0;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    if (stats.current[i] == 0) continue;
    total += stats.current[i];
    record(AllocationEvent{static_cast<MemoryCategory>(i), static_cast<int64_t>(stats.current[i]),
                           stats.current[i], total});
  }
  allocator.set_observer([this](const AllocationEvent& e) { record(e); });
}

void MemoryTimeline::set_step(long step) {
  step_ = step;
  step_starts_.emplace_back(step, Trace::now_us());
}

MemoryTimeline::~MemoryTimeline() {
  allocator_.set_observer(nullptr);
}

void MemoryTimeline::record(const AllocationEvent& event) noexcept {
  if (events_.size() >= kMaxEvents) {
    truncated_ = true;
    return;
  }
  try {
    events_.push_back(Event{Trace::now_us(), step_, event});
  } catch (const std::bad_alloc&) {
    truncated_ = true;
  }
}

uint64_t MemoryTimeline::peak_bytes() const {
  uint64_t peak = 0;
  for (const Event& e : events_) peak = std::max(peak, e.allocation.total_bytes);
  return peak;
}

void MemoryTimeline::add_counters(Trace& trace) const {
  for (const Event& e : events_) {
    trace.add_counter({std::string("memory ") + memory_category_name(e.allocation.category),
                       e.time_us, e.allocation.category_bytes});
    trace.add_counter({"memory total", e.time_us, e.allocation.total_bytes});
  }
}

void MemoryTimeline::write(const std::string& path, const std::vector<TraceSpan>& spans,
                           long plot_step) const {
  std::vector<const TraceSpan*> compute;
  for (const TraceSpan& s : spans) {
    if (!s.comm) compute.push_back(&s);
  }
  std::sort(compute.begin(), compute.end(),
            [](const TraceSpan* a, const TraceSpan* b) { return a->begin_us < b->begin_us; });
  const double origin = events_.empty() ? 0 : events_.front().time_us;

  std::ostringstream table;
  table << "time_ms\tstep\tcategory\ttier\tdelta_bytes\tcategory_bytes\ttotal_bytes\tphase\n";
  // The stacked plot of plot_step, from its start to the next one's (or now): the bytes each
  // category holds before and after each event.
  double step_start = Trace::now_us(), step_end = step_start;
  for (size_t k = 0; k < step_starts_.size(); ++k) {
    if (step_starts_[k].first != plot_step) continue;
    step_start = step_starts_[k].second;
    if (k + 1 < step_starts_.size()) step_end = step_starts_[k + 1].second;
  }
  Held held{};
  Held at_peak{};
  std::vector<std::pair<double, Held>> points;
  double peak_ms = 0;
  uint64_t peak = 0;
  std::string peak_phase;
  bool started = false;
  // What the step starts with: its first point, and the peak unless an event passes it.
  const auto start_plot = [&] {
    started = true;
    points.emplace_back(0.0, held);
    for (uint64_t b : held) peak += b;
    at_peak = held;
    peak_phase = "held at the step's start";
  };
  char number[64];
  for (const Event& e : events_) {
    const std::string phase = e.step == 0 ? "start" : phase_at(compute, e.time_us);
    std::snprintf(number, sizeof(number), "%.3f", (e.time_us - origin) / 1000.0);
    table << number << '\t' << e.step << '\t' << memory_category_name(e.allocation.category) << '\t'
          << tier_ << '\t' << e.allocation.delta_bytes << '\t' << e.allocation.category_bytes
          << '\t' << e.allocation.total_bytes << '\t' << phase << '\n';
    const size_t c = static_cast<size_t>(e.allocation.category);
    if (e.step == plot_step) {
      if (!started) start_plot();
      const double ms = (e.time_us - step_start) / 1000.0;
      points.emplace_back(ms, held);
      held[c] = e.allocation.category_bytes;
      points.emplace_back(ms, held);
      if (e.allocation.total_bytes > peak) {
        peak = e.allocation.total_bytes;
        peak_ms = ms;
        at_peak = held;
        peak_phase = phase;
      }
    } else {
      held[c] = e.allocation.category_bytes;
    }
  }
  if (!started) start_plot();
  points.emplace_back((step_end - step_start) / 1000.0, held);
  if (truncated_) table << "# truncated: more than " << kMaxEvents << " events\n";
  write_text(path, table.str());

  std::vector<int> shown;  // the categories plot_step touched, in enum order
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    for (const auto& point : points) {
      if (point.second[static_cast<size_t>(i)] > 0) {
        shown.push_back(i);
        break;
      }
    }
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1250,600 font 'sans,11' noenhanced\n"
     << "set output '" << path << ".png'\n"
     << "set title 'zero-train: memory of rank 0 in step " << plot_step << " (" << tier_
     << "), stacked by category'\n"
     << "set xlabel 'time in the step (ms)'\nset ylabel 'MiB'\n"
     << "set grid\nset key outside right top box\nset style fill solid 0.8 noborder\n"
     << "set yrange [0:*]\n$data << EOD\n";
  for (const auto& [ms, bytes] : points) {
    gp << ms;
    uint64_t sum = 0;
    for (int i : shown) {
      sum += bytes[static_cast<size_t>(i)];
      gp << ' ' << mib(sum);
    }
    gp << '\n';
  }
  gp << "EOD\n";
  std::ostringstream live;
  std::snprintf(number, sizeof(number), "%.2f MiB\\nat %.2f ms", mib(peak), peak_ms);
  live << "peak " << number << (peak_phase.empty() ? "" : "\\n(" + peak_phase + ")")
       << "\\nlive then, MiB:";
  for (int i : shown) {
    std::snprintf(number, sizeof(number), "%.2f", mib(at_peak[static_cast<size_t>(i)]));
    live << "\\n" << memory_category_name(static_cast<MemoryCategory>(i)) << " " << number;
  }
  gp << "set arrow from " << peak_ms << ", graph 0 to " << peak_ms
     << ", graph 1 nohead dt 2 lw 2 lc rgb 'black' front\n"
     << "set label 1 \"" << live.str() << "\" at screen 0.815, screen 0.62 left front boxed\n"
     << "set rmargin at screen 0.8\n"
     << "names = \"";
  for (size_t k = 0; k < shown.size(); ++k) {
    gp << (k ? " " : "") << memory_category_name(static_cast<MemoryCategory>(shown[k]));
  }
  gp << "\"\nplot for [i=" << shown.size()
     << ":1:-1] $data using 1:(column(i+1)) with filledcurves x1 title word(names, i)\n";
  write_text(path + ".gp", gp.str());
  run_gnuplot(path + ".gp");
}

std::string gnuplot_problem() {
  if (gnuplot_on_path()) return "";
  return "gnuplot is not on PATH; it draws the timeline's plot (scripts/setup.sh installs it)";
}

}  // namespace zero::examples
