// flops_profiler: one step's work per module, as DeepSpeed's flops profiler prints it. The FLOPs
// are the ones the MFU figure counts (models/gpt2.h's gpt2_flops_per_token): forward 2 per
// parameter per token, attributed to the module holding the parameter, plus for the GPT-2 each
// block's attention, 4 * n_embd * seq_len per token; backward twice forward. So the profile's
// total is flops_per_token times the step's tokens. Latencies are rank 0's forward and backward
// spans of each module over the step's micro-batches (with a pipeline, each stage's first rank's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "driver/metrics_writer.h"
#include "zero/runtime/config.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/trace.h"

namespace zero::examples {

struct ModuleProfile {
  std::string name;  // "" for an unnamed module: the output calls it "(module K)", K its place
  uint64_t params = 0;
  double forward_flops = 0;
  double backward_flops = 0;
  double forward_ms = 0;
  double backward_ms = 0;
};

struct FlopsProfile {
  long step = 0;
  double step_ms = 0;
  double tokens = 0;  // the step's, every rank's together
  // Whose module spans the latencies are, for the output: "rank 0", or with a pipeline every
  // stage's first rank.
  std::string latency_of = "rank 0";
  std::vector<ModuleProfile> modules;
  double total_flops() const;
};

// The profile of one step: the modules' parameters from `layout` (the whole model: no tensor
// parallelism; a pipeline stage's, its modules), their names and latencies from `spans` (the
// step's compute spans, "forward NAME" and "backward NAME"), the attention term from
// `model_record`'s n_layer, n_embd and seq_len when it has them. The parameters named in
// `counted_elsewhere` are not counted: another stage's module holds them too and counts them
// (a pipeline's tied wte).
FlopsProfile profile_step(const Layout& layout, const driver::JsonRecord& model_record,
                          const std::vector<TraceSpan>& spans, long step, double step_ms,
                          double tokens, const std::vector<std::string>& counted_elsewhere = {});

// The modules of `profile` as JSON, to carry them to another rank, and back.
driver::JsonRecord module_profiles_record(const std::vector<ModuleProfile>& modules);
std::vector<ModuleProfile> module_profiles_from_record(const driver::JsonRecord& record);

// DeepSpeed's profile summary, aggregated profile (the top_modules by FLOPs, parameters and
// latency) and, with `detailed`, the per-module table.
std::string flops_profile_text(const FlopsProfile& profile, const FlopsProfilerConfig& config);

// The metrics record: {"event": "flops_profile", "step", "tokens", "total_flops", "modules"}.
driver::JsonRecord flops_profile_record(const FlopsProfile& profile);

// Rank 0's report: the text to config.output_file (or standard output) and the record to
// `metrics`. Throws zero::Error naming a file that cannot be written.
void report_flops_profile(const FlopsProfile& profile, const FlopsProfilerConfig& config,
                          driver::MetricsWriter* metrics);

}  // namespace zero::examples
