#include "engine_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "zero/collectives/mpi_communicator.h"
#if ZERO_HAVE_NCCL
#include "zero/collectives/nccl_communicator.h"
#endif
#include "zero/core/check.h"
#include "zero/core/text.h"

namespace zero {

Engine::Impl::Impl(Communicator& c, const std::vector<ParamDecl>& decls, const EngineConfig& cfg)
    : hybrid(HybridGroups::split(c, cfg)),
      comm(hybrid.shard ? *hybrid.shard : c),
      config(validated(cfg, comm)),
      device(DeviceContext::create(cfg.device, cfg.kernel_threads)),
      owned_host_comm(cfg.device.is_cuda() && cfg.grid.host_communicator == nullptr
                          ? make_mpi_communicator()
                          : nullptr),
      host_comm(owned_host_comm                         ? *owned_host_comm
                : cfg.grid.host_communicator != nullptr ? *cfg.grid.host_communicator
                                                        : c),
      allocator(*device),
      host_allocator(device->pinned_memory()),
      pageable_allocator(host_memory()),
      layout(Layout::build(specs_of(decls), layout_options(cfg, c.world_size()))),
      optimizer(cfg.optimizer),
      schedule(cfg.lr_schedule),
      loss_scaler(cfg.precision.loss_scaler),
      rank(comm.rank()),
      world(comm.world_size()),
      replicas(hybrid.replica ? hybrid.replica->world_size() : 1),
      elem(dtype_size(cfg.precision.dtype)),
      accum_dtype(accumulation_dtype(cfg)),
      accum(dtype_size(accum_dtype)),
      trace(cfg.trace),
      timeline(*device, trace, config.schedule.overlap_comm),
      param_pool(allocator, *device, MemoryCategory::kPrefetch, layout.max_unit_numel() * elem,
                 [this](const CommPoint& p) { timeline.wait(p); }),
      reducer(layout, config, comm, hybrid.replica.get(), *device, allocator, timeline, fusion),
      decay_runs(decay_runs_of(decls)) {
  ZERO_CHECK(host_comm.world_size() == world * replicas,
             "EngineConfig::host_communicator has " << host_comm.world_size()
                                                    << " ranks; the engine's communicator has "
                                                    << world * replicas);
  // A split the model declares must be one of this group's size: checkpoints cut and merge
  // slices by it.
  const int tensor_parallel_size =
      config.grid.tensor_parallel == nullptr ? 1 : config.grid.tensor_parallel->world_size();
  for (size_t p = 0; p < decls.size(); ++p) {
    const char* problem =
        split_problem(decls[p].spec.split, decls[p].spec.shape, tensor_parallel_size);
    ZERO_CHECK(*problem == '\0', "parameter " << layout.describe_param(p) << " declares " << problem
                                              << " over " << tensor_parallel_size
                                              << " tensor-parallel rank(s)");
  }
  if (config.desync_check) comm.set_desync_check(true);
  check_same_model_on_all_ranks();
  ZERO_CHECK(config.grid.hpz_partition_size == 1 || !hybrid.shard,
             "zero_hpz_partition_size "
                 << config.grid.hpz_partition_size << " (hpZ) with mics_shard_size "
                 << config.grid.mics_shard_size << " (hybrid sharding) is not supported");
  hpz_node = split_node_group(comm, config);
  resolve_pipeline_ties();
  allocator.set_limit(config.memory_limit_bytes);
  reducer.set_after_last_reduction(
      [this](int u, const CommPoint& reduced) { return copy_grads_to_host(u, reduced); });
  gather_packs = PackedCollectives(layout, gather_bucket_elements(config), /*backward=*/false);
  // Collective, so before anything a single rank may refuse (the plan against its own limit,
  // below): its peers then wait in a collective the watchdog guards, not in this one.
  place_collective_buffers();
  // The plan against the limit before the first allocation: a model that cannot fit is refused
  // with the plan's numbers at once, not after allocating most of it.
  const MemoryPlan plan = plan_memory(layout, config);
  if (config.memory_limit_bytes > 0 &&
      plan.model_state + plan.buffers > config.memory_limit_bytes) {
    std::ostringstream message;
    message << "out of memory: the plan for this rank, " << human_bytes(plan.model_state)
            << " of model state and " << human_bytes(plan.buffers)
            << " of buffers, would pass the limit of " << human_bytes(config.memory_limit_bytes)
            << "\n"
            << what_would_fit();
    throw OutOfMemoryError(message.str());
  }
  try {
    allocate();
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError(std::string(e.what()) + what_would_fit());
  }
  sub_groups = plan_sub_groups();
  check_offload_space();
  working_shards = std::make_unique<WorkingShards>(
      layout, config.stage, rank, world, elem, units, allocator,
      offloads_params_to_nvme(config)
          ? std::make_unique<ParamSwap>(layout, config, allocator, host_allocator, *device, rank,
                                        [this](const CommPoint& p) { timeline.wait(p); })
          : nullptr);
  initialize(decls);
  // The first step's NVMe figures are its own, not the initial values' writes.
  if (working_shards->swap()) working_shards->swap()->take_stats();
  if (offloads_optimizer_to_nvme(config)) open_offload(decls);
  // With nothing offloaded to NVMe after all (no optimizer state in fp32 on the CPU path,
  // nothing trainable), the update runs on the units' own, empty, buffers as in memory.
  if (offload && !offload->layout.records.empty()) {
    shards = std::make_unique<NvmeShards>(*offload, sub_groups, config.offload.optimizer,
                                          host_allocator);
  } else {
    shards = std::make_unique<ResidentShards>(units, sub_groups);
  }
}

EngineConfig Engine::Impl::validated(const EngineConfig& c, Communicator& comm) {
  // A collective reads and writes the engine's buffers directly: the communicator must work on
  // the memory they live in.
  const bool device_comm = comm.stream().native_handle() != nullptr;
  ZERO_CHECK(c.device.is_cuda() == device_comm,
             "the engine runs on " << device_name(c.device) << " but its communicator works on "
                                   << (device_comm ? "device memory (NCCL)" : "host memory (MPI)")
                                   << "; use make_nccl_communicator() for a CUDA device and "
                                      "make_mpi_communicator() for the CPU");
#if ZERO_HAVE_NCCL
  if (const auto* nccl = dynamic_cast<const NcclCommunicator*>(&comm)) {
    ZERO_CHECK(nccl->device() == c.device.index,
               "the engine runs on " << device_name(c.device)
                                     << " but its NCCL communicator on cuda:" << nccl->device());
  }
#endif
  ZERO_CHECK(!(c.trace && c.device.is_cuda()),
             "tracing is not available on " << device_name(c.device)
                                            << ": its spans are host times, which on a GPU "
                                               "would show when work was issued, not when it ran");
  ZERO_CHECK(c.stage >= 0 && c.stage <= 3, "ZeRO stage must be 0, 1, 2 or 3, got " << c.stage);
  ZERO_CHECK(c.micro_batches >= 1,
             "micro-batches per step must be at least 1, got " << c.micro_batches);
  ZERO_CHECK(c.gradient_clipping >= 0.0f,
             "gradient clipping must be >= 0 (0 = off), got " << c.gradient_clipping);
  ZERO_CHECK(
      c.precision.gradient_predivide_factor > 0.0f,
      "gradient_predivide_factor must be > 0, got " << c.precision.gradient_predivide_factor);
  ZERO_CHECK(c.kernel_threads >= 1, "kernel threads must be at least 1, got " << c.kernel_threads);
  const bool params_on_nvme = c.offload.param.device == OffloadDevice::kNvme;
  if (params_on_nvme) {
    // As DeepSpeed: only stage 3 partitions the parameters.
    ZERO_CHECK(c.stage == 3,
               "parameter offload to nvme (offload_param) needs ZeRO stage 3, not "
               "stage "
                   << c.stage << " (only stage 3 partitions the parameters)");
    ZERO_CHECK(
        c.offload.param.buffer_count >= 1,
        "offload_param.buffer_count must be at least 1, got " << c.offload.param.buffer_count);
  }
  if (offloads_optimizer_to_nvme(c)) {
    ZERO_CHECK(c.stage >= 1, "optimizer offload to nvme needs ZeRO stage 1, 2 or 3, not stage "
                                 << c.stage << " (there is no partitioned optimizer to move)");
    const int needed = 1 + (c.offload.optimizer.pipeline_read ? 1 : 0) +
                       (c.offload.optimizer.pipeline_write ? 1 : 0);
    ZERO_CHECK(c.offload.optimizer.buffer_count >= needed,
               "optimizer offload to nvme needs at least "
                   << needed << " staging buffers with these pipeline settings, got buffer_count "
                   << c.offload.optimizer.buffer_count);
  }
  if (offloads_optimizer_to_host(c)) {
    ZERO_CHECK(c.stage >= 1, "optimizer offload to cpu needs ZeRO stage 1, 2 or 3, not stage "
                                 << c.stage << " (there is no partitioned optimizer to move)");
  }
  if (params_on_nvme || offloads_optimizer_to_nvme(c)) {
    ZERO_CHECK(c.offload.aio.block_size >= kNvmeAlignment &&
                   c.offload.aio.block_size % kNvmeAlignment == 0 &&
                   c.offload.aio.queue_depth >= 1 && c.offload.aio.intra_op_parallelism >= 1,
               "aio needs a block_size that is a multiple of "
                   << kNvmeAlignment
                   << " and a queue_depth and intra_op_parallelism of at least 1");
  }
  ZERO_CHECK(c.grid.tensor_parallel == nullptr || !c.device.is_cuda() ||
                 (c.grid.host_communicator != nullptr && c.grid.host_tensor_parallel != nullptr),
             "tensor parallelism on " << device_name(c.device)
                                      << " needs the MPI communicators of its groups for the "
                                         "host-side exchanges (EngineConfig::host_communicator "
                                         "and host_tensor_parallel: a process grid's)");
  ZERO_CHECK(!c.precision.grad_accum_dtype || *c.precision.grad_accum_dtype == DType::kFloat32 ||
                 *c.precision.grad_accum_dtype == c.precision.dtype,
             "gradients accumulate in fp32 or in the working dtype ("
                 << dtype_name(c.precision.dtype) << "), not in "
                 << dtype_name(*c.precision.grad_accum_dtype));
  if (c.precision.quantized_gradients) {
    ZERO_CHECK(c.stage == 3,
               "quantized gradient reduction (zero_quantized_gradients) needs ZeRO "
               "stage 3, not stage "
                   << c.stage);
    ZERO_CHECK(!c.device.is_cuda(),
               "quantized gradient reduction (zero_quantized_gradients) runs on the CPU path "
               "only for now, not on "
                   << device_name(c.device));
    ZERO_CHECK(c.grid.mics_shard_size == -1,
               "quantized gradient reduction (zero_quantized_gradients) with hybrid sharding "
               "(mics_shard_size) is not supported yet");
  }
  if (c.grid.hpz_partition_size != 1) {
    const int k = c.grid.hpz_partition_size;
    ZERO_CHECK(k >= 1, "zero_hpz_partition_size must be 1 (off) or more, got " << k);
    ZERO_CHECK(c.stage == 3, "zero_hpz_partition_size "
                                 << k << " (hpZ) needs ZeRO stage 3, not stage " << c.stage
                                 << " (only stage 3 partitions the parameters)");
    ZERO_CHECK(!c.device.is_cuda(), "zero_hpz_partition_size "
                                        << k << " (hpZ) runs on the CPU path only for now, not on "
                                        << device_name(c.device));
    ZERO_CHECK(c.offload.param.device != OffloadDevice::kNvme,
               "zero_hpz_partition_size " << k
                                          << " (hpZ) with parameter offload to nvme is not "
                                             "supported yet");
  }
  ZERO_CHECK(!c.precision.quantized_weights || c.stage == 3,
             "quantized weight all-gathers (zero_quantized_weights) need ZeRO stage 3, not stage "
                 << c.stage << " (only stage 3 all-gathers parameters)");
  return c;
}

std::vector<ParamSpec> Engine::Impl::specs_of(const std::vector<ParamDecl>& decls) {
  std::vector<ParamSpec> specs;
  specs.reserve(decls.size());
  for (const ParamDecl& d : decls) {
    specs.push_back(d.spec);
    specs.back().trainable = d.trainable;
  }
  return specs;
}

std::vector<std::vector<DecayRun>> Engine::Impl::decay_runs_of(
    const std::vector<ParamDecl>& decls) const {
  std::vector<std::vector<DecayRun>> runs(layout.units().size());
  for (size_t u = 0; u < runs.size(); ++u) {
    runs[u].push_back(DecayRun{0, config.optimizer.weight_decay});
    bool first = true;
    for (int p : layout.units()[u].params) {
      const ParamDecl& d = decls[p];
      const float decay = d.weight_decay.value_or(config.optimizer.weight_decay);
      ZERO_CHECK(
          decay >= 0.0f && std::isfinite(decay),
          "parameter '" << d.spec.name << "': weight_decay must be finite and >= 0, got " << decay);
      if (first) {
        runs[u].back().weight_decay = decay;
      } else if (decay != runs[u].back().weight_decay) {
        runs[u].push_back(DecayRun{layout.params()[p].offset, decay});
      }
      first = false;
    }
  }
  return runs;
}

// Compares the layout's fingerprint across ranks before any collective depends on it: a rank
// with a different model would otherwise hang or corrupt data in a mismatched collective.
void Engine::Impl::check_same_model_on_all_ranks() {
  const auto stage = static_cast<uint64_t>(config.stage);
  std::vector<uint64_t> prints = all_gather_u64(host_comm, layout.fingerprint(stage));
  if (std::all_of(prints.begin(), prints.end(), [&](uint64_t p) { return p == prints[0]; })) return;

  // Find the first parameter that differs: exchange the count, then per-parameter prints.
  std::vector<uint64_t> counts = all_gather_u64(host_comm, layout.params().size());
  std::vector<uint64_t> stages = all_gather_u64(host_comm, stage);
  // Over every rank (host_comm), replicas of a hybrid run's shard groups too.
  const int ranks = host_comm.world_size();
  size_t max_count = *std::max_element(counts.begin(), counts.end());
  for (size_t i = 0; i < max_count; ++i) {
    uint64_t mine = i < layout.params().size() ? layout.param_fingerprint(i) : 0;
    std::vector<uint64_t> theirs = all_gather_u64(host_comm, mine);
    std::vector<int> differing;
    for (int r = 0; r < ranks; ++r) {
      if (theirs[r] != theirs[0]) differing.push_back(r);
    }
    if (differing.empty()) continue;
    std::string mine_text = i < layout.params().size() ? layout.describe_param(i) : "nothing";
    ZERO_FAIL("the model differs across ranks: parameter #"
              << i << " differs between rank 0 and rank(s) " << join(differing, ", ")
              << "; this rank (" << host_comm.rank() << ") registered " << mine_text
              << "; every rank must register the same parameters in the same order");
  }
  for (int r = 0; r < ranks; ++r) {
    ZERO_CHECK(stages[r] == stages[0], "the ZeRO stage differs across ranks: rank 0 uses stage "
                                           << stages[0] << ", rank " << r << " uses stage "
                                           << stages[r]);
  }
  ZERO_FAIL(
      "the layout differs across ranks (same parameters, but a different world size, "
      "alignment or merge threshold); this rank uses world size "
      << world << ", alignment " << config.schedule.alignment_bytes << ", merge threshold "
      << config.schedule.merge_bytes);
}

// The heap is sized for exactly the buffers allocate() puts in the placed categories (each
// rounded up to the heap's 64-byte alignment); a buffer past it, such as a pool's extra one for
// a required gather, falls back to host memory and its collectives stage as before.
void Engine::Impl::place_collective_buffers() {
  if (config.device.is_cuda()) return;
  const size_t units_count = layout.units().size();
  auto rounded = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  size_t bytes = 0;
  for (size_t u = 0; u < units_count; ++u) {
    const UnitBytes b = unit_bytes(layout.units()[u], config, optimizer.state_count());
    bytes += rounded(b.params_full) + rounded(b.grads_full) + rounded(b.grads_shard);
  }
  const size_t unit_buffer = rounded(layout.max_unit_numel() * elem);
  bytes += param_buffer_count(layout, config) * unit_buffer;
  bytes += grad_bucket_count(layout, config) * unit_buffer;
  bytes += rounded(fusion_bytes(layout, config));
  bytes += rounded(quantized_gather_bytes(layout, config));
  bytes += rounded(quantized_reduction_scratch(layout, config));
  bytes += rounded(pipeline_tie_bytes(layout, config));
  bytes +=
      rounded(max_staging_bytes(layout, config, [this](CollectiveOp op, size_t count, DType dtype) {
        return comm.staging_bytes(op, count, dtype);
      }));
  if (needs_fp32_scratch(config)) bytes += rounded(layout.max_unit_numel() * sizeof(float));
  if (!comm.reserve_shared(bytes)) return;
  node_shared = std::make_unique<NodeSharedMemory>(comm, allocator.memory());
  for (MemoryCategory category : {MemoryCategory::kParamsFull, MemoryCategory::kGrads,
                                  MemoryCategory::kCommBuffer, MemoryCategory::kPrefetch}) {
    allocator.place(category, *node_shared);
  }
}

void Engine::Impl::allocate() {
  const int state_arrays = optimizer.state_count();
  units.resize(layout.units().size());
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = layout.units()[u];
    UnitState& s = units[u];
    const UnitBytes b = unit_bytes(unit, config, state_arrays);
    s.persistent = is_persistent(unit, config);
    s.params_full = allocator.allocate(b.params_full, MemoryCategory::kParamsFull);
    s.params_shard = allocator.allocate(b.params_shard, MemoryCategory::kParamsShard);
    s.params_secondary = allocator.allocate(b.params_secondary, MemoryCategory::kParamsShard);
    reducer.allocate_unit(u, b);
    // offload_optimizer cpu: the optimizer's arrays in host memory, where the host kernels step
    // them; page-locked with pin_memory. What crosses the bus is always page-locked: a copy
    // from pageable memory would hold up the stream it runs on.
    Allocator& optimizer_memory = !b.optimizer_on_host                  ? allocator
                                  : config.offload.optimizer.pin_memory ? host_allocator
                                                                        : pageable_allocator;
    s.master = optimizer_memory.allocate(b.master, MemoryCategory::kMaster);
    for (int k = 0; k < b.state_arrays; ++k) {
      s.state[k] = optimizer_memory.allocate(b.state, MemoryCategory::kOptimizerState);
    }
    s.host_grads = host_allocator.allocate(b.host_grads, MemoryCategory::kGrads);
    s.host_params = host_allocator.allocate(b.host_params, MemoryCategory::kParamsShard);
    s.params = config.stage <= 2 || s.persistent ? ParamState::kGathered : ParamState::kSharded;
  }
  param_pool.reserve(param_buffer_count(layout, config));
  reducer.allocate_buckets();
  fusion = allocator.allocate(fusion_bytes(layout, config), MemoryCategory::kCommBuffer);
  quantized_gather =
      allocator.allocate(quantized_gather_bytes(layout, config), MemoryCategory::kCommBuffer);
  pipeline_tie_sum =
      allocator.allocate(pipeline_tie_bytes(layout, config), MemoryCategory::kCommBuffer);
  const size_t staging_bytes =
      max_staging_bytes(layout, config, [this](CollectiveOp op, size_t count, DType dtype) {
        return comm.staging_bytes(op, count, dtype);
      });
  if (staging_bytes > 0) {
    staging = allocator.allocate(staging_bytes, MemoryCategory::kCommBuffer);
    comm.set_staging_buffer(staging.data(), staging.bytes());
  }
  reducer.allocate_scratch();
  norm_sums = allocator.allocate(units.size() * sizeof(float), MemoryCategory::kOther);
  norm_sums_on_host = host_allocator.allocate(units.size() * sizeof(float), MemoryCategory::kOther);
}

