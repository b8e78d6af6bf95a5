// zero-train's command line: the flags as given, parsed and checked, and how they combine with a
// DeepSpeed-style config into the run's TrainingConfig (the file first, every flag given on top).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "examples/run_checks.h"
#include "models/gpt2.h"
#include "models/mlp.h"
#include "zero/core/dtype.h"
#include "zero/runtime/config.h"

namespace zero::examples {

// --inject-fault KIND@STEP, for users (and our tests) to check how their setup fails. The last
// rank misbehaves at that step: inf-grad makes its loss gradient infinite; kill and stop send it
// SIGKILL or SIGSTOP between forward and backward; skip-step makes it skip the optimizer step
// (and the collectives in it) while the others wait there.
struct Fault {
  enum Kind { kNone, kInfGrad, kKill, kStop, kSkipStep } kind = kNone;
  long step = 0;
};

// What the fault does to the gradient a faulty micro-batch's backward starts from: inf-grad
// makes its first element infinite, kill and stop signal this process; skip-step (the training
// loop's business) and no fault leave it alone.
void inject_fault(const Fault& fault, zero::Tensor& grad);

// Validation batches when --val-batches does not say.
constexpr long kDefaultValBatches = 4;

// Flags as given: unset ones leave the config file's (or the built-in default's) value.
struct Flags {
  std::string model = "mlp";
  std::string config;
  long steps = 20;
  std::optional<int> stage;
  std::optional<int> tp;  // --tp: tensor_parallel.tp_size
  // --pp P: pipeline stages; --pp-schedule (gpipe, 1f1b, interleaved, zb-h1: 1f1b when absent),
  // --pp-partition (parameters or uniform: how the GPT-2's blocks are cut into stages),
  // --pp-schedule-dump FILE: each rank's timeline of the last step, measured and as planned;
  // --pp-virtual-stages V: interleaved's model chunks per stage (pipeline_virtual_stages).
  std::optional<int> pp;
  std::string pp_schedule = "1f1b";
  std::optional<int> pp_virtual_stages;
  std::optional<std::string> pp_partition;  // over pipeline.partition
  std::string pp_schedule_dump;
  // --pp-regather: at ZeRO stage 3, gather each unit again for every micro-batch (less memory,
  // m times the all-gathers) instead of keeping it gathered through the step.
  bool pp_regather = false;
  std::optional<uint64_t> seed;
  std::optional<long> global_batch;
  std::optional<int> micro_batches;
  std::optional<float> lr;
  std::optional<float> weight_decay;
  std::optional<float> clip;
  std::optional<std::string> schedule;
  std::optional<long> warmup;
  std::optional<zero::DType> dtype;
  std::optional<size_t> merge_bytes;
  std::optional<long> steps_per_print;
  std::string metrics;
  std::string trace;
  std::string memory_timeline;    // --memory-timeline FILE: the allocator's events and their plot
  long memory_summary_every = 0;  // --memory-summary-every K: rank 0 prints the table every K steps
  zero::models::MlpConfig mlp;
  std::vector<std::string> mlp_flags;  // the MLP's size flags given (not for --model gpt2)
  // --model gpt2: the architecture (a --preset, then any size flag on top), the sequence length
  // (the block size unless given), the token files and validation, and initial weights.
  zero::models::Gpt2Config gpt2;
  std::vector<std::string> gpt2_flags;  // the GPT-2's flags given (not for --model mlp)
  int seq_len = 0;
  std::string data;
  std::string val_data;
  long val_every = 0;
  std::optional<long> val_batches;  // absent: kDefaultValBatches, or fewer when the set is smaller
  std::string init_from;
  // --activation-checkpointing and --number-checkpoints (over the config's
  // activation_checkpointing.mode and number_checkpoints).
  std::optional<std::string> activation_checkpointing;
  std::optional<long> number_checkpoints;
  // --partition-activations: activation_checkpointing.partition_activations true.
  bool partition_activations = false;
  // --checkpoint-nvme-path DIR: activation_checkpointing.nvme_path (ours).
  std::optional<std::string> checkpoint_nvme_path;
  // --threads: EngineConfig::kernel_threads. Absent: 1 on the CPU path (a rank per core); on a GPU
  // this rank's share of the node's cores (run_checks.h's node_share), which zero-train sets.
  std::optional<int> threads;
  bool cuda = false;
  uint64_t memory_limit = 0;
  std::string save_dir;
  long save_every = 0;
  std::string resume;
  std::optional<bool> skip_nonfinite;
  Fault fault;
  long test_comm_delay_us = 0;
  bool override_optimizer = false;
  bool help = false;
};

// zero-train's usage text, printed after a usage error and for --help.
extern const char* const kTrainUsage;

// The flags of argv; throws UsageError (driver/cli.h) for a bad command line.
Flags parse_flags(int argc, char** argv);

// The model chunks per pipeline stage: --pp-virtual-stages, or 2 for --pp-schedule interleaved
// and 1 for the other schedules when it is not given.
int pipeline_virtual_stages(const Flags& f);

// The config file (or the built-in defaults), then every flag the user gave on top. Throws
// zero::ConfigError for a config that cannot be read or does not fit the flags.
TrainingConfig resolve_config(const Flags& f, int world_size);

// Every setting that must agree across ranks for them to train one model: a difference would
// train silently wrong or hang in a collective. Named as the user knows them.
std::vector<Setting> run_description(const Flags& f, const TrainingConfig& tc);

}  // namespace zero::examples
