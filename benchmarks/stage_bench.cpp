#include "benchmarks/stage_bench.h"

#include <dirent.h>
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>

#include "driver/cli.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"
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

// Bytes the interfaces /sys/class/net/PREFIX* have transmitted so far, summed. The files are
// the host's (the nodes share its mount namespace), so any rank can read them.
uint64_t link_tx_bytes(const std::string& prefix) {
  const std::string root = "/sys/class/net";
  uint64_t total = 0;
  int links = 0;
  DIR* dir = opendir(root.c_str());
  ZERO_CHECK(dir != nullptr, "--link-counters: cannot list " << root);
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string path = root + "/" + name + "/statistics/tx_bytes";
    std::ifstream file(path);
    uint64_t bytes = 0;
    if (!(file >> bytes)) {
      closedir(dir);
      ZERO_FAIL("--link-counters: cannot read " << path);
    }
    total += bytes;
    ++links;
  }
  ZERO_CHECK(closedir(dir) == 0,
             "--link-counters: closedir(" << root << "): " << std::strerror(errno));
  ZERO_CHECK(links > 0,
             "--link-counters: no interface " << root << "/" << prefix << "* (is the cluster up?)");
  return total;
}

// Nodes the job spans (ranks that share memory count as one node).
int nodes_of_job() {
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local_rank = 0;
  const int status = MPI_Comm_rank(node, &local_rank);
  const int freed = MPI_Comm_free(&node);
  ZERO_MPI_CHECK(status);
  ZERO_MPI_CHECK(freed);
  int leader = local_rank == 0 ? 1 : 0, nodes = 0;
  ZERO_MPI_CHECK(MPI_Allreduce(&leader, &nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
  return nodes;
}

// Record::link_formula_bytes of a hierarchical run over `nodes` nodes, from what one rank's
// engine sent per step (CommCounters: the ring's share of each collective's buffer); -1 where
// there is none.
double hierarchical_link_formula(const Record& r, int nodes, int micro_batches,
                                 const StageRun& run) {
  const double steps = static_cast<double>(r.steps);
  const auto buffer = [&r, steps](CollectiveOp op, uint64_t sent) {
    return r.world > 1 ? static_cast<double>(sent) / steps / ring_share(op, r.world).factor() : 0.0;
  };
  const int reductions = r.stage >= 2 ? micro_batches : 1;
  double reduced = 4.0 * static_cast<double>(r.padded_params) * reductions;
  double quantized_across = 0;
  if (r.sharding.zeropp.quantized_gradients) {
    // What qgZ leaves exact still goes the hierarchical way, as fp32 partial sums: the counters'
    // bytes are the wire dtype's, which is fp32 only in an fp32 run (no formula otherwise). Its
    // quantized second hop crosses whole, from every rank.
    if (r.dtype != DType::kFloat32) return -1;
    reduced = buffer(CollectiveOp::kReduceScatter, run.reduce_scatter_bytes_sent);
    quantized_across = r.world * (static_cast<double>(run.quantized_bytes_across_nodes) / steps);
  }
  const double gathered = buffer(CollectiveOp::kAllGather, run.gather_bytes_sent);
  const double per_node_pair = r.stage == 0 ? 2 * reduced : reduced + gathered;
  return (nodes - 1) * per_node_pair + quantized_across;
}

// A --collectives entry as the communicator's transport: the ZERO_COLLECTIVES values.
CpuTransport transport_named(const std::string& name) {
  if (name == "auto") return CpuTransport::kFromEnvironment;
  if (name == "mpi") return CpuTransport::kMpi;
  if (name == "shm") return CpuTransport::kSharedMemory;
  if (name == "hierarchical") return CpuTransport::kHierarchical;
  usage_error("--collectives: unknown transport '" + name + "' (auto, mpi, shm, hierarchical)");
}

// One block of measured steps: barrier, steps (adding up the engine's figures), drain. With
// link counters, rank 0 reads them after the first barrier and after a last one, when every
// rank's collectives are done and what they sent has arrived.
void measure_block(StageRun& run, const TrainStep& train_step, const StageOptions& opt, int steps) {
  Engine& engine = run.model->engine();
  Communicator& comm = *run.comm;
  const bool count_links = !opt.link_counters.empty() && comm.rank() == 0;
  engine.communicator().stream().synchronize();
  ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const uint64_t links_before = count_links ? link_tx_bytes(opt.link_counters) : 0;
  engine.trace().clear();
  const auto sent = [&engine](CollectiveOp op) {
    return engine.communicator().counters().bytes[static_cast<size_t>(op)];
  };
  // With hybrid sharding own_comm_bytes is the shard and replica groups' (engine.communicator()
  // is the shard group).
  const bool hybrid = run.sharding.mics_shard_size > 0;
  const auto replica_sent = [&engine, hybrid]() -> uint64_t {
    if (!hybrid) return 0;
    return engine.own_comm_bytes() - engine.communicator().counters().total_bytes();
  };
  const uint64_t gather_before = sent(CollectiveOp::kAllGather);
  const uint64_t replica_before = replica_sent();
  const uint64_t reduce_scatter_before = sent(CollectiveOp::kReduceScatter);
  const uint64_t quantized_across_before = engine.quantized_bytes_across_nodes();
  std::vector<double> starts{Trace::now_us()};
  for (int i = 0; i < steps; ++i) {
    run.data_step += 1;
    const StepStats stats = train_step(run);
    run.busy_ms += stats.comm_busy_ms;
    run.wait_ms += stats.comm_wait_ms;
    run.collectives += stats.collectives;
    if (i + 1 < steps) starts.push_back(Trace::now_us());
  }
  // The last step ends when what it left in flight (stages 1-3's post-step all-gathers, stage
  // 3's prefetch of the first unit) is done, on the engine's communicator (hybrid sharding's
  // shard group: not the world's).
  engine.communicator().stream().synchronize();
  run.gather_bytes_sent += sent(CollectiveOp::kAllGather) - gather_before;
  run.replica_bytes_sent += replica_sent() - replica_before;
  run.reduce_scatter_bytes_sent += sent(CollectiveOp::kReduceScatter) - reduce_scatter_before;
  run.quantized_bytes_across_nodes +=
      engine.quantized_bytes_across_nodes() - quantized_across_before;
  starts.push_back(Trace::now_us());
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    run.step_ms.push_back((starts[i + 1] - starts[i]) / 1000.0);
  }
  if (!opt.link_counters.empty()) {
    ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (count_links) run.link_bytes += link_tx_bytes(opt.link_counters) - links_before;
  }
}

// Combines the ranks' measurements into one record (collective: every rank calls it).
Record summarize(StageRun& run, int world, const StageOptions& opt) {
  Engine& engine = run.model->engine();
  Record r;
  r.transport = run.comm->transport();
  r.stage = run.stage;
  r.sharding = run.sharding;
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
  uint64_t link_bytes = run.link_bytes;  // rank 0's reading; the others hold 0
  ZERO_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, &link_bytes, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
  if (!opt.link_counters.empty()) {
    r.link_bytes_per_step = static_cast<double>(link_bytes) / r.steps;
  }
  return r;
}

}  // namespace

