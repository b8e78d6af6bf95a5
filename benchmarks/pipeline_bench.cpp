// zero-bench-pipeline: the pipeline schedules' bubble, measured with stages that sleep instead of
// computing, against each schedule's formula. Run under mpirun with one rank per stage:
//
//   mpirun -np 4 zero-bench-pipeline --stages 4 --micro-batches 8
//       --schedule gpipe,1f1b,interleaved,zb-h1 --forward-ms 10 --backward-ms 10 --weight-ms 10
//       --json pipeline.json
//
// A stage's forward sleeps F ms, its backward B + W ms (B then, later, W when the schedule splits
// it, as ZB-H1 does); interleaved runs V chunks per rank, each sleeping 1/V of that, so every
// schedule does the same work per rank. Sleeping leaves the cores free, so the timing holds on a
// machine with fewer cores than ranks. Activations of --activation-elements floats travel between
// the stages through the executor (pipeline_executor.h).
//
// Per step (after one warm-up step, each starting behind a barrier): the step time is the
// slowest rank's; the bubble the idle share of rank time, 1 - sum of busy / (stages * step time);
// the idle time per rank step time - mean busy. Each figure is the median over --steps steps.
// The formula's figures are pipeline_bubble_formula's. --timeline-dump PREFIX writes
// PREFIX_<schedule>.json and .png of the last step (write_pipeline_timeline).
#include <mpi.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/collectives/peer_channel.h"
#include "zero/core/check.h"
#include "zero/runtime/pipeline_executor.h"
#include "zero/runtime/pipeline_schedule.h"

namespace {

using zero::PipelineScheduleKind;

struct Options {
  int stages = 0;
  int micro_batches = 0;
  std::vector<PipelineScheduleKind> schedules;
  double forward_ms = -1;
  double backward_ms = -1;
  double weight_ms = 0;
  int virtual_stages = 2;
  int activation_elements = 1024;
  int steps = 5;
  std::string json_path;
  std::string timeline_prefix;
};

const char* const kUsage =
    "usage: mpirun -np P zero-bench-pipeline --stages P --micro-batches M --schedule S[,S...]\n"
    "           --forward-ms F --backward-ms B [--weight-ms W] [--virtual-stages V]\n"
    "           [--activation-elements N] [--steps K] --json FILE [--timeline-dump PREFIX]\n"
    "  S: gpipe, 1f1b, interleaved (V chunks per rank, default 2), zb-h1; F, B, W: a stage's\n"
    "  forward, input-gradient and weight-gradient milliseconds (W default 0); N: floats per\n"
    "  activation (default 1024); K: measured steps after one warm-up (default 5)\n";

// Chunks per rank: V for interleaved, 1 for the others.
int chunks_of(PipelineScheduleKind kind, const Options& opt) {
  return kind == PipelineScheduleKind::kInterleaved ? opt.virtual_stages : 1;
}

// A parser storing milliseconds, at least 0.
zero::driver::FlagParser milliseconds_flag(double* out) {
  return [out](const std::string& flag, const std::string& value) {
    *out = zero::driver::parse_float_at_least(flag, value, 0.0f);
  };
}

Options parse_options(int argc, char** argv) {
  using zero::driver::integer_flag;
  using zero::driver::text_flag;
  Options opt;
  const auto schedules = [&](const std::string& flag, const std::string& value) {
    for (const std::string& name : zero::driver::split_commas(flag, value)) {
      try {
        opt.schedules.push_back(zero::parse_pipeline_schedule(name));
      } catch (const zero::Error& e) {
        zero::driver::usage_error(e.what());
      }
    }
  };
  zero::driver::parse_flags(argc, argv, kUsage,
                            {{"--stages", integer_flag(&opt.stages, 1)},
                             {"--micro-batches", integer_flag(&opt.micro_batches, 1)},
                             {"--schedule", schedules},
                             {"--forward-ms", milliseconds_flag(&opt.forward_ms)},
                             {"--backward-ms", milliseconds_flag(&opt.backward_ms)},
                             {"--weight-ms", milliseconds_flag(&opt.weight_ms)},
                             {"--virtual-stages", integer_flag(&opt.virtual_stages, 2)},
                             {"--activation-elements", integer_flag(&opt.activation_elements, 1)},
                             {"--steps", integer_flag(&opt.steps, 1)},
                             {"--json", text_flag(&opt.json_path)},
                             {"--timeline-dump", text_flag(&opt.timeline_prefix)}});
  if (opt.stages == 0) zero::driver::usage_error("--stages is required");
  if (opt.micro_batches == 0) zero::driver::usage_error("--micro-batches is required");
  if (opt.schedules.empty()) zero::driver::usage_error("--schedule is required");
  if (opt.forward_ms <= 0) zero::driver::usage_error("--forward-ms is required and positive");
  if (opt.backward_ms <= 0) zero::driver::usage_error("--backward-ms is required and positive");
  if (opt.json_path.empty()) zero::driver::usage_error("--json is required");
  // Every schedule's list must exist for these sizes (interleaved: M a multiple of P).
  for (PipelineScheduleKind kind : opt.schedules) {
    try {
      zero::make_pipeline_schedule(kind, opt.stages, opt.micro_batches, chunks_of(kind, opt));
    } catch (const zero::Error& e) {
      zero::driver::usage_error(e.what());
    }
  }
  return opt;
}

// A stage that sleeps: forward F/V ms, backward (B+W)/V, or B/V then W/V when split.
class SleepingStage : public zero::PipelineStageWork {
 public:
  SleepingStage(const Options& opt, int chunks)
      : forward_(opt.forward_ms / chunks),
        backward_(opt.backward_ms / chunks),
        weight_(opt.weight_ms / chunks) {}

