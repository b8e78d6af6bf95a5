#include "zero/runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "zero/kernels/check.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/runtime/estimate.h"

namespace zero {

namespace {

// On the CPU the compute stream is the calling thread: its work is finished when the call
// returns, so an event recorded on it is already complete, and waiting for another stream's
// event blocks the host. The engine still records and waits at every join, so the CUDA
// device only has to replace these two calls.
struct HostCompute {
  Event record() const { return Event(); }
  void wait(const Event& event) const { event.wait(); }
};

// Same-size buffers handed out and given back with the event after which they are free again
// (e.g. the reduce-scatter that reads a gradient bucket). Grows on demand; the peak is what the
// schedule needs (two: the unit being computed and the one in flight beside it).
class BufferPool {
 public:
  BufferPool(Allocator& allocator, MemoryCategory category, size_t bytes)
      : allocator_(allocator), category_(category), bytes_(bytes) {}

  Buffer acquire(bool zeroed) {
    if (free_.empty()) return allocator_.allocate(bytes_, category_);
    Entry entry = std::move(free_.back());
    free_.pop_back();
    entry.free_after.wait();
    if (zeroed) std::memset(entry.buffer.data(), 0, entry.buffer.bytes());
    return std::move(entry.buffer);
  }

  void give_back(Buffer buffer, Event free_after) {
    free_.push_back(Entry{std::move(buffer), std::move(free_after)});
  }

  // Allocates up to `count` buffers ahead of use, so the memory report at start already shows
  // what the schedule will hold.
  void reserve(size_t count) {
    while (free_.size() < count) free_.push_back(Entry{allocator_.allocate(bytes_, category_), {}});
  }

 private:
  struct Entry {
    Buffer buffer;
    Event free_after;
  };
  Allocator& allocator_;
  MemoryCategory category_;
  size_t bytes_;
  std::vector<Entry> free_;
};

// Bytes of each buffer one unit holds at a stage; the single source for plan_memory() and for
// the engine's allocations, so the estimate and the measurement cannot drift apart.
struct UnitBytes {
  size_t params_full = 0;   // working dtype, whole unit (stages 0-2; persistent units at 3)
  size_t params_shard = 0;  // working dtype, this rank's slice (stage 3)
  size_t master = 0;        // fp32 master when the working dtype is not fp32
  size_t grads_full = 0;    // working dtype, whole unit (stages 0-1)
  size_t grads_shard = 0;   // working dtype, slice (stages 2-3)
  size_t state = 0;         // each optimizer state array (fp32)
  int state_arrays = 0;
};

bool is_persistent(const Unit& unit, const EngineConfig& config) {
  return config.stage == 3 && unit.numel < config.persistence_threshold;
}

UnitBytes unit_bytes(const Unit& unit, const EngineConfig& config, int state_arrays) {
  const size_t w = dtype_size(config.dtype);
  const size_t full = unit.numel;
  const size_t shard = unit.shard;
  const size_t owned = config.stage == 0 ? full : shard;  // what this rank updates
  UnitBytes b;
  if (config.stage <= 2 || is_persistent(unit, config)) b.params_full = full * w;
  if (config.stage == 3) b.params_shard = shard * w;
  if (config.dtype != DType::kFloat32) b.master = owned * sizeof(float);
  if (config.stage <= 1) b.grads_full = full * w;
  if (config.stage >= 2) b.grads_shard = shard * w;
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
  Buffer grads_full;  // stages 0-1: persistent; stages 2-3: a pooled bucket during backward
  Buffer grads_shard;
  Buffer state[2];
  Event params_ready;   // the all-gather that fills params_full has finished
  Event grads_reduced;  // the reduction (and accumulation) of the latest grads_ready is done
  bool gathered = false;
  bool persistent = false;
  int micro_batches_done = 0;
};

}  // namespace

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
  if (config.stage == 3) plan.buffers += 2 * max_unit * w;  // gathered parameters
  if (config.stage >= 2) plan.buffers += 2 * max_unit * w;  // gradient buckets
  if (config.reduce_in_fp32 && config.dtype != DType::kFloat32) {
    plan.buffers += max_unit * sizeof(float);
  }
  return plan;
}

std::vector<uint64_t> all_gather_u64(Communicator& comm, uint64_t value) {
  std::vector<uint64_t> all(comm.world_size());
  comm.all_gather_sync(&value, all.data(), sizeof(uint64_t) / 2, DType::kBFloat16);
  return all;
}

