// Optimizer state in host memory (ZeRO-Offload, DeepSpeed's offload_optimizer device cpu;
// page-locked with pin_memory). The device keeps the working parameters and the gradients; the
// host keeps each rank's fp32 master and optimizer state and steps them with the CPU kernels,
// with page-locked copies of the gradient shard and the updated parameters for the bus. Three
// movements make it:
//   1. each unit's reduced gradient shard goes to the host on the communication stream right
//      behind its last reduction of the step, so the copies run during the rest of backward;
//   2. the step runs the same pieces and passes (sub_group_size) as the in-memory update, on the
//      host, with the same kernels as the CPU path: the numbers are the CPU path's, bit for bit;
//   3. each sub-group's updated working parameters go back to the device on its copy stream
//      while the host steps the next sub-group; the device waits for them before anything reads
//      the parameters (the post-step all-gathers, the next forward).
// On the CPU path the same three run with the copies inside host memory. On a GPU the
// optimizer offloaded to NVMe steps on the host too (steps_on_host): its records stream through
// page-locked staging slots, and each pass goes through the same copies (engine_offload.cpp).
#include <cstring>
#include <functional>
#include <vector>

#include "engine_internal.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero {

bool offloads_optimizer_to_host(const EngineConfig& config) {
  return config.offload.optimizer.device == OffloadDevice::kCpu;
}

bool steps_on_host(const EngineConfig& config) {
  return offloads_optimizer_to_host(config) ||
         (offloads_optimizer_to_nvme(config) && config.device.is_cuda());
}

CommPoint Engine::Impl::copy_grads_to_host(int u, const CommPoint& reduced) {
  UnitState& s = units[u];
  if (s.host_grads.empty()) return reduced;  // the update is not on the host (steps_on_host)
  DeviceContext* dev = device.get();
  Stream* on = &comm.stream();
  void* host = s.host_grads.data();
  const void* shard = reducer.owned(static_cast<size_t>(u));
  const size_t bytes = s.host_grads.bytes();
  // A compute-side span (not a collective): it shows when the copy ran against the reductions
  // beside it, and counts in neither the step's collectives nor its communication time. Only
  // where the stream runs the work itself (the CPU): a device stream would stamp issue times.
  Trace* t = trace.enabled() && on->native_handle() == nullptr ? &trace : nullptr;
  on->enqueue([=] {
    const double begin_us = Trace::now_us();
    dev->copy(host, shard, bytes, on);
    if (t) t->add(TraceSpan{"grads_to_host", false, begin_us, Trace::now_us(), bytes});
  });
  // Without overlap_comm the reduction was waited for already (from its issue); the copy is
  // exposed from now on.
  const CommPoint copied = timeline.point(*on);
  if (!config.schedule.overlap_comm) timeline.wait(copied);
  return copied;
}

void Engine::Impl::wait_for_host_uploads() {
  for (const Event& upload : host_uploads) upload.wait();
  host_uploads.clear();
}

void Engine::Impl::begin_host_update() {
  // The host writes the host side of the last step's copies to the device again.
  wait_for_host_uploads();
  // step() ordered the device after the gradients' copies; the host reads them itself.
  for (size_t u = 0; u < units.size(); ++u) reducer.reduced(static_cast<int>(u)).event.wait();
}

void Engine::Impl::apply_pass_on_host(const std::vector<Piece>& pieces,
                                      const std::function<ShardUpdate(size_t)>& make,
                                      float grad_scale) {
  const kernels::KernelOptions options{config.kernel_threads};
  const bool fp32 = config.precision.dtype == DType::kFloat32;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& piece = pieces[i];
    UnitState& s = units[piece.unit];
    // A shard on NVMe (offload_param) is updated in its host buffer and written back to its
    // file from there with its unit's last piece: it goes to the device with its next gather.
    const int u = static_cast<int>(piece.unit);
    const bool swapped = working_shards->swapped(u);
    char* shard = swapped ? static_cast<char*>(working_shards->update_target(
                                u, update_overwrites_shard(u, /*on_host=*/true), /*on_host=*/true))
                          : nullptr;
    // The master and state where make() put them; the gradient and the working copy on this
    // side of the bus. fp32 parameters are the master itself; a 16-bit working copy is written
    // beside it.
    // An NVMe staging slot is read into again while the upload may run: it goes from a copy.
    ZERO_CHECK(!offload || swapped || !s.host_params.empty(),
               "unit " << piece.unit << " has no host copy of its parameters to upload from");
    void* staged = swapped ? shard + piece.begin * elem
                           : byte_offset(s.host_params.data(), piece.begin * elem);
    ShardUpdate update = make(i);
    update.grad = byte_offset(s.host_grads.data(), piece.begin * accum);
    update.param_out = fp32 ? nullptr : staged;
    optimizer.apply(update, accum_dtype, grad_scale, config.precision.dtype, options);
    // An fp32 master that is not page-locked, or not kept (a staging slot of NVMe-resident
    // state), goes through its pinned copy (memory_plan.cpp); a swapped shard is its own.
    if (fp32 && (swapped || !s.host_params.empty())) {
      std::memcpy(staged, update.shard.master, piece.count * elem);
    }
    if (swapped) {
      finish_piece(piece);
      continue;
    }
    const void* updated =
        s.host_params.empty() ? static_cast<const void*>(update.shard.master) : staged;
    host_uploads.push_back(device->copy_from_host_async(
        byte_offset(working_shards->current(u), piece.begin * elem), updated, piece.count * elem));
  }
}

void Engine::Impl::end_host_update() {
  // The copies run in order on the device's one copy stream: after the last, all have run.
  if (!host_uploads.empty()) device->wait(host_uploads.back());
}

void Engine::Impl::set_working_params(size_t u, const float* master) {
  const size_t n = owned_range(u).count;
  if (!steps_on_host(config)) {
    device->cast(master, DType::kFloat32, working_shards->current(static_cast<int>(u)),
                 config.precision.dtype, n);
    return;
  }
  wait_for_host_uploads();
  if (config.precision.dtype == DType::kFloat32) {
    device->copy_from_host(working_shards->current(static_cast<int>(u)), master, n * sizeof(float));
    return;
  }
  // A shard on NVMe has no host copy of its own (its buffer is lent); the copy below is
  // synchronous, so any host memory serves.
  std::vector<char> lent;
  void* staged = units[u].host_params.data();
  if (units[u].host_params.empty()) {
    lent.resize(n * elem);
    staged = lent.data();
  }
  kernels::cast(master, DType::kFloat32, staged, config.precision.dtype, n);
  device->copy_from_host(working_shards->current(static_cast<int>(u)), staged, n * elem);
}

}  // namespace zero
