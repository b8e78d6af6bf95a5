// zero-estimate: model-state memory per rank for each ZeRO stage, before anything runs.
//
//   zero-estimate --params 7.5B --ranks 64 [--dtype bf16|fp16|fp32] [--stage S]
//   zero-estimate --model mlp [--input-dim N --hidden N --output-dim N --layers N]
//                 [--merge-bytes N] --ranks 2 [--dtype D] [--stage S]
//   zero-estimate --model gpt2 [--preset gpt2-1.5B] [--n-layer N --n-head N --n-embd N
//                 --vocab-size N --block-size N] --ranks 8 [--dtype D] [--stage S]
//   zero-estimate --model mlp --ranks 8 --mics-shard-size 2    (hybrid sharding, stage 3)
//   zero-estimate --model mlp --ranks 8 --hpz-partition-size 4 (ZeRO++'s hpZ, stage 3)
//   zero-estimate --model gpt2 ... --micro-batch B [--seq-len T] [--number-checkpoints K]
//                 [--partition-activations] [--checkpoint-nvme-path DIR] [--memory-limit BYTES]
//                                              (activations too, for none/selective/full)
//   zero-estimate --model gpt2 ... --pp P [--pp-partition parameters|uniform|flops|type:REGEX]
//                 [--pp-schedule gpipe|1f1b|interleaved|zb-h1] [--pp-virtual-stages V]
//                 [--micro-batches M] --ranks P*D*T   (each pipeline stage apart)
//
// prints one row per stage (or only stage S): parameters, gradients, optimizer state (fp32
// master and Adam moments) and their total per rank, in GB (1e9 bytes) and in bytes. With the
// arguments above it gives the ZeRO paper's Figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.88 GB.
// With --model, the model's real layout is planned instead: padding, units and the
// engine's pooled buffers included, the exact bytes the engine then allocates (the defaults
// are zero-train's). With --micro-batch the GPT-2's activations of B sequences of T tokens per
// rank follow (models/gpt2_memory.h's formula: what zero-train's allocator counts and its step
// records' peak_activation_bytes measure), for each activation-checkpointing setting, with the
// total per rank at each stage and, with --memory-limit, the setting that fits. Exit code 2 for
// bad arguments, a plan the engine refuses and sizes past 64 bits.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "driver/cli.h"
#include "models/gpt2.h"
#include "models/mlp.h"
#include "tools/zero_estimate_activations.h"
#include "tools/zero_estimate_options.h"
#include "zero/core/check.h"
#include "zero/core/checked_size.h"
#include "zero/core/dtype.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/estimate.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero_estimate {
namespace {

double gigabytes(uint64_t bytes) {
  return static_cast<double>(bytes) / 1e9;
}

// The layout of `specs` (the model's, or a pipeline stage's) as the engine builds it on the
// data-parallel ranks, and the engine's own plan for each ZeRO stage.
void plan_layout(const Options& options, const std::vector<zero::ParamSpec>& specs,
                 const StagePlan& part) {
  const int ranks = options.data_parallel_ranks;
  zero::EngineConfig config;
  config.precision.dtype = options.dtype;
  config.precision.grad_accum_dtype = options.grad_accum_dtype;
  config.schedule.merge_bytes = options.merge_bytes;
  config.schedule.optimizer_sub_group_elements = options.sub_group_size;
  config.offload.optimizer.buffer_count = options.buffer_count;
  if (options.offload_nvme) config.offload.optimizer.device = zero::OffloadDevice::kNvme;
  if (options.gpu) config.device = zero::Device::cuda(0);
  if (options.offload_cpu) {
    config.offload.optimizer.device = zero::OffloadDevice::kCpu;
    config.offload.optimizer.pin_memory = options.pin_memory;
  }
  if (options.offload_param_nvme) config.offload.param.device = zero::OffloadDevice::kNvme;
  config.offload.param.buffer_count = options.param_buffer_count;
  config.offload.param.buffer_size = options.param_buffer_size;
  // The layout is sharded over the shard group (layout_options); only stage 3 is planned then.
  config.grid.mics_shard_size = options.mics_shard_size;
  config.grid.hpz_partition_size = options.hpz_partition_size;
  // The pipeline's end stages both hold wte and sum its gradient in a buffer of its size; at
  // stage 3 a stage keeps its units gathered through the step, and at stages 2-3 whole
  // gradients to reduce once per step (zero-train --pp's defaults).
  if (part.stage.stages > 1) {
    config.grid.pipeline.hold_gathered = true;
    config.grid.pipeline.reduce_once = options.micro_batches > 1;
    if (part.stage.first() || part.stage.last())
      config.grid.pipeline.tied_parameters = {"wte.weight"};
  }
  const zero::Layout layout = zero::Layout::build(specs, zero::layout_options(config, ranks));
  std::printf("%s: %zu parameters (%zu padded) in %zu units, %d ranks, %s\n", options.model.c_str(),
              layout.numel(), layout.padded_numel(), layout.units().size(), ranks,
              zero::dtype_name(options.dtype));
  if (options.gpt2.tensor_parallel_size > 1) {
    std::printf(
        "tensor parallelism: each rank holds its slices of %d, over %d data-parallel "
        "ranks\n",
        options.gpt2.tensor_parallel_size, ranks);
  }
  if (options.mics_shard_size != -1) {
    std::printf("hybrid sharding: shard groups of %d ranks, %d replicas\n", layout.world_size(),
                ranks / layout.world_size());
  }
  std::printf("stage  model state bytes  buffer bytes  total bytes per rank  nvme bytes%s\n",
              options.gpu ? "  pinned host bytes  pageable host bytes" : "");
  std::vector<std::pair<int, uint64_t>> engine_bytes;  // per stage planned
  for (int stage = 0; stage <= 3; ++stage) {
    if (options.stage && *options.stage != stage) continue;
    // Stage 0 has no partitioned optimizer to offload (the engine refuses it).
    if ((options.offload_nvme || options.offload_cpu) && stage == 0) continue;
    config.stage = stage;
    const zero::MemoryPlan plan = zero::plan_memory(layout, config);
    std::printf("%5d  %17llu  %12llu  %20llu  %10llu", stage,
                static_cast<unsigned long long>(plan.model_state),
                static_cast<unsigned long long>(plan.buffers),
                static_cast<unsigned long long>(
                    zero::size_sum(plan.model_state, plan.buffers, "the total per rank")),
                static_cast<unsigned long long>(plan.nvme));
    if (options.gpu) {
      std::printf("  %17llu  %19llu", static_cast<unsigned long long>(plan.host_pinned),
                  static_cast<unsigned long long>(plan.host_pageable));
    }
    std::printf("\n");
    engine_bytes.emplace_back(stage,
                              zero::size_sum(plan.model_state, plan.buffers, "the total per rank"));
  }
  // The tiers: this CPU path holds every byte of the table in host memory (pageable; pinned
  // memory and a device are what the CUDA path would add), the nvme column on the disk.
  if (options.offload_cpu) {
    std::printf(
        "tiers per rank (a GPU run): device = total bytes per rank; host: the fp32 master and "
        "optimizer state (%s), the copies of the gradient shard and the updated parameters "
        "(pinned; fp32 parameters with --pin-memory go from the master itself)%s\n",
        options.pin_memory ? "pinned" : "pageable; --pin-memory pins them",
        options.offload_param_nvme
            ? ", the parameter shards' buffers (pinned; device buffers beside them); nvme = nvme "
              "bytes (the parameter shards)"
            : "; nvme 0");
  } else if (options.gpu) {
    std::printf(
        "tiers per rank (a GPU run): device = total bytes per rank; host: %s; nvme = nvme "
        "bytes\n",
        options.offload_nvme
            ? (options.offload_param_nvme
                   ? "the optimizer records' and the parameter shards' staging, the copies of "
                     "the gradient shard and the updated parameters (all pinned)"
                   : "the optimizer records' staging, the copies of the gradient shard and the "
                     "updated parameters (all pinned)")
            : (options.offload_param_nvme ? "the parameter shards' buffers (pinned; device "
                                            "buffers beside them)"
                                          : "nothing"));
  } else if (options.offload_nvme || options.offload_param_nvme) {
    std::printf("tiers per rank: device 0, host = total bytes per rank, nvme = nvme bytes");
    std::printf(" (optimizer state%s on NVMe)\n",
                options.offload_param_nvme ? " and parameters" : "");
  }
  if (options.micro_batch > 0) print_activations(options, part, engine_bytes);
}

// The model's plan, or with --pp each pipeline stage's: its layers, parameters, model state
// over its data-parallel ranks and activations with its micro-batches in flight.
int plan_model(const Options& options) {
  const int stages = options.pipeline_stages;
  if (stages == 1) {
    plan_layout(options,
                options.model == "gpt2" ? zero::models::gpt2_param_specs(options.gpt2)
                                        : zero::models::mlp_param_specs(options.mlp),
                StagePlan{});
    return 0;
  }
  const int virtual_stages = options.pipeline_virtual_stages;
  const std::vector<int> bounds = zero::models::gpt2_pipeline_partition(
      options.gpt2, stages * virtual_stages, options.pipeline_partition,
      static_cast<int>(options.seq_len));
  const zero::PipelineScheduleKind kind = zero::parse_pipeline_schedule(options.pipeline_schedule);
  const std::string chunks =
      virtual_stages > 1 ? ", " + std::to_string(virtual_stages) + " model chunks per stage" : "";
  std::printf(
      "pipeline of %d stages (%s partition, %s schedule%s, %d micro-batches per step): each "
      "stage on %d data-parallel x %d tensor-parallel ranks, %d ranks in all\n",
      stages, options.pipeline_partition.c_str(), options.pipeline_schedule.c_str(), chunks.c_str(),
      options.micro_batches, options.data_parallel_ranks, options.gpt2.tensor_parallel_size,
      options.ranks);
  for (int s = 0; s < stages; ++s) {
    StagePlan plan;
    plan.stage = zero::models::gpt2_pipeline_stage(options.gpt2, bounds, s, virtual_stages);
    plan.in_flight = zero::pipeline_micro_batches_in_flight(kind, stages, s, options.micro_batches,
                                                            virtual_stages);
    if (kind == zero::PipelineScheduleKind::kZeroBubbleH1) {
      plan.split_loads = zero::pipeline_stage_loads(kind, stages, s, options.micro_batches);
    }
    if (virtual_stages > 1) {
      plan.chunk_actions =
          zero::make_pipeline_schedule(kind, stages, options.micro_batches, virtual_stages)[s];
    }
    std::printf("\npipeline stage %d: layers %s%s%s, %d %s in flight\n", s,
                plan.stage.describe_layers(options.gpt2.n_layer).c_str(),
                plan.stage.first() ? " + embeddings" : "",
                plan.stage.last() ? " + ln_f, head (its own wte)" : "", plan.in_flight,
                virtual_stages > 1    ? "(micro-batch, chunk) pairs"
                : plan.in_flight == 1 ? "micro-batch"
                                      : "micro-batches");
    plan_layout(options, zero::models::gpt2_param_specs(options.gpt2, plan.stage), plan);
  }
  return 0;
}

// The ZeRO paper's model-state bytes per rank for --params: each planned stage's parameters,
// gradients and optimizer state.
int print_model_state(const Options& options) {
  const bool mixed = options.dtype != zero::DType::kFloat32;
  std::printf("%llu parameters, %d ranks, %s parameters and gradients\n",
              static_cast<unsigned long long>(options.params), options.ranks,
              zero::dtype_name(options.dtype));
  std::printf("optimizer state: %s (K = %d bytes per parameter); GB = 1e9 bytes\n",
              mixed ? "fp32 master + Adam moments" : "Adam moments in fp32", mixed ? 12 : 8);
  std::printf("stage  params GB  grads GB  optimizer GB  total GB     total bytes\n");
  for (int stage = 0; stage <= 3; ++stage) {
    if (options.stage && *options.stage != stage) continue;
    const zero::ModelStateBytes bytes =
        zero::estimate_model_state(options.params, options.ranks, options.dtype, stage);
    std::printf("%5d  %9.2f  %8.2f  %12.2f  %8.2f  %14llu\n", stage, gigabytes(bytes.params),
                gigabytes(bytes.grads), gigabytes(bytes.optimizer), gigabytes(bytes.total()),
                static_cast<unsigned long long>(bytes.total()));
  }
  return 0;
}

}  // namespace
}  // namespace zero_estimate

int main(int argc, char** argv) {
  const std::optional<zero_estimate::Options> parsed =
      zero::driver::parse_command_line("zero-estimate", zero_estimate::kUsage, [&] {
        return zero_estimate::parse_options(std::vector<std::string>(argv + 1, argv + argc));
      });
  if (!parsed) return 2;
  const zero_estimate::Options& options = *parsed;
  if (!options.model.empty()) {
    // A plan the engine refuses, or sizes past 64 bits: the arguments ask for what cannot be.
    try {
      return zero_estimate::plan_model(options);
    } catch (const zero::Error& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "zero-estimate: %s\n", e.what());
      return 2;
    }
  }
  return zero_estimate::print_model_state(options);
}
