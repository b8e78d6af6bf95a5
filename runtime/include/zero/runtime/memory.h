// Memory accounting. Every buffer the runtime allocates comes from one Allocator and carries a
// category, so the runtime can print what it holds and the tests can compare measured bytes
// with the ZeRO formulas. Buffers are 64-byte aligned (a cache line; an AVX-512 vector; what
// NCCL and cudaMalloc give) and zero-filled.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "zero/core/check.h"

namespace zero {

// An allocation that did not fit: the message names the category and holds the memory
// summary (the engine adds what would fit instead).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

enum class MemoryCategory : uint8_t {
  kParamsFull,      // whole working-precision parameters (stages 0-2; gathered copies at 3 are
                    // kPrefetch)
  kParamsShard,     // this rank's slice of the parameters (stage 3)
  kGrads,           // gradients kept across the step: full (0-1) or the shard (2-3)
  kMaster,          // fp32 master weights when the working dtype is not fp32
  kOptimizerState,  // Adam moments / momentum
  kCommBuffer,      // fixed-size scratch for collectives (full-unit gradient buckets)
  kPrefetch,        // gathered full parameters of live units at stage 3
  kActivation,      // what a model's modules keep from forward to backward (and backward's own
                    // working set), when the model allocates them here
  kOther,
  kNvmeStaging,  // aligned buffers NVMe-offloaded optimizer state is read into and written from
  kCheckpoint,   // activation checkpoints: the kept inputs recomputation starts from
};
constexpr int kNumMemoryCategories = 11;

const char* memory_category_name(MemoryCategory c);

// True for the categories that make up "model state" in the ZeRO paper's formulas.
bool is_model_state(MemoryCategory c);
// True for kActivation and kCheckpoint.
bool is_activation(MemoryCategory c);

class Allocator;

// Where an Allocator's bytes come from: host memory (host_memory()) or a device's memory (a
// DeviceContext, zero/runtime/device.h). The Allocator does the accounting; this only allocates.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // `bytes` (> 0) of zero-filled memory aligned to at least 64 bytes, or null when there is none.
  virtual void* allocate(size_t bytes) = 0;
  // Never throws: it runs in destructors, also while an earlier error unwinds the stack.
  virtual void deallocate(void* data, size_t bytes) noexcept = 0;
  // "host memory", "memory of cuda:0": for out-of-memory messages.
  virtual std::string memory_name() const = 0;
};

// The process's host memory (aligned_alloc). Stateless: every caller may share it.
MemoryResource& host_memory();

// An owned, aligned, zero-filled allocation. Moving transfers ownership; destruction returns
// the bytes to the allocator's accounting.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }
  MemoryCategory category() const { return category_; }
  // The allocator that counts it (null when empty).
  Allocator* allocator() const { return owner_; }
  // Frees now (same as assigning an empty Buffer).
  void reset();

 private:
  friend class Allocator;
  Buffer(Allocator* owner, void* data, size_t bytes, MemoryCategory category)
      : owner_(owner), data_(data), bytes_(bytes), category_(category) {}
  Allocator* owner_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryCategory category_ = MemoryCategory::kOther;
};

struct MemoryStats {
  std::array<uint64_t, kNumMemoryCategories> current{};
  std::array<uint64_t, kNumMemoryCategories> peak{};
  uint64_t current_total = 0;
  uint64_t peak_total = 0;
  std::array<uint64_t, kNumMemoryCategories> allocations{};  // made so far, per category
  // Since the last Allocator::start_window() (the engine starts one as each step ends, so a
  // window is one step): the peak of each category, and of activations and checkpoints together.
  std::array<uint64_t, kNumMemoryCategories> window_peak{};
  uint64_t window_peak_activations = 0;
  // Sum of current bytes over the model-state categories.
  uint64_t model_state() const;
  // Sum of current bytes over kActivation and kCheckpoint.
  uint64_t activations() const;
  // Sum of current bytes over kCommBuffer, kPrefetch and kNvmeStaging.
  uint64_t buffers() const;
};

// One allocation or release, as an AllocationObserver sees it: after it, the category held
// `category_bytes` and the allocator `total_bytes`.
struct AllocationEvent {
  MemoryCategory category = MemoryCategory::kOther;
  int64_t delta_bytes = 0;  // > 0 allocated, < 0 released
  uint64_t category_bytes = 0;
  uint64_t total_bytes = 0;
};
// Called after every allocation and release (a memory timeline). It runs in Buffer's
// destructor too, so it must not throw.
using AllocationObserver = std::function<void(const AllocationEvent&)>;

// Tagged, accounted allocations from one memory resource (host memory unless given another).
// Not thread-safe: the engine allocates from the main thread only.
class Allocator {
 public:
  Allocator() = default;
  // `memory` must outlive the allocator and every buffer it hands out.
  explicit Allocator(MemoryResource& memory) : memory_(&memory) {}
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // bytes may be 0 (gives an empty Buffer). Throws OutOfMemoryError naming the category when
  // the allocation fails or would take the total past the limit.
  Buffer allocate(size_t bytes, MemoryCategory category);

  // A budget for everything this allocator holds (0 = none): a rank's share of a machine, or a
  // test's way to make an allocation fail.
  void set_limit(uint64_t bytes) { limit_ = bytes; }
  uint64_t limit() const { return limit_; }

  // Starts a new peak window (MemoryStats::window_peak): its peaks start from the bytes held now.
  void start_window();

  // Where the bytes come from (for a category not placed elsewhere).
  MemoryResource& memory() const { return *memory_; }

  // Allocations of `category` come from `memory` from now on (it must outlive the allocator and
  // every buffer it hands out): how the engine puts its collectives' buffers in memory the
  // node's peers can read. Only while no buffer of the category is held.
  void place(MemoryCategory category, MemoryResource& memory);

  // Every allocation and release from now on goes to `observer` too (empty: none).
  void set_observer(AllocationObserver observer) { observer_ = std::move(observer); }

  const MemoryStats& stats() const { return stats_; }
  // A table of current and peak bytes and the allocations made per category, for logs (as
  // torch.cuda.memory_summary()).
  std::string summary() const;

 private:
  friend class Buffer;
  void release(void* data, size_t bytes, MemoryCategory category);
  MemoryResource& memory_for(MemoryCategory category) const;
  MemoryResource* memory_ = &host_memory();
  std::array<MemoryResource*, kNumMemoryCategories> placed_{};  // null: memory_
  MemoryStats stats_;
  uint64_t limit_ = 0;
  AllocationObserver observer_;
};

// "1.50 MiB": bytes in the largest binary unit that keeps the number at or above 1.
std::string human_bytes(uint64_t bytes);

}  // namespace zero
