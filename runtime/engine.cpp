#include "zero/runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "zero/kernels/check.h"
#include "zero/kernels/cpu_kernels.h"

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
// schedule needs (two for prefetch: the unit in use and the next one).
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

struct UnitState {
  Buffer params_full;   // stages 0-2: persistent; stage 3: pooled while gathered
  Buffer params_shard;  // stage 3: this rank's slice, also the fp32 master
  Buffer grads_full;    // stages 0-1: persistent; stages 2-3: pooled bucket during backward
  Buffer grads_shard;   // stages 2-3
  Buffer moments[2];    // optimizer state: the whole unit at stage 0, the shard otherwise
  Event params_ready;   // the all-gather that fills params_full has finished
  Event grads_reduced;  // the reduction (and accumulation) of the latest grads_ready is done
  bool gathered = false;
  int micro_batches_done = 0;
};

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

}  // namespace

std::vector<uint64_t> all_gather_u64(Communicator& comm, uint64_t value) {
  std::vector<uint64_t> all(comm.world_size());
  comm.all_gather_sync(&value, all.data(), sizeof(uint64_t) / 2, DType::kBFloat16);
  return all;
}

struct Engine::Impl {
  Impl(Communicator& c, const std::vector<ParamDecl>& decls, const EngineConfig& cfg)
      : comm(c),
        config(cfg),
        layout(Layout::build(specs_of(decls), LayoutOptions{c.world_size(), DType::kFloat32,
                                                            cfg.alignment_bytes, cfg.merge_bytes})),
        optimizer(cfg.optimizer),
        schedule(cfg.lr_schedule),
        rank(c.rank()),
        world(c.world_size()),
        param_pool(allocator, MemoryCategory::kPrefetch, layout.max_unit_numel() * sizeof(float)),
        grad_pool(allocator, MemoryCategory::kCommBuffer, layout.max_unit_numel() * sizeof(float)) {
    ZERO_CHECK(config.stage >= 0 && config.stage <= 3,
               "ZeRO stage must be 0, 1, 2 or 3, got " << config.stage);
    ZERO_CHECK(config.micro_batches >= 1,
               "micro-batches per step must be at least 1, got " << config.micro_batches);
    ZERO_CHECK(config.gradient_clipping >= 0.0f,
               "gradient clipping must be >= 0 (0 = off), got " << config.gradient_clipping);
    check_same_model_on_all_ranks();
    allocate();
    initialize(decls);
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
    const int stage = config.stage;
    const int state_arrays = optimizer.state_count();
    units.resize(layout.units().size());
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = layout.units()[u];
      UnitState& s = units[u];
      const size_t full = unit.numel * sizeof(float);
      const size_t shard = unit.shard * sizeof(float);
      if (stage <= 2) s.params_full = allocator.allocate(full, MemoryCategory::kParamsFull);
      if (stage == 3) s.params_shard = allocator.allocate(shard, MemoryCategory::kParamsShard);
      if (stage <= 1) s.grads_full = allocator.allocate(full, MemoryCategory::kGrads);
      if (stage >= 2) s.grads_shard = allocator.allocate(shard, MemoryCategory::kGrads);
      for (int k = 0; k < state_arrays; ++k) {
        s.moments[k] =
            allocator.allocate(stage == 0 ? full : shard, MemoryCategory::kOptimizerState);
      }
      s.gathered = stage <= 2;
    }
    // Two of each pooled buffer: the unit being computed and the one in flight beside it.
    if (stage == 3) param_pool.reserve(2);
    if (stage >= 2) grad_pool.reserve(2);
  }

  // Fills the elements this rank holds; the value of each is a function of the seed and the
  // element's global identity only, so every world size starts from the same model.
  void initialize(const std::vector<ParamDecl>& decls) {
    for (size_t i = 0; i < layout.params().size(); ++i) {
      const ParamPlacement& p = layout.params()[i];
      const Unit& unit = layout.units()[p.unit];
      UnitState& s = units[p.unit];
      size_t begin = 0;
      size_t end = p.numel;
      float* base = nullptr;  // where element 0 of the parameter would be
      if (config.stage == 3) {
        size_t shard_begin = static_cast<size_t>(rank) * unit.shard;
        size_t shard_end = shard_begin + unit.shard;
        begin = std::clamp(shard_begin, p.offset, p.offset + p.numel) - p.offset;
        end = std::clamp(shard_end, p.offset, p.offset + p.numel) - p.offset;
        base = s.params_shard.as<float>() + p.offset - static_cast<ptrdiff_t>(shard_begin);
      } else {
        base = s.params_full.as<float>() + p.offset;
      }
      for (size_t e = begin; e < end; ++e) base[e] = init_value(config.seed, i, e, decls[i].init);
    }
  }

  // The rank's slice of a unit's reduced gradient, wherever the stage keeps it.
  float* grad_shard(size_t u) {
    const Unit& unit = layout.units()[u];
    if (config.stage <= 1) return units[u].grads_full.as<float>() + rank * unit.shard;
    return units[u].grads_shard.as<float>();
  }

  void prefetch(int u) {
    check_unit(u);
    UnitState& s = units[u];
    if (config.stage != 3 || s.gathered) return;
    const Unit& unit = layout.units()[u];
    s.params_full = param_pool.acquire(/*zeroed=*/false);
    // The pooled buffer may have just been released by compute: order the gather after it.
    comm.stream().wait(compute.record());
    s.params_ready =
        comm.all_gather(s.params_shard.data(), s.params_full.data(), unit.shard, DType::kFloat32);
    s.gathered = true;
  }

  void gather(int u) {
    prefetch(u);
    UnitState& s = units[u];
    if (!s.gathered) {
      // Stages 1-2 after a step: the parameters come back through the post-step all-gather.
      s.gathered = true;
    }
    compute.wait(s.params_ready);
  }

  void release(int u) {
    check_unit(u);
    UnitState& s = units[u];
    if (config.stage != 3 || !s.gathered) return;
    compute.wait(s.params_ready);
    param_pool.give_back(std::move(s.params_full), compute.record());
    s.gathered = false;
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
    const bool last_micro_batch = s.micro_batches_done == config.micro_batches;
    if (config.stage == 0 && last_micro_batch) {
      comm.stream().wait(compute.record());
      float* g = s.grads_full.as<float>();
      s.grads_reduced = comm.all_reduce(g, g, unit.numel, DType::kFloat32);
    } else if (config.stage >= 2) {
      if (s.grads_full.empty()) s.grads_full = grad_pool.acquire(/*zeroed=*/true);
      comm.stream().wait(compute.record());
      float* bucket = s.grads_full.as<float>();
      if (s.micro_batches_done == 1) {
        // First micro-batch of the step: reduce straight into the shard.
        comm.reduce_scatter(bucket, s.grads_shard.data(), unit.shard, DType::kFloat32);
      } else {
        // Later ones: reduce in place (the result lands in this rank's slot of the bucket),
        // then add it to the shard on the communication stream, in order after the reduction.
        float* slot = bucket + rank * unit.shard;
        comm.reduce_scatter(bucket, slot, unit.shard, DType::kFloat32);
        float* shard = s.grads_shard.as<float>();
        const size_t n = unit.shard;
        comm.stream().enqueue([shard, slot, n] { kernels::accumulate(shard, slot, n); });
      }
      s.grads_reduced = comm.stream().record();
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
      ZERO_CHECK(config.stage != 3 || !units[u].gathered,
                 "step() while unit " << u << " is still gathered; release it first");
    }
    if (config.stage == 1) {
      // Stage 1 keeps whole gradients through accumulation and reduces once, here. In place:
      // the rank's reduced slice lands at its own offset in the full buffer.
      comm.stream().wait(compute.record());
      for (size_t u = 0; u < units.size(); ++u) {
        const Unit& unit = layout.units()[u];
        float* g = units[u].grads_full.as<float>();
        units[u].grads_reduced =
            comm.reduce_scatter(g, g + rank * unit.shard, unit.shard, DType::kFloat32);
      }
    }
    for (UnitState& s : units) compute.wait(s.grads_reduced);

    // Global norm over shards: each rank sums the squares of its slices, one scalar all-reduce.
    const kernels::KernelOptions kopt{config.kernel_threads};
    double local = 0.0;
    for (size_t u = 0; u < units.size(); ++u) {
      local += kernels::sum_squares(grad_shard(u), DType::kFloat32, layout.units()[u].shard, kopt);
    }
    float local_sum = static_cast<float>(local);
    float global_sum = 0.0f;
    comm.all_reduce_sync(&local_sum, &global_sum, 1, DType::kFloat32);

    // Gradients are summed over ranks and micro-batches; the mean over the global batch divides
    // by both. Averaging and clipping fold into the optimizer's gradient scale.
    const float denominator = static_cast<float>(world) * static_cast<float>(config.micro_batches);
    StepStats stats;
    stats.grad_norm = std::sqrt(global_sum) / denominator;
    ZERO_CHECK(std::isfinite(stats.grad_norm), "step " << optimizer.step() + 1
                                                       << ": the gradient norm is not finite ("
                                                       << stats.grad_norm << ")");
    float clip = 1.0f;
    if (config.gradient_clipping > 0.0f && stats.grad_norm > config.gradient_clipping) {
      clip = config.gradient_clipping / (stats.grad_norm + 1e-6f);
      stats.clipped = true;
    }
    const float grad_scale = clip / denominator;
    stats.lr = config.lr_schedule.type == LrScheduleType::kConstant
                   ? config.optimizer.lr
                   : schedule.lr_at(optimizer.step() + 1);
    optimizer.begin_step(stats.lr);

    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = layout.units()[u];
      UnitState& s = units[u];
      ShardState shard;
      const float* grad = nullptr;
      if (config.stage == 0) {
        // Plain data parallelism: every rank updates the whole unit, identically.
        shard.master = s.params_full.as<float>();
        shard.n = unit.numel;
        grad = s.grads_full.as<float>();
      } else {
        shard.master = config.stage == 3 ? s.params_shard.as<float>()
                                         : s.params_full.as<float>() + rank * unit.shard;
        shard.n = unit.shard;
        grad = grad_shard(u);
      }
      shard.state[0] = s.moments[0].as<float>();
      shard.state[1] = s.moments[1].as<float>();
      optimizer.apply(shard, grad, DType::kFloat32, grad_scale, nullptr, DType::kFloat32, kopt);
    }

    if (config.stage == 1 || config.stage == 2) {
      // Bring every rank's updated slice back into the full parameters; the next forward's
      // gather(u) waits for unit u only, so the all-gathers overlap with the forward.
      comm.stream().wait(compute.record());
      for (size_t u = 0; u < units.size(); ++u) {
        const Unit& unit = layout.units()[u];
        float* p = units[u].params_full.as<float>();
        units[u].params_ready =
            comm.all_gather(p + rank * unit.shard, p, unit.shard, DType::kFloat32);
        units[u].gathered = false;
      }
    }
    for (size_t u = 0; u < units.size(); ++u) {
      UnitState& s = units[u];
      if (config.stage <= 1) std::memset(s.grads_full.data(), 0, s.grads_full.bytes());
      s.micro_batches_done = 0;
    }
    stats.step = optimizer.step();
    return stats;
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

  float* param(int p) {
    const ParamPlacement& pl = placement(p);
    UnitState& s = units[pl.unit];
    ZERO_CHECK(s.gathered && !s.params_full.empty(),
               "parameter '" << pl.name << "' used while unit " << pl.unit
                             << " is not gathered; call gather(" << pl.unit << ") first");
    return s.params_full.as<float>() + pl.offset;
  }

  float* grad(int p) {
    const ParamPlacement& pl = placement(p);
    UnitState& s = units[pl.unit];
    if (config.stage >= 2 && s.grads_full.empty()) s.grads_full = grad_pool.acquire(true);
    return s.grads_full.as<float>() + pl.offset;
  }

  std::vector<std::vector<float>> gather_full_params() {
    std::vector<std::vector<float>> out(layout.params().size());
    for (size_t u = 0; u < units.size(); ++u) {
      const bool was_gathered = units[u].gathered;
      gather(static_cast<int>(u));
      for (int p : layout.units()[u].params) {
        const float* src = param(p);
        out[p].assign(src, src + layout.params()[p].numel);
      }
      if (!was_gathered) release(static_cast<int>(u));
    }
    return out;
  }

  Communicator& comm;
  EngineConfig config;
  Allocator allocator;
  Layout layout;
  Optimizer optimizer;
  LrSchedule schedule;
  int rank;
  int world;
  HostCompute compute;
  BufferPool param_pool;
  BufferPool grad_pool;
  std::vector<UnitState> units;
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
float* Engine::param(int param) {
  return impl_->param(param);
}
float* Engine::grad(int param) {
  return impl_->grad(param);
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

}  // namespace zero
