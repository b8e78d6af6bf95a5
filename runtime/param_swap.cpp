#include "param_swap.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "zero/core/check.h"
#include "zero/core/checked_size.h"

namespace zero {
namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

bool offloads_params_to_nvme(const EngineConfig& config) {
  return config.stage == 3 && config.offload.param.device == OffloadDevice::kNvme;
}

bool staged_on_device(const EngineConfig& config) {
  return offloads_params_to_nvme(config) && config.device.is_cuda();
}

bool swaps_unit(const Unit& unit, const EngineConfig& config) {
  return offloads_params_to_nvme(config) && !unit.persistent && unit.shard > 0;
}

ParamRecords param_records(const Layout& layout, const EngineConfig& config) {
  ParamRecords r;
  const size_t units = layout.units().size();
  r.offset.assign(units, 0);
  r.bytes.assign(units, 0);
  if (!offloads_params_to_nvme(config)) return r;
  const size_t elem = dtype_size(config.precision.dtype);
  for (size_t u = 0; u < units; ++u) {
    const Unit& unit = layout.units()[u];
    if (!swaps_unit(unit, config)) continue;
    // DeepSpeed refuses a parameter larger than a swap buffer in the same way.
    ZERO_CHECK(unit.shard <= config.offload.param.buffer_size,
               "offload_param.buffer_size is " << config.offload.param.buffer_size
                                               << " elements, but unit " << u
                                               << "'s shard on each rank has " << unit.shard
                                               << " elements and must fit one buffer; raise "
                                                  "buffer_size to at least "
                                               << unit.shard << " or use more ranks");
    r.offset[u] = r.file_bytes;
    const char* what = "the parameter file per rank";
    r.bytes[u] = nvme_align_up(size_product(unit.shard, elem, what));
    r.file_bytes = size_sum(r.file_bytes, r.bytes[u], what);
    r.slot_bytes = std::max(r.slot_bytes, r.bytes[u]);
  }
  if (r.file_bytes == 0) return r;
  const uint64_t buffers = size_product(static_cast<uint64_t>(config.offload.param.buffer_count),
                                        r.slot_bytes, "the parameter buffers");
  r.staging_bytes = buffers + kNvmeAlignment;
  if (staged_on_device(config)) r.device_bytes = buffers;
  return r;
}

ParamSwap::ParamSwap(const Layout& layout, const EngineConfig& config, Allocator& allocator,
                     Allocator& host, DeviceContext& device, int rank, Waiter wait)
    : records_(param_records(layout, config)),
      device_(device),
      wait_for_comm_(std::move(wait)),
      slot_of_(layout.units().size(), -1),
      read_of_(layout.units().size()) {
  if (records_.file_bytes == 0) return;
  memory_ = (staged_on_device(config) ? host : allocator)
                .allocate(records_.staging_bytes, MemoryCategory::kNvmeStaging);
  if (records_.device_bytes > 0) {
    device_memory_ = allocator.allocate(records_.device_bytes, MemoryCategory::kNvmeStaging);
  }
  const auto base = reinterpret_cast<uintptr_t>(memory_.data());
  char* first = static_cast<char*>(memory_.data()) + (nvme_align_up(base) - base);
  for (int i = 0; i < config.offload.param.buffer_count; ++i) {
    const size_t at = static_cast<size_t>(i) * records_.slot_bytes;
    Slot slot;
    slot.data = first + at;
    slot.device = staged() ? static_cast<char*>(device_memory_.data()) + at : slot.data;
    slots_.push_back(std::move(slot));
    free_.push_back(static_cast<size_t>(i));
  }
  // One file per rank and run: the pid keeps jobs sharing nvme_path apart.
  const std::string path = config.offload.param.nvme_path + "/zero_param_rank" +
                           std::to_string(rank) + "." + std::to_string(::getpid()) + ".swp";
  file_ = std::make_unique<NvmeFile>(path, records_.file_bytes, config.offload.aio, rank);
}

void ParamSwap::wait(const NvmeFile::Ticket& ticket) {
  if (!ticket) return;
  const auto start = std::chrono::steady_clock::now();
  file_->wait(ticket);
  stats_.wait_ms += ms_since(start);
}

size_t ParamSwap::acquire() {
  ZERO_CHECK(!free_.empty(), "offload_param: every one of the " << slots_.size()
                                                                << " buffers (buffer_count) "
                                                                   "holds a unit");
  const size_t slot = free_.front();
  free_.pop_front();
  Slot& s = slots_[slot];
  NvmeFile::Ticket write = std::move(s.write);
  s.write.reset();
  wait(write);
  wait_for_comm_(s.free_after);
  // The file reads into the host buffer next: on a GPU the copy out of it must have run, not
  // only be ordered before the device's next work (on the CPU the event is complete already).
  s.free_after.event.wait();
  s.free_after = CommPoint{};
  s.uploaded = false;
  return slot;
}

bool ParamSwap::start_read(int u, bool required) {
  ZERO_CHECK(swapped(u), "offload_param: unit " << u << " is not on NVMe");
  if (slot_of_[u] >= 0) return true;
  if (!required && free_.empty()) return false;
  const size_t slot = acquire();
  slot_of_[u] = static_cast<int>(slot);
  read_of_[u] = file_->read(slots_[slot].data, records_.offset[u], records_.bytes[u]);
  stats_.read_bytes += records_.bytes[u];
  return true;
}

std::function<void()> ParamSwap::read_waiter(int u) {
  NvmeFile::Ticket ticket = std::move(read_of_[u]);
  read_of_[u].reset();
  NvmeFile* file = file_.get();
  std::shared_ptr<std::atomic<int64_t>> waited = stream_wait_us_;
  return [file, ticket, waited] {
    const auto start = std::chrono::steady_clock::now();
    file->wait(ticket);
    waited->fetch_add(static_cast<int64_t>(ms_since(start) * 1000.0));
  };
}

void ParamSwap::upload(int u, Stream* on) {
  Slot& s = slots_[static_cast<size_t>(slot_of_[u])];
  if (!staged() || s.uploaded) return;
  device_.copy(s.device, s.data, records_.bytes[u], on);
  s.uploaded = true;
}

void ParamSwap::wait_for_read(int u) {
  NvmeFile::Ticket read = std::move(read_of_[u]);
  read_of_[u].reset();
  wait(read);
}

ParamSwap::Slot& ParamSwap::read_in(int u) {
  start_read(u, /*required=*/true);
  wait_for_read(u);
  return slots_[static_cast<size_t>(slot_of_[u])];
}

void* ParamSwap::resident(int u) {
  Slot& s = read_in(u);
  if (staged() && !s.uploaded) {
    device_.copy_from_host(s.device, s.data, records_.bytes[u]);
    s.uploaded = true;
  }
  return s.device;
}

void* ParamSwap::overwritten(int u, bool on_host) {
  ZERO_CHECK(swapped(u), "offload_param: unit " << u << " is not on NVMe");
  if (slot_of_[u] < 0) {
    slot_of_[u] = static_cast<int>(acquire());
  } else {
    wait_for_read(u);
  }
  Slot& s = slots_[static_cast<size_t>(slot_of_[u])];
  if (on_host) {
    ZERO_CHECK(!s.uploaded, "offload_param: unit " << u
                                                   << "'s shard is on the device already; the "
                                                      "host cannot update it in its buffer");
    return s.data;
  }
  if (staged()) s.uploaded = true;
  return s.device;
}

void* ParamSwap::buffer_of(int u) const {
  return slot_of_[u] < 0 ? nullptr : slots_[static_cast<size_t>(slot_of_[u])].device;
}

void ParamSwap::drop(int u, CommPoint free_after) {
  const int slot = slot_of_[u];
  ZERO_CHECK(slot >= 0, "offload_param: unit " << u << " holds no buffer");
  // A read still in flight must end before the buffer can be reused.
  wait_for_read(u);
  slots_[static_cast<size_t>(slot)].free_after = std::move(free_after);
  free_.push_back(static_cast<size_t>(slot));
  slot_of_[u] = -1;
}

void ParamSwap::write_back(int u) {
  Slot& s = read_in(u);
  // Uploaded, the shard was updated on the device (after the compute issued so far).
  if (staged() && s.uploaded) device_.copy_to_host(s.data, s.device, records_.bytes[u]);
  const size_t slot = static_cast<size_t>(slot_of_[u]);
  s.write = file_->write(s.data, records_.offset[u], records_.bytes[u]);
  stats_.write_bytes += records_.bytes[u];
  free_.push_back(slot);
  slot_of_[u] = -1;
}

void ParamSwap::flush() {
  // Every write is waited for, also after one failed: the buffers must not go while in flight.
  std::string first_error;
  for (Slot& s : slots_) {
    try {
      wait(s.write);
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
    s.write.reset();
  }
  if (!first_error.empty()) throw Error(first_error);
}

void ParamSwap::store(int u, const void* data, size_t bytes, Side side) {
  ZERO_CHECK(swapped(u) && bytes <= records_.bytes[u],
             "offload_param: cannot store " << bytes << " bytes into unit " << u << "'s record");
  // A buffer still holding u's old shard (a step that ended in an error) would be gathered
  // instead of what is stored now.
  if (slot_of_[u] >= 0) drop(u, CommPoint{});
  const size_t slot = acquire();
  Slot& s = slots_[slot];
  if (side == Side::kDevice && staged()) {
    device_.copy_to_host(s.data, data, bytes);
  } else {
    std::memcpy(s.data, data, bytes);
  }
  std::memset(s.data + bytes, 0, records_.bytes[u] - bytes);
  s.write = file_->write(s.data, records_.offset[u], records_.bytes[u]);
  stats_.write_bytes += records_.bytes[u];
  NvmeFile::Ticket write = s.write;
  free_.push_back(slot);
  wait(write);
}

void ParamSwap::load(int u, void* data, size_t bytes, Side side) {
  ZERO_CHECK(swapped(u) && bytes <= records_.bytes[u],
             "offload_param: cannot load " << bytes << " bytes from unit " << u << "'s record");
  const size_t slot = acquire();
  Slot& s = slots_[slot];
  free_.push_front(slot);  // given back at once (and first), also when the read throws
  s.free_after = CommPoint{};
  NvmeFile::Ticket read = file_->read(s.data, records_.offset[u], records_.bytes[u]);
  stats_.read_bytes += records_.bytes[u];
  wait(read);
  if (side == Side::kDevice && staged()) {
    device_.copy_from_host(data, s.data, bytes);
  } else {
    std::memcpy(data, s.data, bytes);
  }
}

ParamSwap::Stats ParamSwap::take_stats() {
  Stats out = stats_;
  out.stream_wait_ms = static_cast<double>(stream_wait_us_->exchange(0)) / 1000.0;
  stats_ = Stats{};
  return out;
}

}  // namespace zero