// Fills the elements this rank holds; the value of each is a function of the seed and the
// element's global identity only, so every world size starts from the same model. The working
// copy is the master rounded to the working dtype, as after every optimizer step. Values are
// made in host memory and copied to the device one buffer at a time.
void Engine::Impl::initialize(const std::vector<ParamDecl>& decls) {
  std::vector<char> host;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = layout.units()[u];
    UnitState& s = units[u];
    // `host` gets unit elements [region_begin, region_end) of `dtype`; padding stays zero.
    auto fill = [&](size_t bytes, DType dtype, size_t region_begin, size_t region_end) {
      host.assign(bytes, 0);
      for (int i : unit.params) {
        const ParamPlacement& p = layout.params()[i];
        const size_t begin = std::clamp(region_begin, p.offset, p.offset + p.numel);
        const size_t end = std::clamp(region_end, p.offset, p.offset + p.numel);
        for (size_t e = begin; e < end; ++e) {
          store_from_float(host.data(), dtype, e - region_begin,
                           init_value(config.seed, i, e - p.offset, decls[i].init));
        }
      }
    };
    auto upload = [&](Buffer& buffer, DType dtype, size_t region_begin, size_t region_end) {
      if (buffer.empty()) return;
      fill(buffer.bytes(), dtype, region_begin, region_end);
      device->copy_from_host(buffer.data(), host.data(), host.size());
    };
    const ElementRange mine = shard_range(unit.numel, rank, world);
    const size_t shard_begin = mine.first;
    const size_t shard_end = mine.end();
    upload(s.params_full, config.precision.dtype, 0, unit.numel);
    if (working_shards->swapped(static_cast<int>(u))) {
      fill(unit.shard * elem, config.precision.dtype, shard_begin, shard_end);
      working_shards->swap()->store(static_cast<int>(u), host.data(), host.size(),
                                    ParamSwap::Side::kHost);
    }
    upload(s.params_shard, config.precision.dtype, shard_begin, shard_end);
    if (s.master.empty()) continue;
    const size_t master_begin = config.stage == 0 ? 0 : shard_begin;
    const size_t master_end = config.stage == 0 ? unit.numel : shard_end;
    if (offloads_optimizer_to_host(config)) {
      // Already in host memory: filled in place.
      fill(s.master.bytes(), DType::kFloat32, master_begin, master_end);
      std::memcpy(s.master.data(), host.data(), host.size());
    } else {
      upload(s.master, DType::kFloat32, master_begin, master_end);
    }
  }
}

