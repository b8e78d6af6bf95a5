#include "engine_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

namespace zero {

// One optimizer step in named phases: wait for the reductions, the global norm and overflow,
// the update of each rank's slice, the all-gathers that bring the slices back.
StepStats Engine::Impl::step() {
  check_ready_for_step();
  // Every unit is released by now; the update changes what hpZ's secondary shards copied.
  invalidate_secondary_shards();
  reducer.wait_for_reductions();
  sum_pipeline_ties();
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
    const auto update_start = std::chrono::steady_clock::now();
    update(stats.lr, clip * check.to_mean);
    stats.optimizer_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - update_start)
            .count();
    if (offload) {
      stats.nvme_wait_ms = offload->wait_ms;
      stats.nvme_busy_ms = offload->busy_ms;
      stats.nvme_read_bytes = offload->read_bytes;
      stats.nvme_write_bytes = offload->write_bytes;
    }
    start_post_step_gathers();
  }
  if (ParamSwap* swap = working_shards->swap()) {
    const ParamSwap::Stats swapped = swap->take_stats();
    stats.nvme_wait_ms += swapped.wait_ms;
    stats.nvme_read_bytes += swapped.read_bytes;
    stats.nvme_write_bytes += swapped.write_bytes;
    stats.nvme_param_read_wait_ms = swapped.stream_wait_ms;
  }
  reducer.finish_step();
  stats.step = optimizer.step();
  const CommTimeline::Figures comm_figures = timeline.take();
  stats.collectives = comm_figures.collectives;
  stats.comm_busy_ms = comm_figures.busy_ms;
  stats.comm_wait_ms = comm_figures.wait_ms;
  const MemoryStats& memory = allocator.stats();
  stats.peak_activation_bytes = memory.window_peak_activations;
  stats.peak_checkpoint_bytes =
      memory.window_peak[static_cast<size_t>(MemoryCategory::kCheckpoint)];
  allocator.start_window();
  return stats;
}

void Engine::Impl::check_ready_for_step() const {
  for (size_t u = 0; u < units.size(); ++u) {
    const int done = reducer.micro_batches_done(static_cast<int>(u));
    ZERO_CHECK(!layout.units()[u].trainable || done == config.micro_batches,
               "step() after " << done << " backward pass(es) of unit " << u << "; expected "
                               << config.micro_batches
                               << " (one grads_ready per unit per micro-batch"
                               << (units[u].persistent
                                       ? ", the persistent unit's after the whole backward)"
                                       : ")"));
    // A stage-3 unit gathered across the step would keep serving the old parameters.
    ZERO_CHECK(config.stage != 3 || units[u].params == ParamState::kSharded || units[u].persistent,
               "step() while unit " << u << " is still gathered; release it first");
  }
}

// One all-reduce of each unit's sum of squares over the shards gives the global norm, and
// tells every rank at once whether (and in which unit) a gradient overflowed anywhere.
Engine::Impl::GradientCheck Engine::Impl::check_gradients() {
  float* unit_sums = norm_sums.as<float>();
  {
    ScopedSpan span(trace, "gradient norm");
    // Frozen units have no gradient: they add nothing to the norm.
    device->zero(unit_sums, units.size() * sizeof(float));
    for (size_t u = 0; u < units.size(); ++u) {
      if (!layout.units()[u].trainable) continue;
      if (config.grid.tensor_parallel != nullptr || unit_counts_partly(u)) {
        const float sum = counted_sum_squares(u, unit_sums + u);
        device->copy_from_host(unit_sums + u, &sum, sizeof(float));
      } else {
        device->sum_squares(reducer.shard(u), accum_dtype, layout.units()[u].shard, unit_sums + u);
      }
    }
  }
  comm.stream().wait(device->record());
  timeline.wait(timeline.traced(comm.stream(), "all_reduce", units.size() * sizeof(float), [&] {
    return comm.all_reduce(unit_sums, unit_sums, units.size(), DType::kFloat32);
  }));
  if (config.grid.tensor_parallel != nullptr) {
    // The data-parallel sums of every tensor-parallel rank, added: every rank of the grid then
    // holds the same figures, so all of them clip and skip alike. On a GPU the group's stream
    // starts after the compute stream, which waited for the data-parallel sums, and the copy
    // below waits for the group.
    Communicator& group = *config.grid.tensor_parallel;
    group.stream().wait(device->record());
    device->wait(group.all_reduce(unit_sums, unit_sums, units.size(), DType::kFloat32));
  }
  // The one value the host must see each step: whether to skip, and how much to clip.
  device->copy_to_host(norm_sums_on_host.data(), unit_sums, units.size() * sizeof(float));
  GradientCheck check;
  check.unit_sums.assign(norm_sums_on_host.as<float>(),
                         norm_sums_on_host.as<float>() + units.size());
  double total = 0.0;
  for (float v : check.unit_sums) total += v;
  if (config.grid.pipeline.stages != nullptr) {
    // Every stage's sum, added in stage order on every rank of the pipeline: all stages then
    // clip by the same norm and skip (an overflow anywhere is a non-finite total) together.
    uint64_t bits = 0;
    std::memcpy(&bits, &total, sizeof(total));
    total = 0.0;
    for (uint64_t stage_bits : all_gather_u64(*config.grid.pipeline.stages, bits)) {
      double stage_total = 0.0;
      std::memcpy(&stage_total, &stage_bits, sizeof(stage_total));
      total += stage_total;
    }
  }
  // Gradients are summed over ranks (every replica's too) and micro-batches and carry the loss
  // scale (and the pre-divide): one factor takes them back to the mean gradient of the global
  // batch.
  check.to_mean = config.precision.gradient_predivide_factor /
                  (static_cast<float>(world) * static_cast<float>(replicas) *
                   static_cast<float>(config.micro_batches) * loss_scale());
  check.grad_norm = static_cast<float>(std::sqrt(total)) * check.to_mean;
  check.overflow = !std::isfinite(total);
  return check;
}

