#include "benchmarks/stage_bench.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <exception>

#include "driver/cli.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/kernels/blas_core.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/trace.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace zero::bench {

namespace {

using driver::parse_between;
using driver::split_commas;
using driver::usage_error;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One block of measured steps: barrier, steps (adding up the engine's figures), drain.
void measure_block(StageRun& run, const TrainStep& train_step, Communicator& comm, int steps) {
  Engine& engine = run.model->engine();
  comm.stream().synchronize();
  ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  engine.trace().clear();
  std::vector<double> starts{Trace::now_us()};
  for (int i = 0; i < steps; ++i) {
    run.data_step += 1;
    const StepStats stats = train_step(run);
    run.busy_ms += stats.comm_busy_ms;
    run.wait_ms += stats.comm_wait_ms;
    run.collectives += stats.collectives;
    if (i + 1 < steps) starts.push_back(Trace::now_us());
  }
  // The last step ends when what it left in flight (stages 1-3's post-step all-gathers) is done.
  comm.stream().synchronize();
  starts.push_back(Trace::now_us());
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    run.step_ms.push_back((starts[i + 1] - starts[i]) / 1000.0);
  }
}

// Combines the ranks' measurements into one record (collective: every rank calls it).
Record summarize(StageRun& run, int world) {
  Engine& engine = run.model->engine();
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
  r.plan_model_state_bytes = plan_memory(engine.layout(), engine.config()).model_state;
  return r;
}

}  // namespace

const char* const kStageUsage =
    "  --dtype         comma-separated working dtypes: fp32, bf16, fp16 (default fp32)\n"
    "  --stages        comma-separated ZeRO stages (default 0,1,2,3)\n"
    "  --micro-batches gradient accumulation steps (default 1)\n"
    "  --steps         measured steps per stage, split over the rounds\n"
    "  --warmup        unmeasured steps per stage first\n"
    "  --rounds        interleaved blocks of measured steps per stage\n"
    "  --threads       threads of every kernel and GEMM per rank (default 1)\n"
    "  --merge-bytes   merge neighbouring modules into units up to this size (default 0: off)\n"
    "  --overlap-comm  0: wait for every collective as soon as it is issued (default 1)\n"
    "  --max-elements-per-call  split every MPI call of a collective into pieces of at most\n"
    "                  N elements (default: no limit below INT_MAX)\n"
    "  --json          also write one record per stage and dtype to FILE (a JSON array)\n"
    "  --trace         write PREFIX.stageS.DTYPE.json: a Chrome trace of each stage's last round\n";

bool parse_stage_flag(const std::string& flag, const std::string& value, StageOptions* opt) {
  const auto count = [&](int min_value) {
    return static_cast<int>(parse_between(flag, value, min_value, INT_MAX));
  };
  if (flag == "--dtype") {
    opt->dtypes.clear();
    for (const std::string& item : split_commas(flag, value)) {
      DType dtype;
      if (!parse_dtype(item, &dtype)) {
        usage_error("--dtype: unknown dtype '" + item + "' (fp32, bf16, fp16)");
      }
      opt->dtypes.push_back(dtype);
    }
  } else if (flag == "--stages") {
    opt->stages.clear();
    for (const std::string& item : split_commas(flag, value)) {
      const int stage = static_cast<int>(parse_between(flag, item, 0, 3));
      if (std::find(opt->stages.begin(), opt->stages.end(), stage) != opt->stages.end()) {
        usage_error("--stages lists stage " + item + " twice");
      }
      opt->stages.push_back(stage);
    }
    std::sort(opt->stages.begin(), opt->stages.end());
  } else if (flag == "--micro-batches") {
    opt->micro_batches = count(1);
  } else if (flag == "--steps") {
    opt->steps = count(1);
  } else if (flag == "--warmup") {
    opt->warmup = count(0);
  } else if (flag == "--rounds") {
    opt->rounds = count(1);
  } else if (flag == "--threads") {
    opt->kernel_threads = count(1);
  } else if (flag == "--merge-bytes") {
    opt->merge_bytes = static_cast<size_t>(parse_between(flag, value, 0, LONG_MAX));
  } else if (flag == "--overlap-comm") {
    opt->overlap_comm = parse_between(flag, value, 0, 1) == 1;
  } else if (flag == "--max-elements-per-call") {
    opt->max_elements_per_call = static_cast<size_t>(parse_between(flag, value, 1, INT_MAX));
  } else if (flag == "--json") {
    opt->json_path = value;
  } else if (flag == "--trace") {
    opt->trace_prefix = value;
  } else {
    return false;
  }
  return true;
}

void check_stage_options(const StageOptions& opt) {
  if (opt.rounds > opt.steps) {
    usage_error("--rounds (" + std::to_string(opt.rounds) + ") must not exceed --steps (" +
                std::to_string(opt.steps) + "): every round measures at least one step");
  }
}

