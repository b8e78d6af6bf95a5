// write_pipeline_timeline (pipeline_executor.h): every rank's measured actions and the planned
// timeline as JSON, and a picture of both drawn with gnuplot in the manner of the pipeline
// papers' figures (one row per rank, one box per computation, coloured by kind).

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/core/check.h"
#include "zero/runtime/gnuplot.h"
#include "zero/runtime/pipeline_executor.h"

namespace zero {

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ZERO_CHECK(out, "cannot open pipeline timeline file '"
                      << path << "' for writing: " << std::strerror(errno));
  out << text;
  out.close();
  ZERO_CHECK(out, "cannot write pipeline timeline file '" << path << "': " << std::strerror(errno));
}

// The box colours of the kinds of computation, as in the zero-bubble paper's figures.
// (0xRRGGBB, written in decimal: gnuplot's data reader takes no hexadecimal.)
long colour_of(PipelineAction::Kind kind) {
  switch (kind) {
    case PipelineAction::kForward:
      return 0x4472C4;
    case PipelineAction::kBackward:
      return 0xED7D31;
    case PipelineAction::kBackwardInput:
      return 0x2AB0B0;
    default:
      return 0x70AD47;
  }
}

struct Box {
  int rank;
  PipelineAction action;
  double start;
  double end;
};

// A gnuplot data block of boxes: centre, rank, half width, half height, colour, label.
std::string data_block(const std::string& name, const std::vector<Box>& boxes) {
  std::ostringstream out;
  out << "$" << name << " << EOD\n";
  for (const Box& b : boxes) {
    const std::string label = pipeline_action_label(b.action);
    out << (b.start + b.end) / 2 << ' ' << b.rank << ' ' << (b.end - b.start) / 2 << " 0.38 "
        << colour_of(b.action.kind) << " \"" << label.substr(1) << "\"\n";
  }
  out << "EOD\n";
  return out.str();
}

// The gnuplot key entries of the kinds of computation the planned boxes hold.
std::string legend(const std::vector<Box>& boxes) {
  static const char* const kTitles[] = {"F", "B (input + weight)", "B (input)", "W (weight)"};
  std::ostringstream out;
  for (PipelineAction::Kind kind :
       {PipelineAction::kForward, PipelineAction::kBackward, PipelineAction::kBackwardInput,
        PipelineAction::kBackwardWeight}) {
    const bool used = std::any_of(boxes.begin(), boxes.end(),
                                  [&](const Box& b) { return b.action.kind == kind; });
    if (!used) continue;
    char colour[16];
    std::snprintf(colour, sizeof(colour), "#%06lX", colour_of(kind));
    out << (out.tellp() > 0 ? ", " : "") << "keyentry with boxes fc rgb '" << colour << "' title '"
        << kTitles[kind] << "'";
  }
  return out.str();
}

}  // namespace

std::string write_pipeline_timeline(const std::string& prefix,
                                    const std::vector<PipelineStepReport>& reports,
                                    const std::vector<std::vector<PipelineAction>>& schedules,
                                    const PipelineDurations& planned) {
  const int stages = static_cast<int>(schedules.size());
  ZERO_CHECK(reports.size() == schedules.size(),
             "a pipeline timeline needs a report per stage: " << reports.size() << " reports for "
                                                              << stages << " stages");
  const auto plan = simulate_pipeline_schedule(schedules, stages, planned);
  std::vector<Box> measured_boxes;
  std::vector<Box> planned_boxes;
  double longest = 0.0;  // both panels share the time axis
  nlohmann::ordered_json actions = nlohmann::ordered_json::array();
  for (int rank = 0; rank < stages; ++rank) {
    for (const PipelineActionTiming& t : reports[static_cast<size_t>(rank)].timeline) {
      actions.push_back({{"rank", rank},
                         {"action", pipeline_action_name(t.action.kind)},
                         {"micro_batch", t.action.micro_batch},
                         {"chunk", t.action.chunk},
                         {"timeline", "measured"},
                         {"start_ms", t.start_ms},
                         {"end_ms", t.end_ms}});
      if (is_pipeline_compute(t.action.kind)) {
        measured_boxes.push_back({rank, t.action, t.start_ms, t.end_ms});
        longest = std::max(longest, t.end_ms);
      }
    }
    for (const PlannedAction& a : plan[static_cast<size_t>(rank)]) {
      actions.push_back({{"rank", rank},
                         {"action", pipeline_action_name(a.action.kind)},
                         {"micro_batch", a.action.micro_batch},
                         {"chunk", a.action.chunk},
                         {"timeline", "planned"},
                         {"start_ms", a.start},
                         {"end_ms", a.end}});
      planned_boxes.push_back({rank, a.action, a.start, a.end});
      longest = std::max(longest, a.end);
    }
  }
  nlohmann::ordered_json document = {
      {"stages", stages},
      {"planned_durations",
       {{"forward", planned.forward}, {"backward", planned.backward}, {"weight", planned.weight}}},
      {"planned_bubble_fraction", simulated_bubble_fraction(plan)},
      {"actions", actions}};
  write_text(prefix + ".json", document.dump(1) + "\n");

  if (!gnuplot_on_path()) {
    return "gnuplot is not on PATH (scripts/setup.sh installs it): wrote " + prefix +
           ".json without its picture";
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1400," << 260 + 90 * stages << " font 'sans,10' noenhanced\n"
     << "set output '" << prefix << ".png'\n"
     << data_block("measured", measured_boxes) << data_block("planned", planned_boxes)
     << "set multiplot layout 2,1\n"
     << "set style fill solid 0.85 border lc rgb 'black'\n"
     << "set yrange [" << stages - 0.5 << ":-0.5]\nset ytics (";
  for (int rank = 0; rank < stages; ++rank) {
    gp << (rank ? ", " : "") << "'rank " << rank << "' " << rank;
  }
  gp << ")\nset key outside right top\nset xrange [0:" << std::max(longest, 1e-3) << "]\n"
     << "legend = \"" << legend(planned_boxes) << "\"\n"
     << "set title 'measured (ms since the step started)'\n"
     << "plot $measured using 1:2:3:4:5 with boxxyerror lc rgb variable notitle, "
        "'' using 1:2:6 with labels notitle, @legend\n"
     << "set title 'planned from the lists (F " << planned.forward << ", B " << planned.backward
     << ", W " << planned.weight << " per chunk)'\n"
     << "plot $planned using 1:2:3:4:5 with boxxyerror lc rgb variable notitle, "
        "'' using 1:2:6 with labels notitle, @legend\n"
     << "unset multiplot\n";
  write_text(prefix + ".gp", gp.str());
  run_gnuplot(prefix + ".gp");
  return "";
}

}  // namespace zero
