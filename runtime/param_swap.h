// Stage 3's parameter shards on NVMe (offload_param device nvme; private to runtime/): the
// rank's working-dtype shard of every non-persistent unit is one record of a file under
// nvme_path. A shard is read into one of buffer_count aligned buffers ahead of the unit's
// all-gather (and of its update in the step, unless the update writes all of it from a
// master), and written back after the step updated it;
// memory holds only those buffers, as DeepSpeed's partitioned-parameter swapper does. The
// transfers go through NvmeFile (io_uring, O_DIRECT), the same code as the optimizer's state.
//
// On a GPU each buffer is a page-locked host buffer (what the file's transfers move) paired with
// a device buffer (what the all-gather and the device's optimizer read and write): a shard goes
// up after its read and, when the device updated it, down before its write. On the CPU path the
// two are one buffer and nothing is copied.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "comm_point.h"
#include "zero/runtime/device.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/memory.h"
#include "zero/runtime/nvme_file.h"

namespace zero {

bool offloads_params_to_nvme(const EngineConfig& config);
// Whether the shards pass between page-locked host buffers and device buffers (on a GPU).
bool staged_on_device(const EngineConfig& config);

// Whether unit `unit`'s shard lives on NVMe: every stage-3 unit but the persistent one, which
// every rank keeps whole.
bool swaps_unit(const Unit& unit, const EngineConfig& config);

// The rank's parameter file: one record per swapped unit, its shard padded to kNvmeAlignment.
// Refuses (zero::Error) a unit whose shard does not fit offload_param.buffer_size, naming both.
struct ParamRecords {
  std::vector<uint64_t> offset;  // unit -> its record's offset in the file
  std::vector<size_t> bytes;     // unit -> its record's bytes (aligned); 0: kept in memory
  uint64_t file_bytes = 0;
  // One buffer holds the largest record: buffer_size bounds it, and a buffer larger than every
  // shard would only hold padding.
  size_t slot_bytes = 0;
  uint64_t staging_bytes = 0;  // buffer_count buffers and the slack to align them
  uint64_t device_bytes = 0;   // on a GPU: the buffer_count device buffers beside them
};
ParamRecords param_records(const Layout& layout, const EngineConfig& config);

class ParamSwap {
 public:
  using Waiter = std::function<void(const CommPoint&)>;
  // Allocates the buffers (nvme-staging: the file's from `host`, on a GPU the device's from
  // `allocator`) and creates the rank's file (checking the free space).
  ParamSwap(const Layout& layout, const EngineConfig& config, Allocator& allocator, Allocator& host,
            DeviceContext& device, int rank, Waiter wait);

  bool swapped(int u) const { return records_.bytes[u] > 0; }
  uint64_t file_bytes() const { return records_.file_bytes; }

  // Starts reading u's shard into a buffer (nothing when it is in one already). An optional
  // read (a read-ahead) starts only when a buffer is free and says whether it started.
  bool start_read(int u, bool required);
  // Work for the communication stream: blocks until u's read is done (rethrowing its error) and
  // adds the time to stream_wait_ms. The engine queues it before u's all-gather, and upload(u,
  // stream) behind it.
  std::function<void()> read_waiter(int u);
  // On a GPU, copies u's shard from its host buffer to its device buffer on `on`, unless it went
  // up already; nothing on the CPU.
  void upload(int u, Stream* on);
  // u's shard in its (device) buffer, its read waited for (started here when none is in flight)
  // and uploaded. A write_back() then writes what the device holds.
  void* resident(int u);
  // u's buffer for an update that writes every element of its shard (from a master kept
  // elsewhere), so its old values are not read (a read already started is waited for): the
  // host buffer with `on_host`, else the device buffer, which write_back() then brings down.
  // Only the record's alignment padding past the shard is left as the buffer had it.
  void* overwritten(int u, bool on_host);
  // u's (device) buffer when it has one (its read may be in flight), else null.
  void* buffer_of(int u) const;
  // Gives u's buffer back unchanged; it is free again after `free_after`.
  void drop(int u, CommPoint free_after);
  // Starts writing u's buffer to its record; the buffer is free again once written.
  void write_back(int u);
  // Waits for every write in flight: a later read of the same record must see it.
  void flush();

  // Synchronous copies of u's whole shard (shard elements of the working dtype) from and to
  // memory: host memory (initial values), or the device's (checkpoints' copies of a shard, which
  // the engine computes on).
  enum class Side { kHost, kDevice };
  void store(int u, const void* data, size_t bytes, Side side);
  void load(int u, void* data, size_t bytes, Side side);

  // NVMe traffic since the last take_stats(): bytes moved, time the engine's thread blocked on
  // transfers, and time the communication stream waited for reads before all-gathers.
  struct Stats {
    uint64_t read_bytes = 0;
    uint64_t write_bytes = 0;
    double wait_ms = 0.0;
    double stream_wait_ms = 0.0;
  };
  Stats take_stats();

 private:
  struct Slot {
    char* data = nullptr;    // host memory: what the file's transfers move
    char* device = nullptr;  // what the engine computes on: `data` itself on the CPU path
    bool uploaded = false;   // on a GPU: `device` holds the unit's shard
    NvmeFile::Ticket write;  // the write back in flight from it
    CommPoint free_after;    // the collective still reading it
  };
  // The free buffer that becomes free first (oldest given back), waited for.
  size_t acquire();
  void wait(const NvmeFile::Ticket& ticket);
  // Waits for u's read in flight, if any (rethrowing its error).
  void wait_for_read(int u);

  bool staged() const { return device_memory_.bytes() > 0; }
  // u's slot, its read waited for.
  Slot& read_in(int u);

  ParamRecords records_;
  DeviceContext& device_;
  Waiter wait_for_comm_;
  Buffer memory_;
  Buffer device_memory_;
  std::vector<Slot> slots_;
  std::deque<size_t> free_;                // slots not holding a unit, oldest given back first
  std::vector<int> slot_of_;               // unit -> its slot, -1 when none
  std::vector<NvmeFile::Ticket> read_of_;  // unit -> its read in flight
  std::unique_ptr<NvmeFile> file_;  // after the buffers: destroyed first, ending its transfers
  Stats stats_;
  std::shared_ptr<std::atomic<int64_t>> stream_wait_us_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace zero
