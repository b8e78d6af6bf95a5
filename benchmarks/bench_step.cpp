// zero-bench-step: whole training steps of the example MLP at ZeRO stages 0-3 on the ranks mpirun
// started, side by side. Per stage and dtype: the median step time, the time spent in collectives
// and the share of it that ran behind compute, model-state and peak memory per rank, and the step
// time over stage 0's.
//
//   zerorun -np 2 -- zero-bench-step                    the default: the target configuration
//   zerorun -np 2 -- zero-bench-step --dtype fp32,bf16 --json step.json
//   zero-bench-step --memory-table --json memory.json   plan_memory at 1..8 ranks, no MPI at all
//   zerorun --hostfile H -- zero-bench-step --collectives hierarchical,mpi --link-counters
//   zero-node
//                              the multi-node mode: both transports alternating, and the bytes
//                              that crossed between nodes per step (docs/multinode.md)
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
//  - The multi-node mode measures every stage on one communicator per --collectives entry, all
//    in the same interleaved rounds, so the transports are compared under the same load. The
//    bytes across nodes are not the engine's counters but what the links carried: with
//    --link-counters PREFIX, rank 0 sums the transmit counters of the host's interfaces PREFIX*
//    (for netns_cluster.sh, zero-nodeK: everything delivered into node K) after a barrier before
//    and after each block, divided by the block's steps (frame headers and the barriers'
//    few bytes included). formula_MB beside it is what should cross (Record::link_formula_bytes):
//    for the hierarchical path, from the engine's counted all-gathers; for hybrid sharding with
//    a shard group per node, its sums across replicas. MPI alone has none (its algorithms are
//    OpenMPI's choice), only its measured bytes.
//  - Memory is Engine::model_state_bytes() and the engine allocator's peak (model state plus the
//    pooled gradient buckets and gathered-parameter buffers; activations are host vectors the
//    allocator does not see), the maximum over ranks.
#include <mpi.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/stage_bench.h"
#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "models/mlp.h"
#include "models/train_step.h"
#include "zero/core/check.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/estimate.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/model.h"
#include "zero/runtime/trace.h"