float Engine::Impl::counted_sum_squares(size_t u, float* slot) {
  const Unit& unit = layout.units()[u];
  const ElementRange mine = shard_range(unit.numel, rank, world);
  const size_t begin = mine.first;
  const size_t end = mine.end();
  double sum = 0.0;
  for (int p : unit.params) {
    if (!counts_in_norm(p)) continue;
    const ParamPlacement& param = layout.params()[static_cast<size_t>(p)];
    const size_t first = std::max(begin, param.offset);
    const size_t last = std::min(end, param.offset + param.numel);
    if (first >= last) continue;
    device->sum_squares(byte_offset(reducer.shard(u), (first - begin) * accum), accum_dtype,
                        last - first, slot);
    float part = 0.0f;
    device->copy_to_host(&part, slot, sizeof(float));
    sum += part;
  }
  return static_cast<float>(sum);
}

bool Engine::Impl::counts_in_norm(int p) const {
  const ParamPlacement& param = layout.params()[static_cast<size_t>(p)];
  if (config.grid.tensor_parallel != nullptr && !param.split.is_split() &&
      config.grid.tensor_parallel->rank() != 0) {
    return false;
  }
  if (!config.grid.pipeline.counts_ties_in_norm &&
      std::find(pipeline_tied_params.begin(), pipeline_tied_params.end(), p) !=
          pipeline_tied_params.end()) {
    return false;
  }
  return true;
}

bool Engine::Impl::unit_counts_partly(size_t u) const {
  for (int p : layout.units()[u].params) {
    if (!counts_in_norm(p)) return true;
  }
  return false;
}

// fp16 lets the loss scaler decide; fp32 and bf16 stop on a non-finite gradient, naming the
// unit, unless told to skip such steps.
bool Engine::Impl::skip_step(const GradientCheck& check) {
  if (config.precision.dtype == DType::kFloat16) return loss_scaler.update(check.overflow);
  if (!check.overflow) return false;
  const std::vector<float>& sums = check.unit_sums;
  size_t bad = 0;
  while (bad < sums.size() && std::isfinite(sums[bad])) ++bad;
  // The sum over the pipeline overflowed but this stage's own units are finite.
  ZERO_CHECK(bad < sums.size() || config.precision.skip_nonfinite_steps,
             "step " << optimizer.step() + 1
                     << ": a gradient of another pipeline stage is not finite; stopping "
                        "(\"nonfinite_gradients\": \"skip\" in the config skips such steps "
                        "instead)");
  const Unit& unit = layout.units()[bad < sums.size() ? bad : 0];
  const std::string first_param =
      unit.params.empty() ? "no parameters" : layout.params()[unit.params.front()].name;
  ZERO_CHECK(config.precision.skip_nonfinite_steps,
             "step " << optimizer.step() + 1 << ": the gradient of unit " << bad
                     << " (starting at parameter '" << first_param
                     << "') is not finite on some rank; stopping (\"nonfinite_gradients\": "
                        "\"skip\" in the config skips such steps instead)");
  return true;
}

