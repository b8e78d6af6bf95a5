// zero-bench-step: whole training steps of the example MLP at ZeRO stages 0-3 on the ranks mpirun
// started, side by side. Per stage and dtype: the median step time, the time spent in collectives
// and the share of it that ran behind compute, model-state and peak memory per rank, and the step
// time over stage 0's.
//
//   zerorun -np 2 -- zero-bench-step                    the default: the target configuration
//   zerorun -np 2 -- zero-bench-step --dtype fp32,bf16 --json step.json
//   zero-bench-step --memory-table --json memory.json   plan_memory at 1..8 ranks, no MPI at all
//
// How it measures (the choices, written where a reader of the numbers looks for them):
//  - Every stage gets its own engine on the same communicator, all alive at once. After each
//    engine's warm-up the measured steps run in rounds: a round runs a block of steps of every
//    stage in turn. On a shared machine, load from other processes then lands on all stages
//    alike instead of on whichever stage happened to run at the time.
//  - A step is what a training loop does: make the batch, forward, loss, backward, optimizer
//    step. Its time runs from its start to the next step's start, so the all-gather that stages
//    1-2 leave in flight after step() is paid where the next forward waits for it; a block starts
//    after a barrier and its last step ends when the communication stream has drained. Each step
//    takes the slowest rank's time (the maximum over ranks), and the median is over steps.
//  - Communication figures are the engine's own StepStats, summed over the measured steps and
//    ranks: comm_busy_ms (time the communication stream spent running collectives, between
//    markers queued on that stream right before and after each one) and comm_wait_ms (how long
//    compute was exposed to communication: for each wait, from when compute needed the result
//    until the stream stamped it done). comm_ms is busy time per step, exposed_ms is wait time
//    per step, and overlap_fraction = 1 - sum(wait) / sum(busy): a collective done before
//    compute needed it counts as hidden, one compute needed from its issue counts in full,
//    whatever compute span the wait happened in. (The trace's span union counted a wait inside
//    the backward span as compute, i.e. as overlap that did not happen.) Stamps taken by the
//    stream make the figure independent of when the compute thread happened to be scheduled.
//    --overlap-comm 0 (every collective needed from its issue) is the check that the figure is
//    real: it reads 0 there. The fraction is clamped to [0, 1].
//    compute_ms is the rank's step time minus its wait: what the compute thread spent working
//    (batch, forward, loss, backward, optimizer). collectives is the count per step. A step's
//    stats cover what happened since the previous step() returned, so stages 1-2's post-step
//    all-gathers, issued inside step(), are counted there and their busy time in the next step.
//    Tracing is on only with --trace (a Chrome trace of each stage's last round).
//  - Memory is Engine::model_state_bytes() and the engine allocator's peak (model state plus the
//    pooled gradient buckets and gathered-parameter buffers; activations are host vectors the
//    allocator does not see), the maximum over ranks.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "models/mlp.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/estimate.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/model.h"
#include "zero/runtime/trace.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace {

using zero::DType;

// --- command line ----------------------------------------------------------------------------

// The default is the target configuration: four 1024x1024 hidden layers between narrow
// input and output layers, 128 samples per rank at 2 ranks. A hidden layer does 6 x 128 flops
// per parameter per step (forward and backward GEMMs) against at most 12 bytes of collectives
// per parameter, so compute dominates; the narrow ends keep the batch generation cheap.
struct Options {
  zero::models::MlpConfig mlp{64, 1024, 64, 6};
  long global_batch = 256;
  int micro_batches = 1;
  int steps = 12;
  int warmup = 2;
  int rounds = 4;
  std::vector<DType> dtypes{DType::kFloat32};
  std::vector<int> stages{0, 1, 2, 3};
  size_t merge_bytes = 0;
  bool overlap_comm = true;
  size_t max_elements_per_call = 0;  // 0: the communicator's default (INT_MAX)
  std::string json_path;
  std::string trace_prefix;
  bool memory_table = false;
  int max_ranks = 8;
};

