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
// On the CPU path the same three run with the copies inside host memory.
#include <cstring>

#include "engine_internal.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero {

bool offloads_optimizer_to_host(const EngineConfig& config) {
  return config.offload_optimizer.device == OffloadDevice::kCpu;
}

void Engine::Impl::copy_grads_to_host(int u) {
  UnitState& s = units[u];
  if (s.host_grads.empty()) return;
  DeviceContext* dev = device.get();
  Stream* on = &comm.stream();
  void* host = s.host_grads.data();
  const void* shard = owned_grads(static_cast<size_t>(u));
  const size_t bytes = s.host_grads.bytes();
  // A compute-side span (not a collective): it shows when the copy ran against the reductions
  // beside it, and counts in neither the step's collectives nor its communication time. Only
  // where the stream runs the work itself (the CPU): a device stream would stamp issue times.
  Trace* t = trace.enabled() && measures_comm() ? &trace : nullptr;
  on->enqueue([=] {
    const double begin_us = Trace::now_us();
    dev->copy(host, shard, bytes, on);
    if (t) t->add(TraceSpan{"grads_to_host", false, begin_us, Trace::now_us(), bytes});
  });
  // Without overlap_comm the reduction was waited for already (from its issue); the copy is
  // exposed from now on.
  const CommPoint copied = comm_point();
  if (!config.overlap_comm) wait_for_comm(copied);
  s.grads_reduced = copied;
}

void Engine::Impl::wait_for_host_uploads() {
  for (const Event& upload : host_uploads) upload.wait();
  host_uploads.clear();
}

void Engine::Impl::update_on_host(float grad_scale) {
  // The host writes the host side of the last step's copies to the device again.
  wait_for_host_uploads();
  // step() ordered the device after the gradients' copies; the host reads them itself.
  for (const UnitState& s : units) s.grads_reduced.event.wait();
  const kernels::KernelOptions options{config.kernel_threads};
  const bool fp32 = config.dtype == DType::kFloat32;
  for (const std::vector<Piece>& pieces : sub_groups) {
    for (const Piece& piece : pieces) {
      UnitState& s = units[piece.unit];
      ShardUpdate update;
      update.shard.n = piece.count;
      update.shard.master = s.master.as<float>() + piece.begin;
      for (int k = 0; k < optimizer.state_count(); ++k) {
        update.shard.state[k] = s.state[k].as<float>() + piece.begin;
      }
      update.grad = byte_offset(s.host_grads.data(), piece.begin * accum);
      // fp32 parameters are the master itself; a 16-bit working copy is written beside it.
      update.param_out = fp32 ? nullptr : byte_offset(s.host_params.data(), piece.begin * elem);
      update.weight_decay = piece.weight_decay;
      optimizer.apply(update, accum_dtype, grad_scale, config.dtype, options);
    }
    for (const Piece& piece : pieces) {
      UnitState& s = units[piece.unit];
      void* staged = byte_offset(s.host_params.data(), piece.begin * elem);
      const float* master = s.master.as<float>() + piece.begin;
      // A pageable fp32 master goes through its pinned copy (memory_plan.cpp).
      if (fp32 && !s.host_params.empty()) std::memcpy(staged, master, piece.count * elem);
      const void* updated = s.host_params.empty() ? static_cast<const void*>(master) : staged;
      host_uploads.push_back(device->copy_from_host_async(
          byte_offset(owned_params(piece.unit), piece.begin * elem), updated, piece.count * elem));
    }
  }
  // The copies run in order on the device's one copy stream: after the last, all have run.
  if (!host_uploads.empty()) device->wait(host_uploads.back());
}

void Engine::Impl::upload_params_from_host_master() {
  wait_for_host_uploads();
  for (size_t u = 0; u < units.size(); ++u) {
    if (!layout.units()[u].trainable) continue;
    UnitState& s = units[u];
    const size_t n = owned_numel(u);
    if (config.dtype == DType::kFloat32) {
      device->copy_from_host(owned_params(u), s.master.data(), n * sizeof(float));
      continue;
    }
    kernels::cast(s.master.data(), DType::kFloat32, s.host_params.data(), config.dtype, n);
    device->copy_from_host(owned_params(u), s.host_params.data(), n * elem);
  }
}

}  // namespace zero
