#include "zero/runtime/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <sstream>

#include "zero/collectives/mpi_communicator.h"
#if ZERO_HAVE_NCCL
#include "zero/collectives/nccl_communicator.h"
#endif
#include "zero/core/check.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/runtime/estimate.h"

namespace zero {

namespace {

// A point on the communication stream and when the stream passed it, stamped by the stream
// itself (null for a compute event, or where the stream cannot stamp): a wait for it then
// knows how long compute was exposed to the communication before it.
struct CommPoint {
  Event event;
  std::shared_ptr<const double> done_us;
};

// Same-size buffers handed out and given back with the event after which they are free again
// (e.g. the reduce-scatter that reads a gradient bucket). Buffers come back in the order their
// collectives were issued and the communication stream runs them in that order, so handing out
// the oldest returned one (FIFO) takes the buffer that becomes free first: the one whose
// collective was just launched stays in flight while compute fills another (double buffering).
// The capacity is what the memory plan counts; only a required acquire goes past it.
class BufferPool {
 public:
  using Waiter = std::function<void(const CommPoint&)>;
  BufferPool(Allocator& allocator, DeviceContext& device, MemoryCategory category, size_t bytes,
             Waiter wait)
      : allocator_(allocator),
        device_(device),
        category_(category),
        bytes_(bytes),
        wait_(std::move(wait)) {}

  // Allocates the planned buffers ahead of use, so the memory report at start shows what the
  // schedule will hold.
  void reserve(size_t capacity) {
    capacity_ = capacity;
    while (allocated_ < capacity_) {
      free_.push_back(Entry{allocator_.allocate(bytes_, category_), {}});
      ++allocated_;
    }
  }

  // The buffer that becomes free first, ready for the compute stream. A required acquire with
  // every planned buffer handed out (units kept gathered past their use) allocates one more.
  Buffer acquire(bool zeroed) {
    if (free_.empty()) {
      ++allocated_;
      return allocator_.allocate(bytes_, category_);
    }
    Entry entry = std::move(free_.front());
    free_.pop_front();
    wait_(entry.free_after);
    if (zeroed) device_.zero(entry.buffer.data(), entry.buffer.bytes());
    return std::move(entry.buffer);
  }

  // For optional work (a prefetch): a buffer only while the plan's buffers are not all out.
  bool can_acquire_within_plan() const { return !free_.empty() || allocated_ < capacity_; }

  void give_back(Buffer buffer, CommPoint free_after) {
    free_.push_back(Entry{std::move(buffer), std::move(free_after)});
  }