struct Engine::Impl {
  Impl(Communicator& c, const std::vector<ParamDecl>& decls, const EngineConfig& cfg)
      : comm(c),
        config(validated(cfg)),
        layout(Layout::build(specs_of(decls), LayoutOptions{c.world_size(), cfg.dtype,
                                                            cfg.alignment_bytes, cfg.merge_bytes})),
        optimizer(cfg.optimizer),
        schedule(cfg.lr_schedule),
        loss_scaler(cfg.loss_scaler),
        rank(c.rank()),
        world(c.world_size()),
        elem(dtype_size(cfg.dtype)),
        trace(cfg.trace),
        param_pool(allocator, MemoryCategory::kPrefetch, layout.max_unit_numel() * elem),
        grad_pool(allocator, MemoryCategory::kCommBuffer, layout.max_unit_numel() * elem) {
    if (config.desync_check) comm.set_desync_check(true);
    check_same_model_on_all_ranks();
    allocator.set_limit(config.memory_limit_bytes);
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

  static EngineConfig validated(const EngineConfig& c) {
    ZERO_CHECK(c.stage >= 0 && c.stage <= 3, "ZeRO stage must be 0, 1, 2 or 3, got " << c.stage);
    ZERO_CHECK(c.micro_batches >= 1,
               "micro-batches per step must be at least 1, got " << c.micro_batches);
    ZERO_CHECK(c.gradient_clipping >= 0.0f,
               "gradient clipping must be >= 0 (0 = off), got " << c.gradient_clipping);
    ZERO_CHECK(c.gradient_predivide_factor > 0.0f,
               "gradient_predivide_factor must be > 0, got " << c.gradient_predivide_factor);
    ZERO_CHECK(c.kernel_threads >= 1,
               "kernel threads must be at least 1, got " << c.kernel_threads);
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
    std::vector<uint64_t> prints = all_gather_u64(comm, layout.fingerprint(stage));
    if (std::all_of(prints.begin(), prints.end(), [&](uint64_t p) { return p == prints[0]; }))
      return;

    // Find the first parameter that differs: exchange the count, then per-parameter prints.
    std::vector<uint64_t> counts = all_gather_u64(comm, layout.params().size());
    std::vector<uint64_t> stages = all_gather_u64(comm, stage);
    size_t max_count = *std::max_element(counts.begin(), counts.end());
    for (size_t i = 0; i < max_count; ++i) {
      uint64_t mine = i < layout.params().size() ? layout.param_fingerprint(i) : 0;
      std::vector<uint64_t> theirs = all_gather_u64(comm, mine);
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
    if (config.stage == 3) param_pool.reserve(2);
    if (config.stage >= 2) grad_pool.reserve(2);
    if (config.reduce_in_fp32 && config.dtype != DType::kFloat32) {
      fp32_scratch =
          allocator.allocate(layout.max_unit_numel() * sizeof(float), MemoryCategory::kCommBuffer);
    }
  }

  // Fills the elements this rank holds; the value of each is a function of the seed and the
  // element's global identity only, so every world size starts from the same model. The working
  // copy is the master rounded to the working dtype, as after every optimizer step.
  void initialize(const std::vector<ParamDecl>& decls) {
    for (size_t i = 0; i < layout.params().size(); ++i) {
      const ParamPlacement& p = layout.params()[i];
      const Unit& unit = layout.units()[p.unit];
      UnitState& s = units[p.unit];
      auto fill = [&](void* base, DType dtype, size_t region_begin, size_t region_end) {
        // base holds unit elements [region_begin, region_end); write the parameter's part.
        const size_t begin = std::clamp(region_begin, p.offset, p.offset + p.numel);
        const size_t end = std::clamp(region_end, p.offset, p.offset + p.numel);
        for (size_t e = begin; e < end; ++e) {
          store_from_float(base, dtype, e - region_begin,
                           init_value(config.seed, i, e - p.offset, decls[i].init));
        }
      };
      const size_t shard_begin = static_cast<size_t>(rank) * unit.shard;
      const size_t shard_end = shard_begin + unit.shard;
      if (!s.params_full.empty()) fill(s.params_full.data(), config.dtype, 0, unit.numel);
      if (!s.params_shard.empty()) {
        fill(s.params_shard.data(), config.dtype, shard_begin, shard_end);
      }
      if (!s.master.empty()) {
        if (config.stage == 0) {
          fill(s.master.data(), DType::kFloat32, 0, unit.numel);
        } else {
          fill(s.master.data(), DType::kFloat32, shard_begin, shard_end);
        }
      }
    }
  }

  // Wraps a collective issued on the communication stream with markers that run on that stream
  // right before and after it, so the trace holds when it really ran, not when it was queued.
  template <typename Issue>
  Event traced(const char* name, uint64_t bytes, Issue issue) {
    if (!trace.enabled()) return issue();
    auto begin_us = std::make_shared<double>(0.0);
    comm.stream().enqueue([begin_us] { *begin_us = Trace::now_us(); });
    issue();
    Trace* t = &trace;
    std::string span_name = name;
    // The end marker's event: whoever waits for the collective also waits until its span is
    // closed, so a compute span that starts after the wait cannot look overlapped.
    return comm.stream().enqueue([t, begin_us, span_name, bytes] {
      t->add(TraceSpan{span_name, true, *begin_us, Trace::now_us(), bytes});
    });
  }

  // An issued collective: with overlap_comm off, compute waits for it right away.
  Event issued(Event e) {
    if (!config.overlap_comm) compute.wait(e);
    return e;
  }

  // This rank's slice of the unit's parameters in the working dtype: what the optimizer writes.
  void* param_slice(size_t u) {
    const Unit& unit = layout.units()[u];
    UnitState& s = units[u];
    if (config.stage == 3) return s.params_shard.data();
    return byte_offset(s.params_full.data(), rank * unit.shard * elem);
  }

  // The rank's slice of a unit's reduced gradient, wherever the stage keeps it.
  void* grad_slice(size_t u) {
    const Unit& unit = layout.units()[u];
    if (config.stage <= 1) return byte_offset(units[u].grads_full.data(), rank * unit.shard * elem);
    return units[u].grads_shard.data();
  }

  // Sums `bucket` (the unit's whole gradient from this rank, working dtype) over the ranks and
  // leaves this rank's reduced slice in `dest` (added to it when `accumulate`). Everything runs
  // on the communication stream in order, so the returned event covers the whole chain.
  Event reduce_to_shard(const Unit& unit, void* bucket, void* dest, bool accumulate) {
    const DType w = config.dtype;
    const bool via_fp32 = config.reduce_in_fp32 && w != DType::kFloat32;
    const DType wire = via_fp32 ? DType::kFloat32 : w;
    const size_t numel = unit.numel;
    const size_t shard = unit.shard;
    prepare_for_reduction(bucket, numel);
    comm.stream().wait(compute.record());
    void* buf = bucket;
    if (via_fp32) {
      buf = fp32_scratch.data();
      comm.stream().enqueue([=] { kernels::cast(bucket, w, buf, DType::kFloat32, numel); });
    }
    const uint64_t bytes_on_wire = numel * dtype_size(wire);
    if (!accumulate && !via_fp32 && config.reduce_scatter) {
      traced("reduce_scatter", bytes_on_wire,
             [&] { return comm.reduce_scatter(buf, dest, shard, wire); });
      return issued(comm.stream().record());
    }
    void* slot = byte_offset(buf, rank * shard * dtype_size(wire));
    if (config.reduce_scatter) {
      traced("reduce_scatter", bytes_on_wire,
             [&] { return comm.reduce_scatter(buf, slot, shard, wire); });
    } else {
      traced("all_reduce", bytes_on_wire, [&] { return comm.all_reduce(buf, buf, numel, wire); });
    }
    void* bucket_slot = byte_offset(bucket, rank * shard * dtype_size(w));
    const size_t bytes = shard * dtype_size(w);
    comm.stream().enqueue([=] {
      if (via_fp32) kernels::cast(slot, DType::kFloat32, bucket_slot, w, shard);
      if (dest == bucket_slot) return;
      if (accumulate) {
        kernels::accumulate(dest, bucket_slot, w, shard);
      } else {
        std::memcpy(dest, bucket_slot, bytes);
      }
    });
    return issued(comm.stream().record());
  }

  // Sums a whole unit's gradient over the ranks in place (stage 0).
  Event reduce_whole(const Unit& unit, void* bucket) {
    const DType w = config.dtype;
    const size_t numel = unit.numel;
    prepare_for_reduction(bucket, numel);
    comm.stream().wait(compute.record());
    if (config.reduce_in_fp32 && w != DType::kFloat32) {
      void* buf = fp32_scratch.data();
      comm.stream().enqueue([=] { kernels::cast(bucket, w, buf, DType::kFloat32, numel); });
      traced("all_reduce", numel * sizeof(float),
             [&] { return comm.all_reduce(buf, buf, numel, DType::kFloat32); });
      comm.stream().enqueue([=] { kernels::cast(buf, DType::kFloat32, bucket, w, numel); });
    } else {
      traced("all_reduce", numel * elem, [&] { return comm.all_reduce(bucket, bucket, numel, w); });
    }
    return issued(comm.stream().record());
  }

  // The pre-divide keeps 16-bit sums over many ranks in range: divide by f before the sum,
  // multiply the f back in the optimizer's gradient scale.
  void prepare_for_reduction(void* bucket, size_t numel) {
    if (config.gradient_predivide_factor != 1.0f) {
      kernels::scale(bucket, config.dtype, 1.0f / config.gradient_predivide_factor, numel);
    }
  }

  bool prefetch(int u) {
    check_unit(u);
    UnitState& s = units[u];
    if (s.gathered) return true;
    if (config.stage != 3) return true;  // stages 1-2 wait for the post-step all-gather in gather
    const Unit& unit = layout.units()[u];
    if (config.max_live_elements > 0 && live > 0 && live + unit.numel > config.max_live_elements) {
      return false;  // over the budget: gather() will fetch it when it is needed
    }
    s.params_full = param_pool.acquire(/*zeroed=*/false);
    // The pooled buffer may have just been released by compute: order the gather after it.
    comm.stream().wait(compute.record());
    s.params_ready = issued(traced("all_gather", unit.numel * elem, [&] {
      return comm.all_gather(s.params_shard.data(), s.params_full.data(), unit.shard, config.dtype);
    }));
    s.gathered = true;
    live += unit.numel;
    return true;
  }

  void gather(int u) {
    check_unit(u);
    UnitState& s = units[u];
    if (config.stage == 3 && !s.gathered) {
      // A required gather ignores the live budget: the computation cannot go on without it.
      const size_t saved = config.max_live_elements;
      config.max_live_elements = 0;
      prefetch(u);
      config.max_live_elements = saved;
    }
    // Stages 1-2 after a step: the parameters come back through the post-step all-gather.
    s.gathered = true;
    compute.wait(s.params_ready);
  }

  void release(int u) {
    check_unit(u);
    UnitState& s = units[u];
    if (config.stage != 3 || !s.gathered || s.persistent) return;
    compute.wait(s.params_ready);
    param_pool.give_back(std::move(s.params_full), compute.record());
    s.gathered = false;
    live -= layout.units()[u].numel;
  }

  void grads_ready(int u) {
    check_unit(u);
    UnitState& s = units[u];
    const Unit& unit = layout.units()[u];
    ZERO_CHECK(s.micro_batches_done < config.micro_batches,
               "grads_ready(" << u << ") called " << s.micro_batches_done + 1
                              << " times before step(); configured micro-batches per step: "
                              << config.micro_batches);
    s.micro_batches_done += 1;
    if (config.stage == 0 && s.micro_batches_done == config.micro_batches) {
      s.grads_reduced = reduce_whole(unit, s.grads_full.data());
    } else if (config.stage >= 2) {
      if (s.grads_full.empty()) s.grads_full = grad_pool.acquire(/*zeroed=*/true);
      // Every micro-batch reduces its bucket at once and adds the slice to the shard.
      s.grads_reduced = reduce_to_shard(unit, s.grads_full.data(), s.grads_shard.data(),
                                        /*accumulate=*/s.micro_batches_done > 1);
      grad_pool.give_back(std::move(s.grads_full), s.grads_reduced);
    }
  }

  StepStats step() {
    for (size_t u = 0; u < units.size(); ++u) {
      ZERO_CHECK(units[u].micro_batches_done == config.micro_batches,
                 "step() after " << units[u].micro_batches_done << " backward pass(es) of unit "
                                 << u << "; expected " << config.micro_batches
                                 << " (one grads_ready per unit per micro-batch)");
      // A stage-3 unit gathered across the step would keep serving the old parameters.
      ZERO_CHECK(config.stage != 3 || !units[u].gathered || units[u].persistent,
                 "step() while unit " << u << " is still gathered; release it first");
    }
    if (config.stage == 1) {
      // Stage 1 keeps whole gradients through accumulation and reduces once, here, in place:
      // the rank's reduced slice lands at its own offset in the full buffer.
      for (size_t u = 0; u < units.size(); ++u) {
        units[u].grads_reduced = reduce_to_shard(layout.units()[u], units[u].grads_full.data(),
                                                 grad_slice(u), /*accumulate=*/false);
      }
    }
    for (UnitState& s : units) compute.wait(s.grads_reduced);

    // One all-reduce of each unit's sum of squares over the shards gives the global norm, and
    // tells every rank at once whether (and in which unit) a gradient overflowed anywhere.
    const kernels::KernelOptions kopt{config.kernel_threads};
    std::vector<float> sums(units.size());
    {
      ScopedSpan span(trace, "gradient norm");
      for (size_t u = 0; u < units.size(); ++u) {
        sums[u] = static_cast<float>(
            kernels::sum_squares(grad_slice(u), config.dtype, layout.units()[u].shard, kopt));
      }
    }
    traced("all_reduce", sums.size() * sizeof(float), [&] {
      return comm.all_reduce(sums.data(), sums.data(), sums.size(), DType::kFloat32);
    }).wait();
    double total = 0.0;
    for (float v : sums) total += v;

    // Gradients are summed over ranks and micro-batches and carry the loss scale (and the
    // pre-divide): one factor takes them back to the mean gradient of the global batch.
    const float scale_now = loss_scale();
    const float to_mean =
        config.gradient_predivide_factor /
        (static_cast<float>(world) * static_cast<float>(config.micro_batches) * scale_now);
    StepStats stats;
    stats.grad_norm = static_cast<float>(std::sqrt(total)) * to_mean;
    const bool overflow = !std::isfinite(total);
    bool skip = false;
    if (config.dtype == DType::kFloat16) {
      skip = loss_scaler.update(overflow);  // throws when the scale cannot go lower
    } else if (overflow) {
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
      skip = true;
    }
    stats.skipped = skip;
    stats.loss_scale = loss_scale();
    if (skip) {
      finish_step();
      stats.step = optimizer.step();
      stats.lr = current_lr();
      return stats;
    }

    float clip = 1.0f;
    if (config.gradient_clipping > 0.0f && stats.grad_norm > config.gradient_clipping) {
      clip = config.gradient_clipping / (stats.grad_norm + 1e-6f);
      stats.clipped = true;
    }
    stats.lr = current_lr();
    optimizer.begin_step(stats.lr);
    const bool separate_master = config.dtype != DType::kFloat32;
    for (size_t u = 0; u < units.size(); ++u) {
      ScopedSpan optimizer_span(trace, "optimizer");
      const Unit& unit = layout.units()[u];
      UnitState& s = units[u];
      // Stage 0 updates the whole unit on every rank (identically); the others their slice.
      void* working = config.stage == 0 ? s.params_full.data() : param_slice(u);
      const void* grad = config.stage == 0 ? s.grads_full.data() : grad_slice(u);
      ShardState shard;
      shard.n = config.stage == 0 ? unit.numel : unit.shard;
      shard.master = separate_master ? s.master.as<float>() : static_cast<float*>(working);
      shard.state[0] = s.state[0].as<float>();
      shard.state[1] = s.state[1].as<float>();
      optimizer.apply(shard, grad, config.dtype, clip * to_mean,
                      separate_master ? working : nullptr, config.dtype, kopt);
    }

    // Bring every rank's updated slice back into the full parameters (stages 1-2, and stage 3's
    // persistent units); the next forward's gather(u) waits for unit u only, so the all-gathers
    // overlap with the forward.
    comm.stream().wait(compute.record());
    for (size_t u = 0; u < units.size(); ++u) {
      UnitState& s = units[u];
      if (s.params_full.empty() || config.stage == 0) continue;
      const Unit& unit = layout.units()[u];
      void* source = config.stage == 3 ? s.params_shard.data() : param_slice(u);
      s.params_ready = issued(traced("all_gather", unit.numel * elem, [&] {
        return comm.all_gather(source, s.params_full.data(), unit.shard, config.dtype);
      }));
      if (!s.persistent) s.gathered = false;
    }
    finish_step();
    stats.step = optimizer.step();
    return stats;
  }

  float current_lr() const {
    return config.lr_schedule.type == LrScheduleType::kConstant
               ? config.optimizer.lr
               : schedule.lr_at(optimizer.step() + 1);
  }

  float loss_scale() const { return config.dtype == DType::kFloat16 ? loss_scaler.scale() : 1.0f; }

  // Gradients start from zero for the next step.
  void finish_step() {
    for (UnitState& s : units) {
      if (config.stage <= 1) std::memset(s.grads_full.data(), 0, s.grads_full.bytes());
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
    if (config.stage >= 2 && s.grads_full.empty()) s.grads_full = grad_pool.acquire(true);
    return byte_offset(s.grads_full.data(), pl.offset * elem);
  }

  Engine::StateView state_view(int u) {
    check_unit(u);
    const Unit& unit = layout.units()[u];
    UnitState& s = units[u];
    Engine::StateView view;
    view.begin = config.stage == 0 ? 0 : static_cast<size_t>(rank) * unit.shard;
    view.end = config.stage == 0 ? unit.numel : view.begin + unit.shard;
    if (config.dtype != DType::kFloat32) {
      view.master = s.master.as<float>();
    } else {
      view.master = static_cast<float*>(config.stage == 0 ? s.params_full.data() : param_slice(u));
    }
    view.state_count = optimizer.state_count();
    for (int k = 0; k < view.state_count; ++k) view.state[k] = s.state[k].as<float>();
    return view;
  }

  void state_loaded() {
    const kernels::KernelOptions kopt{config.kernel_threads};
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = layout.units()[u];
      UnitState& s = units[u];
      if (config.dtype != DType::kFloat32) {
        void* working = config.stage == 0 ? s.params_full.data() : param_slice(u);
        const size_t n = config.stage == 0 ? unit.numel : unit.shard;
        kernels::cast(s.master.data(), DType::kFloat32, working, config.dtype, n, kopt);
      }
    }
    comm.stream().wait(compute.record());
    for (size_t u = 0; u < units.size(); ++u) {
      UnitState& s = units[u];
      if (config.stage == 0 || s.params_full.empty()) continue;
      const Unit& unit = layout.units()[u];
      void* source = config.stage == 3 ? s.params_shard.data() : param_slice(u);
      s.params_ready = comm.all_gather(source, s.params_full.data(), unit.shard, config.dtype);
    }
    for (UnitState& s : units) compute.wait(s.params_ready);
  }

  std::vector<std::vector<float>> gather_full_params() {
    std::vector<std::vector<float>> out(layout.params().size());
    for (size_t u = 0; u < units.size(); ++u) {
      const bool was_gathered = units[u].gathered;
      gather(static_cast<int>(u));
      for (int p : layout.units()[u].params) {
        out[p].resize(layout.params()[p].numel);
        kernels::cast(param(p), config.dtype, out[p].data(), DType::kFloat32, out[p].size());
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
        std::memcpy(full.data(), units[u].master.data(), unit.numel * sizeof(float));
      } else {
        comm.all_gather_sync(units[u].master.data(), full.data(), unit.shard, DType::kFloat32);
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
  Allocator allocator;
  Layout layout;
  Optimizer optimizer;
  LrSchedule schedule;
  LossScaler loss_scaler;
  int rank;
  int world;
  size_t elem;  // bytes per element of the working dtype
  Trace trace;
  HostCompute compute;
  BufferPool param_pool;
  BufferPool grad_pool;
  Buffer fp32_scratch;  // reductions in fp32 of a 16-bit gradient (reduce_in_fp32)
  std::vector<UnitState> units;
  size_t live = 0;  // elements of non-persistent stage-3 units gathered now
};

Engine::Engine(Communicator& comm, const std::vector<ParamDecl>& params, const EngineConfig& config)
    : impl_(std::make_unique<Impl>(comm, params, config)) {}

Engine::~Engine() {
  // Collectives may still read or write our buffers: let them finish before the memory goes.
  // A failed stream reports its error to whoever waits; here there is no one left to tell.
  try {
    impl_->comm.stream().synchronize();
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
