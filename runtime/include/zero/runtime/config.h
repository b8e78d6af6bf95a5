// The training config: a DeepSpeed-style JSON file (or protobuf text format), schema in
// proto/config.proto, validated and mapped onto EngineConfig. A DeepSpeed user's file works
// as is where the meaning is the same; every key is either honoured or rejected with a
// ConfigError that names it (callers exit with code 2 and start nothing):
//   - an unknown key names its full path and suggests the closest valid key;
//   - a well-known DeepSpeed key we do not support yet (offload, autotuning, ...)
//     says so, as opposed to being called a misspelling;
//   - wrong types name the key and the expected type; integer keys accept integral numbers
//     written as 5e8 (in JSON; text format has protobuf's own syntax); duplicate keys are errors
//     and // or /* */ comments are allowed, as DeepSpeed's hjson reader does;
//   - a parameter the chosen optimizer or scheduler does not take is an error (PyTorch's
//     constructors reject it too).
//
// Mapping and defaults (DeepSpeed's unless said otherwise):
//   batch sizes        train_batch_size = train_micro_batch_size_per_gpu *
//                      gradient_accumulation_steps * world size; any two give the third, one of
//                      the first two alone takes 1 accumulation step; all three must agree.
//   zero_optimization  absent stage: 0. overlap_comm absent: true (the engine's default;
//                      DeepSpeed's is true only at stage 3; it changes timing, not results).
//                      reduce_bucket_size -> reduce_bucket_elements (gradient elements per
//                      reduction collective), allgather_bucket_size -> allgather_bucket_elements
//                      (elements per stage 1-2 parameter all-gather), sub_group_size ->
//                      optimizer_sub_group_elements; absent, EngineConfig's 0 (off). None of
//                      them merges modules into units: that is merge_bytes, our own option
//                      (zero-train --merge-bytes), never set from the file.
//                      contiguous_gradients and allgather_partitions: what this runtime always
//                      does, so only true is accepted.
//                      stage3_* keys map to the engine fields of the same meaning; absent they
//                      keep EngineConfig's defaults (0 = off), NOT DeepSpeed's 1e5/5e7/1e9/1e9,
//                      so a file without them schedules as the engine does by default. Given at
//                      stages 0-2 they are validated and have no effect, as in DeepSpeed. Two
//                      DeepSpeed values have no engine equivalent and are rejected: prefetch
//                      bucket 0 (no prefetching) and max_live_parameters 0.
//                      stage3_gather_16bit_weights_on_model_save -> TrainingConfig's
//                      gather_16bit_weights_on_model_save (each save also writes the model in the
//                      working dtype, at any stage).
//   data_types         grad_accum_dtype ("fp32", "bf16", "fp16") -> grad_accum_dtype; it must be
//                      fp32 or the working dtype. Absent: the engine's default.
//   fp16 / bf16        enabled selects the working dtype (both on is an error); the fp16 loss
//                      scaler keys map to LossScalerConfig. Keys of a disabled section are
//                      validated and have no effect.
//   optimizer          "AdamW" and "Adam" are decoupled-weight-decay AdamW (DeepSpeed's Adam
//                      defaults to adam_w_mode = true); "Adam" with adam_w_mode false is Adam
//                      with L2 weight decay; "SGD". Type names in any case. Params absent take
//                      DeepSpeed's / PyTorch's defaults (lr 1e-3, betas 0.9 0.999, eps 1e-8,
//                      weight_decay 0, momentum 0). No optimizer section: the caller's, as
//                      DeepSpeed takes the client's optimizer: EngineConfig's, with the
//                      ConfigContext's lr and weight_decay where it gives them.
//   scheduler          WarmupLR, WarmupDecayLR, WarmupCosineLR (any case) as LrScheduleConfig
//                      describes; warmup_type "log" (absent: log, DeepSpeed's default) or
//                      "linear". No scheduler: the optimizer's lr, constant.
//   communication_data_type  "fp32" reduces gradients in fp32 (reduce_in_fp32); the working
//                      dtype's name is the default; another 2-byte type is an error.
//   seed               ours; absent: EngineConfig's.
//   wall_clock_breakdown -> TrainingConfig's wall_clock_breakdown (per-step timing lines).
//   tensorboard, csv_monitor  {enabled, output_path, job_name} -> MonitorConfig; job_name must
//                      not be empty or hold a '/' (it names one directory). wandb is refused:
//                      it needs a network service.
//   comms_logger       {enabled, verbose, prof_all, prof_ops} -> CommsLoggerConfig; prof_ops
//                      must name collectives the engine issues; debug true is an error (it adds
//                      the Python caller's name, which the engine's collectives do not have).
//   flops_profiler     {enabled, profile_step (>= 1), module_depth (>= -1), top_modules (>= 1),
//                      detailed, output_file} -> FlopsProfilerConfig; the caller checks
//                      profile_step against the run's steps.
//   checkpoint         ours: override_optimizer (see TrainingConfig).
//   tensor_parallel    tp_size or autotp_size (DeepSpeed's inference and training names; equal
//                      when both are given) -> tensor_parallel_size, absent 1; it must divide
//                      the world size; mics_shard_size must then divide the data-parallel
//                      size. The batch keys' "world size" is then the data-parallel size,
//                      world / tp.
//   activation_checkpointing  -> ActivationCheckpointingConfig: number_checkpoints (at least 1),
//                      our mode ("none", "selective", "full"; absent: none), cpu_checkpointing,
//                      contiguous_memory_optimization, profile, partition_activations and
//                      synchronize_checkpoint_boundary, and our nvme_path (the checkpoints
//                      spilled to files there; not empty).
//
// Accepted and ignored, because ignoring them cannot change the result; each one a file gives
// is listed in TrainingConfig::ignored_keys with the reason: memory_breakdown,
// zero_allow_untested_optimizer, zero_optimization.round_robin_gradients.
//
// "auto" (JSON only), as Hugging Face's Trainer resolves it, from the ConfigContext: the batch
// keys, gradient_clipping, fp16/bf16.enabled (from the run's dtype), optimizer.params lr,
// weight_decay (the run's), betas and eps (Adam's defaults 0.9, 0.999 and 1e-8: no flag sets
// them), scheduler.params warmup_min_lr (0), warmup_max_lr (the run's lr), warmup_num_steps,
// total_num_steps, and for the model's hidden size h: reduce_bucket_size h * h,
// stage3_prefetch_bucket_size 0.9 * h * h, stage3_param_persistence_threshold 10 * h. A key
// whose value the context lacks is a ConfigError naming it; "auto" for any other key is a wrong
// type. Each resolution is listed in TrainingConfig::resolved_auto.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zero/core/check.h"
#include "zero/runtime/engine.h"