 private:
  struct Entry {
    Buffer buffer;
    CommPoint free_after;
  };
  Allocator& allocator_;
  DeviceContext& device_;
  MemoryCategory category_;
  size_t bytes_;
  Waiter wait_;
  size_t capacity_ = 0;
  size_t allocated_ = 0;
  std::deque<Entry> free_;
};

// The dtype gradients are accumulated in over micro-batches (data_types.grad_accum_dtype):
// DeepSpeed's bf16 optimizer accumulates in fp32, so bf16 does here unless told otherwise.
DType accumulation_dtype(const EngineConfig& config) {
  if (config.grad_accum_dtype) return *config.grad_accum_dtype;
  return config.dtype == DType::kBFloat16 ? DType::kFloat32 : config.dtype;
}

// Backward writes a micro-batch's gradient into a pooled bucket of the working dtype when what
// the rank keeps is a shard (stages 2-3) or is accumulated in another dtype; otherwise straight
// into the kept full gradient.
bool uses_grad_buckets(const EngineConfig& config) {
  return config.stage >= 2 || accumulation_dtype(config) != config.dtype;
}

// A bucket reduced in the working dtype needs fp32 scratch when the reduction runs in fp32.
bool needs_fp32_scratch(const EngineConfig& config) {
  const bool reduces_working_dtype =
      config.stage >= 2 || accumulation_dtype(config) == config.dtype;
  return config.reduce_in_fp32 && config.dtype != DType::kFloat32 && reduces_working_dtype;
}

// Gathered-parameter buffers of stage 3: the unit computing, the next one in flight, and as
// many more as stage3_prefetch_bucket_size asks to have gathered ahead. Prefetches never take
// more, so the plan holds.
size_t param_buffer_count(const Layout& layout, const EngineConfig& config) {
  if (config.stage != 3) return 0;
  const size_t max_unit = std::max<size_t>(layout.max_unit_numel(), 1);
  return 2 + config.prefetch_elements / max_unit;
}

// The dtype a gradient reduction puts on the wire: fp32 when asked (communication_data_type)
// or when the kept gradients are fp32 at stages 0-1 (they are reduced from the accumulator),
// the working dtype otherwise.
DType reduction_dtype(const EngineConfig& config) {
  if (config.reduce_in_fp32) return DType::kFloat32;
  return config.stage <= 1 ? accumulation_dtype(config) : config.dtype;
}

// Collectives grouped as DeepSpeed's bucket keys ask: consecutive units, in the order their
// collectives are issued, packed into one collective while their elements fit in `limit`
// elements (a unit larger than it goes alone; 0: one collective per unit). Units themselves
// stay the registered modules: packing groups collectives, it never widens a gather. A pack
// never exceeds two of the largest unit either: its fusion buffer then costs no more than the
// double-buffered gradient buckets beside it, where DeepSpeed's usual 5e8 would hold a whole
// small model's gradient once more.
std::vector<std::vector<int>> pack_units(const Layout& layout, size_t limit, bool backward) {
  const size_t cap = limit == 0 ? 0 : std::min(limit, 2 * layout.max_unit_numel());
  std::vector<std::vector<int>> packs;
  size_t numel = 0;
  bool open = false;  // whether the last pack takes more units
  const int n = static_cast<int>(layout.units().size());
  for (int i = 0; i < n; ++i) {
    const int u = backward ? n - 1 - i : i;
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

// The fusion buffer packed collectives go through: the larger of the gradient packs (in the
// reduction dtype) and the stage 1-2 parameter packs (working dtype).
size_t fusion_bytes(const Layout& layout, const EngineConfig& config) {
  const size_t reduce = max_fused_numel(layout, config.reduce_bucket_elements, true) *
                        dtype_size(reduction_dtype(config));
  const bool post_step_gathers = config.stage == 1 || config.stage == 2;
  const size_t gather = post_step_gathers
                            ? max_fused_numel(layout, config.allgather_bucket_elements, false) *
                                  dtype_size(config.dtype)
                            : 0;
  return std::max(reduce, gather);
}

// The packs of one kind of collective, and where each unit sits in its pack: the fusion buffer
// holds a pack as N rank regions (region r: shard r of every unit of the pack, in pack order),
// so one reduce-scatter or all-gather of the regions serves every unit at once.
struct PackedCollectives {
  std::vector<std::vector<int>> packs;
  std::vector<int> pack_of;       // unit -> its pack
  std::vector<size_t> offset_of;  // unit -> its offset inside a rank region, in elements
  std::vector<size_t> region;     // pack -> elements of one rank region
  int filling = -1;               // the pack whose units are being copied in, if any
  size_t filled = 0;              // and how many of them are in

  PackedCollectives() = default;
  PackedCollectives(const Layout& layout, size_t limit, bool backward)
      : packs(pack_units(layout, limit, backward)),
        pack_of(layout.units().size()),
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
  bool fused(int u) const { return packs[pack_of[u]].size() > 1; }
};

// Bytes of staging memory a collective needs in the communicator: what the MPI backend sums
// 16-bit gradients in (fp32), given to it from the engine's allocator so that it is counted
// and under the memory limit.
using StagingBytes = std::function<size_t(CollectiveOp, size_t, DType)>;

// The most staging any of the engine's step collectives needs: each reduction (alone or
// packed) and the norm's all-reduce; all-gathers stage nothing.
size_t max_staging_bytes(const Layout& layout, const EngineConfig& config,
                         const StagingBytes& staging) {
  const DType wire = reduction_dtype(config);
  const bool all_reduce = config.stage == 0 || !config.reduce_scatter;
  const CollectiveOp op = all_reduce ? CollectiveOp::kAllReduce : CollectiveOp::kReduceScatter;
  const size_t ranks = static_cast<size_t>(layout.world_size());
  size_t most = staging(CollectiveOp::kAllReduce, layout.units().size(), DType::kFloat32);
  const PackedCollectives packs(layout, config.reduce_bucket_elements, /*backward=*/true);
  for (size_t p = 0; p < packs.packs.size(); ++p) {
    const size_t region = packs.region[p];
    most = std::max(most, staging(op, all_reduce ? ranks * region : region, wire));
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

// Bytes of each buffer one unit holds at a stage; the single source for plan_memory() and for
// the engine's allocations, so the estimate and the measurement cannot drift apart.
struct UnitBytes {
  size_t params_full = 0;   // working dtype, whole unit (stages 0-2; persistent units at 3)
  size_t params_shard = 0;  // working dtype, this rank's slice (stage 3)
  size_t master = 0;        // fp32 master when the working dtype is not fp32
  size_t grads_full = 0;    // accumulation dtype, whole unit (stages 0-1)
  size_t grads_shard = 0;   // accumulation dtype, slice (stages 2-3)
  size_t state = 0;         // each optimizer state array (fp32)
  int state_arrays = 0;
};

// Stage 3 keeps the persistent unit (the parameters under stage3_param_persistence_threshold)
// whole on every rank, and its gradient whole until the step, where it is reduced.
bool is_persistent(const Unit& unit, const EngineConfig& config) {
  return config.stage == 3 && unit.persistent;
}

UnitBytes unit_bytes(const Unit& unit, const EngineConfig& config, int state_arrays) {
  const size_t w = dtype_size(config.dtype);
  const size_t g = dtype_size(accumulation_dtype(config));
  const size_t full = unit.numel;
  const size_t shard = unit.shard;
  const size_t owned = config.stage == 0 ? full : shard;  // what this rank updates
  UnitBytes b;
  if (config.stage <= 2 || is_persistent(unit, config)) b.params_full = full * w;
  if (config.stage == 3) b.params_shard = shard * w;
  if (config.dtype != DType::kFloat32) b.master = owned * sizeof(float);
  if (config.stage <= 1) b.grads_full = full * g;
  if (is_persistent(unit, config)) b.grads_full = full * w;  // backward adds into it directly
  if (config.stage >= 2) b.grads_shard = shard * g;
  b.state = owned * sizeof(float);
  b.state_arrays = state_arrays;
  return b;
}

int optimizer_state_arrays(const OptimizerConfig& config) {
  return Optimizer(config).state_count();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

char* byte_offset(void* p, size_t bytes) {
  return static_cast<char*>(p) + bytes;
}

struct UnitState {
  Buffer params_full;
  Buffer params_shard;
  Buffer master;
  Buffer grads_full;  // stages 0-1: the reduced (and accumulated) gradient, accumulation dtype
  Buffer bucket;      // a pooled working-dtype gradient during backward (uses_grad_buckets)
  Buffer grads_shard;
  Buffer state[2];
  CommPoint params_ready;   // the all-gather that fills params_full has finished
  CommPoint grads_reduced;  // the reduction (and accumulation) of the latest grads_ready is done
  bool gathered = false;
  bool persistent = false;
  int micro_batches_done = 0;
};

}  // namespace

LayoutOptions layout_options(const EngineConfig& config, int world_size) {
  LayoutOptions options;
  options.world_size = world_size;
  options.dtype = config.dtype;
  options.alignment_bytes = config.alignment_bytes;
  options.merge_bytes = config.merge_bytes;
  options.persistent_below = config.stage == 3 ? config.persistence_threshold : 0;
  return options;
}

MemoryPlan plan_memory(const Layout& layout, const EngineConfig& config) {
  const int state_arrays = optimizer_state_arrays(config.optimizer);
  MemoryPlan plan;
  for (const Unit& unit : layout.units()) {
    UnitBytes b = unit_bytes(unit, config, state_arrays);
    plan.model_state += b.params_full + b.params_shard + b.master + b.grads_full + b.grads_shard +
                        b.state * static_cast<size_t>(b.state_arrays);
  }
  const size_t max_unit = layout.max_unit_numel();
  const size_t w = dtype_size(config.dtype);
  plan.buffers += param_buffer_count(layout, config) * max_unit * w;
  if (uses_grad_buckets(config)) plan.buffers += 2 * max_unit * w;  // double-buffered buckets
  if (needs_fp32_scratch(config)) plan.buffers += max_unit * sizeof(float);
  plan.buffers += fusion_bytes(layout, config);
  plan.buffers += planned_staging_bytes(layout, config);
  return plan;
}

struct Engine::Impl {
  Impl(Communicator& c, const std::vector<ParamDecl>& decls, const EngineConfig& cfg)
      : comm(c),
        config(validated(cfg, c)),
        device(DeviceContext::create(cfg.device, cfg.kernel_threads)),
        owned_host_comm(cfg.device.is_cuda() ? make_mpi_communicator() : nullptr),
        host_comm(owned_host_comm ? *owned_host_comm : c),
        allocator(*device),
        host_allocator(device->pinned_memory()),
        layout(Layout::build(specs_of(decls), layout_options(cfg, c.world_size()))),
        optimizer(cfg.optimizer),
        schedule(cfg.lr_schedule),
        loss_scaler(cfg.loss_scaler),
        rank(c.rank()),
        world(c.world_size()),
        elem(dtype_size(cfg.dtype)),
        accum_dtype(accumulation_dtype(cfg)),
        accum(dtype_size(accum_dtype)),
        trace(cfg.trace),
        param_pool(allocator, *device, MemoryCategory::kPrefetch, layout.max_unit_numel() * elem,
                   [this](const CommPoint& p) { wait_for_comm(p); }),
        grad_pool(allocator, *device, MemoryCategory::kCommBuffer, layout.max_unit_numel() * elem,
                  [this](const CommPoint& p) { wait_for_comm(p); }) {
    if (config.desync_check) comm.set_desync_check(true);
    check_same_model_on_all_ranks();
    allocator.set_limit(config.memory_limit_bytes);
    reduce_packs = PackedCollectives(layout, config.reduce_bucket_elements, /*backward=*/true);
    if (config.stage == 1 || config.stage == 2) {
      gather_packs = PackedCollectives(layout, config.allgather_bucket_elements, false);
    } else {
      gather_packs = PackedCollectives(layout, 0, false);
    }
    try {
      allocate();
    } catch (const OutOfMemoryError& e) {
      throw OutOfMemoryError(std::string(e.what()) + what_would_fit());
    }
    initialize(decls);
  }

  // The estimator's view of this model on other stages and more ranks, for an out-of-memory
  // message: the exact plan of the engine for each stage here, the ZeRO formula beyond.
  std::string what_would_fit() const {
    const uint64_t budget = allocator.limit();
    std::ostringstream out;
    out << "what the estimator says for this model (" << layout.numel() << " parameters, "
        << dtype_name(config.dtype) << ")";
    if (budget > 0) out << " against the limit of " << human_bytes(budget);
    out << ":\n";
    for (int stage = 0; stage <= 3; ++stage) {
      EngineConfig other = config;
      other.stage = stage;
      const MemoryPlan plan = plan_memory(layout, other);
      const uint64_t need = plan.model_state + plan.buffers;
      out << "  stage " << stage << " on " << world << " rank(s): " << human_bytes(need)
          << " per rank" << (budget > 0 && need <= budget ? " (fits)" : "")
          << (stage == config.stage ? " <- this run" : "") << "\n";
    }
    for (int ranks : {world * 2, world * 4, world * 8}) {
      const uint64_t need =
          estimate_model_state(layout.padded_numel(), ranks, config.dtype, 3).total();
      out << "  stage 3 on " << ranks << " ranks: about " << human_bytes(need)
          << " of model state per rank" << (budget > 0 && need <= budget ? " (fits)" : "") << "\n";
    }
    return out.str();
  }

  static EngineConfig validated(const EngineConfig& c, Communicator& comm) {
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
               "tracing is not available on "
                   << device_name(c.device)
                   << ": its spans are host times, which on a GPU "
                      "would show when work was issued, not when it ran");
    ZERO_CHECK(c.stage >= 0 && c.stage <= 3, "ZeRO stage must be 0, 1, 2 or 3, got " << c.stage);
    ZERO_CHECK(c.micro_batches >= 1,
               "micro-batches per step must be at least 1, got " << c.micro_batches);
    ZERO_CHECK(c.gradient_clipping >= 0.0f,
               "gradient clipping must be >= 0 (0 = off), got " << c.gradient_clipping);
    ZERO_CHECK(c.gradient_predivide_factor > 0.0f,
               "gradient_predivide_factor must be > 0, got " << c.gradient_predivide_factor);
    ZERO_CHECK(c.kernel_threads >= 1,
               "kernel threads must be at least 1, got " << c.kernel_threads);
    ZERO_CHECK(!c.grad_accum_dtype || *c.grad_accum_dtype == DType::kFloat32 ||
                   *c.grad_accum_dtype == c.dtype,
               "gradients accumulate in fp32 or in the working dtype ("
                   << dtype_name(c.dtype) << "), not in " << dtype_name(*c.grad_accum_dtype));
    return c;
  }

  static std::vector<ParamSpec> specs_of(const std::vector<ParamDecl>& decls) {
    std::vector<ParamSpec> specs;
    specs.reserve(decls.size());
    for (const ParamDecl& d : decls) specs.push_back(d.spec);
    return specs;
  }

  // Compares the layout's fingerprint across ranks before any collective depends on it: a rank
  // with a different model would otherwise hang or corrupt data in a mismatched collective.
  void check_same_model_on_all_ranks() {
    const auto stage = static_cast<uint64_t>(config.stage);
    std::vector<uint64_t> prints = all_gather_u64(host_comm, layout.fingerprint(stage));
    if (std::all_of(prints.begin(), prints.end(), [&](uint64_t p) { return p == prints[0]; }))
      return;

    // Find the first parameter that differs: exchange the count, then per-parameter prints.
    std::vector<uint64_t> counts = all_gather_u64(host_comm, layout.params().size());
    std::vector<uint64_t> stages = all_gather_u64(host_comm, stage);
    size_t max_count = *std::max_element(counts.begin(), counts.end());
    for (size_t i = 0; i < max_count; ++i) {
      uint64_t mine = i < layout.params().size() ? layout.param_fingerprint(i) : 0;
      std::vector<uint64_t> theirs = all_gather_u64(host_comm, mine);
      std::vector<int> differing;
      for (int r = 0; r < world; ++r) {
        if (theirs[r] != theirs[0]) differing.push_back(r);
      }
      if (differing.empty()) continue;
      std::string mine_text = i < layout.params().size() ? layout.describe_param(i) : "nothing";
      ZERO_FAIL("the model differs across ranks: parameter #"
                << i << " differs between rank 0 and rank(s) " << join_ranks(differing)
                << "; this rank (" << rank << ") registered " << mine_text
                << "; every rank must register the same parameters in the same order");
    }
    for (int r = 0; r < world; ++r) {
      ZERO_CHECK(stages[r] == stages[0], "the ZeRO stage differs across ranks: rank 0 uses stage "
                                             << stages[0] << ", rank " << r << " uses stage "
                                             << stages[r]);
    }
    ZERO_FAIL(
        "the layout differs across ranks (same parameters, but a different world size, "
        "alignment or merge threshold); this rank uses world size "
        << world << ", alignment " << config.alignment_bytes << ", merge threshold "
        << config.merge_bytes);
  }

  void allocate() {
    const int state_arrays = optimizer.state_count();
    units.resize(layout.units().size());
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = layout.units()[u];
      UnitState& s = units[u];
      const UnitBytes b = unit_bytes(unit, config, state_arrays);
      s.persistent = is_persistent(unit, config);
      s.params_full = allocator.allocate(b.params_full, MemoryCategory::kParamsFull);
      s.params_shard = allocator.allocate(b.params_shard, MemoryCategory::kParamsShard);
      s.master = allocator.allocate(b.master, MemoryCategory::kMaster);
      s.grads_full = allocator.allocate(b.grads_full, MemoryCategory::kGrads);
      s.grads_shard = allocator.allocate(b.grads_shard, MemoryCategory::kGrads);
      for (int k = 0; k < b.state_arrays; ++k) {
        s.state[k] = allocator.allocate(b.state, MemoryCategory::kOptimizerState);
      }
      s.gathered = config.stage <= 2 || s.persistent;
    }
    param_pool.reserve(param_buffer_count(layout, config));
    grad_pool.reserve(uses_grad_buckets(config) ? 2 : 0);
    fusion = allocator.allocate(fusion_bytes(layout, config), MemoryCategory::kCommBuffer);
    const size_t staging_bytes =
        max_staging_bytes(layout, config, [this](CollectiveOp op, size_t count, DType dtype) {
          return comm.staging_bytes(op, count, dtype);
        });
    if (staging_bytes > 0) {
      staging = allocator.allocate(staging_bytes, MemoryCategory::kCommBuffer);
      comm.set_staging_buffer(staging.data(), staging.bytes());
    }
    if (needs_fp32_scratch(config)) {
      fp32_scratch =
          allocator.allocate(layout.max_unit_numel() * sizeof(float), MemoryCategory::kCommBuffer);
    }
    norm_sums = allocator.allocate(units.size() * sizeof(float), MemoryCategory::kOther);
    norm_sums_on_host =
        host_allocator.allocate(units.size() * sizeof(float), MemoryCategory::kOther);
  }

  // Fills the elements this rank holds; the value of each is a function of the seed and the
  // element's global identity only, so every world size starts from the same model. The working
  // copy is the master rounded to the working dtype, as after every optimizer step. Values are
  // made in host memory and copied to the device one buffer at a time.
  void initialize(const std::vector<ParamDecl>& decls) {
    std::vector<char> host;
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = layout.units()[u];
      UnitState& s = units[u];
      // `buffer` holds unit elements [region_begin, region_end) of `dtype`; padding stays zero.
      auto upload = [&](Buffer& buffer, DType dtype, size_t region_begin, size_t region_end) {
        if (buffer.empty()) return;
        host.assign(buffer.bytes(), 0);
        for (int i : unit.params) {
          const ParamPlacement& p = layout.params()[i];
          const size_t begin = std::clamp(region_begin, p.offset, p.offset + p.numel);
          const size_t end = std::clamp(region_end, p.offset, p.offset + p.numel);
          for (size_t e = begin; e < end; ++e) {
            store_from_float(host.data(), dtype, e - region_begin,
                             init_value(config.seed, i, e - p.offset, decls[i].init));
          }
        }
        device->copy_from_host(buffer.data(), host.data(), host.size());
      };
      const size_t shard_begin = static_cast<size_t>(rank) * unit.shard;
      const size_t shard_end = shard_begin + unit.shard;
      upload(s.params_full, config.dtype, 0, unit.numel);
      upload(s.params_shard, config.dtype, shard_begin, shard_end);
      if (config.stage == 0) {
        upload(s.master, DType::kFloat32, 0, unit.numel);
      } else {
        upload(s.master, DType::kFloat32, shard_begin, shard_end);
      }
    }
  }

  // Wraps a collective issued on the communication stream with markers that run on that stream
  // right before and after it: the step's comm_busy_ms is what ran between them, and the trace
  // holds when the collective really ran, not when it was queued. The end marker is the point
  // returned, so whoever waits for the collective also waits until its span is closed, and a
  // compute span that starts after the wait cannot look overlapped. (CUDA runs enqueued host
  // work at issue, so there the figures would be issue times: only the CPU stream measures.)
  template <typename Issue>
  CommPoint traced(const char* name, uint64_t bytes, Issue issue) {
    ++collectives_issued;
    if (!measures_comm()) return CommPoint{issue(), nullptr};
    auto begin_us = std::make_shared<double>(0.0);
    comm.stream().enqueue([begin_us] { *begin_us = Trace::now_us(); });
    issue();
    Trace* t = trace.enabled() ? &trace : nullptr;
    std::shared_ptr<std::atomic<int64_t>> busy = comm_busy_us;
    std::string span_name = name;
    auto end_us = std::make_shared<double>(0.0);
    Event end = comm.stream().enqueue([t, busy, begin_us, end_us, span_name, bytes] {
      *end_us = Trace::now_us();
      busy->fetch_add(static_cast<int64_t>(*end_us - *begin_us));
      if (t) t->add(TraceSpan{span_name, true, *begin_us, *end_us, bytes});
    });
    return CommPoint{std::move(end), std::move(end_us)};
  }

  bool measures_comm() const {
    return comm.stream().native_handle() == nullptr;
  }

  // The communication stream's current end, stamped when the stream gets there.
  CommPoint comm_point() {
    if (!measures_comm()) return CommPoint{comm.stream().record(), nullptr};
    auto done_us = std::make_shared<double>(0.0);
    Event e = comm.stream().enqueue([done_us] { *done_us = Trace::now_us(); });
    return CommPoint{std::move(e), std::move(done_us)};
  }

  // The one place compute waits for communication. comm_wait_ms adds how long compute was
  // exposed to it: from when compute needed the result (`needed_us`; now, by default) until
  // the stream got there, as the stream stamped it. Whether this thread happened to be
  // scheduled while the collective ran does not change the figure (ranks outnumber cores here).
  void wait_for_comm(const CommPoint& point, double needed_us = -1.0) {
    if (needed_us < 0.0) needed_us = Trace::now_us();
    device->wait(point.event);  // rethrows a failed collective's error
    if (point.done_us) comm_wait_us += std::max(0.0, *point.done_us - needed_us);
  }

  // An issued collective: with overlap_comm off, compute needs it from the moment it was
  // issued (`issue_us`) and waits for it right away.
  CommPoint issued(CommPoint point, double issue_us) {
    if (!config.overlap_comm) wait_for_comm(point, issue_us);
    return point;
  }

  // The slice of a unit's elements this rank updates: the whole unit at stage 0 (every rank
  // updates all of it identically), its shard otherwise. Offsets in elements of the unit.
  size_t owned_begin(size_t u) const {
    return config.stage == 0 ? 0 : static_cast<size_t>(rank) * layout.units()[u].shard;
  }
  size_t owned_numel(size_t u) const {
    return config.stage == 0 ? layout.units()[u].numel : layout.units()[u].shard;
  }

  // This rank's working-dtype parameters the optimizer writes (see owned_begin).
  void* owned_params(size_t u) {
    UnitState& s = units[u];
    if (config.stage == 3) return s.params_shard.data();
    return byte_offset(s.params_full.data(), owned_begin(u) * elem);
  }

  // The rank's reduced (and accumulated) gradient of what it owns, in accum_dtype.
  void* owned_grads(size_t u) {
    if (config.stage <= 1) return byte_offset(units[u].grads_full.data(), owned_begin(u) * accum);
    return units[u].grads_shard.data();
  }

  // The rank's shard of the reduced gradient at every stage: the global norm is summed over
  // shards, so stage 0 (which owns whole units) adds up in the same order as the others.
  void* grad_shard(size_t u) {
    const size_t begin = static_cast<size_t>(rank) * layout.units()[u].shard;
    if (config.stage <= 1) return byte_offset(units[u].grads_full.data(), begin * accum);
    return units[u].grads_shard.data();
  }

  // Sums `bucket` (the unit's whole gradient from this rank, `dtype`) over the ranks and leaves
  // this rank's reduced slice in `dest` (accum_dtype; added to it when `accumulate`). Everything
  // runs on the communication stream in order, so the returned event covers the whole chain.
  CommPoint reduce_to_shard(const Unit& unit, void* bucket, DType dtype, void* dest,
                            bool accumulate) {
    const double issue_us = Trace::now_us();
    const bool via_fp32 = config.reduce_in_fp32 && dtype != DType::kFloat32;
    const DType wire = via_fp32 ? DType::kFloat32 : dtype;
    const DType dest_dtype = accum_dtype;
    const size_t numel = unit.numel;
    const size_t shard = unit.shard;
    prepare_for_reduction(bucket, dtype, numel);
    comm.stream().wait(device->record());
    DeviceContext* dev = device.get();
    Stream* on = &comm.stream();
    void* buf = bucket;
    if (via_fp32) {
      buf = fp32_scratch.data();
      on->enqueue([=] { dev->cast(bucket, dtype, buf, DType::kFloat32, numel, on); });
    }
    const uint64_t bytes_on_wire = numel * dtype_size(wire);
    if (!accumulate && wire == dest_dtype && config.reduce_scatter) {
      return issued(traced("reduce_scatter", bytes_on_wire,
                           [&] { return comm.reduce_scatter(buf, dest, shard, wire); }),
                    issue_us);
    }
    void* slot = byte_offset(buf, rank * shard * dtype_size(wire));
    if (config.reduce_scatter) {
      traced("reduce_scatter", bytes_on_wire,
             [&] { return comm.reduce_scatter(buf, slot, shard, wire); });
    } else {
      traced("all_reduce", bytes_on_wire, [&] { return comm.all_reduce(buf, buf, numel, wire); });
    }
    on->enqueue([=] {
      if (dest == slot) return;
      if (accumulate) {
        dev->add(dest, dest_dtype, slot, wire, shard, on);
      } else {
        dev->cast(slot, wire, dest, dest_dtype, shard, on);
      }
    });
    return issued(comm_point(), issue_us);
  }

  // Sums a whole unit's gradient (`dtype`) over the ranks in place (stage 0).
  CommPoint reduce_whole(const Unit& unit, void* bucket, DType dtype) {
    const double issue_us = Trace::now_us();
    const size_t numel = unit.numel;
    prepare_for_reduction(bucket, dtype, numel);
    comm.stream().wait(device->record());
    if (config.reduce_in_fp32 && dtype != DType::kFloat32) {
      DeviceContext* dev = device.get();
      Stream* on = &comm.stream();
      void* buf = fp32_scratch.data();
      on->enqueue([=] { dev->cast(bucket, dtype, buf, DType::kFloat32, numel, on); });
      traced("all_reduce", numel * sizeof(float),
             [&] { return comm.all_reduce(buf, buf, numel, DType::kFloat32); });
      on->enqueue([=] { dev->cast(buf, DType::kFloat32, bucket, dtype, numel, on); });
    } else {
      traced("all_reduce", numel * dtype_size(dtype),
             [&] { return comm.all_reduce(bucket, bucket, numel, dtype); });
    }
    return issued(comm_point(), issue_us);
  }

  // The pre-divide keeps 16-bit sums over many ranks in range: divide by f before the sum,
  // multiply the f back in the optimizer's gradient scale.
  void prepare_for_reduction(void* bucket, DType dtype, size_t numel) {
    if (config.gradient_predivide_factor != 1.0f) {
      device->scale(bucket, dtype, 1.0f / config.gradient_predivide_factor, numel);
    }
  }

  // Stage 3: starts unit u's all-gather into a pooled buffer. An optional prefetch stays within
  // the live budget (stage3_max_live_parameters) and the planned buffers and says whether it
  // started; a required gather always starts.
  bool start_gather(int u, bool required) {
    UnitState& s = units[u];
    if (s.gathered || config.stage != 3) return true;
    const Unit& unit = layout.units()[u];
    if (!required) {
      const bool over_live_budget =
          config.max_live_elements > 0 && live > 0 && live + unit.numel > config.max_live_elements;
      if (over_live_budget || !param_pool.can_acquire_within_plan()) return false;
    }
    const double issue_us = Trace::now_us();
    s.params_full = param_pool.acquire(/*zeroed=*/false);
    // The pooled buffer may have just been released by compute: order the gather after it.
    comm.stream().wait(device->record());
    s.params_ready =
        issued(traced("all_gather", unit.numel * elem,
                      [&] {
                        return comm.all_gather(s.params_shard.data(), s.params_full.data(),
                                               unit.shard, config.dtype);
                      }),
               issue_us);
    s.gathered = true;
    live += unit.numel;
    return true;
  }

  bool prefetch(int u) {
    check_unit(u);
    return start_gather(u, /*required=*/false);
  }

  void gather(int u) {
    check_unit(u);
    UnitState& s = units[u];
    start_gather(u, /*required=*/true);
    // Stages 1-2 after a step: the parameters come back through the post-step all-gather.
    s.gathered = true;
    wait_for_comm(s.params_ready);
  }

  void release(int u) {
    check_unit(u);
    UnitState& s = units[u];
    if (config.stage != 3 || !s.gathered || s.persistent) return;
    wait_for_comm(s.params_ready);
    param_pool.give_back(std::move(s.params_full), CommPoint{device->record(), nullptr});
    s.gathered = false;
    live -= layout.units()[u].numel;
  }

  // Each unit's gradient is reduced as soon as it is final, behind the rest of backward (as
  // DDP does): stages 0-1 after the last micro-batch's backward of the unit, stages 2-3 after
  // every micro-batch's, whose bucket is then free for the next unit once that collective ran.
  void grads_ready(int u) {
    check_unit(u);
    UnitState& s = units[u];
    const Unit& unit = layout.units()[u];
    ZERO_CHECK(s.micro_batches_done < config.micro_batches,
               "grads_ready(" << u << ") called " << s.micro_batches_done + 1
                              << " times before step(); configured micro-batches per step: "
                              << config.micro_batches);
    ZERO_CHECK(!s.persistent, "grads_ready(" << u << "): unit " << u
                                             << " holds the persistent parameters "
                                                "(stage3_param_persistence_threshold); step() "
                                                "reduces their gradients itself");
    s.micro_batches_done += 1;
    const bool last = s.micro_batches_done == config.micro_batches;
    if (config.stage >= 2) {
      if (s.bucket.empty()) s.bucket = grad_pool.acquire(/*zeroed=*/true);
      const CommPoint bucket_read = reduce_unit(u, s.bucket.data(), config.dtype,
                                                /*accumulate=*/s.micro_batches_done > 1);
      grad_pool.give_back(std::move(s.bucket), bucket_read);
      return;
    }
    if (!s.bucket.empty()) {
      // This micro-batch's gradient into the accumulator of another dtype.
      device->add(s.grads_full.data(), accum_dtype, s.bucket.data(), config.dtype, unit.numel);
      grad_pool.give_back(std::move(s.bucket), CommPoint{device->record(), nullptr});
    }
    // Stages 0-1 keep whole gradients through accumulation and reduce them in place (stage 1's
    // reduced slice lands at the rank's own offset in the full buffer).
    if (last) reduce_unit(u, s.grads_full.data(), accum_dtype, /*accumulate=*/false);
  }

  // Reduces unit u's gradient `source` (`dtype`) into what the rank keeps of it, alone or as
  // part of its reduce_bucket_size pack. Returns the event after which `source` may be reused.
  CommPoint reduce_unit(int u, void* source, DType dtype, bool accumulate) {
    UnitState& s = units[u];
    const Unit& unit = layout.units()[u];
    if (reduce_packs.fused(u)) return reduce_packed(u, source, dtype, accumulate);
    s.grads_reduced = config.stage == 0
                          ? reduce_whole(unit, source, dtype)
                          : reduce_to_shard(unit, source, dtype, owned_grads(u), accumulate);
    return s.grads_reduced;
  }

  // A unit of a packed reduction: its gradient is copied into its place in every rank region
  // of the fusion buffer (in the reduction dtype); the pack's last unit issues the one
  // collective and copies each unit's reduced part out to what the rank keeps.
  CommPoint reduce_packed(int u, void* source, DType dtype, bool accumulate) {
    const double issue_us = Trace::now_us();
    PackedCollectives& packs = reduce_packs;
    const int p = packs.pack_of[u];
    ZERO_CHECK(packs.filling == -1 || packs.filling == p,
               "grads_ready(" << u << ") while the reduction bucket of unit "
                              << packs.packs[packs.filling].front()
                              << " still waits for units; with reduce_bucket_size packing "
                                 "units must become ready in backward order");
    packs.filling = p;
    const DType wire = reduction_dtype(config);
    const size_t wire_size = dtype_size(wire);
    const size_t region = packs.region[p];
    const Unit& unit = layout.units()[u];
    prepare_for_reduction(source, dtype, unit.numel);
    comm.stream().wait(device->record());
    DeviceContext* dev = device.get();
    Stream* on = &comm.stream();
    char* fused = static_cast<char*>(fusion.data());
    const int ranks = world;
    const size_t shard = unit.shard;
    const size_t offset = packs.offset_of[u];
    const char* from = static_cast<const char*>(source);
    const size_t from_size = dtype_size(dtype);
    on->enqueue([=] {
      for (int r = 0; r < ranks; ++r) {
        dev->cast(from + r * shard * from_size, dtype, fused + (r * region + offset) * wire_size,
                  wire, shard, on);
      }
    });
    const CommPoint copied = comm_point();
    units[u].grads_reduced = copied;
    if (++packs.filled < packs.packs[p].size()) return copied;
    packs.filling = -1;
    packs.filled = 0;

    const uint64_t bytes = ranks * region * wire_size;
    if (config.stage == 0 || !config.reduce_scatter) {
      traced("all_reduce", bytes,
             [&] { return comm.all_reduce(fused, fused, ranks * region, wire); });
    } else {
      traced("reduce_scatter", bytes, [&] {
        return comm.reduce_scatter(fused, fused + rank * region * wire_size, region, wire);
      });
    }
    for (int v : packs.packs[p]) {
      const size_t v_shard = layout.units()[v].shard;
      const char* reduced = fused + packs.offset_of[v] * wire_size;
      if (config.stage == 0) {
        // Stage 0 keeps the whole sum: every rank region goes back to its place.
        char* dest = static_cast<char*>(units[v].grads_full.data());
        const DType to = accum_dtype;
        on->enqueue([=] {
          for (int r = 0; r < ranks; ++r) {
            dev->cast(reduced + r * region * wire_size, wire, dest + r * v_shard * dtype_size(to),
                      to, v_shard, on);
          }
        });
        continue;
      }
      const char* mine = reduced + rank * region * wire_size;
      void* dest = owned_grads(static_cast<size_t>(v));
      const DType to = accum_dtype;
      on->enqueue([=] {
        if (accumulate) {
          dev->add(dest, to, mine, wire, v_shard, on);
        } else {
          dev->cast(mine, wire, dest, to, v_shard, on);
        }
      });
    }
    const CommPoint reduced = issued(comm_point(), issue_us);
    for (int v : packs.packs[p]) units[v].grads_reduced = reduced;
    return copied;
  }

  // One optimizer step in named phases: wait for the reductions, the global norm and overflow,
  // the update of each rank's slice, the all-gathers that bring the slices back.
  StepStats step() {
    check_ready_for_step();
    // The persistent unit's gradient was added to by every module's backward: reduce it now.
    for (size_t u = 0; u < units.size(); ++u) {
      if (units[u].persistent) {
        reduce_unit(static_cast<int>(u), units[u].grads_full.data(), config.dtype, false);
      }
    }
    for (UnitState& s : units) wait_for_comm(s.grads_reduced);
    const GradientCheck check = check_gradients();

    StepStats stats;
    stats.grad_norm = check.grad_norm;
    stats.skipped = skip_step(check);
    stats.loss_scale = loss_scale();
    stats.lr = current_lr();
    if (!stats.skipped) {
      float clip = 1.0f;
      if (config.gradient_clipping > 0.0f && stats.grad_norm > config.gradient_clipping) {
        clip = config.gradient_clipping / (stats.grad_norm + 1e-6f);
        stats.clipped = true;
      }
      update(stats.lr, clip * check.to_mean);
      start_post_step_gathers();
    }
    finish_step();
    stats.step = optimizer.step();
    stats.collectives = collectives_issued;
    stats.comm_busy_ms = static_cast<double>(comm_busy_us->exchange(0)) / 1000.0;
    stats.comm_wait_ms = comm_wait_us / 1000.0;
    collectives_issued = 0;
    comm_wait_us = 0.0;
    return stats;
  }

  void check_ready_for_step() const {
    for (size_t u = 0; u < units.size(); ++u) {
      if (units[u].persistent) continue;  // reduced by the step itself
      ZERO_CHECK(units[u].micro_batches_done == config.micro_batches,
                 "step() after " << units[u].micro_batches_done << " backward pass(es) of unit "
                                 << u << "; expected " << config.micro_batches
                                 << " (one grads_ready per unit per micro-batch)");
      // A stage-3 unit gathered across the step would keep serving the old parameters.
      ZERO_CHECK(config.stage != 3 || !units[u].gathered || units[u].persistent,
                 "step() while unit " << u << " is still gathered; release it first");
    }
  }

  struct GradientCheck {
    std::vector<float> unit_sums;  // each unit's sum of squared gradients over all ranks
    float grad_norm = 0.0f;        // of the mean gradient of the global batch
    float to_mean = 1.0f;          // the factor that takes the reduced gradients to that mean
    bool overflow = false;
  };

  // One all-reduce of each unit's sum of squares over the shards gives the global norm, and
  // tells every rank at once whether (and in which unit) a gradient overflowed anywhere.
  GradientCheck check_gradients() {
    float* unit_sums = norm_sums.as<float>();
    {
      ScopedSpan span(trace, "gradient norm");
      for (size_t u = 0; u < units.size(); ++u) {
        device->sum_squares(grad_shard(u), accum_dtype, layout.units()[u].shard, unit_sums + u);
      }
    }
    comm.stream().wait(device->record());
    wait_for_comm(traced("all_reduce", units.size() * sizeof(float), [&] {
      return comm.all_reduce(unit_sums, unit_sums, units.size(), DType::kFloat32);
    }));
    // The one value the host must see each step: whether to skip, and how much to clip.
    device->copy_to_host(norm_sums_on_host.data(), unit_sums, units.size() * sizeof(float));
    GradientCheck check;
    check.unit_sums.assign(norm_sums_on_host.as<float>(),
                           norm_sums_on_host.as<float>() + units.size());
    double total = 0.0;
    for (float v : check.unit_sums) total += v;
    // Gradients are summed over ranks and micro-batches and carry the loss scale (and the
    // pre-divide): one factor takes them back to the mean gradient of the global batch.
    check.to_mean =
        config.gradient_predivide_factor /
        (static_cast<float>(world) * static_cast<float>(config.micro_batches) * loss_scale());
    check.grad_norm = static_cast<float>(std::sqrt(total)) * check.to_mean;
    check.overflow = !std::isfinite(total);
    return check;
  }

  // fp16 lets the loss scaler decide; fp32 and bf16 stop on a non-finite gradient, naming the
  // unit, unless told to skip such steps.
  bool skip_step(const GradientCheck& check) {
    if (config.dtype == DType::kFloat16) return loss_scaler.update(check.overflow);
    if (!check.overflow) return false;
    const std::vector<float>& sums = check.unit_sums;
    size_t bad = 0;
    while (bad < sums.size() && std::isfinite(sums[bad])) ++bad;
    const Unit& unit = layout.units()[bad < sums.size() ? bad : 0];
    const std::string first_param =
        unit.params.empty() ? "no parameters" : layout.params()[unit.params.front()].name;
    ZERO_CHECK(config.skip_nonfinite_steps,
               "step " << optimizer.step() + 1 << ": the gradient of unit " << bad
                       << " (starting at parameter '" << first_param
                       << "') is not finite on some rank; stopping (\"nonfinite_gradients\": "
                          "\"skip\" in the config skips such steps instead)");
    return true;
  }

  // Fused AdamW (or SGD) over what each rank owns, in passes of at most sub_group_size
  // elements (DeepSpeed's bound on what one optimizer pass touches); each unit's slice may be
  // cut into several pieces, which the element-wise update does not notice.
  void update(float lr, float grad_scale) {
    optimizer.begin_step(lr);
    const bool separate_master = config.dtype != DType::kFloat32;
    const size_t limit = config.optimizer_sub_group_elements;
    std::vector<ShardUpdate> group;
    size_t group_numel = 0;
    ScopedSpan optimizer_span(trace, "optimizer");
    const auto flush = [&] {
      if (!group.empty())
        device->apply_optimizer(optimizer, group, accum_dtype, grad_scale, config.dtype);
      group.clear();
      group_numel = 0;
    };
    for (size_t u = 0; u < units.size(); ++u) {
      UnitState& s = units[u];
      void* working = owned_params(u);
      const size_t n = owned_numel(u);
      for (size_t begin = 0; begin < n;) {
        const size_t room = limit == 0 ? n : limit - group_numel;
        const size_t count = std::min(n - begin, room);
        ShardUpdate piece;
        piece.shard.n = count;
        piece.shard.master =
            separate_master ? s.master.as<float>() + begin : static_cast<float*>(working) + begin;
        for (int k = 0; k < optimizer.state_count(); ++k) {
          piece.shard.state[k] = s.state[k].as<float>() + begin;
        }
        piece.grad = byte_offset(owned_grads(u), begin * accum);
        piece.param_out = separate_master ? byte_offset(working, begin * elem) : nullptr;
        group.push_back(piece);
        group_numel += count;
        begin += count;
        if (limit != 0 && group_numel == limit) flush();
      }
    }
    flush();
  }

  // Brings every rank's updated slice back into the full parameters (stages 1-2, and stage
  // 3's persistent units); the next forward's gather(u) waits for unit u only, so the
  // all-gathers overlap with the forward.
  void start_post_step_gathers() {
    if (config.stage == 0) return;
    comm.stream().wait(device->record());
    for (const std::vector<int>& pack : gather_packs.packs) {
      if (pack.size() > 1) {
        gather_packed(pack);
        continue;
      }
      const int u = pack.front();
      UnitState& s = units[u];
      if (s.params_full.empty()) continue;
      const Unit& unit = layout.units()[u];
      const double issue_us = Trace::now_us();
      s.params_ready = issued(traced("all_gather", unit.numel * elem,
                                     [&] {
                                       return comm.all_gather(owned_params(u), s.params_full.data(),
                                                              unit.shard, config.dtype);
                                     }),
                              issue_us);
      if (!s.persistent) s.gathered = false;
    }
  }

  // An allgather_bucket_size pack (stages 1-2): each unit's updated slice into its place in
  // this rank's region of the fusion buffer, one all-gather of the regions, and every rank's
  // slice of each unit back into its full parameters.
  void gather_packed(const std::vector<int>& pack) {
    const double issue_us = Trace::now_us();
    const int p = gather_packs.pack_of[pack.front()];
    const size_t region = gather_packs.region[p];
    char* fused = static_cast<char*>(fusion.data());
    DeviceContext* dev = device.get();
    Stream* on = &comm.stream();
    const size_t w = elem;
    for (int u : pack) {
      const char* mine = static_cast<const char*>(owned_params(u));
      char* slot = fused + (rank * region + gather_packs.offset_of[u]) * w;
      const size_t bytes = layout.units()[u].shard * w;
      on->enqueue([=] { dev->copy(slot, mine, bytes, on); });
    }
    traced("all_gather", world * region * w,
           [&] { return comm.all_gather(fused + rank * region * w, fused, region, config.dtype); });
    for (int u : pack) {
      char* full = static_cast<char*>(units[u].params_full.data());
      const char* part = fused + gather_packs.offset_of[u] * w;
      const size_t shard_bytes = layout.units()[u].shard * w;
      const int ranks = world;
      on->enqueue([=] {
        for (int r = 0; r < ranks; ++r) {
          dev->copy(full + r * shard_bytes, part + r * region * w, shard_bytes, on);
        }
      });
    }
    const CommPoint ready = issued(comm_point(), issue_us);
    for (int u : pack) {
      units[u].params_ready = ready;
      units[u].gathered = false;
    }
  }

  float current_lr() const {
    return config.lr_schedule.type == LrScheduleType::kConstant
               ? config.optimizer.lr
               : schedule.lr_at(optimizer.step() + 1);
  }

  float loss_scale() const {
    return config.dtype == DType::kFloat16 ? loss_scaler.scale() : 1.0f;
  }

  // Gradients start from zero for the next step.
  void finish_step() {
    for (UnitState& s : units) {
      if (!s.grads_full.empty()) device->zero(s.grads_full.data(), s.grads_full.bytes());
      s.micro_batches_done = 0;
    }
  }

  void check_unit(int u) const {
    ZERO_CHECK(u >= 0 && u < static_cast<int>(units.size()),
               "unit " << u << " does not exist; the model has " << units.size() << " units");
  }

  const ParamPlacement& placement(int p) const {
    ZERO_CHECK(p >= 0 && p < static_cast<int>(layout.params().size()),
               "parameter " << p << " does not exist; the model has " << layout.params().size()
                            << " parameters");
    return layout.params()[p];
  }

  void* param(int p) {
    const ParamPlacement& pl = placement(p);
    UnitState& s = units[pl.unit];
    ZERO_CHECK(s.gathered && !s.params_full.empty(),
               "parameter '" << pl.name << "' used while unit " << pl.unit
                             << " is not gathered; call gather(" << pl.unit << ") first");
    return byte_offset(s.params_full.data(), pl.offset * elem);
  }

  void* grad(int p) {
    const ParamPlacement& pl = placement(p);
    UnitState& s = units[pl.unit];
    if (!uses_grad_buckets(config) || s.persistent) {
      return byte_offset(s.grads_full.data(), pl.offset * elem);
    }
    if (s.bucket.empty()) s.bucket = grad_pool.acquire(/*zeroed=*/true);
    return byte_offset(s.bucket.data(), pl.offset * elem);
  }

  Engine::StateView state_view(int u) {
    check_unit(u);
    // A post-step all-gather or a prefetch may still be reading these arrays.
    device->wait(comm.stream().record());
    UnitState& s = units[u];
    Engine::StateView view;
    view.begin = owned_begin(u);
    view.end = view.begin + owned_numel(u);
    const size_t n = view.end - view.begin;
    const bool separate_master = config.dtype != DType::kFloat32;
    view.master =
        host_view(separate_master ? s.master.as<float>() : static_cast<float*>(owned_params(u)), n);
    view.state_count = optimizer.state_count();
    for (int k = 0; k < view.state_count; ++k) view.state[k] = host_view(s.state[k].as<float>(), n);
    return view;
  }

  // Host memory for the n floats at `data`: the array itself on the CPU; on a GPU a fresh copy,
  // which state_loaded() writes back.
  float* host_view(float* data, size_t n) {
    if (!config.device.is_cuda()) return data;
    Buffer& copy = host_state[data];
    if (copy.bytes() != n * sizeof(float)) {
      copy = host_allocator.allocate(n * sizeof(float), MemoryCategory::kOther);
    }
    device->copy_to_host(copy.data(), data, n * sizeof(float));
    return copy.as<float>();
  }

  void state_loaded() {
    device->wait(comm.stream().record());
    for (const auto& [data, copy] : host_state)
      device->copy_from_host(data, copy.data(), copy.bytes());
    host_state.clear();
    for (size_t u = 0; u < units.size(); ++u) {
      if (config.dtype != DType::kFloat32) {
        device->cast(units[u].master.data(), DType::kFloat32, owned_params(u), config.dtype,
                     owned_numel(u));
      }
    }
    start_post_step_gathers();
    for (UnitState& s : units) wait_for_comm(s.params_ready);
  }

  std::vector<std::vector<float>> gather_full_params() {
    std::vector<std::vector<float>> out(layout.params().size());
    for (size_t u = 0; u < units.size(); ++u) {
      const bool was_gathered = units[u].gathered;
      gather(static_cast<int>(u));
      std::vector<char> host(layout.units()[u].numel * elem);
      device->copy_to_host(host.data(), units[u].params_full.data(), host.size());
      for (int p : layout.units()[u].params) {
        const ParamPlacement& pl = layout.params()[p];
        out[p].resize(pl.numel);
        kernels::cast(host.data() + pl.offset * elem, config.dtype, out[p].data(), DType::kFloat32,
                      pl.numel);
      }
      if (!was_gathered) release(static_cast<int>(u));
    }
    return out;
  }

  std::vector<std::vector<float>> gather_full_master() {
    if (config.dtype == DType::kFloat32) return gather_full_params();
    std::vector<std::vector<float>> out(layout.params().size());
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = layout.units()[u];
      std::vector<float> full(unit.numel);
      if (config.stage == 0) {
        device->copy_to_host(full.data(), units[u].master.data(), unit.numel * sizeof(float));
      } else {
        Buffer gathered = allocator.allocate(unit.numel * sizeof(float), MemoryCategory::kOther);
        comm.stream().wait(device->record());
        device->wait(
            comm.all_gather(units[u].master.data(), gathered.data(), unit.shard, DType::kFloat32));
        device->copy_to_host(full.data(), gathered.data(), unit.numel * sizeof(float));
      }
      for (int p : unit.params) {
        const ParamPlacement& pl = layout.params()[p];
        out[p].assign(full.begin() + static_cast<ptrdiff_t>(pl.offset),
                      full.begin() + static_cast<ptrdiff_t>(pl.offset + pl.numel));
      }
    }
    return out;
  }

  Communicator& comm;
  EngineConfig config;
  std::shared_ptr<DeviceContext> device;  // before the allocator: its memory comes from here
  std::unique_ptr<Communicator> owned_host_comm;
  Communicator& host_comm;
  Allocator allocator;
  Allocator host_allocator;  // pinned host memory for the device's copies (host memory on the CPU)
  Layout layout;
  Optimizer optimizer;
  LrSchedule schedule;
  LossScaler loss_scaler;
  int rank;
  int world;
  size_t elem;        // bytes per element of the working dtype
  DType accum_dtype;  // of the kept gradients (see accumulation_dtype)
  size_t accum;       // and its bytes per element
  Trace trace;
  BufferPool param_pool;
  BufferPool grad_pool;
  Buffer fp32_scratch;  // reductions in fp32 of a 16-bit gradient (reduce_in_fp32)
  Buffer fusion;        // packed collectives (see pack_units); one at a time, in stream order
  Buffer staging;       // the communicator's staging memory (set_staging_buffer)
  PackedCollectives reduce_packs;
  PackedCollectives gather_packs;
  Buffer norm_sums;          // each unit's sum of squared gradients, all-reduced at step()
  Buffer norm_sums_on_host;  // and their copy, which the host reads
  std::map<float*, Buffer> host_state;  // state_view() copies of device arrays (CUDA only)
  std::vector<UnitState> units;
  size_t live = 0;  // elements of non-persistent stage-3 units gathered now
  // Communication figures of the step in progress (StepStats). Busy time is added by markers
  // on the communication stream, hence shared with its closures and atomic.
  int collectives_issued = 0;
  double comm_wait_us = 0.0;
  std::shared_ptr<std::atomic<int64_t>> comm_busy_us = std::make_shared<std::atomic<int64_t>>(0);
};

Engine::Engine(Communicator& comm, const std::vector<ParamDecl>& params, const EngineConfig& config)
    : impl_(std::make_unique<Impl>(comm, params, config)) {}

Engine::~Engine() {
  // Collectives may still read or write our buffers: let them finish before the memory goes.
  // A failed stream reports its error to whoever waits; here there is no one left to tell.
  try {
    impl_->comm.stream().synchronize();
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
const std::shared_ptr<DeviceContext>& Engine::device_context() const {
  return impl_->device;
}
Allocator& Engine::allocator() {
  return impl_->allocator;
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
  impl_->grads_ready(unit);
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
  return impl_->config.dtype;
}
float Engine::loss_scale() const {
  return impl_->loss_scale();
}
size_t Engine::live_elements() const {
  return impl_->live;
}
bool Engine::is_gathered(int unit) const {
  impl_->check_unit(unit);
  return impl_->units[unit].gathered;
}
Engine::StateView Engine::state_view(int unit) {
  return impl_->state_view(unit);
}
void Engine::state_loaded() {
  impl_->state_loaded();
}
void Engine::release_state_views() {
  impl_->host_state.clear();
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
std::vector<std::vector<float>> Engine::gather_full_params() {
  return impl_->gather_full_params();
}
std::vector<std::vector<float>> Engine::gather_full_master() {
  return impl_->gather_full_master();
}

}  // namespace zero