const char* kUsage =
    "usage: zero-bench-step [--dtype LIST] [--stages LIST] [--input-dim N] [--hidden N]\n"
    "                       [--output-dim N] [--layers N] [--global-batch B] [--micro-batches K]\n"
    "                       [--steps N] [--warmup N] [--rounds R] [--merge-bytes N]\n"
    "                       [--overlap-comm 0|1] [--max-elements-per-call N]\n"
    "                       [--json FILE] [--trace PREFIX]\n"
    "       zero-bench-step --memory-table [--max-ranks N] [model and dtype flags] [--json FILE]\n"
    "  --dtype         comma-separated working dtypes: fp32, bf16, fp16 (default fp32)\n"
    "  --stages        comma-separated ZeRO stages (default 0,1,2,3)\n"
    "  --input-dim, --hidden, --output-dim, --layers   the MLP (default 64, 1024, 64, 6)\n"
    "  --global-batch  samples per step over all ranks (default 256)\n"
    "  --micro-batches gradient accumulation steps (default 1)\n"
    "  --steps         measured steps per stage, split over the rounds (default 12)\n"
    "  --warmup        unmeasured steps per stage first (default 2)\n"
    "  --rounds        interleaved blocks of measured steps per stage (default 4)\n"
    "  --merge-bytes   merge neighbouring modules into units up to this size (default 0: off)\n"
    "  --overlap-comm  0: wait for every collective as soon as it is issued (default 1)\n"
    "  --max-elements-per-call  split every MPI call of a collective into pieces of at most\n"
    "                  N elements (default: no limit below INT_MAX)\n"
    "  --json          also write one record per stage and dtype to FILE (a JSON array)\n"
    "  --trace         write PREFIX.stageS.DTYPE.json: a Chrome trace of each stage's last round\n"
    "  --memory-table  print plan_memory against the ZeRO formula for 1..--max-ranks ranks\n"
    "                  (default 8) and every stage, without starting MPI\n";

using zero::driver::parse_between;
using zero::driver::split_commas;
using zero::driver::usage_error;

int parse_int(const std::string& flag, const std::string& text, int min_value) {
  return static_cast<int>(parse_between(flag, text, min_value, INT_MAX));
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    }
    if (flag == "--memory-table") {
      opt.memory_table = true;
      continue;
    }
    if (i + 1 >= argc) usage_error("missing value after " + flag);
    const std::string value = argv[++i];
    if (flag == "--dtype") {
      opt.dtypes.clear();
      for (const std::string& item : split_commas(flag, value)) {
        DType dtype;
        if (!zero::parse_dtype(item, &dtype)) {
          usage_error("--dtype: unknown dtype '" + item + "' (fp32, bf16, fp16)");
        }
        opt.dtypes.push_back(dtype);
      }
    } else if (flag == "--stages") {
      opt.stages.clear();
      for (const std::string& item : split_commas(flag, value)) {
        const int stage = static_cast<int>(parse_between(flag, item, 0, 3));
        if (std::find(opt.stages.begin(), opt.stages.end(), stage) != opt.stages.end()) {
          usage_error("--stages lists stage " + item + " twice");
        }
        opt.stages.push_back(stage);
      }
      std::sort(opt.stages.begin(), opt.stages.end());
    } else if (flag == "--input-dim") {
      opt.mlp.input_dim = parse_int(flag, value, 1);
    } else if (flag == "--hidden") {
      opt.mlp.hidden_dim = parse_int(flag, value, 1);
    } else if (flag == "--output-dim") {
      opt.mlp.output_dim = parse_int(flag, value, 1);
    } else if (flag == "--layers") {
      opt.mlp.layers = parse_int(flag, value, 1);
    } else if (flag == "--global-batch") {
      opt.global_batch = parse_between(flag, value, 1, LONG_MAX);
    } else if (flag == "--micro-batches") {
      opt.micro_batches = parse_int(flag, value, 1);
    } else if (flag == "--steps") {
      opt.steps = parse_int(flag, value, 1);
    } else if (flag == "--warmup") {
      opt.warmup = parse_int(flag, value, 0);
    } else if (flag == "--rounds") {
      opt.rounds = parse_int(flag, value, 1);
    } else if (flag == "--merge-bytes") {
      opt.merge_bytes = static_cast<size_t>(parse_between(flag, value, 0, LONG_MAX));
    } else if (flag == "--overlap-comm") {
      opt.overlap_comm = parse_between(flag, value, 0, 1) == 1;
    } else if (flag == "--max-elements-per-call") {
      opt.max_elements_per_call = static_cast<size_t>(parse_between(flag, value, 1, INT_MAX));
    } else if (flag == "--json") {
      opt.json_path = value;
    } else if (flag == "--trace") {
      opt.trace_prefix = value;
    } else if (flag == "--max-ranks") {
      opt.max_ranks = static_cast<int>(parse_between(flag, value, 1, 1024));
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  if (opt.rounds > opt.steps) {
    usage_error("--rounds (" + std::to_string(opt.rounds) + ") must not exceed --steps (" +
                std::to_string(opt.steps) + "): every round measures at least one step");
  }
  return opt;
}

