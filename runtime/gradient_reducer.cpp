#include "gradient_reducer.h"

namespace zero {

GradientReducer::GradientReducer(const Layout& layout, const EngineConfig& config,
                                 Communicator& comm, Communicator* replicas, DeviceContext& device,
                                 Allocator& allocator, CommTimeline& timeline, const Buffer& fusion)
    : layout_(layout),
      config_(config),
      comm_(comm),
      replicas_(replicas),
      device_(device),
      allocator_(allocator),
      timeline_(timeline),
      fusion_(fusion),
      rank_(comm.rank()),
      world_(comm.world_size()),
      accum_dtype_(accumulation_dtype(config)),
      wire_(reduction_dtype(config)),
      pool_(allocator, device, MemoryCategory::kCommBuffer,
            layout.max_unit_numel() * dtype_size(config.precision.dtype),
            [&timeline](const CommPoint& p) { timeline.wait(p); }),
      packs_(layout, config.schedule.reduce_bucket_elements, /*backward=*/true),
      units_(layout.units().size()),
      after_last_([](int, const CommPoint& reduced) { return reduced; }) {
  // Collective (the groups are split from the world): every rank's config asks alike.
  if (quantized_reduction_scratch(layout, config) > 0) {
    quantized_ = std::make_unique<QuantizedReduceScatter>(comm, device, timeline);
  }
}

void GradientReducer::allocate_unit(size_t u, const UnitBytes& bytes) {
  UnitGrads& g = units_[u];
  g.persistent = is_persistent(layout_.units()[u], config_);
  g.full = allocator_.allocate(bytes.grads_full, MemoryCategory::kGrads);
  g.shard = allocator_.allocate(bytes.grads_shard, MemoryCategory::kGrads);
}

void GradientReducer::allocate_buckets() {
  pool_.reserve(grad_bucket_count(layout_, config_));
}

void GradientReducer::allocate_scratch() {
  if (needs_fp32_scratch(config_)) {
    fp32_scratch_ =
        allocator_.allocate(layout_.max_unit_numel() * sizeof(float), MemoryCategory::kCommBuffer);
  }
  if (quantized_) {
    quantized_scratch_ = allocator_.allocate(quantized_reduction_scratch(layout_, config_),
                                             MemoryCategory::kCommBuffer);
    quantized_->set_scratch(quantized_scratch_.data(), quantized_scratch_.bytes());
  }
}

uint64_t GradientReducer::quantized_bytes_within_nodes() const {
  return quantized_ ? quantized_->sent_within_nodes() : 0;
}

uint64_t GradientReducer::quantized_bytes_across_nodes() const {
  return quantized_ ? quantized_->sent_across_nodes() : 0;
}

void* GradientReducer::gradient(int u, size_t offset) {
  UnitGrads& g = units_[u];
  const size_t at = offset * dtype_size(config_.precision.dtype);
  if (g.persistent) {
    // The last micro-batch's reduction may still read the buffer: zero it once that is done.
    if (g.full_reused) {
      timeline_.wait(g.full_read);
      device_.zero(g.full.data(), g.full.bytes());
      g.full_reused = false;
    }
    return byte_offset(g.full.data(), at);
  }
  if (!uses_grad_buckets(config_)) return byte_offset(g.full.data(), at);
  if (g.bucket.empty()) g.bucket = pool_.acquire(/*zeroed=*/true);
  return byte_offset(g.bucket.data(), at);
}

void GradientReducer::ready(int u) {
  UnitGrads& g = units_[u];
  const Unit& unit = layout_.units()[u];
  if (!unit.trainable) return;  // frozen: no gradient to reduce
  ZERO_CHECK(g.micro_batches_done < config_.micro_batches,
             "grads_ready(" << u << ") called " << g.micro_batches_done + 1
                            << " times before step(); configured micro-batches per step: "
                            << config_.micro_batches);
  g.micro_batches_done += 1;
  const bool last = g.micro_batches_done == config_.micro_batches;
  const bool accumulate = g.micro_batches_done > 1;
  transition(g.state, {GradState::kEmpty, GradState::kAccumulating},
             last ? GradState::kReducing : GradState::kAccumulating, u, "grads_ready");
  if (g.persistent) {
    // Every module's backward added into the whole gradient (working dtype): reduced per
    // micro-batch into the shard and accumulated there in the accumulation dtype, as every
    // other unit.
    g.full_read = reduce(u, g.full.data(), config_.precision.dtype, accumulate, last);
    g.full_reused = !last;  // finish_step() zeroes it after the last
    return;
  }
  if (reduces_every_micro_batch(config_)) {
    if (g.bucket.empty()) g.bucket = pool_.acquire(/*zeroed=*/true);
    const CommPoint bucket_read =
        reduce(u, g.bucket.data(), config_.precision.dtype, accumulate, last);
    pool_.give_back(std::move(g.bucket), bucket_read);
    return;
  }
  // No gradient asked for in this micro-batch (grads_ready without grad()): a zeroed bucket
  // stands for it, so that the accumulator starts from 0 (not the last step's sum) and the
  // reduction finds its buffers.
  if (uses_grad_buckets(config_) && g.bucket.empty()) g.bucket = pool_.acquire(/*zeroed=*/true);
  if (!g.bucket.empty()) {
    // This micro-batch's gradient into the accumulator of another dtype.
    if (last && wire_ == config_.precision.dtype) {
      // The wire carries the working dtype at every stage: the micro-batches' sum, rounded
      // once (with one micro-batch, the gradient as backward left it), is what is reduced.
      if (config_.micro_batches > 1) {
        device_.add(g.full.data(), accum_dtype_, g.bucket.data(), config_.precision.dtype,
                    unit.numel);
        device_.cast(g.full.data(), accum_dtype_, g.bucket.data(), config_.precision.dtype,
                     unit.numel);
      }
      const CommPoint bucket_read =
          reduce(u, g.bucket.data(), config_.precision.dtype, /*accumulate=*/false, last);
      pool_.give_back(std::move(g.bucket), bucket_read);
      return;
    }
    // The step's first micro-batch is the accumulator's first value: copied in (widened), so
    // that finish_step() need not zero the accumulator for it to be added to.
    if (accumulate) {
      device_.add(g.full.data(), accum_dtype_, g.bucket.data(), config_.precision.dtype,
                  unit.numel);
    } else {
      device_.cast(g.bucket.data(), config_.precision.dtype, g.full.data(), accum_dtype_,
                   unit.numel);
    }
    pool_.give_back(std::move(g.bucket), CommPoint{device_.record()});
  }
  // Stages 0-1 (and 2-3 reducing once) keep whole gradients through accumulation and reduce
  // them after the last micro-batch: in place at stage 1, whose reduced slice lands at the
  // rank's own offset in the whole buffer, into the shard at stages 2-3.
  if (last) reduce(u, g.full.data(), accum_dtype_, /*accumulate=*/false, last);
}

// The pack's rank regions are put together in the wire dtype (a unit alone already in it is
// reduced where it is), one collective reduces them, and each unit's reduced part goes to what
// the rank keeps: its shard (added to it when accumulating), or at stage 0 the whole unit. With
// hybrid sharding the sum across replicas follows: with one micro-batch on the wire's result
// before it is cast out (half the bytes when the wire is 16-bit), with several once, on the
// accumulated shards after the last (as MiCS does at the accumulation boundary).
CommPoint GradientReducer::reduce(int u, void* source, DType dtype, bool accumulate, bool last) {
  const double issue_us = Trace::now_us();
  const int p = packs_.pack_of[u];
  const std::vector<int>& pack = packs_.packs[p];
  const Unit& unit = layout_.units()[u];
  const size_t region = packs_.region[p];
  const size_t wire_size = dtype_size(wire_);
  const bool alone = pack.size() == 1;
  ZERO_CHECK(alone || packs_.filling == -1 || packs_.filling == p,
             "grads_ready(" << u << ") while the reduction bucket of unit "
                            << packs_.packs[packs_.filling].front()
                            << " still waits for units; with reduce_bucket_size packing "
                               "units must become ready in backward order");
  if (config_.precision.gradient_predivide_factor != 1.0f) {
    // The pre-divide keeps 16-bit sums over many ranks in range: divide by f before the sum,
    // multiply the f back in the optimizer's gradient scale.
    device_.scale(source, dtype, 1.0f / config_.precision.gradient_predivide_factor, unit.numel);
  }
  Stream& stream = comm_.stream();
  stream.wait(device_.record());
  DeviceContext* dev = &device_;
  const int ranks = world_;
  char* send = static_cast<char*>(source);
  if (!alone || dtype != wire_) {
    send = static_cast<char*>(alone ? fp32_scratch_.data() : fusion_.data());
    ZERO_CHECK(send != nullptr, "internal error: unit " << u
                                                        << "'s reduction has no buffer to "
                                                           "put its gradient in the wire dtype");
    if (packs_.filled == 0) stream.wait(staging_read_by_replicas_);
    const char* from = static_cast<const char*>(source);
    const size_t from_size = dtype_size(dtype);
    const size_t shard = unit.shard;
    const size_t offset = packs_.offset_of[u];
    const DType wire = wire_;
    Stream* on = &stream;
    on->enqueue([=] {
      for (int r = 0; r < ranks; ++r) {
        dev->cast(from + r * shard * from_size, dtype, send + (r * region + offset) * wire_size,
                  wire, shard, on);
      }
    });
  }
  const bool staged = send != source;
  CommPoint copied;
  if (!alone) {
    packs_.filling = p;
    copied = timeline_.point(stream);
    units_[u].reduced = copied;
    if (++packs_.filled < pack.size()) return copied;
    packs_.filling = -1;
    packs_.filled = 0;
  }

  // The collective. A unit alone reduced into a shard of its own dtype lands there directly.
  const bool whole = config_.stage == 0 || !config_.schedule.reduce_scatter;
  const bool into_shard = alone && !whole && !accumulate && wire_ == accum_dtype_;
  char* mine = into_shard ? static_cast<char*>(owned(static_cast<size_t>(u)))
                          : send + rank_ * region * wire_size;
  const uint64_t bytes = ranks * region * wire_size;
  const CommPoint collected =
      whole ? timeline_.traced(stream, "all_reduce", bytes,
                               [&] { return comm_.all_reduce(send, send, ranks * region, wire_); })
      : quantized_ && reduces_quantized(region)
          ? quantized_->reduce_scatter(send, mine, region, wire_)
          : timeline_.traced(stream, "reduce_scatter", bytes,
                             [&] { return comm_.reduce_scatter(send, mine, region, wire_); });

  // Each unit's part out to what the rank keeps.
  const bool sum_at_boundary = config_.micro_batches > 1;
  Stream* on = sum_at_boundary ? &stream : &sum_across_replicas(mine, region, wire_);
  bool enqueued = on != &stream;
  for (int v : pack) {
    const size_t v_shard = layout_.units()[v].shard;
    const char* part = send + packs_.offset_of[v] * wire_size;
    const DType to = accum_dtype_;
    const DType wire = wire_;
    if (config_.stage == 0) {
      // Stage 0 keeps the whole sum: every rank region goes back to its place.
      char* dest = static_cast<char*>(units_[v].full.data());
      if (dest == part) continue;
      on->enqueue([=] {
        for (int r = 0; r < ranks; ++r) {
          dev->cast(part + r * region * wire_size, wire, dest + r * v_shard * dtype_size(to), to,
                    v_shard, on);
        }
      });
      enqueued = true;
      continue;
    }
    const char* reduced = mine + packs_.offset_of[v] * wire_size;
    void* dest = owned(static_cast<size_t>(v));
    if (dest == reduced) continue;
    on->enqueue([=] {
      if (accumulate) {
        dev->add(dest, to, reduced, wire, v_shard, on);
      } else {
        dev->cast(reduced, wire, dest, to, v_shard, on);
      }
    });
    enqueued = true;
  }
  if (sum_at_boundary && last && config_.stage != 0) {
    for (int v : pack) {
      on = &sum_across_replicas(owned(static_cast<size_t>(v)), layout_.units()[v].shard,
                                accum_dtype_);
      enqueued = enqueued || on != &stream;
    }
  }
  const CommPoint done = timeline_.issued(enqueued ? timeline_.point(*on) : collected, issue_us);
  // A staging buffer read on the replica stream must not be written again before that ran.
  const bool staging_read_elsewhere = staged && !into_shard && on != &stream && !sum_at_boundary;
  if (staging_read_elsewhere) staging_read_by_replicas_ = done.event;
  for (int v : pack) {
    units_[v].reduced = last ? after_last_(v, done) : done;
  }
  // The source is free once it is copied into the pack, read by the collective, or (reduced
  // where it is) cast out of.
  if (!alone) return copied;
  return staged || into_shard ? collected : done;
}

// The replica all-reduce runs on the replica communicator's stream after the shard group's
// reduction it follows; the shard group's stream does not wait for it. It is issued from the
// engine's thread, which is where the replica communicator's counters are read. Every rank
// issues its reductions in the same order, so the replica groups' collectives match.
Stream& GradientReducer::sum_across_replicas(void* data, size_t count, DType dtype) {
  if (replicas_ == nullptr) return comm_.stream();
  Communicator& replica = *replicas_;
  Stream& on = replica.stream();
  on.wait(comm_.stream().record());
  timeline_.traced(on, "replica_all_reduce", count * dtype_size(dtype),
                   [&] { return replica.all_reduce(data, data, count, dtype); });
  return on;
}

void GradientReducer::wait_for_reductions() {
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitGrads& g = units_[u];
    timeline_.wait(g.reduced);
    if (!layout_.units()[u].trainable) continue;
    transition(g.state, {GradState::kReducing}, GradState::kReduced, static_cast<int>(u),
               "the step's wait for the reductions");
  }
}

void* GradientReducer::owned(size_t u) {
  if (config_.stage == 0) return units_[u].full.data();
  return shard(u);
}

void* GradientReducer::shard(size_t u) {
  // Stages 2-3 keep a shard of their own, except where a pipeline reduces once per step into
  // the whole gradient (as stage 1 does).
  if (reduces_every_micro_batch(config_) || !units_[u].shard.empty()) {
    return units_[u].shard.data();
  }
  const ElementRange mine = shard_range(layout_.units()[u].numel, rank_, world_);
  return byte_offset(units_[u].full.data(), mine.first * dtype_size(accum_dtype_));
}

void GradientReducer::finish_step() {
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitGrads& g = units_[u];
    // Zeroed where backward adds into it; a bucket's first micro-batch is copied into it.
    if (!g.full.empty() && (g.persistent || !uses_grad_buckets(config_))) {
      device_.zero(g.full.data(), g.full.bytes());
    }
    g.full_reused = false;
    g.micro_batches_done = 0;
    if (!layout_.units()[u].trainable) continue;
    transition(g.state, {GradState::kReduced}, GradState::kEmpty, static_cast<int>(u),
               "the step's end");
  }
}
}  // namespace zero