// Fused AdamW (or SGD) over what each rank owns, in passes of at most sub_group_size
// elements (DeepSpeed's bound on what one optimizer pass touches); each unit's slice may be
// cut into several pieces, which the element-wise update does not notice. NVMe-offloaded state
// goes through the same passes and pieces, streamed (NvmeShards, engine_offload.cpp), and state
// in host memory is stepped there (engine_host_optimizer.cpp).
void Engine::Impl::update(float lr, float grad_scale) {
  optimizer.begin_step(lr);
  ScopedSpan optimizer_span(trace, "optimizer");
  const bool on_host = steps_on_host(config);
  if (on_host) begin_host_update();
  shards->begin_update();
  try {
    for (size_t k = 0; k < sub_groups.size(); ++k) {
      const std::vector<Piece>& pieces = sub_groups[k];
      shards->begin_pass(k);
      const auto make = [&](size_t i) { return piece_update(pieces[i], shards->arrays(k, i)); };
      if (on_host) {
        apply_pass_on_host(pieces, make, grad_scale);
      } else {
        apply_pass(pieces, make, grad_scale);
      }
      shards->end_pass(k);
    }
    shards->end_update();
  } catch (...) {
    shards->abandon();
    throw;
  }
  if (on_host) end_host_update();
  // The next forward reads the shards written back here.
  working_shards->end_update();
}

void Engine::Impl::apply_pass(const std::vector<Piece>& pieces,
                              const std::function<ShardUpdate(size_t)>& make, float grad_scale) {
  std::vector<ShardUpdate> group;
  if (!working_shards->swap()) {
    for (size_t i = 0; i < pieces.size(); ++i) group.push_back(make(i));
    device->apply_optimizer(optimizer, group, accum_dtype, grad_scale, config.precision.dtype);
    return;
  }
  // Unit by unit, so that a swapped shard is in a buffer while its pieces are stepped.
  for (size_t i = 0; i < pieces.size();) {
    const int u = static_cast<int>(pieces[i].unit);
    size_t end = i;
    while (end < pieces.size() && pieces[end].unit == pieces[i].unit) ++end;
    const bool overwritten = update_overwrites_shard(u, /*on_host=*/false);
    working_shards->update_target(u, overwritten, /*on_host=*/false);
    group.clear();
    for (size_t k = i; k < end; ++k) group.push_back(make(k));
    // A shard taken unread must come out of the update whole.
    ZERO_CHECK(!working_shards->swapped(u) || !overwritten ||
                   std::all_of(group.begin(), group.end(),
                               [](const ShardUpdate& g) { return g.param_out != nullptr; }),
               "offload_param: unit " << u << "'s update does not write its shard");
    device->apply_optimizer(optimizer, group, accum_dtype, grad_scale, config.precision.dtype);
    finish_piece(pieces[end - 1]);
    i = end;
  }
}

// An update that rounds a master kept elsewhere (on the host, in the optimizer's records, or
// beside the working parameters) writes the whole shard: its old values need no read.
bool Engine::Impl::update_overwrites_shard(int u, bool on_host) const {
  return on_host || (offload ? offload->layout.master : !units[u].master.empty());
}

void Engine::Impl::finish_piece(const Piece& last) {
  if (last.begin + last.count == owned_range(last.unit).count) {
    working_shards->updated(static_cast<int>(last.unit));
  }
}

PieceArrays ResidentShards::arrays(size_t pass, size_t piece) {
  const Piece& p = passes_[pass][piece];
  UnitState& s = units_[p.unit];
  PieceArrays arrays;
  for (int k = 0; k < 2; ++k) {
    if (!s.state[k].empty()) arrays.state[k] = s.state[k].as<float>() + p.begin;
  }
  if (!s.master.empty()) arrays.master = s.master.as<float>() + p.begin;
  return arrays;
}

PieceArrays ResidentShards::unit_arrays(int unit, size_t count) {
  static_cast<void>(count);  // the buffers hold the whole owned slice
  UnitState& s = units_[static_cast<size_t>(unit)];
  PieceArrays arrays;
  for (int k = 0; k < 2; ++k) {
    if (!s.state[k].empty()) arrays.state[k] = s.state[k].as<float>();
  }
  if (!s.master.empty()) arrays.master = s.master.as<float>();
  return arrays;
}