// --- the model as the engine sees it ---------------------------------------------------------

zero::EngineConfig engine_config(const Options& opt, int stage, DType dtype, bool trace) {
  zero::EngineConfig config;
  config.stage = stage;
  config.dtype = dtype;
  config.micro_batches = opt.micro_batches;
  config.merge_bytes = opt.merge_bytes;
  config.overlap_comm = opt.overlap_comm;
  config.kernel_threads = 1;
  config.trace = trace;
  return config;
}

// Multiply-adds of every GEMM one rank runs per step, counted as 2 flops each: forward x W^T,
// backward dW and dx per layer, and the teacher's two GEMMs that make the targets.
double gemm_flops_per_rank(const zero::models::MlpConfig& mlp, double samples_per_rank) {
  double layer_products = 0;
  for (int l = 0; l < mlp.layers; ++l) {
    const double in = l == 0 ? mlp.input_dim : mlp.hidden_dim;
    const double out = l == mlp.layers - 1 ? mlp.output_dim : mlp.hidden_dim;
    layer_products += in * out;
  }
  const double teacher_products = static_cast<double>(mlp.input_dim) * mlp.hidden_dim +
                                  static_cast<double>(mlp.hidden_dim) * mlp.output_dim;
  return samples_per_rank * (6.0 * layer_products + 2.0 * teacher_products);
}

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// --- memory table: plan_memory against the formula, no MPI ------------------------------------

int memory_table(const Options& opt) {
  const std::vector<zero::ParamSpec> specs = zero::models::mlp_param_specs(opt.mlp);
  // The file is created (or emptied) at once, so a path that cannot be written fails first.
  if (!opt.json_path.empty() && !zero::driver::write_json_array(opt.json_path, {})) {
    std::fprintf(stderr, "zero-bench-step: cannot write %s\n", opt.json_path.c_str());
    return 1;
  }
  std::vector<zero::driver::JsonRecord> json;
  std::printf(
      "# zero-bench-step --memory-table: model-state bytes per rank the engine plans\n"
      "# (plan_memory, what it allocates byte for byte) against the ZeRO formula\n"
      "# (estimate_model_state on the unpadded parameter count), for the MLP %d-%dx%d-%d\n",
      opt.mlp.input_dim, opt.mlp.hidden_dim, opt.mlp.layers, opt.mlp.output_dim);
  std::printf("# %5s %6s %6s %12s %12s %14s %14s %14s %8s\n", "dtype", "stage", "ranks", "params",
              "padded", "formula(B)", "plan(B)", "buffers(B)", "plan/f");
  for (DType dtype : opt.dtypes) {
    for (int stage : opt.stages) {
      for (int ranks = 1; ranks <= opt.max_ranks; ++ranks) {
        const zero::Layout layout =
            zero::Layout::build(specs, zero::LayoutOptions{ranks, dtype, 64, opt.merge_bytes});
        const zero::MemoryPlan plan =
            zero::plan_memory(layout, engine_config(opt, stage, dtype, false));
        const uint64_t formula =
            zero::estimate_model_state(layout.numel(), ranks, dtype, stage).total();
        std::printf("  %5s %6d %6d %12zu %12zu %14llu %14llu %14llu %8.4f\n",
                    zero::dtype_name(dtype), stage, ranks, layout.numel(), layout.padded_numel(),
                    static_cast<unsigned long long>(formula),
                    static_cast<unsigned long long>(plan.model_state),
                    static_cast<unsigned long long>(plan.buffers),
                    static_cast<double>(plan.model_state) / static_cast<double>(formula));
        json.push_back({{"dtype", zero::dtype_name(dtype)},
                        {"stage", stage},
                        {"world_size", ranks},
                        {"params", layout.numel()},
                        {"padded_params", layout.padded_numel()},
                        {"formula_bytes", formula},
                        {"plan_model_state_bytes", plan.model_state},
                        {"plan_buffer_bytes", plan.buffers}});
      }
    }
  }
  if (!opt.json_path.empty()) {
    if (!zero::driver::write_json_array(opt.json_path, json)) {
      std::fprintf(stderr, "zero-bench-step: error writing %s\n", opt.json_path.c_str());
      return 1;
    }
  }
  return 0;
}

