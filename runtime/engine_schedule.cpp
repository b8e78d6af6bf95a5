#include "engine_internal.h"

#include <algorithm>

namespace zero {

CommPoint Engine::Impl::comm_point(Stream& on) {
  if (on.native_handle() != nullptr) return CommPoint{on.record(), nullptr};
  auto done_us = std::make_shared<double>(0.0);
  Event e = on.enqueue([done_us] { *done_us = Trace::now_us(); });
  return CommPoint{std::move(e), std::move(done_us)};
}

// The one place compute waits for communication. comm_wait_ms adds how long compute was
// exposed to it, by the wall clock: from when compute needed the result (`needed_us`; now, by
// default) until this thread goes on, when the stream had not got there yet. That includes the
// time this thread takes to be woken (ranks outnumber cores here): the step pays it too.
void Engine::Impl::wait_for_comm(const CommPoint& point, double needed_us) {
  if (needed_us < 0.0) needed_us = Trace::now_us();
  if (!point.done_us) {
    device->wait(point.event);  // a device stream: no host-side figure
    return;
  }
  const bool had_arrived = point.event.done();
  device->wait(point.event);  // rethrows a failed collective's error
  const double until_us = had_arrived ? *point.done_us : Trace::now_us();
  comm_wait_us += std::max(0.0, until_us - needed_us);
}

// An issued collective: with overlap_comm off, compute needs it from the moment it was
// issued (`issue_us`) and waits for it right away.
CommPoint Engine::Impl::issued(CommPoint point, double issue_us) {
  if (!config.overlap_comm) wait_for_comm(point, issue_us);
  return point;
}

// This rank's working-dtype parameters the optimizer writes (see owned_begin).
void* Engine::Impl::owned_params(size_t u) {
  UnitState& s = units[u];
  if (config.stage == 3 && param_swap && param_swap->swapped(static_cast<int>(u))) {
    const auto copy = param_copies.find(static_cast<int>(u));
    if (copy != param_copies.end()) return copy->second.data();
    void* buffer = param_swap->buffer_of(static_cast<int>(u));
    ZERO_CHECK(buffer != nullptr, "offload_param: unit " << u << "'s shard is not in memory");
    return buffer;
  }
  if (config.stage == 3) return s.params_shard.data();
  return byte_offset(s.params_full.data(), owned_begin(u) * elem);
}

// The rank's reduced (and accumulated) gradient of what it owns, in accum_dtype.
void* Engine::Impl::owned_grads(size_t u) {
  if (config.stage <= 1) return byte_offset(units[u].grads_full.data(), owned_begin(u) * accum);
  return units[u].grads_shard.data();
}

// The rank's shard of the reduced gradient at every stage: the global norm is summed over
// shards, so stage 0 (which owns whole units) adds up in the same order as the others.
void* Engine::Impl::grad_shard(size_t u) {
  const size_t begin = static_cast<size_t>(rank) * layout.units()[u].shard;
  if (config.stage <= 1) return byte_offset(units[u].grads_full.data(), begin * accum);
  return units[u].grads_shard.data();
}

// Sums `bucket` (the unit's whole gradient from this rank, `dtype`) over the ranks and leaves
// this rank's reduced slice in `dest` (accum_dtype; added to it when `accumulate`). The shard
// group's part runs on the communication stream in order; the sum across replicas and what
// follows it, on the replica stream (sum_across_replicas). With gradient accumulation the
// replicas are summed once, as MiCS does at the accumulation boundary: the accumulated `dest`
// after the `last` micro-batch's reduction. With one micro-batch the result is summed in the
// wire dtype before its cast into `dest` (half the bytes across replicas when that is 16-bit).
Reduction Engine::Impl::reduce_to_shard(const Unit& unit, void* bucket, DType dtype, void* dest,
                                        bool accumulate, bool last) {
  const double issue_us = Trace::now_us();
  const bool via_fp32 = config.reduce_in_fp32 && dtype != DType::kFloat32;
  const DType wire = via_fp32 ? DType::kFloat32 : dtype;
  const DType dest_dtype = accum_dtype;
  const size_t numel = unit.numel;
  const size_t shard = unit.shard;
  const bool sum_at_boundary = config.micro_batches > 1;
  prepare_for_reduction(bucket, dtype, numel);
  comm.stream().wait(device->record());
  DeviceContext* dev = device.get();
  void* buf = bucket;
  if (via_fp32) {
    buf = fp32_scratch.data();
    wait_until_replicas_read_scratch();
    Stream* on = &comm.stream();
    on->enqueue([=] { dev->cast(bucket, dtype, buf, DType::kFloat32, numel, on); });
  }
  const uint64_t bytes_on_wire = numel * dtype_size(wire);
  if (!accumulate && wire == dest_dtype && config.reduce_scatter) {
    const CommPoint scattered = traced("reduce_scatter", bytes_on_wire,
                                       [&] { return comm.reduce_scatter(buf, dest, shard, wire); });
    if (sum_at_boundary && !last) return Reduction{scattered, issued(scattered, issue_us)};
    Stream& tail = sum_across_replicas(dest, shard, wire);
    const bool replicated = &tail != &comm.stream();
    return Reduction{scattered, issued(replicated ? comm_point(tail) : scattered, issue_us)};
  }
  void* slot = byte_offset(buf, rank * shard * dtype_size(wire));
  if (config.reduce_scatter) {
    traced("reduce_scatter", bytes_on_wire,
           [&] { return comm.reduce_scatter(buf, slot, shard, wire); });
  } else {
    traced("all_reduce", bytes_on_wire, [&] { return comm.all_reduce(buf, buf, numel, wire); });
  }
  // The slot is read until the tail has run: the bucket is free after it, and so is the
  // scratch (which the bucket then no longer needs).
  Stream* on = sum_at_boundary ? &comm.stream() : &sum_across_replicas(slot, shard, wire);
  on->enqueue([=] {
    if (dest == slot) return;
    if (accumulate) {
      dev->add(dest, dest_dtype, slot, wire, shard, on);
    } else {
      dev->cast(slot, wire, dest, dest_dtype, shard, on);
    }
  });
  if (sum_at_boundary) {
    const CommPoint added = comm_point();
    if (!last) return Reduction{added, issued(added, issue_us)};
    Stream& tail = sum_across_replicas(dest, shard, dest_dtype);
    const bool replicated = &tail != &comm.stream();
    return Reduction{added, issued(replicated ? comm_point(tail) : added, issue_us)};
  }
  const CommPoint done = issued(comm_point(*on), issue_us);
  if (!via_fp32 || on == &comm.stream()) return Reduction{done, done};
  scratch_read_by_replicas = done.event;
  return Reduction{comm_point(), done};
}

// Sums a whole unit's gradient (`dtype`) over the ranks into `dest` (accum_dtype; the bucket
// itself when that is where the gradient is kept) (stage 0).
CommPoint Engine::Impl::reduce_whole(const Unit& unit, void* bucket, DType dtype, void* dest) {
  const double issue_us = Trace::now_us();
  const size_t numel = unit.numel;
  const DType dest_dtype = accum_dtype;
  prepare_for_reduction(bucket, dtype, numel);
  comm.stream().wait(device->record());
  DeviceContext* dev = device.get();
  if (config.reduce_in_fp32 && dtype != DType::kFloat32) {
    void* buf = fp32_scratch.data();
    wait_until_replicas_read_scratch();
    Stream* from = &comm.stream();
    from->enqueue([=] { dev->cast(bucket, dtype, buf, DType::kFloat32, numel, from); });
    traced("all_reduce", numel * sizeof(float),
           [&] { return comm.all_reduce(buf, buf, numel, DType::kFloat32); });
    Stream* on = &sum_across_replicas(buf, numel, DType::kFloat32);
    on->enqueue([=] { dev->cast(buf, DType::kFloat32, dest, dest_dtype, numel, on); });
    const CommPoint done = issued(comm_point(*on), issue_us);
    if (on != from) scratch_read_by_replicas = done.event;
    return done;
  }
  traced("all_reduce", numel * dtype_size(dtype),
         [&] { return comm.all_reduce(bucket, bucket, numel, dtype); });
  Stream* on = &sum_across_replicas(bucket, numel, dtype);
  if (dest != bucket) on->enqueue([=] { dev->cast(bucket, dtype, dest, dest_dtype, numel, on); });
  return issued(comm_point(*on), issue_us);
}

// The pre-divide keeps 16-bit sums over many ranks in range: divide by f before the sum,
// multiply the f back in the optimizer's gradient scale.
void Engine::Impl::prepare_for_reduction(void* bucket, DType dtype, size_t numel) {
  if (config.gradient_predivide_factor != 1.0f) {
    device->scale(bucket, dtype, 1.0f / config.gradient_predivide_factor, numel);
  }
}

// Stage 3: starts unit u's all-gather into a pooled buffer. An optional prefetch stays within
// the live budget (stage3_max_live_parameters) and the planned buffers and says whether it
// started; a required gather always starts.
bool Engine::Impl::start_gather(int u, bool required) {
  UnitState& s = units[u];
  if (s.gathered || config.stage != 3) return true;
  const Unit& unit = layout.units()[u];
  if (!required) {
    const bool over_live_budget =
        config.max_live_elements > 0 && live > 0 && live + unit.numel > config.max_live_elements;
    if (over_live_budget || !param_pool.can_acquire_within_plan()) return false;
  }
  // A shard on NVMe is read into a buffer now, behind compute; the communication stream waits
  // for the read right before the all-gather, and the buffer is free once that ran.
  const bool swapped = param_swap && param_swap->swapped(u);
  if (swapped && !param_swap->start_read(u, required)) return false;
  const void* shard = swapped ? param_swap->buffer_of(u) : s.params_shard.data();
  const double issue_us = Trace::now_us();
  s.params_full = param_pool.acquire(/*zeroed=*/false);
  // The pooled buffer may have just been released by compute: order the gather after it.
  comm.stream().wait(device->record());
  if (swapped) {
    // On a GPU the stream runs this at once, so the host waits for the read here.
    comm.stream().enqueue(param_swap->read_waiter(u));
    param_swap->upload(u, &comm.stream());
  }
  s.params_ready = all_gather_unit(u, shard, issue_us);
  if (swapped) param_swap->drop(u, s.params_ready);
  s.gathered = true;
  live += unit.numel;
  return true;
}

// Unit u's all-gather of this rank's `shard` into its params_full, issued at `issue_us`.
CommPoint Engine::Impl::all_gather_unit(int u, const void* shard, double issue_us) {
  const Unit& unit = layout.units()[u];
  void* full = units[u].params_full.data();
  return issued(traced("all_gather", unit.numel * elem,
                       [&] { return comm.all_gather(shard, full, unit.shard, config.dtype); }),
                issue_us);
}

bool Engine::Impl::prefetch(int u) {
  check_unit(u);
  return start_gather(u, /*required=*/false);
}

void Engine::Impl::gather(int u) {
  check_unit(u);
  UnitState& s = units[u];
  start_gather(u, /*required=*/true);
  // Stages 1-2 after a step: the parameters come back through the post-step all-gather.
  s.gathered = true;
  wait_for_comm(s.params_ready);
}

void Engine::Impl::release(int u) {
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
void Engine::Impl::grads_ready(int u) {
  check_unit(u);
  UnitState& s = units[u];
  const Unit& unit = layout.units()[u];
  if (!unit.trainable) return;  // frozen: no gradient to reduce
  ZERO_CHECK(s.micro_batches_done < config.micro_batches,
             "grads_ready(" << u << ") called " << s.micro_batches_done + 1
                            << " times before step(); configured micro-batches per step: "
                            << config.micro_batches);
  s.micro_batches_done += 1;
  const bool last = s.micro_batches_done == config.micro_batches;
  if (s.persistent) {
    // Every module's backward added into the whole gradient (working dtype): reduced per
    // micro-batch into the shard and accumulated there in accum_dtype, as every other unit.
    s.grads_full_read = reduce_unit(u, s.grads_full.data(), config.dtype,
                                    /*accumulate=*/s.micro_batches_done > 1, last);
    s.grads_full_reused = !last;  // finish_step() zeroes it after the last
    return;
  }
  if (config.stage >= 2) {
    if (s.bucket.empty()) s.bucket = grad_pool.acquire(/*zeroed=*/true);
    const CommPoint bucket_read = reduce_unit(u, s.bucket.data(), config.dtype,
                                              /*accumulate=*/s.micro_batches_done > 1, last);
    grad_pool.give_back(std::move(s.bucket), bucket_read);
    return;
  }
  if (!s.bucket.empty()) {
    // This micro-batch's gradient into the accumulator of another dtype.
    const bool wire_is_working_dtype = reduction_dtype(config) == config.dtype;
    if (last && wire_is_working_dtype) {
      // The wire carries the working dtype at every stage: the micro-batches' sum, rounded
      // once (with one micro-batch, the gradient as backward left it), is what is reduced.
      if (config.micro_batches > 1) {
        device->add(s.grads_full.data(), accum_dtype, s.bucket.data(), config.dtype, unit.numel);
        device->cast(s.grads_full.data(), accum_dtype, s.bucket.data(), config.dtype, unit.numel);
      }
      const CommPoint bucket_read =
          reduce_unit(u, s.bucket.data(), config.dtype, /*accumulate=*/false, last);
      grad_pool.give_back(std::move(s.bucket), bucket_read);
      return;
    }
    device->add(s.grads_full.data(), accum_dtype, s.bucket.data(), config.dtype, unit.numel);
    grad_pool.give_back(std::move(s.bucket), CommPoint{device->record(), nullptr});
  }
  // Stages 0-1 keep whole gradients through accumulation and reduce them in place (stage 1's
  // reduced slice lands at the rank's own offset in the full buffer).
  if (last) reduce_unit(u, s.grads_full.data(), accum_dtype, /*accumulate=*/false, last);
}

// Reduces unit u's gradient `source` (`dtype`) into what the rank keeps of it, alone or as
// part of its reduce_bucket_size pack. Returns the event after which `source` may be reused.
CommPoint Engine::Impl::reduce_unit(int u, void* source, DType dtype, bool accumulate, bool last) {
  UnitState& s = units[u];
  const Unit& unit = layout.units()[u];
  if (reduce_packs.fused(u)) return reduce_packed(u, source, dtype, accumulate, last);
  if (config.stage == 0) {
    s.grads_reduced = reduce_whole(unit, source, dtype, s.grads_full.data());
    return s.grads_reduced;
  }
  const Reduction r = reduce_to_shard(unit, source, dtype, owned_grads(u), accumulate, last);
  s.grads_reduced = r.done;
  if (last) copy_grads_to_host(u);
  return r.input_read;
}

// A unit of a packed reduction: its gradient is copied into its place in every rank region
// of the fusion buffer (in the reduction dtype); the pack's last unit issues the one
// collective and copies each unit's reduced part out to what the rank keeps.
CommPoint Engine::Impl::reduce_packed(int u, void* source, DType dtype, bool accumulate,
                                      bool last) {
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
  if (packs.filled == 0) wait_until_replicas_read_scratch();
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
  // Only this rank's region is read below (hybrid sharding runs at stage 3 alone). With
  // gradient accumulation each unit's accumulated shard is summed across replicas at the end.
  const bool sum_at_boundary = config.micro_batches > 1;
  if (!sum_at_boundary) on = &sum_across_replicas(fused + rank * region * wire_size, region, wire);
  for (int v : packs.packs[p]) {
    const size_t v_shard = layout.units()[v].shard;
    const char* reduced = fused + packs.offset_of[v] * wire_size;
    if (config.stage == 0) {
      // Stage 0 keeps the whole sum: every rank region goes back to its place.
      char* dest = static_cast<char*>(units[v].grads_full.data());
      const DType to = accum_dtype;
      on->enqueue([=] {
        for (int r = 0; r < ranks; ++r) {
          dev->cast(reduced + r * region * wire_size, wire, dest + r * v_shard * dtype_size(to), to,
                    v_shard, on);
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
  if (sum_at_boundary && last && config.stage != 0) {
    for (int v : packs.packs[p]) {
      on = &sum_across_replicas(owned_grads(static_cast<size_t>(v)), layout.units()[v].shard,
                                accum_dtype);
    }
  }
  const CommPoint reduced = issued(comm_point(*on), issue_us);
  if (on != &comm.stream() && !sum_at_boundary) scratch_read_by_replicas = reduced.event;
  for (int v : packs.packs[p]) {
    units[v].grads_reduced = reduced;
    if (last) copy_grads_to_host(v);
  }
  return copied;
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
  ZERO_CHECK(s.gathered && !s.params_full.empty(),
             "parameter '" << pl.name << "' used while unit " << pl.unit
                           << " is not gathered; call gather(" << pl.unit << ") first");
  // A unit can stay gathered while its buffer is refilled (the persistent unit's post-step
  // all-gather, which no gather() waits for): its values are read only once that landed.
  wait_for_params(s);
  return byte_offset(s.params_full.data(), pl.offset * elem);
}

void Engine::Impl::wait_for_params(UnitState& s) {
  wait_for_comm(s.params_ready);
  s.params_ready = CommPoint{};  // waited for: the next reader goes straight through
}

void* Engine::Impl::grad(int p) {
  const ParamPlacement& pl = placement(p);
  UnitState& s = units[pl.unit];
  if (!pl.trainable) return nullptr;
  if (s.persistent) {
    // The last micro-batch's reduction may still read the buffer: zero it once that is done.
    if (s.grads_full_reused) {
      wait_for_comm(s.grads_full_read);
      device->zero(s.grads_full.data(), s.grads_full.bytes());
      s.grads_full_reused = false;
    }
    return byte_offset(s.grads_full.data(), pl.offset * elem);
  }
  if (!uses_grad_buckets(config)) return byte_offset(s.grads_full.data(), pl.offset * elem);
  if (s.bucket.empty()) s.bucket = grad_pool.acquire(/*zeroed=*/true);
  return byte_offset(s.bucket.data(), pl.offset * elem);
}

}  // namespace zero
