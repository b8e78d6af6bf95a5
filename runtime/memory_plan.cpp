#include "engine_internal.h"

#include <algorithm>
#include <sstream>

#include "quantized_reduction.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/checked_size.h"
#include "zero/kernels/quantize_math.h"

namespace zero {

namespace {

// Collectives grouped as DeepSpeed's bucket keys ask: consecutive units, in the order their
// collectives are issued, packed into one collective while their elements fit in `limit`
// elements (a unit larger than it goes alone; 0: one collective per unit). Units themselves
// stay the registered modules: packing groups collectives, it never widens a gather. A pack
// never exceeds two of the largest unit either: its fusion buffer then costs no more than the
// double-buffered gradient buckets beside it, where DeepSpeed's usual 5e8 would hold a whole
// small model's gradient once more. Frozen units are in no pack: they are neither reduced nor
// updated, so neither kind of collective has anything of theirs to carry.
std::vector<std::vector<int>> pack_units(const Layout& layout, size_t limit, bool backward) {
  const size_t cap = limit == 0 ? 0 : std::min(limit, 2 * layout.max_unit_numel());
  std::vector<std::vector<int>> packs;
  size_t numel = 0;
  bool open = false;  // whether the last pack takes more units
  const int n = static_cast<int>(layout.units().size());
  for (int i = 0; i < n; ++i) {
    const int u = backward ? n - 1 - i : i;
    if (!layout.units()[u].trainable) continue;
    const size_t unit_numel = layout.units()[u].numel;
    if (!open || numel + unit_numel > cap) {
      packs.emplace_back();
      numel = 0;
    }
    packs.back().push_back(u);
    numel += unit_numel;
    // The persistent unit is reduced at the step, apart from backward's order: always alone.
    open = cap > 0 && !layout.units()[u].persistent;
    if (!open) numel = 0;
  }
  return packs;
}

// Elements of the largest pack of more than one unit: the fusion buffer's size (0: none).
size_t max_fused_numel(const Layout& layout, size_t limit, bool backward) {
  size_t most = 0;
  for (const std::vector<int>& pack : pack_units(layout, limit, backward)) {
    if (pack.size() < 2) continue;
    size_t numel = 0;
    for (int u : pack) numel += layout.units()[u].numel;
    most = std::max(most, numel);
  }
  return most;
}

// What the CPU path's communicator (MPI) stages; CUDA's (NCCL) stages nothing.
size_t planned_staging_bytes(const Layout& layout, const EngineConfig& config) {
  if (config.device.is_cuda()) return 0;
  const int ranks = layout.world_size();
  return max_staging_bytes(layout, config, [ranks](CollectiveOp op, size_t count, DType dtype) {
    return mpi_staging_bytes(op, count, dtype, ranks);
  });
}

}  // namespace

DType accumulation_dtype(const EngineConfig& config) {
  if (config.precision.grad_accum_dtype) return *config.precision.grad_accum_dtype;
  return config.precision.dtype == DType::kBFloat16 ? DType::kFloat32 : config.precision.dtype;
}

bool reduces_every_micro_batch(const EngineConfig& config) {
  return config.stage >= 2 && !config.grid.pipeline.reduce_once;
}

bool uses_grad_buckets(const EngineConfig& config) {
  return reduces_every_micro_batch(config) || accumulation_dtype(config) != config.precision.dtype;
}

size_t grad_bucket_count(const Layout& layout, const EngineConfig& config) {
  if (!uses_grad_buckets(config)) return 0;
  const size_t tied = static_cast<size_t>(
      std::count_if(layout.units().begin(), layout.units().end(), [&](const Unit& unit) {
        return unit.tied && unit.trainable && !is_persistent(unit, config);
      }));
  return 2 + tied;
}

bool needs_fp32_scratch(const EngineConfig& config) {
  const bool reduces_working_dtype =
      config.stage >= 2 || accumulation_dtype(config) == config.precision.dtype;
  return config.precision.reduce_in_fp32 && config.precision.dtype != DType::kFloat32 &&
         reduces_working_dtype;
}

size_t param_buffer_count(const Layout& layout, const EngineConfig& config) {
  if (config.stage != 3) return 0;
  const size_t max_unit = std::max<size_t>(layout.max_unit_numel(), 1);
  const size_t gathered_units = static_cast<size_t>(
      std::count_if(layout.units().begin(), layout.units().end(),
                    [&](const Unit& unit) { return !is_persistent(unit, config); }));
  if (config.grid.pipeline.hold_gathered) return gathered_units;
  return std::min(2 + config.schedule.prefetch_elements / max_unit, gathered_units);
}

DType reduction_dtype(const EngineConfig& config) {
  return config.precision.reduce_in_fp32 ? DType::kFloat32 : config.precision.dtype;
}

size_t pipeline_tie_bytes(const Layout& layout, const EngineConfig& config) {
  size_t largest = 0;
  for (const std::string& name : config.grid.pipeline.tied_parameters) {
    for (const ParamPlacement& p : layout.params()) {
      if (p.name == name) largest = std::max(largest, p.numel);
    }
  }
  return size_product(largest, sizeof(float), "the pipeline ties' buffer");
}

size_t fusion_bytes(const Layout& layout, const EngineConfig& config) {
  const size_t reduce =
      size_product(max_fused_numel(layout, config.schedule.reduce_bucket_elements, true),
                   dtype_size(reduction_dtype(config)), "the fusion buffer");
  const size_t gather = size_product(max_fused_numel(layout, gather_bucket_elements(config), false),
                                     dtype_size(config.precision.dtype), "the fusion buffer");
  return std::max(reduce, gather);
}

size_t gather_bucket_elements(const EngineConfig& config) {
  return config.stage == 1 || config.stage == 2 ? config.schedule.allgather_bucket_elements : 0;
}

PackedCollectives::PackedCollectives(const Layout& layout, size_t limit, bool backward)
    : packs(pack_units(layout, limit, backward)),
      pack_of(layout.units().size(), -1),
      offset_of(layout.units().size()),
      region(packs.size()) {
  for (size_t p = 0; p < packs.size(); ++p) {
    for (int u : packs[p]) {
      pack_of[u] = static_cast<int>(p);
      offset_of[u] = region[p];
      region[p] += layout.units()[u].shard;
    }
  }
}

size_t max_staging_bytes(const Layout& layout, const EngineConfig& config,
                         const StagingBytes& staging) {
  const DType wire = reduction_dtype(config);
  const bool all_reduce = config.stage == 0 || !config.schedule.reduce_scatter;
  const CollectiveOp op = all_reduce ? CollectiveOp::kAllReduce : CollectiveOp::kReduceScatter;
  const size_t ranks = static_cast<size_t>(layout.world_size());
  size_t most = staging(CollectiveOp::kAllReduce, layout.units().size(), DType::kFloat32);
  const PackedCollectives packs(layout, config.schedule.reduce_bucket_elements, /*backward=*/true);
  for (size_t p = 0; p < packs.packs.size(); ++p) {
    const size_t region = packs.region[p];
    const size_t count =
        all_reduce ? size_product(ranks, region, "a collective's elements") : region;
    most = std::max(most, staging(op, count, wire));
  }
  return most;
}

QuantizedShard quantized_shard(size_t shard) {
  QuantizedShard q;
  q.values_bytes = (shard + 3) / 4 * 4;
  q.scales = int8_block_count(shard, kWeightQuantizationBlock);
  q.region_bytes = size_sum(q.values_bytes, size_product(q.scales, sizeof(float), "scales"),
                            "a quantized shard");
  return q;
}

bool quantizes_gather(const Unit& unit, const EngineConfig& config) {
  return config.precision.quantized_weights && config.stage == 3 && unit.trainable &&
         !unit.persistent;
}

size_t quantized_gather_bytes(const Layout& layout, const EngineConfig& config) {
  size_t largest = 0;
  for (const Unit& unit : layout.units()) {
    if (quantizes_gather(unit, config)) largest = std::max(largest, unit.shard);
  }
  if (largest == 0) return 0;
  return size_product(quantized_shard(largest).region_bytes,
                      static_cast<size_t>(layout.world_size()), "the quantized all-gather buffer");
}

bool quantizes_reductions(const EngineConfig& config) {
  return config.precision.quantized_gradients && config.stage == 3 &&
         config.schedule.reduce_scatter;
}

size_t quantized_reduction_scratch(const Layout& layout, const EngineConfig& config) {
  if (!quantizes_reductions(config)) return 0;
  const PackedCollectives packs(layout, config.schedule.reduce_bucket_elements, /*backward=*/true);
  size_t largest = 0;
  for (size_t region : packs.region) largest = std::max(largest, region);
  return quantized_reduction_bytes(largest, layout.world_size());
}

bool is_persistent(const Unit& unit, const EngineConfig& config) {
  return config.stage == 3 && unit.persistent;
}

bool keeps_secondary_shard(const Unit& unit, const EngineConfig& config) {
  return config.stage == 3 && config.grid.hpz_partition_size > 1 && !unit.persistent;
}

UnitBytes unit_bytes(const Unit& unit, const EngineConfig& config, int state_arrays) {
  // Every figure below is one of these element counts times at most 4 bytes: checked once.
  size_product(unit.numel, sizeof(float), "a unit's bytes");
  const size_t w = dtype_size(config.precision.dtype);
  const size_t g = dtype_size(accumulation_dtype(config));
  const size_t full = unit.numel;
  const size_t shard = unit.shard;
  const size_t owned = config.stage == 0 ? full : shard;  // what this rank updates
  UnitBytes b;
  if (config.stage <= 2 || is_persistent(unit, config)) b.params_full = full * w;
  // A shard on NVMe (offload_param) is in the rank's parameter file, not in memory.
  if (config.stage == 3 && !swaps_unit(unit, config)) b.params_shard = shard * w;
  // A unit is padded to a multiple of the group's ranks, so the node's k split it evenly.
  if (keeps_secondary_shard(unit, config)) {
    b.params_secondary = full / static_cast<size_t>(config.grid.hpz_partition_size) * w;
  }
  if (!unit.trainable) return b;  // frozen: its working parameters are all it holds
  // Offloaded to NVMe, the master and optimizer state are in the rank's file, not in memory.
  const bool on_nvme = offloads_optimizer_to_nvme(config);
  b.optimizer_on_host = offloads_optimizer_to_host(config);
  // On the host, fp32 parameters need a master too: the working copy is on the device.
  const bool has_master = config.precision.dtype != DType::kFloat32 || b.optimizer_on_host;
  if (has_master && !on_nvme) b.master = owned * sizeof(float);
  if (!reduces_every_micro_batch(config)) b.grads_full = full * g;
  if (is_persistent(unit, config)) b.grads_full = full * w;  // backward adds into it directly
  // Reduced once per step, the whole gradient holds the rank's reduced slice in place (as at
  // stage 1); the persistent unit reduces every micro-batch into a shard of its own.
  if (reduces_every_micro_batch(config) || is_persistent(unit, config)) {
    b.grads_shard = shard * g;
  }
  b.state = on_nvme ? 0 : owned * sizeof(float);
  b.state_arrays = state_arrays;
  if (steps_on_host(config)) {
    b.host_grads = owned * g;
    // fp32 parameters go back to the device straight from a kept, page-locked master; a copy
    // from pageable memory would hold up the host while it is staged, and an NVMe staging slot
    // is read into again while the copy may still run. A shard on NVMe is updated in its own
    // host buffer (param_swap.h).
    if (!swaps_unit(unit, config) &&
        (config.precision.dtype != DType::kFloat32 || !b.optimizer_on_host ||
         !config.offload.optimizer.pin_memory)) {
      b.host_params = owned * w;
    }
  }
  return b;
}

int optimizer_state_arrays(const OptimizerConfig& config) {
  return Optimizer(config).state_count();
}

LayoutOptions layout_options(const EngineConfig& config, int world_size) {
  LayoutOptions options;
  options.world_size = sharding_group_size(config, world_size);
  options.dtype = config.precision.dtype;
  options.alignment_bytes = config.schedule.alignment_bytes;
  options.merge_bytes = config.schedule.merge_bytes;
  options.persistent_below = config.stage == 3 ? config.schedule.persistence_threshold : 0;
  return options;
}

MemoryPlan plan_memory(const Layout& layout, const EngineConfig& config) {
  const int state_arrays = optimizer_state_arrays(config.optimizer);
  MemoryPlan plan;
  for (const Unit& unit : layout.units()) {
    UnitBytes b = unit_bytes(unit, config, state_arrays);
    const char* what = "the model state per rank";
    const uint64_t optimizer =
        size_sum(b.master, size_product(b.state, static_cast<size_t>(b.state_arrays), what), what);
    for (uint64_t bytes :
         {b.params_full, b.params_shard, b.params_secondary, b.grads_full, b.grads_shard}) {
      plan.model_state = size_sum(plan.model_state, bytes, what);
    }
    plan.host_pinned =
        size_sum(plan.host_pinned, size_sum(b.host_grads, b.host_params, what), what);
    uint64_t& optimizer_tier = !b.optimizer_on_host                  ? plan.model_state
                               : config.offload.optimizer.pin_memory ? plan.host_pinned
                                                                     : plan.host_pageable;
    optimizer_tier = size_sum(optimizer_tier, optimizer, what);
  }
  const char* buffers = "the buffers per rank";
  // A unit's bytes in the working dtype, checked: the largest buffer of the plan below.
  const size_t max_unit_bytes =
      size_product(layout.max_unit_numel(), dtype_size(config.precision.dtype), buffers);
  const size_t max_unit = layout.max_unit_numel();
  plan.buffers = size_product(param_buffer_count(layout, config), max_unit_bytes, buffers);
  plan.buffers =
      size_sum(plan.buffers,
               size_product(grad_bucket_count(layout, config), max_unit_bytes, buffers), buffers);
  if (needs_fp32_scratch(config)) {
    plan.buffers = size_sum(plan.buffers, size_product(max_unit, sizeof(float), buffers), buffers);
  }
  plan.buffers = size_sum(plan.buffers, fusion_bytes(layout, config), buffers);
  plan.buffers = size_sum(plan.buffers, quantized_gather_bytes(layout, config), buffers);
  plan.buffers = size_sum(plan.buffers, quantized_reduction_scratch(layout, config), buffers);
  plan.buffers = size_sum(plan.buffers, pipeline_tie_bytes(layout, config), buffers);
  plan.buffers = size_sum(plan.buffers, planned_staging_bytes(layout, config), buffers);
  const NvmeRecords records = nvme_records(layout, config, state_arrays);
  const ParamRecords params = param_records(layout, config);
  // On a GPU the optimizer's records stream through page-locked host memory.
  (steps_on_host(config) ? plan.host_pinned : plan.buffers) += records.staging_bytes;
  // On a GPU the shards' buffers are page-locked host memory, with device buffers beside.
  (staged_on_device(config) ? plan.host_pinned : plan.buffers) += params.staging_bytes;
  plan.buffers += params.device_bytes;
  plan.nvme = records.file_bytes + params.file_bytes;
  plan.nvme_params = params.file_bytes;
  return plan;
}

// The estimator's view of this model on other stages and more ranks, for an out-of-memory
// message: the exact plan of the engine for each stage here, the ZeRO formula beyond.
// The plan of this model under another config and world size: the layout rebuilt as the
// engine would build it there (padding and the persistent unit depend on both).
MemoryPlan plan_elsewhere(const Layout& layout, const EngineConfig& config, int world_size) {
  const LayoutOptions wanted = layout_options(config, world_size);
  const LayoutOptions& have = layout.options();
  const bool same_layout = wanted.world_size == have.world_size && wanted.dtype == have.dtype &&
                           wanted.alignment_bytes == have.alignment_bytes &&
                           wanted.merge_bytes == have.merge_bytes &&
                           wanted.persistent_below == have.persistent_below;
  if (same_layout) return plan_memory(layout, config);
  std::vector<ParamSpec> specs;
  for (const ParamPlacement& p : layout.params())
    specs.push_back({p.name, p.shape, p.module, p.trainable, p.split});
  return plan_memory(Layout::build(specs, wanted), config);
}

std::string what_would_fit(const Layout& layout, const EngineConfig& config, int world,
                           uint64_t budget) {
  std::ostringstream out;
  out << "what the estimator says for this model (" << layout.numel() << " parameters, "
      << dtype_name(config.precision.dtype) << ")";
  if (budget > 0) out << " against the limit of " << human_bytes(budget);
  out << ":\n";
  const auto row = [&](int stage, int ranks, bool this_run) {
    EngineConfig other = config;
    other.stage = stage;
    // `ranks` counts the ranks the state is sharded over (the shard group with hybrid
    // sharding), so each row is a plain ZeRO run on that many.
    other.grid.mics_shard_size = -1;
    const MemoryPlan plan = plan_elsewhere(layout, other, ranks);
    const uint64_t need = plan.model_state + plan.buffers;
    out << "  stage " << stage << " on " << ranks << " rank(s): " << human_bytes(need)
        << " per rank" << (budget > 0 && need <= budget ? " (fits)" : "")
        << (this_run ? " <- this run" : "") << " (buffers " << human_bytes(plan.buffers) << ")\n";
  };
  for (int stage = 0; stage <= 3; ++stage) row(stage, world, stage == config.stage);
  for (int ranks : {world * 2, world * 4, world * 8}) row(3, ranks, false);
  return out.str();
}

std::string Engine::Impl::what_would_fit() const {
  return zero::what_would_fit(layout, config, world, allocator.limit());
}

}  // namespace zero