// --- one stage's engine and its measurements -------------------------------------------------

struct StageRun {
  int stage = 0;
  DType dtype = DType::kFloat32;
  std::unique_ptr<zero::ZeroModel> model;
  long data_step = 0;           // which global batch the next step trains on
  std::vector<double> step_ms;  // this rank's measured steps
  double busy_ms = 0;           // sum of StepStats::comm_busy_ms over the measured steps
  double wait_ms = 0;           // sum of StepStats::comm_wait_ms
  long collectives = 0;         // sum of StepStats::collectives
  float last_loss = 0.0f;
};

// Everything one optimizer step does, micro-batch by micro-batch; returns the engine's figures.
zero::StepStats train_step(StageRun& run, const zero::models::TeacherTask& task,
                           const Options& opt, int rank, int world) {
  zero::Trace& trace = run.model->engine().trace();
  const long per_micro_batch = opt.global_batch / (static_cast<long>(world) * opt.micro_batches);
  run.data_step += 1;
  float loss_sum = 0.0f;
  for (int k = 0; k < opt.micro_batches; ++k) {
    // Micro-batch k of the global batch is split across ranks in contiguous blocks.
    const int64_t first = (static_cast<int64_t>(k) * world + rank) * per_micro_batch;
    zero::models::Batch batch;
    {
      zero::ScopedSpan span(trace, "data");
      batch = task.batch(run.data_step, first, per_micro_batch);
    }
    const zero::Tensor prediction = run.model->forward(batch.inputs);
    zero::Tensor grad;
    {
      zero::ScopedSpan span(trace, "loss");
      loss_sum += zero::models::mse_loss(prediction, batch.targets, grad);
    }
    run.model->backward(grad);
  }
  const zero::StepStats stats = run.model->step();
  run.last_loss = loss_sum / static_cast<float>(opt.micro_batches);
  return stats;
}

// One block of measured steps: barrier, steps (adding up the engine's figures), drain.
void measure_block(StageRun& run, const zero::models::TeacherTask& task, const Options& opt,
                   zero::Communicator& comm, int steps) {
  zero::Engine& engine = run.model->engine();
  comm.stream().synchronize();
  ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  engine.trace().clear();
  std::vector<double> starts{zero::Trace::now_us()};
  for (int i = 0; i < steps; ++i) {
    const zero::StepStats stats = train_step(run, task, opt, comm.rank(), comm.world_size());
    run.busy_ms += stats.comm_busy_ms;
    run.wait_ms += stats.comm_wait_ms;
    run.collectives += stats.collectives;
    if (i + 1 < steps) starts.push_back(zero::Trace::now_us());
  }
  // The last step ends when what it left in flight (stages 1-3's post-step all-gathers) is done.
  comm.stream().synchronize();
  starts.push_back(zero::Trace::now_us());
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    run.step_ms.push_back((starts[i + 1] - starts[i]) / 1000.0);
  }
}

// --- results ---------------------------------------------------------------------------------