  void forward(int, int, const zero::Tensor&, zero::Tensor&) override { sleep_ms(forward_); }
  void backward(int, int, const zero::Tensor&, zero::Tensor&) override {
    sleep_ms(backward_ + weight_);
  }
  bool splits_backward() const override { return true; }
  void backward_input(int, int, const zero::Tensor&, zero::Tensor&) override {
    sleep_ms(backward_);
  }
  void backward_weight(int, int) override { sleep_ms(weight_); }

 private:
  static void sleep_ms(double ms) {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  }

  double forward_;
  double backward_;
  double weight_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double all_ranks(double mine, MPI_Op op) {
  double all = 0;
  ZERO_MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, op, MPI_COMM_WORLD));
  return all;
}

// One schedule's steps; its JSON record on rank 0.
zero::driver::JsonRecord run_schedule(PipelineScheduleKind kind, const Options& opt, int rank) {
  const int chunks = chunks_of(kind, opt);
  const int p = opt.stages;
  const auto lists = zero::make_pipeline_schedule(kind, p, opt.micro_batches, chunks);
  zero::PeerChannel channel(MPI_COMM_WORLD);
  zero::PipelineExecutor executor(channel, rank, p, lists, {1, opt.activation_elements}, chunks);
  SleepingStage stage(opt, chunks);
  std::vector<double> step_ms, bubble, idle_ms, busy_ms, wait_ms;
  uint64_t bytes_sent = 0;
  zero::PipelineStepReport last;
  for (int step = -1; step < opt.steps; ++step) {
    ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    last = executor.run(stage);
    if (step < 0) continue;  // the warm-up
    const double slowest = all_ranks(last.step_ms, MPI_MAX);
    const double busy = all_ranks(last.busy_ms, MPI_SUM) / p;
    step_ms.push_back(slowest);
    busy_ms.push_back(busy);
    idle_ms.push_back(slowest - busy);
    bubble.push_back(1.0 - busy / slowest);
    wait_ms.push_back(all_ranks(last.wait_ms, MPI_SUM) / p);
    bytes_sent = static_cast<uint64_t>(all_ranks(static_cast<double>(last.bytes_sent), MPI_SUM));
  }
  const auto reports = zero::gather_pipeline_reports(channel, last);
  if (rank != 0) return {};
  const double formula = zero::pipeline_bubble_formula(
      kind, p, opt.micro_batches, chunks, opt.forward_ms, opt.backward_ms, opt.weight_ms);
  const double work = opt.micro_batches * (opt.forward_ms + opt.backward_ms + opt.weight_ms);
  const zero::PipelineDurations per_chunk{opt.forward_ms / chunks, opt.backward_ms / chunks,
                                          opt.weight_ms / chunks};
  if (!opt.timeline_prefix.empty()) {
    const std::string prefix = opt.timeline_prefix + "_" + zero::pipeline_schedule_name(kind);
    const std::string note = zero::write_pipeline_timeline(prefix, reports, lists, per_chunk);
    if (!note.empty()) std::printf("# zero-bench-pipeline: %s\n", note.c_str());
  }
  zero::driver::JsonRecord record = {{"schedule", zero::pipeline_schedule_name(kind)},
                                     {"stages", p},
                                     {"micro_batches", opt.micro_batches},
                                     {"virtual_stages", chunks},
                                     {"forward_ms", opt.forward_ms},
                                     {"backward_ms", opt.backward_ms},
                                     {"weight_ms", opt.weight_ms},
                                     {"activation_elements", opt.activation_elements},
                                     {"steps", opt.steps},
                                     {"step_ms", median(step_ms)},
                                     {"bubble_fraction", median(bubble)},
                                     {"formula_bubble_fraction", formula},
                                     {"idle_ms", median(idle_ms)},
                                     {"formula_idle_ms", formula / (1 - formula) * work},
                                     {"busy_ms", median(busy_ms)},
                                     {"wait_ms", median(wait_ms)},
                                     {"bytes_sent", bytes_sent},
                                     {"step_ms_all", step_ms},
                                     {"bubble_fraction_all", bubble}};
  std::printf("  %-12s %3d %8.1f %10.4f %10.4f %9.1f %9.1f %9.1f %12llu\n",
              zero::pipeline_schedule_name(kind), chunks, median(step_ms), median(bubble), formula,
              median(idle_ms), formula / (1 - formula) * work, median(wait_ms),
              static_cast<unsigned long long>(bytes_sent));
  std::fflush(stdout);
  return record;
}

