#include "examples/memory_timeline.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
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

// The compute spans of `spans`, sorted by begin (for phase_at).
std::vector<const TraceSpan*> compute_spans(const std::vector<TraceSpan>& spans) {
  std::vector<const TraceSpan*> compute;
  for (const TraceSpan& s : spans) {
    if (!s.comm) compute.push_back(&s);
  }
  std::sort(compute.begin(), compute.end(),
            [](const TraceSpan* a, const TraceSpan* b) { return a->begin_us < b->begin_us; });
  return compute;
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

MemoryTimeline::MemoryTimeline(Allocator& allocator, std::string tier,
                               std::shared_ptr<DeviceContext> device)
    : device_(std::move(device)) {
  add(allocator, std::move(tier));
}

void MemoryTimeline::add(Allocator& allocator, std::string tier) {
  for (const Source& s : sources_) {
    ZERO_CHECK(s.tier != tier && s.allocator != &allocator,
               "memory timeline: tier '" << tier << "' or its allocator is recorded already");
  }
  const size_t index = sources_.size();
  sources_.push_back(Source{&allocator, std::move(tier)});
  const MemoryStats& stats = allocator.stats();
  uint64_t total = 0;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    if (stats.current[i] == 0) continue;
    total += stats.current[i];
    record(index, AllocationEvent{static_cast<MemoryCategory>(i),
                                  static_cast<int64_t>(stats.current[i]), stats.current[i], total});
  }
  allocator.set_observer([this, index](const AllocationEvent& e) { record(index, e); });
}

void MemoryTimeline::set_step(long step) {
  step_ = step;
  step_starts_.push_back(StepStart{step, Trace::now_us(), sample_driver()});
}

MemoryTimeline::~MemoryTimeline() {
  for (const Source& s : sources_) s.allocator->set_observer(nullptr);
}

std::optional<DriverMemory> MemoryTimeline::sample_driver() noexcept {
  if (!device_ || !driver_error_.empty()) return std::nullopt;
  try {
    return device_->driver_memory();
  } catch (const std::exception& e) {
    driver_error_ = e.what();
    return std::nullopt;
  }
}

void MemoryTimeline::record(size_t tier, const AllocationEvent& event) noexcept {
  if (events_.size() >= kMaxEvents) {
    truncated_ = true;
    return;
  }
  try {
    events_.push_back(Event{Trace::now_us(), step_, tier, event, sample_driver()});
  } catch (const std::bad_alloc&) {
    truncated_ = true;
  }
}

uint64_t MemoryTimeline::peak_bytes(const std::string& tier) const {
  uint64_t peak = 0;
  for (const Event& e : events_) {
    if (sources_[e.tier].tier == tier) peak = std::max(peak, e.allocation.total_bytes);
  }
  return peak;
}

void MemoryTimeline::add_counters(Trace& trace) const {
  for (const Event& e : events_) {
    const std::string suffix = e.tier == 0 ? "" : " (" + sources_[e.tier].tier + ")";
    trace.add_counter(
        {std::string("memory ") + memory_category_name(e.allocation.category) + suffix, e.time_us,
         e.allocation.category_bytes});
    trace.add_counter({"memory total" + suffix, e.time_us, e.allocation.total_bytes});
  }
  const auto add_driver = [&trace](double time_us, const std::optional<DriverMemory>& driver) {
    if (!driver) return;
    trace.add_counter({"device free (driver)", time_us, driver->free_bytes});
    trace.add_counter({"device total (driver)", time_us, driver->total_bytes});
  };
  for (const StepStart& s : step_starts_) add_driver(s.time_us, s.driver);
  for (const Event& e : events_) add_driver(e.time_us, e.driver);
}

void MemoryTimeline::write(const std::string& path, const std::vector<TraceSpan>& spans,
                           long plot_step) const {
  write_events(path, spans);
  write_plot_script(path, spans, plot_step);
  run_gnuplot(path + ".gp");
}

void MemoryTimeline::write_events(const std::string& path,
                                  const std::vector<TraceSpan>& spans) const {
  const std::vector<const TraceSpan*> compute = compute_spans(spans);
  const double origin = events_.empty() ? 0 : events_.front().time_us;
  std::ostringstream table;
  table << "time_ms\tstep\tcategory\ttier\tdelta_bytes\tcategory_bytes\ttotal_bytes\tphase"
           "\tdriver_free_bytes\tdriver_total_bytes\n";
  char number[64];
  for (const Event& e : events_) {
    std::snprintf(number, sizeof(number), "%.3f", (e.time_us - origin) / 1000.0);
    table << number << '\t' << e.step << '\t' << memory_category_name(e.allocation.category) << '\t'
          << sources_[e.tier].tier << '\t' << e.allocation.delta_bytes << '\t'
          << e.allocation.category_bytes << '\t' << e.allocation.total_bytes << '\t'
          << (e.step == 0 ? "start" : phase_at(compute, e.time_us)) << '\t';
    if (e.driver)
      table << e.driver->free_bytes << '\t' << e.driver->total_bytes;
    else
      table << '\t';
    table << '\n';
  }
  if (!owner_.empty()) table << "# the memory of " << owner_ << "\n";
  if (truncated_) table << "# truncated: more than " << kMaxEvents << " events\n";
  if (!driver_error_.empty()) {
    table << "# the driver's memory was not sampled after a failed query: " << driver_error_
          << '\n';
  }
  write_text(path, table.str());
}