std::string ZeroPlusPlus::name() const {
  std::string out;
  const auto add = [&out](bool set, const char* part) {
    if (!set) return;
    if (!out.empty()) out += "+";
    out += part;
  };
  add(quantized_weights, "qwz");
  add(hpz, "hpz");
  add(quantized_gradients, "qgz");
  return out;
}

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
    "  --trace         write PREFIX.stageS.DTYPE.json: a Chrome trace of each stage's last round\n"
    "  --collectives   multi-node mode: comma-separated ZERO_COLLECTIVES values (auto, mpi, shm,\n"
    "                  hierarchical), each stage measured on each, alternating (default: one,\n"
    "                  from the environment)\n"
    "  --link-counters multi-node mode: add up the transmit counters of /sys/class/net/PREFIX*\n"
    "                  (zero-node: netns_cluster.sh's links) as the bytes across nodes\n"
    "  --mics-shard-size  also measure stage 3 with hybrid sharding over groups of K ranks\n"
    "                  (MiCS), alternating with stage 3 over all ranks (default 0: off)\n"
    "  --zeropp        also measure stage 3 with ZeRO++, one variant per comma-separated\n"
    "                  set of qwz (int8 weight all-gathers), hpz (a secondary shard per node)\n"
    "                  and qgz (int8 gradient reduction) joined by '+', e.g. qwz+hpz+qgz,hpz\n";