EngineConfig engine_config(const StageOptions& opt, int stage, DType dtype, bool trace) {
  EngineConfig config;
  config.stage = stage;
  config.dtype = dtype;
  config.micro_batches = opt.micro_batches;
  config.merge_bytes = opt.merge_bytes;
  config.overlap_comm = opt.overlap_comm;
  config.kernel_threads = opt.kernel_threads;
  config.trace = trace;
  return config;
}

std::vector<Record> measure_stages(const StageOptions& opt, DType dtype, Communicator& comm,
                                   const MakeModel& make_model, const TrainStep& train_step) {
  const bool trace = !opt.trace_prefix.empty();
  std::vector<StageRun> runs(opt.stages.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].stage = opt.stages[i];
    runs[i].dtype = dtype;
    runs[i].model = make_model(opt.stages[i], dtype, trace);
    for (int w = 0; w < opt.warmup; ++w) {
      runs[i].data_step += 1;
      train_step(runs[i]);
    }
  }
  for (int round = 0; round < opt.rounds; ++round) {
    // Spread the steps over the rounds as evenly as the count allows.
    const int block = opt.steps / opt.rounds + (round < opt.steps % opt.rounds ? 1 : 0);
    for (StageRun& run : runs) measure_block(run, train_step, comm, block);
  }
  std::vector<Record> records;
  for (StageRun& run : runs) records.push_back(summarize(run, comm.world_size()));
  for (Record& r : records) {
    if (records.front().stage == 0) r.ratio_to_stage0 = r.median_ms / records.front().median_ms;
  }
  if (trace) {
    for (StageRun& run : runs) {
      const std::string path = opt.trace_prefix + ".stage" + std::to_string(run.stage) + "." +
                               dtype_name(dtype) + ".json";
      run.model->engine().trace().write_chrome_trace(comm, path);
      if (comm.rank() == 0) std::printf("# trace of the last round written to %s\n", path.c_str());
    }
  }
  return records;
}

driver::JsonRecord record_json(const Record& r, const StageOptions& opt) {
  using driver::rounded;
  driver::JsonRecord ratio;  // null: stage 0 was not measured
  if (r.ratio_to_stage0 >= 0) ratio = rounded(r.ratio_to_stage0, 4);
  return {{"stage", r.stage},
          {"dtype", dtype_name(r.dtype)},
          {"world_size", r.world},
          {"params", r.params},
          {"padded_params", r.padded_params},
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
          {"ratio_to_stage0", ratio},
          {"final_loss", r.final_loss}};
}

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

std::string percent(double fraction) {
  if (fraction < 0) return "-";
  char text[16];
  std::snprintf(text, sizeof(text), "%.0f%%", 100.0 * fraction);
  return text;
}

void print_record_header() {
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
              r.stage, dtype_name(r.dtype), r.median_ms, range, r.compute_ms, r.comm_ms,
              r.exposed_ms, percent(r.overlap).c_str(), r.collectives, mib(r.model_state_bytes),
              mib(r.peak_bytes), ratio, r.final_loss);
}

int run_with_mpi(int* argc, char*** argv, const char* program, const StageOptions& opt,
                 const std::function<int(Communicator&)>& run) {
  // Ranks already use every core; OpenBLAS threads on top would only contend with them (the
  // kernels split their GEMMs over --threads themselves).
  openblas_set_num_threads(1);
  MpiSession mpi(argc, argv);
  const std::string blas_warning = kernels::blas_core_warning();
  if (mpi.world_rank() == 0 && !blas_warning.empty()) {
    std::fprintf(stderr, "%s: %s\n", program, blas_warning.c_str());
  }
  try {
    std::unique_ptr<Communicator> comm = opt.max_elements_per_call > 0
                                             ? make_mpi_communicator(opt.max_elements_per_call)
                                             : make_mpi_communicator();
    return run(*comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: error: %s\n", program, mpi.world_rank(), e.what());
    // The other ranks may be waiting in a collective this rank will never join: end the job.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}

TrainStep forward_backward_step(SourceOf source_of, long global_batch, int micro_batches, int rank,
                                int world) {
  return [=](StageRun& run) {
    const float loss_sum = models::forward_backward(*run.model, source_of(run.stage), run.data_step,
                                                    global_batch, micro_batches, rank, world);
    const StepStats stats = run.model->step();
    run.last_loss = loss_sum / static_cast<float>(micro_batches);
    return stats;
  };
}

std::vector<Record> measure_dtypes(const StageOptions& opt, Communicator& comm,
                                   const MakeModel& make_model, const TrainStep& train_step,
                                   const std::function<void(const Record& first)>& header) {
  std::vector<Record> records;
  for (DType dtype : opt.dtypes) {
    const std::vector<Record> dtype_records =
        measure_stages(opt, dtype, comm, make_model, train_step);
    if (comm.rank() == 0) {
      if (records.empty()) header(dtype_records.front());
      for (const Record& r : dtype_records) print_record(r);
      std::fflush(stdout);
    }
    records.insert(records.end(), dtype_records.begin(), dtype_records.end());
  }
  return records;
}

}  // namespace zero::bench