struct Record {
  int stage = 0;
  DType dtype = DType::kFloat32;
  int world = 1;
  size_t params = 0;
  size_t padded_params = 0;
  int steps = 0;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  // Per step, mean over ranks: step time minus comm wait, comm busy, comm wait, collectives.
  double compute_ms = 0;
  double comm_ms = 0;
  double exposed_ms = 0;
  double collectives = 0;
  double overlap = 0;  // 1 - sum(wait) / sum(busy), clamped to [0, 1]
  uint64_t model_state_bytes = 0;
  uint64_t peak_bytes = 0;
  uint64_t plan_model_state_bytes = 0;
  double ratio_to_stage0 = -1;  // negative: stage 0 was not measured
  double final_loss = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Combines the ranks' measurements into one record (collective: every rank calls it).
Record summarize(StageRun& run, int world) {
  zero::Engine& engine = run.model->engine();
  Record r;
  r.stage = run.stage;
  r.dtype = run.dtype;
  r.world = world;
  r.params = engine.layout().numel();
  r.padded_params = engine.layout().padded_numel();
  r.steps = static_cast<int>(run.step_ms.size());

  std::vector<double> slowest = run.step_ms;
  ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, slowest.data(), static_cast<int>(slowest.size()),
                               MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  r.median_ms = median(slowest);
  r.min_ms = *std::min_element(slowest.begin(), slowest.end());
  r.max_ms = *std::max_element(slowest.begin(), slowest.end());

  double own_ms = 0;
  for (double ms : run.step_ms) own_ms += ms;
  std::vector<double> sums{own_ms, run.busy_ms, run.wait_ms, static_cast<double>(run.collectives),
                           static_cast<double>(run.last_loss)};
  ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_DOUBLE,
                               MPI_SUM, MPI_COMM_WORLD));
  const double rank_steps = static_cast<double>(world) * r.steps;
  r.compute_ms = (sums[0] - sums[2]) / rank_steps;
  r.comm_ms = sums[1] / rank_steps;
  r.exposed_ms = sums[2] / rank_steps;
  r.collectives = sums[3] / rank_steps;
  r.overlap = sums[1] > 0 ? std::min(1.0, std::max(0.0, 1.0 - sums[2] / sums[1])) : 0.0;
  r.final_loss = sums[4] / world;

  uint64_t memory[2] = {engine.model_state_bytes(), engine.allocator().stats().peak_total};
  ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, memory, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
  r.model_state_bytes = memory[0];
  r.peak_bytes = memory[1];
  r.plan_model_state_bytes = zero::plan_memory(engine.layout(), engine.config()).model_state;
  return r;
}

// --json: one record per stage and dtype, figures rounded as the report shows them.
bool write_json(const std::string& path, const std::vector<Record>& records, const Options& opt) {
  using zero::driver::rounded;
  std::vector<zero::driver::JsonRecord> json;
  for (const Record& r : records) {
    json.push_back({{"stage", r.stage},
                    {"dtype", zero::dtype_name(r.dtype)},
                    {"world_size", r.world},
                    {"params", r.params},
                    {"padded_params", r.padded_params},
                    {"input_dim", opt.mlp.input_dim},
                    {"hidden", opt.mlp.hidden_dim},
                    {"output_dim", opt.mlp.output_dim},
                    {"layers", opt.mlp.layers},
                    {"global_batch", opt.global_batch},
                    {"micro_batches", opt.micro_batches},
                    {"steps", r.steps},
                    {"warmup", opt.warmup},
                    {"median_step_ms", rounded(r.median_ms, 4)},
                    {"min_step_ms", rounded(r.min_ms, 4)},
                    {"max_step_ms", rounded(r.max_ms, 4)},
                    {"overlap_comm", opt.overlap_comm},
                    {"compute_ms", rounded(r.compute_ms, 4)},
                    {"comm_ms", rounded(r.comm_ms, 4)},
                    {"exposed_comm_ms", rounded(r.exposed_ms, 4)},
                    {"overlap_fraction", rounded(r.overlap, 4)},
                    {"collectives_per_step", rounded(r.collectives, 2)},
                    {"model_state_bytes", r.model_state_bytes},
                    {"plan_model_state_bytes", r.plan_model_state_bytes},
                    {"peak_bytes", r.peak_bytes},
                    {"ratio_to_stage0", r.ratio_to_stage0 < 0 ? zero::driver::JsonRecord()
                                                              : zero::driver::JsonRecord(
                                                                    rounded(r.ratio_to_stage0, 4))},
                    {"final_loss", r.final_loss}});
  }
  return zero::driver::write_json_array(path, json);
}