driver::FlagTable stage_flags(StageOptions* opt) {
  using driver::integer_flag;
  using driver::text_flag;
  const auto dtypes = [opt](const std::string& flag, const std::string& value) {
    opt->dtypes.clear();
    for (const std::string& item : split_commas(flag, value)) {
      DType dtype;
      if (!parse_dtype(item, &dtype)) {
        usage_error("--dtype: unknown dtype '" + item + "' (fp32, bf16, fp16)");
      }
      opt->dtypes.push_back(dtype);
    }
  };
  const auto stages = [opt](const std::string& flag, const std::string& value) {
    opt->stages.clear();
    for (const std::string& item : split_commas(flag, value)) {
      const int stage = static_cast<int>(parse_between(flag, item, 0, 3));
      if (std::find(opt->stages.begin(), opt->stages.end(), stage) != opt->stages.end()) {
        usage_error("--stages lists stage " + item + " twice");
      }
      opt->stages.push_back(stage);
    }
    std::sort(opt->stages.begin(), opt->stages.end());
  };
  const auto overlap_comm = [opt](const std::string& flag, const std::string& value) {
    opt->overlap_comm = parse_between(flag, value, 0, 1) == 1;
  };
  const auto collectives = [opt](const std::string& flag, const std::string& value) {
    opt->collectives.clear();
    for (const std::string& item : split_commas(flag, value)) {
      transport_named(item);  // a bad name is a usage error now, before MPI starts
      opt->collectives.push_back(item);
    }
  };
  const auto link_counters = [opt](const std::string&, const std::string& value) {
    if (value.empty() || value.find('/') != std::string::npos) {
      usage_error("--link-counters takes an interface name prefix, got '" + value + "'");
    }
    opt->link_counters = value;
  };
  const auto zeropp = [opt](const std::string& flag, const std::string& value) {
    opt->zeropp.clear();
    for (const std::string& set : split_commas(flag, value)) {
      ZeroPlusPlus z;
      size_t start = 0;
      while (start <= set.size()) {
        const size_t end = std::min(set.find('+', start), set.size());
        const std::string part = set.substr(start, end - start);
        bool* setting = part == "qwz"   ? &z.quantized_weights
                        : part == "hpz" ? &z.hpz
                        : part == "qgz" ? &z.quantized_gradients
                                        : nullptr;
        if (setting == nullptr) {
          usage_error(flag + ": unknown ZeRO++ setting '" + part + "' in '" + set +
                      "' (qwz, hpz, qgz, joined by '+')");
        }
        if (*setting) usage_error(flag + ": '" + set + "' names " + part + " twice");
        *setting = true;
        start = end + 1;
      }
      opt->zeropp.push_back(z);
    }
  };
  return {{"--dtype", dtypes},
          {"--stages", stages},
          {"--micro-batches", integer_flag(&opt->micro_batches, 1)},
          {"--steps", integer_flag(&opt->steps, 1)},
          {"--warmup", integer_flag(&opt->warmup, 0)},
          {"--rounds", integer_flag(&opt->rounds, 1)},
          {"--threads", integer_flag(&opt->kernel_threads, 1)},
          {"--merge-bytes", integer_flag(&opt->merge_bytes, 0, LONG_MAX)},
          {"--overlap-comm", overlap_comm},
          {"--max-elements-per-call", integer_flag(&opt->max_elements_per_call, 1)},
          {"--json", text_flag(&opt->json_path)},
          {"--trace", text_flag(&opt->trace_prefix)},
          {"--collectives", collectives},
          {"--mics-shard-size", integer_flag(&opt->mics_shard_size, 1)},
          {"--zeropp", zeropp},
          {"--link-counters", link_counters}};
}

void check_stage_options(const StageOptions& opt) {
  if (opt.rounds > opt.steps) {
    usage_error("--rounds (" + std::to_string(opt.rounds) + ") must not exceed --steps (" +
                std::to_string(opt.steps) + "): every round measures at least one step");
  }
  if (opt.mics_shard_size > 0 &&
      std::find(opt.stages.begin(), opt.stages.end(), 3) == opt.stages.end()) {
    usage_error("--mics-shard-size shards stage 3, which --stages does not list");
  }
  if (!opt.zeropp.empty() &&
      std::find(opt.stages.begin(), opt.stages.end(), 3) == opt.stages.end()) {
    usage_error("--zeropp varies stage 3, which --stages does not list");
  }
}

EngineConfig engine_config(const StageOptions& opt, int stage, DType dtype, bool trace) {
  EngineConfig config;
  config.stage = stage;
  config.precision.dtype = dtype;
  config.micro_batches = opt.micro_batches;
  config.schedule.merge_bytes = opt.merge_bytes;
  config.schedule.overlap_comm = opt.overlap_comm;
  config.kernel_threads = opt.kernel_threads;
  config.trace = trace;
  return config;
}

