#include "engine_internal.h"

#include "zero/kernels/cpu_kernels.h"

namespace zero {

Engine::StateView Engine::Impl::state_view(int u) {
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
float* Engine::Impl::host_view(float* data, size_t n) {
  if (!config.device.is_cuda()) return data;
  Buffer& copy = host_state[data];
  if (copy.bytes() != n * sizeof(float)) {
    copy = host_allocator.allocate(n * sizeof(float), MemoryCategory::kOther);
  }
  device->copy_to_host(copy.data(), data, n * sizeof(float));
  return copy.as<float>();
}

void Engine::Impl::state_loaded() {
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

std::vector<std::vector<float>> Engine::Impl::gather_full_params() {
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

std::vector<std::vector<float>> Engine::Impl::gather_full_master() {
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

}  // namespace zero