std::string percent(double fraction) {
  if (fraction < 0) return "-";
  char text[16];
  std::snprintf(text, sizeof(text), "%.0f%%", 100.0 * fraction);
  return text;
}

void print_header(const Options& opt, int world, size_t params) {
  const double per_rank = static_cast<double>(opt.global_batch) / world;
  const double gflop = gemm_flops_per_rank(opt.mlp, per_rank) / 1e9;
  // Stages 0-2 move 2Ψ elements per rank per step, stage 3 3Ψ (ZeRO paper, section 7), each
  // times (N-1)/N on the wire; in fp32, 4 bytes each.
  const double wire = world > 1 ? static_cast<double>(world - 1) / world : 0.0;
  const double mb3 = 3.0 * static_cast<double>(params) * 4.0 * wire / 1e6;
  std::printf(
      "# zero-bench-step: mlp %d-%dx%d-%d (%zu params), %d rank(s), global batch %ld "
      "(%.0f per rank, %d micro-batch(es)), overlap_comm %s\n"
      "# %d measured steps per stage in %d interleaved round(s) after %d warm-up step(s); "
      "OpenBLAS and kernels on 1 thread per rank\n"
      "# work per rank per step: %.2f GFLOP of GEMMs against at most %.1f MB of collectives "
      "(stage 3, fp32): %.0f flop per byte moved, so compute should dominate; the measured times "
      "per step are below\n"
      "# step: median over steps of the slowest rank's step; per step, mean over ranks, from the "
      "engine's StepStats: comm = comm_busy_ms, exposed = comm_wait_ms (compute blocked on a "
      "collective), compute = step - exposed, colls = collectives issued; overlap = 1 - "
      "sum(wait) / sum(busy)\n",
      opt.mlp.input_dim, opt.mlp.hidden_dim, opt.mlp.layers, opt.mlp.output_dim, params, world,
      opt.global_batch, per_rank, opt.micro_batches, opt.overlap_comm ? "on" : "off", opt.steps,
      opt.rounds, opt.warmup, gflop, mb3, mb3 > 0 ? gflop * 1e9 / (mb3 * 1e6) : 0.0);
  std::printf("# %5s %5s %9s %17s %10s %8s %8s %7s %6s %10s %9s %8s %10s\n", "stage", "dtype",
              "step_ms", "(min-max)", "compute_ms", "comm_ms", "exposed", "overlap", "colls",
              "state_MiB", "peak_MiB", "vs_st0", "loss");
}

void print_record(const Record& r) {
  char range[32];
  std::snprintf(range, sizeof(range), "(%.1f-%.1f)", r.min_ms, r.max_ms);
  char ratio[16] = "-";
  if (r.ratio_to_stage0 >= 0) std::snprintf(ratio, sizeof(ratio), "%.3f", r.ratio_to_stage0);
  std::printf("  %5d %5s %9.2f %17s %10.2f %8.2f %8.2f %7s %6.1f %10.2f %9.2f %8s %10.6f\n",
              r.stage, zero::dtype_name(r.dtype), r.median_ms, range, r.compute_ms, r.comm_ms,
              r.exposed_ms, percent(r.overlap).c_str(), r.collectives, mib(r.model_state_bytes),
              mib(r.peak_bytes), ratio, r.final_loss);
}

// The targets, as measured: stage 3 within 1.3x of stage 0; stage 2's communication (its
// reduce-scatters during backward and its post-step all-gathers) more than half hidden behind
// compute, by the engine's figures; and whether compute dominated stage 0's step at all.
void print_targets(const std::vector<Record>& records) {
  for (const Record& r : records) {
    const char* dtype = zero::dtype_name(r.dtype);
    if (r.stage == 0 && r.comm_ms > 0) {
      std::printf(
          "# %s stage 0: compute %.1f ms vs collectives %.1f ms per step: compute %s "
          "(x%.1f)\n",
          dtype, r.compute_ms, r.comm_ms,
          r.compute_ms > r.comm_ms ? "dominates" : "does NOT dominate", r.compute_ms / r.comm_ms);
    }
    if (r.stage == 3 && r.ratio_to_stage0 >= 0) {
      std::printf("# target %s: stage 3 / stage 0 step time %.3f (target <= 1.3): %s\n", dtype,
                  r.ratio_to_stage0, r.ratio_to_stage0 <= 1.3 ? "met" : "MISSED");
    }
    if (r.stage == 2 && r.comm_ms > 0) {
      std::printf(
          "# target %s: stage 2 communication overlap %.1f%% (1 - comm_wait / comm_busy, "
          "target > 50%%): %s\n",
          dtype, 100.0 * r.overlap, r.overlap > 0.5 ? "met" : "MISSED");
    }
  }
}