Engine::Engine(Communicator& comm, const std::vector<ParamDecl>& params, const EngineConfig& config)
    : impl_(std::make_unique<Impl>(comm, params, config)) {}

Engine::~Engine() {
  // Collectives may still read or write our buffers: let them finish before the memory goes.
  // A failed stream reports its error to whoever waits; here there is no one left to tell.
  try {
    impl_->comm.stream().synchronize();
  } catch (const std::exception&) {
  }
  try {
    // Hybrid sharding's sums across replicas and their tails read and write our buffers too.
    if (impl_->hybrid.replica) impl_->hybrid.replica->stream().synchronize();
  } catch (const std::exception&) {
  }
  try {
    // hpZ's gathers inside the node write our pooled buffers.
    if (impl_->hpz_node) impl_->hpz_node->stream().synchronize();
  } catch (const std::exception&) {
  }
  try {
    impl_->device->synchronize();
    // The communicator outlives the engine: it must not keep staging in memory freed next.
    if (!impl_->staging.empty()) impl_->comm.clear_staging_buffer();
  } catch (const std::exception&) {
  }
}

const Layout& Engine::layout() const {
  return impl_->layout;
}
const EngineConfig& Engine::config() const {
  return impl_->config;
}
Communicator& Engine::communicator() {
  return impl_->comm;
}
Communicator& Engine::host_communicator() {
  return impl_->host_comm;
}
Communicator* Engine::host_tensor_parallel() const {
  const EngineConfig& c = impl_->config;
  return c.device.is_cuda() ? c.grid.host_tensor_parallel : c.grid.tensor_parallel;
}
const std::shared_ptr<DeviceContext>& Engine::device_context() const {
  return impl_->device;
}
Allocator& Engine::allocator() {
  return impl_->allocator;
}
Allocator& Engine::pinned_host_allocator() {
  return impl_->host_allocator;
}
Allocator& Engine::pageable_host_allocator() {
  return impl_->pageable_allocator;
}
Trace& Engine::trace() {
  return impl_->trace;
}
void Engine::prefetch(int unit) {
  impl_->prefetch(unit);
}
void Engine::gather(int unit) {
  impl_->gather(unit);
}
void Engine::release(int unit) {
  impl_->release(unit);
}
void Engine::grads_ready(int unit) {
  impl_->check_unit(unit);
  impl_->reducer.ready(unit);
}
StepStats Engine::step() {
  return impl_->step();
}
void* Engine::param(int param) {
  return impl_->param(param);
}
void* Engine::grad(int param) {
  return impl_->grad(param);
}
DType Engine::dtype() const {
  return impl_->config.precision.dtype;
}
float Engine::loss_scale() const {
  return impl_->loss_scale();
}
size_t Engine::live_elements() const {
  return impl_->live;
}
bool Engine::is_gathered(int unit) const {
  impl_->check_unit(unit);
  return impl_->units[unit].params != ParamState::kSharded;
}
Engine::StateView Engine::state_view(int unit) {
  return impl_->state_view(unit);
}
void Engine::state_loaded() {
  impl_->state_loaded();
}
void Engine::write_state_views() {
  impl_->write_state_views();
}
void Engine::release_state_views() {
  impl_->release_state_views();
}
long Engine::optimizer_step() const {
  return impl_->optimizer.step();
}
void Engine::set_optimizer_step(long step) {
  impl_->optimizer.set_step(step);
}
LossScaler::State Engine::loss_scaler_state() const {
  return impl_->loss_scaler.state();
}
void Engine::set_loss_scaler_state(const LossScaler::State& state) {
  impl_->loss_scaler.set_state(state);
}
uint64_t Engine::model_state_bytes() const {
  return impl_->allocator.stats().model_state();
}
uint64_t Engine::buffer_bytes() const {
  return impl_->allocator.stats().buffers();
}
uint64_t Engine::pinned_host_bytes() const {
  const MemoryStats& stats = impl_->host_allocator.stats();
  return stats.model_state() + stats.buffers();
}
uint64_t Engine::pageable_host_bytes() const {
  return impl_->pageable_allocator.stats().model_state();
}
uint64_t Engine::nvme_bytes() const {
  const uint64_t optimizer_file =
      impl_->offload && impl_->offload->file ? impl_->offload->file->bytes() : 0;
  return optimizer_file +
         (impl_->working_shards->swap() ? impl_->working_shards->swap()->file_bytes() : 0);
}
std::vector<std::vector<float>> Engine::gather_full_params() {
  return impl_->gather_full_params();
}
std::vector<std::vector<float>> Engine::gather_full_master() {
  return impl_->gather_full_master();
}

}  // namespace zero