std::vector<Record> measure_stages(const StageOptions& opt, DType dtype, const Communicators& comms,
                                   const MakeModel& make_model, const TrainStep& train_step) {
  const bool trace = !opt.trace_prefix.empty();
  std::vector<StageRun> runs;
  for (Communicator* comm : comms) {
    for (int stage : opt.stages) {
      std::vector<Sharding> shardings = {Sharding{}};
      if (stage == 3 && opt.mics_shard_size > 0) {
        shardings.push_back(Sharding{opt.mics_shard_size, {}});
      }
      if (stage == 3) {
        for (const ZeroPlusPlus& zeropp : opt.zeropp) shardings.push_back(Sharding{-1, zeropp});
      }
      for (const Sharding& sharding : shardings) {
        StageRun run;
        run.comm = comm;
        run.stage = stage;
        run.sharding = sharding;
        run.dtype = dtype;
        EngineConfig config = engine_config(opt, stage, dtype, trace);
        config.grid.mics_shard_size = sharding.mics_shard_size;
        config.precision.quantized_weights = sharding.zeropp.quantized_weights;
        config.precision.quantized_gradients = sharding.zeropp.quantized_gradients;
        if (sharding.zeropp.hpz) {
          config.grid.hpz_partition_size = ranks_per_node(*comm);
          ZERO_CHECK(config.grid.hpz_partition_size > 0,
                     "--zeropp hpz: the ranks do not form equal nodes of consecutive ranks, "
                     "which hpZ's secondary shard spans");
        }
        run.model = make_model(*comm, config);
        for (int w = 0; w < opt.warmup; ++w) {
          run.data_step += 1;
          train_step(run);
        }
        runs.push_back(std::move(run));
      }
    }
  }
  for (int round = 0; round < opt.rounds; ++round) {
    // Spread the steps over the rounds as evenly as the count allows.
    const int block = opt.steps / opt.rounds + (round < opt.steps % opt.rounds ? 1 : 0);
    for (StageRun& run : runs) measure_block(run, train_step, opt, block);
  }
  std::vector<Record> records;
  for (StageRun& run : runs) records.push_back(summarize(run, run.comm->world_size(), opt));
  const int nodes = nodes_of_job();
  for (size_t i = 0; i < records.size(); ++i) {
    Record& r = records[i];
    const StageRun& run = runs[i];
    const double steps = static_cast<double>(r.steps);
    const bool hierarchical = r.transport.rfind("hierarchical", 0) == 0;
    const int mics_shard_size = r.sharding.mics_shard_size;
    if (hierarchical && mics_shard_size < 0) {
      r.link_formula_bytes = hierarchical_link_formula(r, nodes, opt.micro_batches, run);
    }
    const bool shard_group_per_node = mics_shard_size > 0 && mics_shard_size * nodes == r.world;
    if (nodes > 1 && shard_group_per_node) {
      r.link_formula_bytes = r.world * (run.replica_bytes_sent / steps);
    }
  }
  for (Record& r : records) {
    for (const Record& base : records) {
      if (base.stage == 0 && base.transport == r.transport) {
        r.ratio_to_stage0 = r.median_ms / base.median_ms;
      }
    }
  }
  if (trace) {
    for (StageRun& run : runs) {
      std::string sharding;
      if (run.sharding.mics_shard_size > 0) {
        sharding = ".mics" + std::to_string(run.sharding.mics_shard_size);
      }
      if (run.sharding.zeropp.any()) sharding = "." + run.sharding.zeropp.name();
      const std::string path = opt.trace_prefix + ".stage" + std::to_string(run.stage) + sharding +
                               "." + dtype_name(dtype) + ".json";
      run.model->engine().trace().write_chrome_trace(*run.comm, path);
      if (run.comm->rank() == 0) {
        std::printf("# trace of the last round written to %s\n", path.c_str());
      }
    }
  }
  return records;
}

driver::JsonRecord record_json(const Record& r, const StageOptions& opt) {
  using driver::rounded;
  driver::JsonRecord ratio;  // null: stage 0 was not measured
  if (r.ratio_to_stage0 >= 0) ratio = rounded(r.ratio_to_stage0, 4);
  return {{"stage", r.stage},
          {"mics_shard_size", r.sharding.mics_shard_size > 0
                                  ? driver::JsonRecord(r.sharding.mics_shard_size)
                                  : driver::JsonRecord()},
          {"zeropp", r.sharding.zeropp.any() ? driver::JsonRecord(r.sharding.zeropp.name())
                                             : driver::JsonRecord()},
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
          {"final_loss", r.final_loss},
          {"collectives", r.transport},
          {"link_formula_bytes_per_step",
           r.link_formula_bytes < 0 ? driver::JsonRecord()
                                    : driver::JsonRecord(rounded(r.link_formula_bytes, 0))},
          {"link_bytes_per_step", r.link_bytes_per_step < 0
                                      ? driver::JsonRecord()
                                      : driver::JsonRecord(rounded(r.link_bytes_per_step, 0))}};
}