// --- the benchmark ---------------------------------------------------------------------------

int run_benchmark(const Options& opt, zero::Communicator& comm) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  const long per_rank_total = static_cast<long>(world) * opt.micro_batches;
  if (opt.global_batch % per_rank_total != 0) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "zero-bench-step: --global-batch %ld does not split into %d rank(s) x %d "
                   "micro-batch(es) of equal size\n",
                   opt.global_batch, world, opt.micro_batches);
    }
    return 2;
  }
  const zero::models::TeacherTask task(opt.mlp, 1);
  std::vector<Record> records;
  bool header_printed = false;
  for (DType dtype : opt.dtypes) {
    std::vector<StageRun> runs(opt.stages.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      runs[i].stage = opt.stages[i];
      runs[i].dtype = dtype;
      runs[i].model = std::make_unique<zero::ZeroModel>(
          comm, zero::models::make_mlp(opt.mlp),
          engine_config(opt, opt.stages[i], dtype, !opt.trace_prefix.empty()));
      for (int w = 0; w < opt.warmup; ++w) train_step(runs[i], task, opt, rank, world);
    }
    if (rank == 0 && !header_printed) {
      print_header(opt, world, runs[0].model->engine().layout().numel());
      std::fflush(stdout);
      header_printed = true;
    }
    for (int round = 0; round < opt.rounds; ++round) {
      // Spread the steps over the rounds as evenly as the count allows.
      const int block = opt.steps / opt.rounds + (round < opt.steps % opt.rounds ? 1 : 0);
      for (StageRun& run : runs) measure_block(run, task, opt, comm, block);
    }
    std::vector<Record> dtype_records;
    for (StageRun& run : runs) dtype_records.push_back(summarize(run, world));
    for (Record& r : dtype_records) {
      if (dtype_records.front().stage == 0) {
        r.ratio_to_stage0 = r.median_ms / dtype_records.front().median_ms;
      }
      if (rank == 0) print_record(r);
      records.push_back(r);
    }
    if (rank == 0) std::fflush(stdout);
    if (!opt.trace_prefix.empty()) {
      for (StageRun& run : runs) {
        const std::string path = opt.trace_prefix + ".stage" + std::to_string(run.stage) + "." +
                                 zero::dtype_name(dtype) + ".json";
        run.model->engine().trace().write_chrome_trace(comm, path);
        if (rank == 0) std::printf("# trace of the last round written to %s\n", path.c_str());
      }
    }
  }
  if (rank != 0) return 0;
  print_targets(records);
  if (!opt.json_path.empty() && !write_json(opt.json_path, records, opt)) {
    std::fprintf(stderr, "zero-bench-step: cannot write %s\n", opt.json_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Flags are checked before MPI starts, so a usage error exits 2 on every rank at once.
  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const zero::driver::UsageError& e) {
    std::fprintf(stderr, "zero-bench-step: %s\n%s", e.what(), kUsage);
    return 2;
  }
  // Ranks already use every core; OpenBLAS threads on top would only contend with them.
  openblas_set_num_threads(1);
  if (opt.memory_table) {
    try {
      return memory_table(opt);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero-bench-step: error: %s\n", e.what());
      return 1;
    }
  }
  zero::MpiSession mpi(&argc, &argv);
  int status = 0;
  try {
    std::unique_ptr<zero::Communicator> comm =
        opt.max_elements_per_call > 0 ? zero::make_mpi_communicator(opt.max_elements_per_call)
                                      : zero::make_mpi_communicator();
    status = run_benchmark(opt, *comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-bench-step: rank %d: error: %s\n", mpi.world_rank(), e.what());
    // The other ranks may be waiting in a collective this rank will never join: end the job.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return status;
}
