#include "zero/runtime/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <utility>

#include "zero/core/check.h"

namespace zero {

namespace {
constexpr size_t kAlignment = 64;

size_t index_of(MemoryCategory c) {
  return static_cast<size_t>(c);
}

class HostMemory : public MemoryResource {
 public:
  void* allocate(size_t bytes) override {
    // aligned_alloc wants a multiple of the alignment; the padding is not counted as used.
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* data = std::aligned_alloc(kAlignment, rounded);
    if (data != nullptr) std::memset(data, 0, rounded);
    return data;
  }
  void deallocate(void* data, size_t) noexcept override { std::free(data); }
  std::string memory_name() const override { return "host memory"; }
};

}  // namespace

MemoryResource& host_memory() {
  static HostMemory memory;
  return memory;
}

std::string human_bytes(uint64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (bytes >= (1ull << 30)) {
    out << static_cast<double>(bytes) / (1ull << 30) << " GiB";
  } else if (bytes >= (1ull << 20)) {
    out << static_cast<double>(bytes) / (1ull << 20) << " MiB";
  } else if (bytes >= (1ull << 10)) {
    out << static_cast<double>(bytes) / (1ull << 10) << " KiB";
  } else {
    out << bytes << " B";
  }
  return out.str();
}

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParamsFull:
      return "params-full";
    case MemoryCategory::kParamsShard:
      return "params-shard";
    case MemoryCategory::kGrads:
      return "grads";
    case MemoryCategory::kMaster:
      return "master";
    case MemoryCategory::kOptimizerState:
      return "optimizer-state";
    case MemoryCategory::kCommBuffer:
      return "comm-buffer";
    case MemoryCategory::kPrefetch:
      return "prefetch";
    case MemoryCategory::kActivation:
      return "activations";
    case MemoryCategory::kOther:
      return "other";
    case MemoryCategory::kNvmeStaging:
      return "nvme-staging";
    case MemoryCategory::kCheckpoint:
      return "checkpoints";
  }
  return "?";
}

bool is_model_state(MemoryCategory c) {
  return c == MemoryCategory::kParamsFull || c == MemoryCategory::kParamsShard ||
         c == MemoryCategory::kGrads || c == MemoryCategory::kMaster ||
         c == MemoryCategory::kOptimizerState;
}

bool is_activation(MemoryCategory c) {
  return c == MemoryCategory::kActivation || c == MemoryCategory::kCheckpoint;
}

uint64_t MemoryStats::activations() const {
  return current[index_of(MemoryCategory::kActivation)] +
         current[index_of(MemoryCategory::kCheckpoint)];
}

uint64_t MemoryStats::model_state() const {
  uint64_t total = 0;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    if (is_model_state(static_cast<MemoryCategory>(i))) total += current[i];
  }
  return total;
}

uint64_t MemoryStats::buffers() const {
  return current[index_of(MemoryCategory::kCommBuffer)] +
         current[index_of(MemoryCategory::kPrefetch)] +
         current[index_of(MemoryCategory::kNvmeStaging)];
}

Buffer::~Buffer() {
  reset();
}

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      category_(other.category_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    category_ = other.category_;
  }
  return *this;
}

void Buffer::reset() {
  if (data_ != nullptr) owner_->release(data_, bytes_, category_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Buffer Allocator::allocate(size_t bytes, MemoryCategory category) {
  if (bytes == 0) return Buffer();
  if (limit_ > 0 && stats_.current_total + bytes > limit_) {
    std::ostringstream message;
    message << "out of memory: allocating " << human_bytes(bytes) << " for "
            << memory_category_name(category) << " would pass the limit of " << human_bytes(limit_)
            << " (" << human_bytes(stats_.current_total) << " in use)\n"
            << summary();
    throw OutOfMemoryError(message.str());
  }
  MemoryResource& memory = memory_for(category);
  void* data = memory.allocate(bytes);
  if (data == nullptr) {
    std::ostringstream message;
    message << "out of " << memory.memory_name() << ": allocating " << human_bytes(bytes) << " for "
            << memory_category_name(category) << " failed (" << human_bytes(stats_.current_total)
            << " in use)\n"
            << summary();
    throw OutOfMemoryError(message.str());
  }
  size_t i = index_of(category);
  stats_.current[i] += bytes;
  ++stats_.allocations[i];
  stats_.current_total += bytes;
  if (stats_.current[i] > stats_.peak[i]) stats_.peak[i] = stats_.current[i];
  if (stats_.current_total > stats_.peak_total) stats_.peak_total = stats_.current_total;
  stats_.window_peak[i] = std::max(stats_.window_peak[i], stats_.current[i]);
  if (is_activation(category)) {
    stats_.window_peak_activations = std::max(stats_.window_peak_activations, stats_.activations());
  }
  Buffer buffer(this, data, bytes, category);
  if (observer_) {
    observer_(AllocationEvent{category, static_cast<int64_t>(bytes), stats_.current[i],
                              stats_.current_total});
  }
  return buffer;
}

void Allocator::start_window() {
  stats_.window_peak = stats_.current;
  stats_.window_peak_activations = stats_.activations();
}

void Allocator::place(MemoryCategory category, MemoryResource& memory) {
  ZERO_CHECK(stats_.current[index_of(category)] == 0,
             "Allocator::place: " << memory_category_name(category)
                                  << " buffers are held; they would be freed to the wrong memory");
  placed_[index_of(category)] = &memory;
}

MemoryResource& Allocator::memory_for(MemoryCategory category) const {
  MemoryResource* placed = placed_[index_of(category)];
  return placed != nullptr ? *placed : *memory_;
}

void Allocator::release(void* data, size_t bytes, MemoryCategory category) {
  memory_for(category).deallocate(data, bytes);
  stats_.current[index_of(category)] -= bytes;
  stats_.current_total -= bytes;
  if (observer_) {
    observer_(AllocationEvent{category, -static_cast<int64_t>(bytes),
                              stats_.current[index_of(category)], stats_.current_total});
  }
}

std::string Allocator::summary() const {
  std::ostringstream out;
  out << std::left << std::setw(18) << "category" << std::right << std::setw(14) << "current"
      << std::setw(14) << "peak" << std::setw(10) << "allocs"
      << "\n";
  uint64_t allocations = 0;
  for (int i = 0; i < kNumMemoryCategories; ++i) {
    allocations += stats_.allocations[i];
    if (stats_.peak[i] == 0) continue;
    out << std::left << std::setw(18) << memory_category_name(static_cast<MemoryCategory>(i))
        << std::right << std::setw(14) << human_bytes(stats_.current[i]) << std::setw(14)
        << human_bytes(stats_.peak[i]) << std::setw(10) << stats_.allocations[i] << "\n";
  }
  out << std::left << std::setw(18) << "total" << std::right << std::setw(14)
      << human_bytes(stats_.current_total) << std::setw(14) << human_bytes(stats_.peak_total)
      << std::setw(10) << allocations << "\n";
  return out.str();
}

}  // namespace zero