void MemoryTimeline::write_plot_script(const std::string& path, const std::vector<TraceSpan>& spans,
                                       long plot_step) const {
  const std::vector<const TraceSpan*> compute = compute_spans(spans);
  // The plot of plot_step, from its start to the next one's (or now): the bytes each category
  // of the first tier holds before and after each event, the other tiers' totals, and what the
  // driver counts in use (total - free).
  double step_start = Trace::now_us(), step_end = step_start;
  std::optional<DriverMemory> driver;
  for (size_t k = 0; k < step_starts_.size(); ++k) {
    if (step_starts_[k].step != plot_step) continue;
    step_start = step_starts_[k].time_us;
    driver = step_starts_[k].driver;
    if (k + 1 < step_starts_.size()) step_end = step_starts_[k + 1].time_us;
  }
  const size_t tiers = sources_.size();
  struct Point {
    double ms;
    Held held;                     // the first tier's categories
    std::vector<uint64_t> totals;  // every tier's total
    std::optional<DriverMemory> driver;
  };
  std::vector<Held> held(tiers);
  std::vector<uint64_t> totals(tiers, 0);
  std::vector<Point> points;
  Held at_peak{};
  double peak_ms = 0;
  uint64_t peak = 0;
  std::string peak_phase;
  bool started = false;
  // What the step starts with: its first point, and the peak unless an event passes it.
  const auto start_plot = [&] {
    started = true;
    points.push_back(Point{0.0, held[0], totals, driver});
    for (uint64_t b : held[0]) peak += b;
    at_peak = held[0];
    peak_phase = "held at the step's start";
  };
  for (const Event& e : events_) {
    const size_t c = static_cast<size_t>(e.allocation.category);
    if (e.step != plot_step) {
      held[e.tier][c] = e.allocation.category_bytes;
      totals[e.tier] = e.allocation.total_bytes;
      continue;
    }
    if (!started) start_plot();
    const double ms = (e.time_us - step_start) / 1000.0;
    points.push_back(Point{ms, held[0], totals, driver});
    held[e.tier][c] = e.allocation.category_bytes;
    totals[e.tier] = e.allocation.total_bytes;
    if (e.driver) driver = e.driver;
    points.push_back(Point{ms, held[0], totals, driver});
    if (e.tier == 0 && e.allocation.total_bytes > peak) {
      peak = e.allocation.total_bytes;
      peak_ms = ms;
      at_peak = held[0];
      peak_phase = phase_at(compute, e.time_us);
    }
  }
  if (!started) start_plot();
  points.push_back(Point{(step_end - step_start) / 1000.0, held[0], totals, driver});

  std::vector<int> shown;  // the first tier's categories plot_step touched, in enum order
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    for (const Point& point : points) {
      if (point.held[static_cast<size_t>(i)] > 0) {
        shown.push_back(i);
        break;
      }
    }
  }
  std::vector<size_t> other_tiers;  // the tiers after the first that held bytes in plot_step
  for (size_t t = 1; t < tiers; ++t) {
    for (const Point& point : points) {
      if (point.totals[t] > 0) {
        other_tiers.push_back(t);
        break;
      }
    }
  }
  const bool has_driver = std::any_of(points.begin(), points.end(),
                                      [](const Point& p) { return p.driver.has_value(); });
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1400,600 font 'sans,11' noenhanced\n"
     << "set output '" << path << ".png'\n"
     << "set title 'zero-train: memory of " << (owner_.empty() ? "rank 0" : owner_) << " in step "
     << plot_step << " (" << sources_[0].tier << "), stacked by category'\n"
     << "set xlabel 'time in the step (ms)'\nset ylabel 'MiB'\n"
     << "set grid\nset key outside right top box\nset style fill solid 0.8 noborder\n"
     << "set yrange [0:*]\n$data << EOD\n";
  uint64_t driver_total = 0;
  for (const Point& point : points) {
    gp << point.ms;
    uint64_t sum = 0;
    for (int i : shown) {
      sum += point.held[static_cast<size_t>(i)];
      gp << ' ' << mib(sum);
    }
    for (size_t t : other_tiers) gp << ' ' << mib(point.totals[t]);
    if (has_driver) {
      if (point.driver) {
        gp << ' ' << mib(point.driver->total_bytes - point.driver->free_bytes);
        driver_total = point.driver->total_bytes;
      } else {
        gp << " NaN";
      }
    }
    gp << '\n';
  }
  gp << "EOD\n";
  char number[64];
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
     << "set label 1 \"" << live.str() << "\" at screen 0.755, screen 0.47 left front boxed\n"
     << "set rmargin at screen 0.74\n";
  // The areas from the top of the stack down, so each lower one is drawn over the one above;
  // then the lines.
  std::vector<std::string> plots;
  for (size_t k = shown.size(); k-- > 0;) {
    plots.push_back("$data using 1:" + std::to_string(k + 2) + " with filledcurves x1 title '" +
                    memory_category_name(static_cast<MemoryCategory>(shown[k])) + "'");
  }
  size_t column = shown.size() + 2;
  for (size_t t : other_tiers) {
    plots.push_back("$data using 1:" + std::to_string(column++) + " with lines lw 2 title '" +
                    sources_[t].tier + " (total)'");
  }
  if (has_driver) {
    std::snprintf(number, sizeof(number), "%.1f", mib(driver_total) / 1024.0);
    plots.push_back("$data using 1:" + std::to_string(column) +
                    " with lines lw 2 dt 3 lc rgb 'black' title 'driver: in use of " + number +
                    " GiB'");
  }
  gp << "plot ";
  for (size_t k = 0; k < plots.size(); ++k) gp << (k ? ", \\\n     " : "") << plots[k];
  gp << '\n';
  write_text(path + ".gp", gp.str());
}

std::string gnuplot_problem() {
  if (gnuplot_on_path()) return "";
  return "gnuplot is not on PATH; it draws the timeline's plot (scripts/setup.sh installs it)";
}

}  // namespace zero::examples
