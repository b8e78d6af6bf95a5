#include "engine_internal.h"

#include <algorithm>

namespace zero {

// Stage 3: starts unit u's all-gather into a pooled buffer. An optional prefetch stays within
// the live budget (stage3_max_live_parameters) and the planned buffers and says whether it
// started; a required gather always starts.
bool Engine::Impl::start_gather(int u, bool required) {
  UnitState& s = units[u];
  if (config.stage != 3 || s.params != ParamState::kSharded) return true;
  const Unit& unit = layout.units()[u];
  if (!required) {
    const bool over_live_budget = config.schedule.max_live_elements > 0 && live > 0 &&
                                  live + unit.numel > config.schedule.max_live_elements;
    if (over_live_budget || !param_pool.can_acquire_within_plan()) return false;
  }
  if (!working_shards->start_gather_read(u, required)) return false;
  const double issue_us = Trace::now_us();
  s.params_full = param_pool.acquire(/*zeroed=*/false);
  if (s.secondary_valid) {
    s.params_ready = all_gather_unit_in_node(u, issue_us);
  } else {
    // The pooled buffer may have just been released by compute: order the gather after it.
    comm.stream().wait(device->record());
    const void* shard = working_shards->gather_source(u, comm.stream());
    s.params_ready = quantizes_gather(unit, config) ? all_gather_unit_quantized(u, shard, issue_us)
                                                    : all_gather_unit(u, shard, issue_us);
    working_shards->gathered(u, s.params_ready);
    if (keeps_secondary_shard(unit, config)) s.params_ready = keep_secondary_shard(u, issue_us);
  }
  transition(s.params, {ParamState::kSharded}, ParamState::kGathering, u, "the gather's start");
  live += unit.numel;
  return true;
}

// Unit u's all-gather of this rank's `shard` into its params_full, issued at `issue_us`.
CommPoint Engine::Impl::all_gather_unit(int u, const void* shard, double issue_us) {
  const Unit& unit = layout.units()[u];
  void* full = units[u].params_full.data();
  return timeline.issued(
      timeline.traced(
          comm.stream(), "all_gather", unit.numel * elem,
          [&] { return comm.all_gather(shard, full, unit.shard, config.precision.dtype); }),
      issue_us);
}

// Every step on the communication stream, in its order: the quantization reads the shard after
// the compute the gather was ordered behind, and the staging buffer is free again once the
// previous gather's dequantization, queued before it, has run.
CommPoint Engine::Impl::all_gather_unit_quantized(int u, const void* shard, double issue_us) {
  const Unit& unit = layout.units()[u];
  const QuantizedShard wire = quantized_shard(unit.shard);
  char* regions = static_cast<char*>(quantized_gather.data());
  char* mine = regions + rank * wire.region_bytes;
  char* full = static_cast<char*>(units[u].params_full.data());
  DeviceContext* dev = device.get();
  Stream* on = &comm.stream();
  const size_t n = unit.shard;
  const DType dtype = config.precision.dtype;
  const size_t shard_bytes = n * elem;
  const int ranks = world;
  on->enqueue([=] {
    dev->quantize_int8(shard, dtype, n, kWeightQuantizationBlock, reinterpret_cast<int8_t*>(mine),
                       reinterpret_cast<float*>(mine + wire.values_bytes), on);
  });
  timeline.traced(*on, "all_gather", ranks * wire.region_bytes,
                  [&] { return comm.all_gather_bytes(mine, regions, wire.region_bytes); });
  on->enqueue([=] {
    for (int r = 0; r < ranks; ++r) {
      const char* region = regions + r * wire.region_bytes;
      dev->dequantize_int8(reinterpret_cast<const int8_t*>(region),
                           reinterpret_cast<const float*>(region + wire.values_bytes), n,
                           kWeightQuantizationBlock, full + r * shard_bytes, dtype, on);
    }
  });
  return timeline.issued(timeline.point(*on), issue_us);
}

// The slice is what the node gather puts back at this rank's place: with qwZ, the dequantized
// values the forward computed with (as DeepSpeed's secondary copy), so both gathers agree.
CommPoint Engine::Impl::keep_secondary_shard(int u, double issue_us) {
  UnitState& s = units[u];
  const size_t slice_bytes = secondary_numel(u) * elem;
  const char* from = static_cast<const char*>(s.params_full.data()) +
                     static_cast<size_t>(hpz_node->rank()) * slice_bytes;
  void* to = s.params_secondary.data();
  DeviceContext* dev = device.get();
  Stream* on = &comm.stream();
  on->enqueue([=] { dev->copy(to, from, slice_bytes, on); });
  s.secondary_ready = timeline.issued(timeline.point(*on), issue_us);
  s.secondary_valid = true;
  return s.secondary_ready;
}

CommPoint Engine::Impl::all_gather_unit_in_node(int u, double issue_us) {
  UnitState& s = units[u];
  Stream& on = hpz_node->stream();
  // The pooled buffer may have just been released by compute, and the secondary shard is
  // written on the communication stream: order the gather after both.
  on.wait(device->record());
  on.wait(s.secondary_ready.event);
  const void* mine = s.params_secondary.data();
  void* full = s.params_full.data();
  const size_t count = secondary_numel(u);
  const DType dtype = config.precision.dtype;
  return timeline.issued(
      timeline.traced(on, "all_gather", layout.units()[u].numel * elem,
                      [&] { return hpz_node->all_gather(mine, full, count, dtype); }),
      issue_us);
}

void Engine::Impl::invalidate_secondary_shards() {
  for (UnitState& s : units) {
    s.secondary_valid = false;
    s.secondary_ready = CommPoint{};
  }
}

bool Engine::Impl::prefetch(int u) {
  check_unit(u);
  return start_gather(u, /*required=*/false);
}

// Stages 1-2 after a step: the parameters come back through the post-step all-gather, which
// this waits for.
void Engine::Impl::gather(int u) {
  check_unit(u);
  start_gather(u, /*required=*/true);
  wait_for_params(u);
}

void Engine::Impl::release(int u) {
  check_unit(u);
  UnitState& s = units[u];
  if (config.stage != 3 || s.persistent || s.params == ParamState::kSharded) return;
  timeline.wait(s.params_ready);
  param_pool.give_back(std::move(s.params_full), CommPoint{device->record()});
  transition(s.params, {ParamState::kGathering, ParamState::kGathered}, ParamState::kSharded, u,
             "release");
  live -= layout.units()[u].numel;
}

const ParamPlacement& Engine::Impl::placement(int p) const {
  ZERO_CHECK(p >= 0 && p < static_cast<int>(layout.params().size()),
             "parameter " << p << " does not exist; the model has " << layout.params().size()
                          << " parameters");
  return layout.params()[p];
}

void* Engine::Impl::param(int p) {
  const ParamPlacement& pl = placement(p);
  UnitState& s = units[pl.unit];
  ZERO_CHECK(s.params != ParamState::kSharded && !s.params_full.empty(),
             "parameter '" << pl.name << "' used while unit " << pl.unit
                           << " is not gathered; call gather(" << pl.unit << ") first");
  // A unit can stay gathered while its buffer is refilled (the persistent unit's post-step
  // all-gather, which no gather() waits for): its values are read only once that landed.
  wait_for_params(pl.unit);
  return byte_offset(s.params_full.data(), pl.offset * elem);
}

void Engine::Impl::wait_for_params(int u) {
  UnitState& s = units[u];
  timeline.wait(s.params_ready);
  s.params_ready = CommPoint{};  // waited for: the next reader goes straight through
  if (s.params == ParamState::kGathering) {
    transition(s.params, {ParamState::kGathering}, ParamState::kGathered, u,
               "the wait for its all-gather");
  }
}

void* Engine::Impl::grad(int p) {
  const ParamPlacement& pl = placement(p);
  if (!pl.trainable) return nullptr;
  return reducer.gradient(pl.unit, pl.offset);
}

}  // namespace zero