int run_bench(const Options& opt, int rank, int world) {
  if (world != opt.stages) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "zero-bench-pipeline: --stages %d needs one rank per stage, and the job has %d "
                   "ranks (mpirun -np %d)\n",
                   opt.stages, world, opt.stages);
    }
    return 2;
  }
  if (rank == 0) {
    std::printf(
        "# zero-bench-pipeline: %d stages, %d micro-batches, F %.3g B %.3g W %.3g ms per stage, "
        "%d floats per activation; median of %d step(s) after 1 warm-up\n",
        opt.stages, opt.micro_batches, opt.forward_ms, opt.backward_ms, opt.weight_ms,
        opt.activation_elements, opt.steps);
    std::printf("# %-12s %3s %8s %10s %10s %9s %9s %9s %12s\n", "schedule", "v", "step_ms",
                "bubble", "formula", "idle_ms", "formula", "wait_ms", "bytes_sent");
  }
  std::vector<zero::driver::JsonRecord> records;
  for (PipelineScheduleKind kind : opt.schedules) {
    zero::driver::JsonRecord record = run_schedule(kind, opt, rank);
    if (rank == 0) records.push_back(std::move(record));
  }
  if (rank == 0 && !zero::driver::write_json_array(opt.json_path, records)) {
    std::fprintf(stderr, "zero-bench-pipeline: cannot write %s\n", opt.json_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> parsed = zero::driver::parse_command_line(
      "zero-bench-pipeline", kUsage, [&] { return parse_options(argc, argv); });
  if (!parsed) return 2;
  zero::MpiSession mpi(&argc, &argv);
  const int rank = mpi.world_rank();
  // Sleeps end within a microsecond rather than the default 50 us of timer slack, which would
  // add to every stage on the critical path and show as bubble.
  if (prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0) != 0) {
    std::fprintf(stderr, "zero-bench-pipeline: rank %d: prctl(PR_SET_TIMERSLACK) failed\n", rank);
  }
  try {
    return run_bench(*parsed, rank, mpi.world_size());
  } catch (const std::exception& e) {
    // Other ranks may be waiting for a transfer this rank will never make: end the whole job.
    std::fprintf(stderr, "zero-bench-pipeline: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
