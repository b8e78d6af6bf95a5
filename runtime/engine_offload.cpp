// Optimizer state on NVMe (ZeRO-Infinity's offload_optimizer device nvme): each rank's fp32
// master (16-bit working dtypes; on a GPU fp32's too) and optimizer state live in one file of
// records, one per sub-group (NvmeRecords). The step streams the records through a few aligned
// staging buffers and runs the same kernels on the same pieces, in the same order, as
// memory-resident state: the result is bitwise the same. On a GPU the buffers are page-locked
// host memory and each record is stepped on the host (engine_host_optimizer.cpp).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include "engine_internal.h"
#include "zero/core/check.h"
#include "zero/core/checked_size.h"

namespace zero {

const char* offload_device_name(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

bool offloads_optimizer_to_nvme(const EngineConfig& config) {
  return config.offload.optimizer.device == OffloadDevice::kNvme;
}

NvmeRecords nvme_records(const Layout& layout, const EngineConfig& config, int state_arrays) {
  NvmeRecords r;
  if (!offloads_optimizer_to_nvme(config)) return r;
  // On a GPU the working parameters are on the device: fp32's master is in the records too.
  r.master = config.precision.dtype != DType::kFloat32 || config.device.is_cuda();
  r.arrays = (r.master ? 1 : 0) + state_arrays;
  size_t total = 0;
  for (const Unit& unit : layout.units()) {
    if (unit.trainable) total += config.stage == 0 ? unit.numel : unit.shard;
  }
  if (r.arrays == 0 || total == 0) return r;
  const size_t limit = config.schedule.optimizer_sub_group_elements == 0
                           ? total
                           : std::min(total, config.schedule.optimizer_sub_group_elements);
  for (size_t first = 0; first < total; first += limit) {
    NvmeRecords::Record record;
    record.offset = r.file_bytes;
    record.numel = std::min(limit, total - first);
    const char* what = "the optimizer file per rank";
    record.array_bytes = nvme_align_up(size_product(record.numel, sizeof(float), what));
    const size_t record_bytes =
        size_product(record.array_bytes, static_cast<size_t>(r.arrays), what);
    r.file_bytes = size_sum(r.file_bytes, record_bytes, what);
    r.slot_bytes = std::max(r.slot_bytes, record_bytes);
    r.records.push_back(record);
  }
  const auto slots = static_cast<uint64_t>(config.offload.optimizer.buffer_count);
  r.staging_bytes = size_sum(size_product(slots, r.slot_bytes, "the optimizer's staging"),
                             kNvmeAlignment, "the optimizer's staging");
  return r;
}

void Engine::Impl::check_offload_space() {
  if (!offloads_optimizer_to_nvme(config) || !offloads_params_to_nvme(config)) return;
  // Each file checks its own bytes when made; on one file system both must fit together.
  const std::string& optimizer_path = config.offload.optimizer.nvme_path;
  const std::string& param_path = config.offload.param.nvme_path;
  struct stat optimizer_dir {};
  struct stat param_dir {};
  if (::stat(optimizer_path.c_str(), &optimizer_dir) != 0 ||
      ::stat(param_path.c_str(), &param_dir) != 0 || optimizer_dir.st_dev != param_dir.st_dev) {
    return;  // a bad path is reported, naming it, when its file is made
  }
  const uint64_t bytes = nvme_records(layout, config, optimizer.state_count()).file_bytes +
                         param_records(layout, config).file_bytes;
  check_free_space(
      param_path, bytes,
      "rank " + std::to_string(rank) + "'s pair of offload files (optimizer state and parameters)");
}

void Engine::Impl::open_offload(const std::vector<ParamDecl>& decls) {
  offload = std::make_unique<OffloadedOptimizer>();
  OffloadedOptimizer& o = *offload;
  o.layout = nvme_records(layout, config, optimizer.state_count());
  size_t first = 0;
  o.unit_first.assign(units.size(), 0);
  for (size_t u = 0; u < units.size(); ++u) {
    o.unit_first[u] = first;
    if (layout.units()[u].trainable) first += owned_range(u).count;
  }
  if (o.layout.records.empty()) return;  // nothing to offload (no state, nothing trainable)
  // Views and the update hand the records' master to host code: on a GPU it must be there.
  ZERO_CHECK(o.layout.master || !config.device.is_cuda(),
             "offload_optimizer nvme on " << device_name(config.device)
                                          << " without the master in its records");
  // On a GPU the records are stepped on the host: staged in its page-locked memory.
  Allocator& slots_memory = steps_on_host(config) ? host_allocator : allocator;
  o.staging_memory = slots_memory.allocate(o.layout.staging_bytes, MemoryCategory::kNvmeStaging);
  const auto base = reinterpret_cast<uintptr_t>(o.staging_memory.data());
  o.slots = static_cast<char*>(o.staging_memory.data()) + (nvme_align_up(base) - base);
  // One file per rank and run: the pid keeps jobs sharing nvme_path apart.
  const std::string path = config.offload.optimizer.nvme_path + "/zero_optimizer_rank" +
                           std::to_string(rank) + "." + std::to_string(::getpid()) + ".swp";
  o.file = std::make_unique<NvmeFile>(path, o.layout.file_bytes, config.offload.aio, rank);
  if (!o.layout.master) return;  // the state starts as zeros: what fallocate's extents read as
  // The initial master, record by record: the value of each element is a function of the seed
  // and its identity only, as in memory (initialize()).
  const std::vector<Piece> all = [&] {
    std::vector<Piece> pieces;
    for (const std::vector<Piece>& group : sub_groups)
      pieces.insert(pieces.end(), group.begin(), group.end());
    return pieces;
  }();
  size_t next = 0;
  for (size_t k = 0; k < o.layout.records.size(); ++k) {
    const NvmeRecords::Record& record = o.layout.records[k];
    std::memset(o.slots, 0, record.array_bytes * static_cast<size_t>(o.layout.arrays));
    auto* master = reinterpret_cast<float*>(o.slots);
    for (size_t at = 0; at < record.numel; at += all[next].count, ++next) {
      const Piece& piece = all[next];
      const Unit& unit = layout.units()[piece.unit];
      const size_t region = owned_range(piece.unit).first + piece.begin;
      for (int i : unit.params) {
        const ParamPlacement& p = layout.params()[i];
        const size_t begin = std::clamp(region, p.offset, p.offset + p.numel);
        const size_t end = std::clamp(region + piece.count, p.offset, p.offset + p.numel);
        for (size_t e = begin; e < end; ++e) {
          master[at + e - region] = init_value(config.seed, i, e - p.offset, decls[i].init);
        }
      }
    }
    o.file->wait(o.file->write(o.slots, record.offset,
                               record.array_bytes * static_cast<size_t>(o.layout.arrays)));
  }
}

NvmeShards::NvmeShards(OffloadedOptimizer& offload, const std::vector<std::vector<Piece>>& passes,
                       const OptimizerOffload& config, Allocator& host)
    : o_(offload),
      passes_(passes),
      config_(config),
      host_(host),
      slot_ticket_(static_cast<size_t>(config.buffer_count)),
      slot_of_(offload.layout.records.size(), 0),
      read_of_(offload.layout.records.size()) {
  ZERO_CHECK(offload.layout.records.size() == passes.size(),
             "internal error: " << offload.layout.records.size() << " NVMe records for "
                                << passes.size() << " optimizer passes");
}

char* NvmeShards::slot_memory(size_t slot) const {
  return o_.slots + slot * o_.layout.slot_bytes;
}

size_t NvmeShards::record_bytes(size_t k) const {
  return o_.layout.records[k].array_bytes * static_cast<size_t>(o_.layout.arrays);
}

void NvmeShards::wait(const NvmeFile::Ticket& ticket) {
  const auto start = std::chrono::steady_clock::now();
  o_.file->wait(ticket);
  o_.wait_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void NvmeShards::start_read(size_t k) {
  if (free_slots_.empty()) {
    const size_t oldest = writing_.front();
    writing_.pop_front();
    wait(slot_ticket_[oldest]);
    free_slots_.push_back(oldest);
  }
  const size_t slot = free_slots_.front();
  free_slots_.pop_front();
  slot_of_[k] = slot;
  read_of_[k] = o_.file->read(slot_memory(slot), o_.layout.records[k].offset, record_bytes(k));
  o_.read_bytes += record_bytes(k);
}

void NvmeShards::drain() {
  while (!writing_.empty()) {
    wait(slot_ticket_[writing_.front()]);
    free_slots_.push_back(writing_.front());
    writing_.pop_front();
  }
}

void NvmeShards::begin_update() {
  o_.cached = -1;  // the step rewrites every record
  o_.wait_ms = 0.0;
  o_.busy_ms = 0.0;
  o_.read_bytes = 0;
  o_.write_bytes = 0;
  free_slots_.clear();
  for (size_t i = 0; i < slot_ticket_.size(); ++i) free_slots_.push_back(i);
  writing_.clear();
  busy_before_ = o_.file->busy_ms();
}

void NvmeShards::begin_pass(size_t k) {
  if (!read_of_[k]) start_read(k);
  if (config_.pipeline_read && k + 1 < passes_.size()) start_read(k + 1);
  wait(read_of_[k]);
  read_of_[k].reset();
  at_of_.assign(1, 0);
  for (const Piece& piece : passes_[k]) at_of_.push_back(at_of_.back() + piece.count);
}

PieceArrays NvmeShards::arrays(size_t k, size_t piece) {
  const size_t stride = o_.layout.records[k].array_bytes / sizeof(float);
  auto* record = reinterpret_cast<float*>(slot_memory(slot_of_[k]));
  float* const first_state = record + (o_.layout.master ? stride : 0);
  const size_t at = at_of_[piece];
  PieceArrays arrays;
  if (o_.layout.master) arrays.master = record + at;
  arrays.state[0] = first_state + at;
  arrays.state[1] = first_state + stride + at;
  return arrays;
}

void NvmeShards::end_pass(size_t k) {
  const size_t slot = slot_of_[k];
  slot_ticket_[slot] =
      o_.file->write(slot_memory(slot), o_.layout.records[k].offset, record_bytes(k));
  o_.write_bytes += record_bytes(k);
  writing_.push_back(slot);
  if (!config_.pipeline_write) drain();
}

void NvmeShards::end_update() {
  drain();
  o_.busy_ms = o_.file->busy_ms() - busy_before_;
}

void NvmeShards::abandon() noexcept {
  for (NvmeFile::Ticket& ticket : read_of_) {
    try {
      o_.file->wait(ticket);
    } catch (const std::exception&) {
      // The first error is the one being reported.
    }
    ticket.reset();
  }
  for (size_t slot : writing_) {
    try {
      o_.file->wait(slot_ticket_[slot]);
    } catch (const std::exception&) {
      // As above.
    }
  }
  writing_.clear();
}

char* NvmeShards::cached_record(size_t k) {
  if (o_.cached != static_cast<int>(k)) {
    o_.cached = -1;
    o_.file->wait(o_.file->read(o_.slots, o_.layout.records[k].offset, record_bytes(k)));
    o_.cached = static_cast<int>(k);
  }
  return o_.slots;
}

// Host copies of the unit's owned arrays, read out of the records its slice spans (without a
// master in the records, the working parameters are the master: null here).
PieceArrays NvmeShards::unit_arrays(int unit, size_t count) {
  std::vector<Buffer>& copies = o_.views[unit];
  copies.clear();
  const int arrays = o_.layout.arrays;
  for (int a = 0; a < arrays; ++a) {
    copies.push_back(host_.allocate(count * sizeof(float), MemoryCategory::kOther));
  }
  const size_t unit_first = o_.unit_first[static_cast<size_t>(unit)];
  size_t record_first = 0;
  for (size_t k = 0; k < o_.layout.records.size(); ++k) {
    const NvmeRecords::Record& record = o_.layout.records[k];
    const size_t lo = std::max(record_first, unit_first);
    const size_t hi = std::min(record_first + record.numel, unit_first + count);
    if (lo < hi) {
      const char* data = cached_record(k);
      for (int a = 0; a < arrays; ++a) {
        std::memcpy(copies[a].as<float>() + (lo - unit_first),
                    data + a * record.array_bytes + (lo - record_first) * sizeof(float),
                    (hi - lo) * sizeof(float));
      }
    }
    record_first += record.numel;
  }
  const int first_state = o_.layout.master ? 1 : 0;
  PieceArrays out;
  if (o_.layout.master) out.master = copies[0].as<float>();
  for (int k = 0; k + first_state < arrays && k < 2; ++k) {
    out.state[k] = copies[first_state + k].as<float>();
  }
  return out;
}

// Every record some copy overlaps is read, patched from the copies and written back.
void NvmeShards::write_back_views(
    const std::function<void(int unit, const float* master)>& master_written) {
  if (o_.views.empty()) return;
  size_t record_first = 0;
  for (size_t k = 0; k < o_.layout.records.size(); ++k) {
    const NvmeRecords::Record& record = o_.layout.records[k];
    char* data = nullptr;
    for (const auto& [u, copies] : o_.views) {
      const size_t unit_first = o_.unit_first[static_cast<size_t>(u)];
      const size_t count = copies.empty() ? 0 : copies[0].bytes() / sizeof(float);
      const size_t lo = std::max(record_first, unit_first);
      const size_t hi = std::min(record_first + record.numel, unit_first + count);
      if (lo >= hi) continue;
      if (data == nullptr) data = cached_record(k);
      for (size_t a = 0; a < copies.size(); ++a) {
        std::memcpy(data + a * record.array_bytes + (lo - record_first) * sizeof(float),
                    copies[a].as<float>() + (lo - unit_first), (hi - lo) * sizeof(float));
      }
    }
    if (data != nullptr) o_.file->wait(o_.file->write(data, record.offset, record_bytes(k)));
    record_first += record.numel;
  }
  if (o_.layout.master) {
    for (const auto& [u, copies] : o_.views) master_written(u, copies[0].as<float>());
  }
  o_.views.clear();
}

}  // namespace zero