namespace zero {

// A bad config (as opposed to a failed system call or a bug): callers exit with code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// activation_checkpointing: what the model recomputes in backward. The runtime only carries it:
// the model's code applies it (models/gpt2_memory.h).
struct ActivationCheckpointingConfig {
  std::string mode = "none";    // "none", "selective" or "full"
  long number_checkpoints = 0;  // checkpointed blocks, spread evenly; 0: every block
  bool number_checkpoints_given = false;
  // DeepSpeed's keys, with its defaults (false). cpu_checkpointing: checkpoints in pinned host
  // memory on CUDA (the CPU path keeps them in host memory anyway); contiguous_memory_optimization:
  // all checkpoints in one buffer; profile: per-block forward, recompute and backward times;
  // partition_activations: each checkpoint split over the tensor-parallel group.
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  bool profile = false;
  bool partition_activations = false;
  // synchronize_checkpoint_boundary: the device finishes the work issued before each
  // checkpointed block's forward and backward begin.
  bool synchronize_checkpoint_boundary = false;
  // Ours: the directory checkpoints are spilled to (models/gpt2_spill.h); empty: none.
  std::string nvme_path;
};

// tensorboard and csv_monitor, DeepSpeed's keys and defaults: when enabled, rank 0 writes the
// run's events into output_path/job_name (zero/runtime/monitor.h).
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
  // output_path/job_name, as DeepSpeed joins them (os.path.join: an empty output_path leaves
  // job_name, relative to the working directory).
  std::string log_dir() const;
};

// comms_logger, DeepSpeed's keys and defaults: the engine's collectives per kind and message
// size (count, bytes, latency, algbw and busbw), printed by rank 0 at the end of a run and
// written into the step records.
struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;               // a line per collective as its step ends
  bool prof_all = true;               // every op; false: only those in prof_ops
  std::vector<std::string> prof_ops;  // op names: all_gather, reduce_scatter, all_reduce, ...
  // Whether `op` is logged.
  bool logs(const std::string& op) const;
};

// flops_profiler, DeepSpeed's keys and defaults: at profile_step, per module, the parameters,
// forward and backward FLOPs and latency, printed by rank 0 and written into the metrics.
struct FlopsProfilerConfig {
  bool enabled = false;
  long profile_step = 1;
  long module_depth = -1;  // -1: every depth; 0: the model alone
  long top_modules = 1;
  bool detailed = true;
  std::string output_file;  // "": standard output
};