std::string stage_label(const Record& r) {
  std::string label = std::to_string(r.stage);
  if (r.sharding.mics_shard_size > 0) label += "/m" + std::to_string(r.sharding.mics_shard_size);
  if (r.sharding.zeropp.any()) label += "/" + r.sharding.zeropp.name();
  return label;
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

namespace {

bool multinode_mode(const StageOptions& opt) {
  return !opt.collectives.empty() || !opt.link_counters.empty();
}

}  // namespace

void print_record_header(const StageOptions& opt) {
  std::printf("# %5s %5s %9s %17s %10s %8s %8s %7s %6s %10s %9s %8s %10s", "stage", "dtype",
              "step_ms", "(min-max)", "compute_ms", "comm_ms", "exposed", "overlap", "colls",
              "state_MiB", "peak_MiB", "vs_st0", "loss");
  if (multinode_mode(opt)) {
    std::printf(" %13s %10s  %s", "link_MB/step", "formula_MB", "collectives");
  }
  std::printf("\n");
}

void print_record(const Record& r, const StageOptions& opt) {
  char range[32];
  std::snprintf(range, sizeof(range), "(%.1f-%.1f)", r.min_ms, r.max_ms);
  char ratio[16] = "-";
  if (r.ratio_to_stage0 >= 0) std::snprintf(ratio, sizeof(ratio), "%.3f", r.ratio_to_stage0);
  std::printf("  %5s %5s %9.2f %17s %10.2f %8.2f %8.2f %7s %6.1f %10.2f %9.2f %8s %10.6f",
              stage_label(r).c_str(), dtype_name(r.dtype), r.median_ms, range, r.compute_ms,
              r.comm_ms, r.exposed_ms, percent(r.overlap).c_str(), r.collectives,
              mib(r.model_state_bytes), mib(r.peak_bytes), ratio, r.final_loss);
  if (multinode_mode(opt)) {
    char link[24] = "-";
    if (r.link_bytes_per_step >= 0) {
      std::snprintf(link, sizeof(link), "%.3f", r.link_bytes_per_step / 1e6);
    }
    char formula[24] = "-";
    if (r.link_formula_bytes >= 0) {
      std::snprintf(formula, sizeof(formula), "%.3f", r.link_formula_bytes / 1e6);
    }
    std::printf(" %13s %10s  %s", link, formula, r.transport.c_str());
  }
  std::printf("\n");
}

int run_with_mpi(int* argc, char*** argv, const char* program, const StageOptions& opt,
                 const std::function<int(const Communicators&)>& run) {
  // Ranks already use every core; OpenBLAS threads on top would only contend with them (the
  // kernels split their GEMMs over --threads themselves).
  openblas_set_num_threads(1);
  MpiSession mpi(argc, argv);
  const std::string blas_warning = kernels::blas_core_warning();
  if (mpi.world_rank() == 0 && !blas_warning.empty()) {
    std::fprintf(stderr, "%s: %s\n", program, blas_warning.c_str());
  }
  try {
    const size_t max_per_call =
        opt.max_elements_per_call > 0 ? opt.max_elements_per_call : static_cast<size_t>(INT_MAX);
    std::vector<std::unique_ptr<Communicator>> owned;
    if (opt.collectives.empty()) {
      owned.push_back(make_mpi_communicator(max_per_call));
    }
    for (const std::string& name : opt.collectives) {
      owned.push_back(make_mpi_communicator(max_per_call, transport_named(name)));
    }
    Communicators comms;
    for (const auto& comm : owned) comms.push_back(comm.get());
    return run(comms);
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
    const float loss_sum = models::forward_backward(*run.model, source_of(run), run.data_step,
                                                    global_batch, micro_batches, rank, world);
    const StepStats stats = run.model->step();
    run.last_loss = loss_sum / static_cast<float>(micro_batches);
    return stats;
  };
}

std::vector<Record> measure_dtypes(const StageOptions& opt, const Communicators& comms,
                                   const MakeModel& make_model, const TrainStep& train_step,
                                   const std::function<void(const Record& first)>& header) {
  std::vector<Record> records;
  for (DType dtype : opt.dtypes) {
    const std::vector<Record> dtype_records =
        measure_stages(opt, dtype, comms, make_model, train_step);
    if (comms.front()->rank() == 0) {
      if (records.empty()) header(dtype_records.front());
      for (const Record& r : dtype_records) print_record(r, opt);
      std::fflush(stdout);
    }
    records.insert(records.end(), dtype_records.begin(), dtype_records.end());
  }
  return records;
}

}  // namespace zero::bench
