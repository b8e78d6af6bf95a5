// zero-estimate's command line: its usage text, the options it takes and their checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/mlp.h"
#include "zero/core/dtype.h"

namespace zero_estimate {

inline constexpr const char* kUsage =
    "usage: zero-estimate --params P --ranks N [--dtype bf16|fp16|fp32] [--stage S]\n"
    "  --params P  number of parameters: 7.5e9, 7.5B, 350M, 125K, 1.2T or 1000000\n"
    "  --ranks N   data-parallel ranks (N >= 1)\n"
    "  --dtype D   dtype of parameters and gradients: bf16 (default), fp16 or fp32\n"
    "  --stage S   print only ZeRO stage S (0-3); default: every stage\n"
    "  --model mlp instead of --params: plan the MLP's real layout (and its shape\n"
    "              flags --input-dim --hidden --output-dim --layers --merge-bytes)\n"
    "  --model gpt2 the same for the GPT-2: --preset tiny|gpt2-124M|gpt2-350M|gpt2-774M|\n"
    "              gpt2-1.5B, then --n-layer --n-head --n-embd --vocab-size --block-size\n"
    "  with --model: --offload-optimizer none|cpu|nvme: cpu plans a GPU run with the\n"
    "              master and optimizer state in host memory (ZeRO-Offload; the host\n"
    "              columns; page-locked with --pin-memory, as the config's pin_memory),\n"
    "              nvme the optimizer state on NVMe, with\n"
    "              --sub-group-size N (default 1e9) and --buffer-count N (default 4), as the\n"
    "              config's offload_optimizer and sub_group_size; the nvme column is the files\n"
    "  with --model: --gpu plans a GPU run (implied by --offload-optimizer cpu): the device\n"
    "              holds the table's bytes, the host columns what the copies across the bus\n"
    "              go through (an NVMe offload's staging, the gradient and parameter copies)\n"
    "  with --model: --offload-param none|nvme (stage 3's parameter shards on NVMe, only\n"
    "              stage 3 is planned), --param-buffer-count N (default 5) and\n"
    "              --param-buffer-size N (elements, default 1e8), as the config's offload_param\n"
    "  with --model: --grad-accum-dtype D: the dtype gradients accumulate in (the config's\n"
    "              data_types.grad_accum_dtype; default fp32 for bf16, else the dtype)\n"
    "  with --model: --mics-shard-size K: hybrid sharding (the config's mics_shard_size):\n"
    "              stage 3 sharded over groups of K of the N ranks, replicated across them\n"
    "  with --model: --hpz-partition-size K: ZeRO++'s hpZ (the config's\n"
    "              zero_hpz_partition_size): stage 3 with a secondary shard of 1/K of each unit\n"
    "  with --model gpt2: --tp T: tensor parallelism over T ranks (the config's\n"
    "              tensor_parallel.tp_size): each rank holds its slices; --ranks N is then\n"
    "              the data-parallel ranks (N x T in the job)\n"
    "  with --model gpt2: --micro-batch B: the activations of B sequences per rank for each\n"
    "              activation checkpointing (none, selective, full), with --seq-len T\n"
    "              (default: --block-size), --number-checkpoints K (default: every block),\n"
    "              --partition-activations (with --tp: each checkpoint split over the T\n"
    "              ranks, the config's activation_checkpointing.partition_activations),\n"
    "              --contiguous-memory-optimization (the checkpoints in one buffer, the\n"
    "              config's activation_checkpointing.contiguous_memory_optimization),\n"
    "              --checkpoint-nvme-path DIR (checkpoints spilled to NVMe, as zero-train's)\n"
    "              and --memory-limit BYTES[K|M|G] (which setting fits at each stage, and the\n"
    "              most sequences per rank each one fits)\n"
    "  with --model gpt2: --pp P: the GPT-2 cut into P pipeline stages (zero-train --pp),\n"
    "              each planned apart: its parameters (--pp-partition parameters|uniform|\n"
    "              flops|type:REGEX, default parameters; wte on the first and the last\n"
    "              stage), its model state\n"
    "              over its data-parallel ranks (--ranks N is then the job's P x D x T ranks)\n"
    "              and, with --micro-batch, its activations with the micro-batches the\n"
    "              schedule holds in flight on it (--pp-schedule gpipe|1f1b|interleaved|zb-h1,\n"
    "              default 1f1b, --micro-batches M, default 1; interleaved's model chunks per\n"
    "              stage: --pp-virtual-stages V, default 2)\n";

struct Options {
  uint64_t params = 0;
  int ranks = 0;
  zero::DType dtype = zero::DType::kBFloat16;  // mixed precision, as in the paper
  std::optional<int> stage;
  std::string model;  // "mlp" or "gpt2"; empty: --params
  zero::models::MlpConfig mlp;
  zero::models::Gpt2Config gpt2;
  size_t merge_bytes = 32 * 1024;  // zero-train's default
  bool offload_nvme = false;
  bool offload_cpu = false;  // a GPU run's optimizer in host memory
  bool pin_memory = false;   // offload_optimizer.pin_memory
  bool gpu = false;          // plan a GPU run (--gpu, or implied by offload_cpu)
  bool offload_param_nvme = false;
  int param_buffer_count = 5;  // DeepSpeed's offload_param defaults
  size_t param_buffer_size = 100000000;
  size_t sub_group_size = 1000000000;  // DeepSpeed's default, as the config takes it
  int buffer_count = 4;
  int mics_shard_size = -1;    // off
  int hpz_partition_size = 1;  // off
  // The GPT-2's activations: sequences per rank (0: not printed), their length (0: block_size),
  // checkpointed blocks (0: every one), whether checkpoints are partitioned over the
  // tensor-parallel ranks or in one buffer, and the per-rank budget (0: none).
  int micro_batch = 0;
  int seq_len = 0;
  int number_checkpoints = 0;
  bool partition_activations = false;
  bool contiguous_memory = false;  // contiguous_memory_optimization
  uint64_t memory_limit = 0;
  // The checkpoints spilled to this directory (zero-train --checkpoint-nvme-path): planned, not
  // touched.
  std::string checkpoint_nvme_path;
  // The config's data_types.grad_accum_dtype; unset: the engine's default for the dtype.
  std::optional<zero::DType> grad_accum_dtype;
  // Pipeline parallelism (--model gpt2): stages, their cut, the schedule and the micro-batches
  // of a step. With more than one stage `ranks` is the job's and `data_parallel_ranks` each
  // stage's data-parallel ranks (ranks / (pipeline_stages x tensor_parallel_size)).
  int pipeline_stages = 1;
  std::string pipeline_partition = "parameters";
  std::string pipeline_schedule = "1f1b";
  int pipeline_virtual_stages = 1;  // interleaved: model chunks per stage (--pp-virtual-stages)
  int micro_batches = 1;
  int data_parallel_ranks = 0;
};

// The options of `args` (argv after the program's name); --help prints the usage and exits 0.
// Throws zero::driver::UsageError for a bad or missing option, naming it.
Options parse_options(const std::vector<std::string>& args);

// The checkpointing zero-train runs with these flags and `recompute` (none spills nothing).
zero::models::Gpt2Checkpointing checkpointing_of(const Options& options,
                                                 zero::models::Recompute recompute);

}  // namespace zero_estimate