struct TrainingConfig {
  EngineConfig engine;
  // tensor_parallel.tp_size (or autotp_size): ranks per tensor-parallel group (1: none). The
  // batch keys count data-parallel ranks, world size / tensor_parallel_size, as DeepSpeed's do.
  int tensor_parallel_size = 1;
  // Pipeline stages (pipeline.stages, zero-train --pp): the world is pipeline_stages stages of
  // consecutive ranks, each a data x tensor-parallel grid holding a contiguous part of the
  // model. The batch keys
  // then count world size / (tensor_parallel_size x pipeline_stages) data-parallel ranks, and
  // gradient_accumulation_steps is the pipeline's micro-batches, as in DeepSpeed.
  int pipeline_stages = 1;
  // pipeline.partition (--pp-partition): "parameters", "uniform", "flops" or "type:REGEX".
  std::string pipeline_partition = "parameters";
  // pipeline.pipe_partitioned and grad_partitioned (DeepSpeed's defaults: true): with tensor
  // parallelism the activations, and their gradients, cross between stages as 1/t slices from
  // each tensor-parallel rank, gathered again in the receiving group (PipelineSlicing).
  bool pipeline_partition_activations = true;
  bool pipeline_partition_gradients = true;
  ActivationCheckpointingConfig activation_checkpointing;
  long train_batch_size = 0;            // samples per optimizer step, all ranks together
  long micro_batch_per_rank = 0;        // samples per micro-batch on one rank
  int gradient_accumulation_steps = 1;  // equals engine.micro_batches
  long steps_per_print = 10;            // rank 0 prints a progress line this often
  bool wall_clock_breakdown = false;    // print per-step forward/backward/reduce/step/gather times
  MonitorConfig tensorboard;            // TensorBoard event files of the run's events
  MonitorConfig csv_monitor;            // the same events as CSV files, one per event
  CommsLoggerConfig comms_logger;
  FlopsProfilerConfig flops_profiler;
  // zero_optimization.stage3_gather_16bit_weights_on_model_save: every checkpoint save also
  // writes the consolidated model in the working dtype (SaveOptions::consolidated_weights).
  bool gather_16bit_weights_on_model_save = false;
  // checkpoint.override_optimizer: a resume may change the optimizer type and hyperparameters
  // (LoadOptions::override_optimizer); otherwise a difference is an error.
  bool override_optimizer = false;
  std::string origin;  // the file (or name) it was read from, for messages
  // One line per "auto" resolved: `zero_optimization.reduce_bucket_size "auto" -> 16384 (hidden
  // 128 squared)`, and per accepted-but-ignored key given: `memory_breakdown is ignored: ...`.
  // Callers print them once at start.
  std::vector<std::string> resolved_auto;
  std::vector<std::string> ignored_keys;
};

// What "auto" resolves to: the run's command line (or the program's defaults for it) and the
// model. An empty value leaves the keys that need it unresolvable.
struct ConfigContext {
  std::optional<long> train_batch_size;             // train_batch_size (all ranks together)
  std::optional<long> gradient_accumulation_steps;  // with the above, the micro-batch per rank
  std::optional<float> gradient_clipping;
  std::optional<DType> dtype;  // fp16.enabled, bf16.enabled
  // optimizer.params.lr and scheduler warmup_max_lr; with weight_decay, also the optimizer
  // of a file without an optimizer section.
  std::optional<float> lr;
  std::optional<float> weight_decay;     // optimizer.params.weight_decay
  std::optional<long> warmup_num_steps;  // scheduler.params.warmup_num_steps
  std::optional<long> total_num_steps;   // scheduler.params.total_num_steps
  std::optional<long> hidden_size;       // the model's: the three bucket-size keys
  // The run trains on a GPU: offload_optimizer's "cpu" then moves the optimizer off it. On the
  // CPU path that is where the state already lives, and the key is dropped with a note.
  bool cuda = false;
  std::string source = "the command line";  // where the values came from, for messages
  // The caller's own flag gives the global batch (zero-train's --global-batch) and overrides the
  // file's: a file with neither train_batch_size nor train_micro_batch_size_per_gpu then takes
  // train_batch_size above (and gradient_accumulation_steps, unless the file has it) instead of
  // being an error.
  bool batch_from_caller = false;
  // The caller's pipeline stages (zero-train's --pp): "auto" takes them, and they override
  // pipeline.stages, so the batch keys count world size / (tp x these) data-parallel ranks.
  std::optional<long> pipeline_stages;
};

// Parses a DeepSpeed-style JSON text (or protobuf text format when the first non-space
// character is not '{'), validates it for world_size ranks and fills a TrainingConfig, with
// "auto" values taken from `context`. `origin` (a file name) goes into every message. Throws
// ConfigError. A NUL byte, and text that is neither JSON nor text format (prose: it does not
// open with a key and ':' or '{'), are errors that give the byte offset (from 0); keys longer
// than 64 bytes are quoted cut short, with their length.
TrainingConfig parse_training_config(const std::string& text, int world_size,
                                     const std::string& origin, const ConfigContext& context = {});

// Reads the file at `path` and parses it as above. A file that cannot be read, is not a regular
// file (a named pipe, a device) or is larger than kMaxConfigBytes is a ConfigError too, raised
// before anything is read from it.
constexpr size_t kMaxConfigBytes = size_t{1} << 20;
TrainingConfig load_training_config(const std::string& path, int world_size,
                                    const ConfigContext& context = {});

struct BatchSizes {
  long train_batch_size = 0;
  long micro_batch_per_rank = 0;
  int gradient_accumulation_steps = 1;
};

// DeepSpeed's batch-size rule on its own, for callers whose command-line flags override some of
// the three values: any two given derive the third; train_batch or micro_batch alone takes one
// accumulation step; neither is an error, as are values below 1, a train_batch_size that does
// not divide, and three values that do not multiply out. Messages use the config key names and
// name `origin`. Throws ConfigError.
BatchSizes derive_batch_sizes(std::optional<long> train_batch_size,
                              std::optional<long> micro_batch_per_rank,
                              std::optional<long> gradient_accumulation_steps, int world_size,
                              const std::string& origin);

}  // namespace zero
