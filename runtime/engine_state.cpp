#include "engine_internal.h"

#include <algorithm>

#include "zero/kernels/cpu_kernels.h"

namespace zero {

Engine::StateView Engine::Impl::state_view(int u) {
  check_unit(u);
  // A post-step all-gather or a prefetch may still be reading these arrays.
  device->wait(comm.stream().record());
  // A swapped shard is read into a copy, which the view reads and a load writes.
  working_shards->checkpoint_shard(u);
  if (!layout.units()[u].trainable) return frozen_state_view(u);
  Engine::StateView view;
  const ElementRange owned = owned_range(u);
  view.begin = owned.first;
  view.end = owned.end();
  const size_t n = owned.count;
  view.state_count = optimizer.state_count();
  const PieceArrays arrays = shards->unit_arrays(u, n);
  float* master =
      arrays.master != nullptr ? arrays.master : static_cast<float*>(working_shards->current(u));
  // Copies out of the NVMe records are host memory already, and so is state offloaded to the
  // host, which a load may write as soon as the last update's copies to the device have read it.
  // Arrays in the device's memory are copied to the host (host_view).
  const bool host_offload = offloads_optimizer_to_host(config);
  if (host_offload) wait_for_host_uploads();
  const bool in_host_memory = shards->hands_out_copies() || host_offload;
  view.master = in_host_memory ? master : host_view(master, n);
  for (int k = 0; k < view.state_count; ++k) {
    view.state[k] = in_host_memory ? arrays.state[k] : host_view(arrays.state[k], n);
  }
  return view;
}

// Host memory for the n floats at `data`: the array itself on the CPU; on a GPU a fresh copy,
// which write_state_views() writes back.
float* Engine::Impl::host_view(float* data, size_t n) {
  if (!config.device.is_cuda()) return data;
  Buffer& copy = host_state[data];
  if (copy.bytes() != n * sizeof(float)) {
    copy = host_allocator.allocate(n * sizeof(float), MemoryCategory::kOther);
  }
  device->copy_to_host(copy.data(), data, n * sizeof(float));
  return copy.as<float>();
}

Engine::StateView Engine::Impl::frozen_state_view(int u) {
  const ElementRange owned = owned_range(u);
  const size_t n = owned.count;
  Engine::StateView view;
  view.begin = owned.first;
  view.end = owned.end();
  FrozenView& frozen = frozen_views[u];
  if (config.precision.dtype == DType::kFloat32) {
    view.master = host_view(static_cast<float*>(working_shards->current(u)), n);
  } else {
    std::vector<char> working(n * elem);
    device->copy_to_host(working.data(), working_shards->current(u), working.size());
    frozen.master = host_allocator.allocate(n * sizeof(float), MemoryCategory::kOther);
    kernels::cast(working.data(), config.precision.dtype, frozen.master.data(), DType::kFloat32, n);
    view.master = frozen.master.as<float>();
  }
  view.state_count = optimizer.state_count();
  for (int k = 0; k < view.state_count; ++k) {
    frozen.state[k] = host_allocator.allocate(n * sizeof(float), MemoryCategory::kOther);
    std::fill_n(frozen.state[k].as<float>(), n, 0.0f);
    view.state[k] = frozen.state[k].as<float>();
  }
  return view;
}

void Engine::Impl::state_loaded() {
  device->wait(comm.stream().record());
  // Shards on NVMe went back to their files as their views were written.
  write_state_views();
  // A unit that keeps a master (a 16-bit working dtype, or the optimizer on the host) takes its
  // working parameters from it; NVMe-resident masters and shards did so as their views were
  // written back.
  for (size_t u = 0; u < units.size(); ++u) {
    if (!offload && !working_shards->swapped(static_cast<int>(u)) && !units[u].master.empty()) {
      set_working_params(u, units[u].master.as<float>());
    }
  }
  start_post_step_gathers(/*with_frozen=*/true);
  for (size_t u = 0; u < units.size(); ++u) wait_for_params(static_cast<int>(u));
}

void Engine::Impl::write_state_views() {
  // What the views write may still be read by a queued collective (a prefetch's all-gather).
  device->wait(comm.stream().record());
  invalidate_secondary_shards();  // hpZ's copies hold the values the views replace
  for (const auto& [data, copy] : host_state) {
    device->copy_from_host(data, copy.data(), copy.bytes());
  }
  host_state.clear();
  // A frozen unit's 16-bit values come back from the fp32 copy its view handed out.
  for (const auto& [u, frozen] : frozen_views) {
    if (frozen.master.empty()) continue;
    const size_t n = owned_range(u).count;
    std::vector<char> working(n * elem);
    kernels::cast(frozen.master.data(), DType::kFloat32, working.data(), config.precision.dtype, n);
    device->copy_from_host(working_shards->current(u), working.data(), working.size());
  }
  frozen_views.clear();
  // A master that came back from a copy rounds its unit's working parameters; a unit whose shard
  // is on NVMe takes them in a copy of the shard, which store_checkpoint_copies() writes to its
  // file.
  shards->write_back_views([this](int u, const float* master) {
    working_shards->checkpoint_shard(u);
    set_working_params(static_cast<size_t>(u), master);
  });
  // Each copy of a shard on NVMe that a view handed out goes back to its file now (its working
  // values first rounded from the loaded master where the unit keeps one in memory), so a load
  // writing one unit at a time holds one shard's copy.
  working_shards->store_checkpoint_copies([this](int u) {
    if (!offload && !units[u].master.empty()) set_working_params(u, units[u].master.as<float>());
  });
}

void Engine::Impl::release_state_views() {
  host_state.clear();
  working_shards->release_checkpoint_copies();
  shards->release_views();
  frozen_views.clear();
}

std::vector<std::vector<float>> Engine::Impl::gather_full_params() {
  std::vector<std::vector<float>> out(layout.params().size());
  for (size_t u = 0; u < units.size(); ++u) {
    const bool was_gathered = units[u].params != ParamState::kSharded;
    gather(static_cast<int>(u));
    std::vector<char> host(layout.units()[u].numel * elem);
    device->copy_to_host(host.data(), units[u].params_full.data(), host.size());
    for (int p : layout.units()[u].params) {
      const ParamPlacement& pl = layout.params()[p];
      out[p].resize(pl.numel);
      kernels::cast(host.data() + pl.offset * elem, config.precision.dtype, out[p].data(),
                    DType::kFloat32, pl.numel);
    }
    if (!was_gathered) release(static_cast<int>(u));
  }
  return out;
}

std::vector<std::vector<float>> Engine::Impl::gather_full_master() {
  if (config.precision.dtype == DType::kFloat32) return gather_full_params();
  // Frozen units keep no master: their values are the working parameters.
  const bool any_frozen = std::any_of(layout.units().begin(), layout.units().end(),
                                      [](const Unit& unit) { return !unit.trainable; });
  std::vector<std::vector<float>> out =
      any_frozen ? gather_full_params() : std::vector<std::vector<float>>(layout.params().size());
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = layout.units()[u];
    if (!unit.trainable) continue;
    std::vector<float> full(unit.numel);
    // Out of NVMe records, the master comes in a host copy the gather reads.
    float* master = shards->unit_arrays(static_cast<int>(u), owned_range(u).count).master;
    // A master in host memory goes to the device's for the collective to read.
    Buffer on_device;
    if (steps_on_host(config)) {
      on_device = allocator.allocate(unit.shard * sizeof(float), MemoryCategory::kOther);
      device->copy_from_host(on_device.data(), master, on_device.bytes());
      master = on_device.as<float>();
    }
    if (config.stage == 0) {
      device->copy_to_host(full.data(), master, unit.numel * sizeof(float));
    } else {
      Buffer gathered = allocator.allocate(unit.numel * sizeof(float), MemoryCategory::kOther);
      comm.stream().wait(device->record());
      device->wait(comm.all_gather(master, gathered.data(), unit.shard, DType::kFloat32));
      device->copy_to_host(full.data(), gathered.data(), unit.numel * sizeof(float));
    }
    shards->release_view(static_cast<int>(u));
    for (int p : unit.params) {
      const ParamPlacement& pl = layout.params()[p];
      out[p].assign(full.begin() + static_cast<ptrdiff_t>(pl.offset),
                    full.begin() + static_cast<ptrdiff_t>(pl.offset + pl.numel));
    }
  }
  return out;
}

}  // namespace zero