ShardUpdate Engine::Impl::piece_update(const Piece& piece, const PieceArrays& arrays) {
  void* working_shard = working_shards->current(static_cast<int>(piece.unit));
  float* master = arrays.master;
  ShardUpdate update;
  update.shard.n = piece.count;
  update.shard.master =
      master != nullptr ? master : static_cast<float*>(working_shard) + piece.begin;
  for (int k = 0; k < optimizer.state_count(); ++k) update.shard.state[k] = arrays.state[k];
  update.grad = byte_offset(reducer.owned(piece.unit), piece.begin * accum);
  update.param_out = master != nullptr ? byte_offset(working_shard, piece.begin * elem) : nullptr;
  update.weight_decay = piece.weight_decay;
  return update;
}

// Each unit's slice is cut where its weight decay changes and where a pass reaches
// sub_group_size elements; frozen units are left out.
std::vector<std::vector<Piece>> Engine::Impl::plan_sub_groups() const {
  const size_t limit = config.schedule.optimizer_sub_group_elements;
  std::vector<std::vector<Piece>> groups(1);
  size_t group_numel = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (!layout.units()[u].trainable) continue;
    const size_t n = owned_range(u).count;
    const size_t first = owned_range(u).first;
    const std::vector<DecayRun>& runs = decay_runs[u];
    size_t run = 0;
    for (size_t begin = 0; begin < n;) {
      // The decay run holding element `begin` of the slice, and where it ends in the slice.
      while (run + 1 < runs.size() && runs[run + 1].begin <= first + begin) ++run;
      const size_t run_end = run + 1 < runs.size() ? runs[run + 1].begin - first : n;
      const size_t room = limit == 0 ? n : limit - group_numel;
      const size_t count = std::min({n - begin, room, run_end - begin});
      groups.back().push_back(Piece{u, begin, count, runs[run].weight_decay});
      group_numel += count;
      begin += count;
      if (limit != 0 && group_numel == limit) {
        groups.emplace_back();
        group_numel = 0;
      }
    }
  }
  if (groups.back().empty()) groups.pop_back();
  return groups;
}

// Brings every rank's updated slice back into the full parameters (stages 1-2, and stage
// 3's persistent units); the next forward's gather(u) waits for unit u only, so the
// all-gathers overlap with the forward.
void Engine::Impl::start_post_step_gathers(bool with_frozen) {
  if (config.stage == 0) return;
  comm.stream().wait(device->record());
  for (const std::vector<int>& pack : gather_packs.packs) {
    if (pack.size() > 1) {
      gather_packed(pack);
    } else {
      gather_one(pack.front());
    }
  }
  if (!with_frozen) return;
  for (size_t u = 0; u < units.size(); ++u) {
    if (!layout.units()[u].trainable) gather_one(static_cast<int>(u));
  }
}

void Engine::Impl::gather_one(int u) {
  UnitState& s = units[u];
  if (s.params_full.empty()) return;
  const void* shard = working_shards->post_step_source(u);
  const double issue_us = Trace::now_us();
  s.params_ready = all_gather_unit(u, shard, issue_us);
  working_shards->gathered(u, s.params_ready);
  // Stages 1-2 wait for this gather in gather(). A stage-3 unit gathered here was prefetched
  // before a state load: its buffer now holds the loaded values and stays gathered (and
  // counted live) until its release, which gives the buffer back.
  transition(s.params, {ParamState::kGathered, ParamState::kGathering}, ParamState::kGathering, u,
             "the post-step all-gather");
}

// An allgather_bucket_size pack (stages 1-2): each unit's updated slice into its place in
// this rank's region of the fusion buffer, one all-gather of the regions, and every rank's
// slice of each unit back into its full parameters.
void Engine::Impl::gather_packed(const std::vector<int>& pack) {
  const double issue_us = Trace::now_us();
  const int p = gather_packs.pack_of[pack.front()];
  const size_t region = gather_packs.region[p];
  char* fused = static_cast<char*>(fusion.data());
  DeviceContext* dev = device.get();
  Stream* on = &comm.stream();
  const size_t w = elem;
  for (int u : pack) {
    const char* mine = static_cast<const char*>(working_shards->current(u));
    char* slot = fused + (rank * region + gather_packs.offset_of[u]) * w;
    const size_t bytes = layout.units()[u].shard * w;
    on->enqueue([=] { dev->copy(slot, mine, bytes, on); });
  }
  timeline.traced(comm.stream(), "all_gather", world * region * w, [&] {
    return comm.all_gather(fused + rank * region * w, fused, region, config.precision.dtype);
  });
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
  const CommPoint ready = timeline.issued(timeline.point(comm.stream()), issue_us);
  for (int u : pack) {
    units[u].params_ready = ready;
    transition(units[u].params, {ParamState::kGathered, ParamState::kGathering},
               ParamState::kGathering, u, "the post-step all-gather");
  }
}

}  // namespace zero