namespace {

using zero::DType;
using zero::bench::Record;
using zero::bench::StageOptions;
using zero::bench::StageRun;

// --- command line ----------------------------------------------------------------------------

// The default is the target configuration: four 1024x1024 hidden layers between narrow
// input and output layers, 128 samples per rank at 2 ranks. A hidden layer does 6 x 128 flops
// per parameter per step (forward and backward GEMMs) against at most 12 bytes of collectives
// per parameter, so compute dominates; the narrow ends keep the batch generation cheap.
struct Options {
  zero::models::MlpConfig mlp{64, 1024, 64, 6};
  long global_batch = 256;
  StageOptions run;
  bool memory_table = false;
  int max_ranks = 8;
};

const std::string kUsage =
    std::string(
        "usage: zero-bench-step [--dtype LIST] [--stages LIST] [--input-dim N] [--hidden N]\n"
        "                       [--output-dim N] [--layers N] [--global-batch B]\n"
        "                       [--micro-batches K] [--steps N] [--warmup N] [--rounds R]\n"
        "                       [--threads N] [--merge-bytes N] [--overlap-comm 0|1]\n"
        "                       [--max-elements-per-call N] [--json FILE] [--trace PREFIX]\n"
        "       zero-bench-step --memory-table [--max-ranks N] [model and dtype flags] [--json "
        "FILE]\n"
        "  --input-dim, --hidden, --output-dim, --layers   the MLP (default 64, 1024, 64, 6)\n"
        "  --global-batch  samples per step over all ranks (default 256)\n"
        "  --memory-table  print plan_memory against the ZeRO formula for 1..--max-ranks ranks\n"
        "                  (default 8) and every stage, without starting MPI\n"
        "  (--steps, --warmup, --rounds default to 12, 2, 4)\n") +
    zero::bench::kStageUsage;

Options parse_options(int argc, char** argv) {
  using zero::driver::integer_flag;
  Options opt;
  zero::driver::FlagTable flags = zero::bench::stage_flags(&opt.run);
  flags.insert({{"--input-dim", integer_flag(&opt.mlp.input_dim, 1)},
                {"--hidden", integer_flag(&opt.mlp.hidden_dim, 1)},
                {"--output-dim", integer_flag(&opt.mlp.output_dim, 1)},
                {"--layers", integer_flag(&opt.mlp.layers, 1)},
                {"--global-batch", integer_flag(&opt.global_batch, 1, LONG_MAX)},
                {"--max-ranks", integer_flag(&opt.max_ranks, 1, 1024)}});
  zero::driver::parse_flags(argc, argv, kUsage, flags, {{"--memory-table", &opt.memory_table}});
  zero::bench::check_stage_options(opt.run);
  return opt;
}

// --- the model as the engine sees it ---------------------------------------------------------

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

// --- memory table: plan_memory against the formula, no MPI ------------------------------------

// --- memory table: plan_memory against the formula, no MPI ------------------------------------

int memory_table(const Options& opt) {
  const std::vector<zero::ParamSpec> specs = zero::models::mlp_param_specs(opt.mlp);
  // The file is created (or emptied) at once, so a path that cannot be written fails first.
  if (!opt.run.json_path.empty() && !zero::driver::write_json_array(opt.run.json_path, {})) {
    std::fprintf(stderr, "zero-bench-step: cannot write %s\n", opt.run.json_path.c_str());
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
  for (DType dtype : opt.run.dtypes) {
    for (int stage : opt.run.stages) {
      for (int ranks = 1; ranks <= opt.max_ranks; ++ranks) {
        const zero::Layout layout =
            zero::Layout::build(specs, zero::LayoutOptions{ranks, dtype, 64, opt.run.merge_bytes});
        const zero::MemoryPlan plan =
            zero::plan_memory(layout, zero::bench::engine_config(opt.run, stage, dtype, false));
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
  if (!opt.run.json_path.empty()) {
    if (!zero::driver::write_json_array(opt.run.json_path, json)) {
      std::fprintf(stderr, "zero-bench-step: error writing %s\n", opt.run.json_path.c_str());
      return 1;
    }
  }
  return 0;
}

// --- one step of the MLP ---------------------------------------------------------------------

// The teacher task's micro-batches: inputs, and the mean squared error against the targets.
class TeacherSource : public zero::models::MicroBatchSource {
 public:
  explicit TeacherSource(const zero::models::TeacherTask& task) : task_(task) {}
  zero::Tensor input(long step, int64_t first, int64_t count) override {
    zero::models::Batch batch = task_.batch(step, first, count);
    targets_ = std::move(batch.targets);
    return std::move(batch.inputs);
  }
  float loss(const zero::Tensor& output, zero::Tensor& grad) override {
    return zero::models::mse_loss(output, targets_.to(output.device()), grad);
  }

 private:
  const zero::models::TeacherTask& task_;
  zero::Tensor targets_;
};

// --- results ---------------------------------------------------------------------------------

// --json: one record per stage and dtype, figures rounded as the report shows them.
bool write_json(const std::string& path, const std::vector<Record>& records, const Options& opt) {
  std::vector<zero::driver::JsonRecord> json;
  for (const Record& r : records) {
    zero::driver::JsonRecord record = zero::bench::record_json(r, opt.run);
    record["input_dim"] = opt.mlp.input_dim;
    record["hidden"] = opt.mlp.hidden_dim;
    record["output_dim"] = opt.mlp.output_dim;
    record["layers"] = opt.mlp.layers;
    record["global_batch"] = opt.global_batch;
    json.push_back(record);
  }
  return zero::driver::write_json_array(path, json);
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
      "OpenBLAS and kernels on %d thread(s) per rank\n"
      "# work per rank per step: %.2f GFLOP of GEMMs against at most %.1f MB of collectives "
      "(stage 3, fp32): %.0f flop per byte moved, so compute should dominate; the measured times "
      "per step are below\n"
      "# step: median over steps of the slowest rank's step; per step, mean over ranks, from the "
      "engine's StepStats: comm = comm_busy_ms, exposed = comm_wait_ms (compute blocked on a "
      "collective), compute = step - exposed, colls = collectives issued; overlap = 1 - "
      "sum(wait) / sum(busy)\n",
      opt.mlp.input_dim, opt.mlp.hidden_dim, opt.mlp.layers, opt.mlp.output_dim, params, world,
      opt.global_batch, per_rank, opt.run.micro_batches, opt.run.overlap_comm ? "on" : "off",
      opt.run.steps, opt.run.rounds, opt.run.warmup, opt.run.kernel_threads, gflop, mb3,
      mb3 > 0 ? gflop * 1e9 / (mb3 * 1e6) : 0.0);
  zero::bench::print_record_header(opt.run);
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
    if (r.stage == 3 && r.sharding.mics_shard_size < 0 && !r.sharding.zeropp.any() &&
        r.ratio_to_stage0 >= 0) {
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

int run_benchmark(const Options& opt, const zero::bench::Communicators& comms) {
  zero::Communicator& comm = *comms.front();
  const int rank = comm.rank();
  const int world = comm.world_size();
  const long per_rank_total = static_cast<long>(world) * opt.run.micro_batches;
  if (opt.global_batch % per_rank_total != 0) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "zero-bench-step: --global-batch %ld does not split into %d rank(s) x %d "
                   "micro-batch(es) of equal size\n",
                   opt.global_batch, world, opt.run.micro_batches);
    }
    return 2;
  }
  const zero::models::TeacherTask task(opt.mlp, 1);
  TeacherSource source(task);
  const zero::bench::MakeModel make_model = [&](zero::Communicator& on,
                                                const zero::EngineConfig& config) {
    return std::make_unique<zero::ZeroModel>(on, zero::models::make_mlp(opt.mlp), config);
  };
  const zero::bench::TrainStep step = zero::bench::forward_backward_step(
      [&](const zero::bench::StageRun&) -> zero::models::MicroBatchSource& { return source; },
      opt.global_batch, opt.run.micro_batches, rank, world);
  const std::vector<Record> records = zero::bench::measure_dtypes(
      opt.run, comms, make_model, step,
      [&](const Record& first) { print_header(opt, world, first.params); });
  if (rank != 0) return 0;
  print_targets(records);
  if (!opt.run.json_path.empty() && !write_json(opt.run.json_path, records, opt)) {
    std::fprintf(stderr, "zero-bench-step: cannot write %s\n", opt.run.json_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> parsed = zero::driver::parse_command_line(
      "zero-bench-step", kUsage, [&] { return parse_options(argc, argv); });
  if (!parsed) return 2;
  const Options& opt = *parsed;
  if (opt.memory_table) {
    try {
      return memory_table(opt);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero-bench-step: error: %s\n", e.what());
      return 1;
    }
  }
  return zero::bench::run_with_mpi(
      &argc, &argv, "zero-bench-step", opt.run,
      [&](const zero::bench::Communicators& comms) { return run_benchmark(opt, comms); });
}
