// What the step benchmarks share (zero-bench-step's MLP, zero-bench-gpt2's GPT-2): the flags
// that choose stages, dtypes and how many steps to measure; one engine per ZeRO stage, all alive
// at once on one communicator, measured in interleaved rounds; and each stage's record combined
// over the ranks. bench_step.cpp's header comment says how and why it measures this way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "models/train_step.h"
#include "zero/collectives/communicator.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/model.h"

namespace zero::bench {

// ZeRO++'s settings for one variant of stage 3 (DeepSpeed's zero_quantized_weights,
// zero_hpz_partition_size, zero_quantized_gradients); hpZ's secondary shard spans the ranks of
// one node.
struct ZeroPlusPlus {
  bool quantized_weights = false;    // qwZ
  bool hpz = false;                  // hpZ
  bool quantized_gradients = false;  // qgZ
  bool any() const { return quantized_weights || hpz || quantized_gradients; }
  // "qwz+hpz+qgz" (those set, in that order); "" when none is.
  std::string name() const;
};

// How one run of stage 3 shards beyond the default (over every rank): hybrid sharding, or ZeRO++.
struct Sharding {
  int mics_shard_size = -1;  // -1: sharded over every rank
  ZeroPlusPlus zeropp;
};

struct StageOptions {
  std::vector<DType> dtypes{DType::kFloat32};
  std::vector<int> stages{0, 1, 2, 3};
  int micro_batches = 1;
  int steps = 12;
  int warmup = 2;
  int rounds = 4;
  size_t merge_bytes = 0;
  bool overlap_comm = true;
  size_t max_elements_per_call = 0;  // 0: the communicator's default (INT_MAX)
  int kernel_threads = 1;
  std::string json_path;
  std::string trace_prefix;
  // The multi-node mode. `collectives`: ZERO_COLLECTIVES values (auto, mpi, shm, hierarchical),
  // one communicator each, every stage measured on each, alternating in the same rounds; empty:
  // one communicator as the environment says. `link_counters`: a prefix of network interfaces
  // under /sys/class/net (e.g. zero-node, netns_cluster.sh's host ends of the nodes' links) whose
  // transmit counters, summed, are the bytes delivered across nodes; read around every block.
  std::vector<std::string> collectives;
  std::string link_counters;
  // Hybrid sharding (DeepSpeed MiCS's mics_shard_size): with k > 0, stage 3 is measured twice on
  // each communicator, sharded over all ranks and over groups of k ranks (replicated across
  // groups), alternating in the same rounds. 0: off.
  int mics_shard_size = 0;
  // ZeRO++: each entry one more variant of stage 3 over every rank, alternating in the same
  // rounds (--zeropp qwz+hpz+qgz,hpz).
  std::vector<ZeroPlusPlus> zeropp;
};

// The usage lines of StageOptions' flags, for a program's usage text.
extern const char* const kStageUsage;

// StageOptions' flags, each parsed into `opt` (driver::UsageError for a bad value), for a
// program to add its own to.
driver::FlagTable stage_flags(StageOptions* opt);
// Checks what single flags cannot: every round measures at least one step.
void check_stage_options(const StageOptions& opt);

EngineConfig engine_config(const StageOptions& opt, int stage, DType dtype, bool trace);

// One stage's engine and what was measured of it on this rank.
struct StageRun {
  Communicator* comm = nullptr;  // the communicator the model runs on
  int stage = 0;
  Sharding sharding;
  DType dtype = DType::kFloat32;
  std::unique_ptr<ZeroModel> model;
  long data_step = 0;           // which global batch the next step trains on
  std::vector<double> step_ms;  // this rank's measured steps
  double busy_ms = 0;           // sum of StepStats::comm_busy_ms over the measured steps
  double wait_ms = 0;           // sum of StepStats::comm_wait_ms
  long collectives = 0;         // sum of StepStats::collectives
  float last_loss = 0.0f;
  uint64_t link_bytes = 0;  // delivered across nodes during the measured steps (rank 0)
  // What this rank's engine counted during the measured steps (CommCounters: the bytes one rank
  // sends by the ring's figures): its communicator's all-gathers, and with hybrid sharding the
  // replica group's collectives.
  uint64_t gather_bytes_sent = 0;
  uint64_t replica_bytes_sent = 0;
  // ZeRO++: what this rank's communicator's reduce-scatters sent (the reductions qgZ leaves
  // exact), and what qgZ sent across nodes (its second hop).
  uint64_t reduce_scatter_bytes_sent = 0;
  uint64_t quantized_bytes_across_nodes = 0;
};

// One stage and dtype, combined over the ranks.
struct Record {
  std::string transport;  // the communicator's transport()
  int stage = 0;
  Sharding sharding;
  DType dtype = DType::kFloat32;
  int world = 1;
  size_t params = 0;
  size_t padded_params = 0;
  int steps = 0;
  double median_ms = 0, min_ms = 0, max_ms = 0;  // of the slowest rank's step
  // Per step, mean over ranks: step time minus comm wait, comm busy, comm wait, collectives.
  double compute_ms = 0;
  double comm_ms = 0;
  double exposed_ms = 0;
  double collectives = 0;
  double overlap = 0;  // 1 - sum(wait) / sum(busy), clamped to [0, 1]
  uint64_t model_state_bytes = 0;
  uint64_t peak_bytes = 0;
  uint64_t plan_model_state_bytes = 0;
  double ratio_to_stage0 = -1;  // step time over stage 0's; negative: stage 0 was not measured
  double final_loss = 0;
  double link_bytes_per_step = -1;  // across nodes, from the link counters; negative: not read
  // What should cross M nodes per step, all links together, in bytes (negative where there is
  // no formula). The hierarchical path: (M - 1) x (each reduction's fp32 partial sums of the
  // padded parameters, 4 bytes an element, twice for stage 0's all-reduce, once per
  // micro-batch at stages 2-3; each parameter all-gather's whole buffer, as many as the engine
  // counted: stage 3 gathers a unit for its forward, its backward, and for every module tied
  // to it). Hybrid sharding with one shard group per node: only the sums across replicas
  // cross, every rank's ring share of them. ZeRO++: the all-gathers' buffers as above (qwZ's
  // int8 regions; hpZ's gathers stay inside the node), with qgZ the exact reductions' fp32
  // partial sums and what every rank's second hop sent across.
  double link_formula_bytes = -1;
};

// The model of one run, on `comm` with `config` (engine_config's, and the run's sharding), and
// everything one optimizer step does to it (batch, forward, loss, backward, step), returning the
// engine's figures and setting run.last_loss.
using MakeModel =
    std::function<std::unique_ptr<ZeroModel>(Communicator& comm, const EngineConfig& config)>;
using TrainStep = std::function<StepStats(StageRun& run)>;

// The step zero-train runs (models::forward_backward over the micro-batches, then step()), on
// the micro-batches of `source_of(run)`: sets run.last_loss to this rank's mean micro-batch
// loss.
using SourceOf = std::function<models::MicroBatchSource&(const StageRun& run)>;
TrainStep forward_backward_step(SourceOf source_of, long global_batch, int micro_batches, int rank,
                                int world);

// The communicators a benchmark measures on: one per opt.collectives entry, or one.
using Communicators = std::vector<Communicator*>;

// Collective: builds every stage's model for `dtype` on each communicator, warms each up,
// measures them in interleaved rounds and returns one record per communicator and stage (on
// every rank), ratios to the same communicator's stage 0 set.
// With opt.trace_prefix, writes PREFIX.stageS.DTYPE.json, a Chrome trace of each stage's last
// round.
std::vector<Record> measure_stages(const StageOptions& opt, DType dtype, const Communicators& comms,
                                   const MakeModel& make_model, const TrainStep& train_step);

// measure_stages for each dtype of opt.dtypes in turn, all records together; rank 0 prints
// `header(first record)` once, then each record's line as its dtype is done.
std::vector<Record> measure_dtypes(const StageOptions& opt, const Communicators& comms,
                                   const MakeModel& make_model, const TrainStep& train_step,
                                   const std::function<void(const Record& first)>& header);

// The keys of a record every step benchmark writes; the program adds its model's.
driver::JsonRecord record_json(const Record& r, const StageOptions& opt);

// A record's stage as the tables print it: "3", "3/m2" for stage 3 sharded over groups of 2,
// "3/qwz+hpz+qgz" with ZeRO++.
std::string stage_label(const Record& r);
double mib(uint64_t bytes);
std::string percent(double fraction);  // "-" for a negative fraction
// The table zero-bench-step prints, one line per record under its header; in the multi-node
// mode (opt.collectives or opt.link_counters set) with the transport and the bytes across nodes.
void print_record_header(const StageOptions& opt);
void print_record(const Record& r, const StageOptions& opt);

// main() of a step benchmark after its flags are parsed: OpenBLAS on one thread, MPI started,
// the communicators made, `run` called; an exception aborts the whole job with a message.
int run_with_mpi(int* argc, char*** argv, const char* program, const StageOptions& opt,
                 const std::function<int(const Communicators&)>& run);

}  // namespace zero::bench
