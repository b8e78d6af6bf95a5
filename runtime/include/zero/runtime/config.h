// The training config: a DeepSpeed-style JSON file (or protobuf text format), schema in
// proto/config.proto, validated and mapped onto EngineConfig. A DeepSpeed user's file works
// as is where the meaning is the same; every key is either honoured or rejected with a
// ConfigError that names it (callers exit with code 2 and start nothing):
//   - an unknown key names its full path and suggests the closest valid key;
//   - a well-known DeepSpeed key we do not support yet (offload, activation checkpointing, ...)
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
//                      reduce_bucket_size / allgather_bucket_size are elements: our one unit of
//                      granularity serves both collectives, so merge_bytes = the smaller of the
//                      two * bytes of the working dtype; absent, EngineConfig's merge_bytes.
//                      contiguous_gradients and allgather_partitions: what this runtime always
//                      does, so only true is accepted.
//                      stage3_* keys map to the engine fields of the same meaning; absent they
//                      keep EngineConfig's defaults (0 = off), NOT DeepSpeed's 1e5/5e7/1e9/1e9,
//                      so a file without them schedules as the engine does by default. Given at
//                      stages 0-2 they are validated and have no effect, as in DeepSpeed. Two
//                      DeepSpeed values have no engine equivalent and are rejected: prefetch
//                      bucket 0 (no prefetching) and max_live_parameters 0.
//   fp16 / bf16        enabled selects the working dtype (both on is an error); the fp16 loss
//                      scaler keys map to LossScalerConfig. Keys of a disabled section are
//                      validated and have no effect.
//   optimizer          "AdamW" and "Adam" are decoupled-weight-decay AdamW (DeepSpeed's Adam
//                      defaults to adam_w_mode = true); "Adam" with adam_w_mode false is Adam
//                      with L2 weight decay; "SGD". Type names in any case. Params absent take
//                      DeepSpeed's / PyTorch's defaults (lr 1e-3, betas 0.9 0.999, eps 1e-8,
//                      weight_decay 0, momentum 0). No optimizer section: EngineConfig's.
//   scheduler          WarmupLR, WarmupDecayLR, WarmupCosineLR (any case) as LrScheduleConfig
//                      describes (linear warm-up only: warmup_type "log" is rejected). No
//                      scheduler: the optimizer's lr, constant.
//   communication_data_type  "fp32" reduces gradients in fp32 (reduce_in_fp32); the working
//                      dtype's name is the default; another 2-byte type is an error.
//   seed               ours; absent: EngineConfig's.
#pragma once

#include <optional>
#include <string>

#include "zero/kernels/check.h"
#include "zero/runtime/engine.h"

namespace zero {

// A bad config (as opposed to a failed system call or a bug): callers exit with code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

struct TrainingConfig {
  EngineConfig engine;
  long train_batch_size = 0;            // samples per optimizer step, all ranks together
  long micro_batch_per_rank = 0;        // samples per micro-batch on one rank
  int gradient_accumulation_steps = 1;  // equals engine.micro_batches
  long steps_per_print = 10;            // rank 0 prints a progress line this often
  std::string origin;                   // the file (or name) it was read from, for messages
};

// Parses a DeepSpeed-style JSON text (or protobuf text format when the first non-space
// character is not '{'), validates it for world_size ranks and fills a TrainingConfig.
// `origin` (a file name) goes into every message. Throws ConfigError.
TrainingConfig parse_training_config(const std::string& text, int world_size,
                                     const std::string& origin);

// Reads the file at `path` and parses it as above; an unreadable file is a ConfigError too.
TrainingConfig load_training_config(const std::string& path, int world_size);

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
