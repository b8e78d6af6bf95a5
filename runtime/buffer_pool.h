// A pool of same-size device buffers handed out in the order they become free (private to
// runtime/): stage 3's gathered parameters and the gradient buckets.
#pragma once

#include <deque>
#include <functional>
#include <utility>

#include "comm_point.h"
#include "zero/runtime/device.h"
#include "zero/runtime/memory.h"

namespace zero {

inline char* byte_offset(void* p, size_t bytes) {
  return static_cast<char*>(p) + bytes;
}

// Same-size buffers handed out and given back with the event after which they are free again
// (e.g. the reduce-scatter that reads a gradient bucket). Buffers come back in the order their
// collectives were issued and the communication stream runs them in that order, so handing out
// the oldest returned one (FIFO) takes the buffer that becomes free first: the one whose
// collective was just launched stays in flight while compute fills another (double buffering).
// The capacity is what the memory plan counts; only a required acquire goes past it.
class BufferPool {
 public:
  using Waiter = std::function<void(const CommPoint&)>;
  BufferPool(Allocator& allocator, DeviceContext& device, MemoryCategory category, size_t bytes,
             Waiter wait)
      : allocator_(allocator),
        device_(device),
        category_(category),
        bytes_(bytes),
        wait_(std::move(wait)) {}

  // Allocates the planned buffers ahead of use, so the memory report at start shows what the
  // schedule will hold.
  void reserve(size_t capacity) {
    capacity_ = capacity;
    while (allocated_ < capacity_) {
      free_.push_back(Entry{allocator_.allocate(bytes_, category_), {}});
      ++allocated_;
    }
  }

  // The buffer that becomes free first, ready for the compute stream. A required acquire with
  // every planned buffer handed out (units kept gathered past their use) allocates one more.
  Buffer acquire(bool zeroed) {
    if (free_.empty()) {
      ++allocated_;
      return allocator_.allocate(bytes_, category_);
    }
    Entry entry = std::move(free_.front());
    free_.pop_front();
    wait_(entry.free_after);
    if (zeroed) device_.zero(entry.buffer.data(), entry.buffer.bytes());
    return std::move(entry.buffer);
  }

  // For optional work (a prefetch): a buffer only while the plan's buffers are not all out.
  bool can_acquire_within_plan() const { return !free_.empty() || allocated_ < capacity_; }

  void give_back(Buffer buffer, CommPoint free_after) {
    free_.push_back(Entry{std::move(buffer), std::move(free_after)});
  }

 private:
  struct Entry {
    Buffer buffer;
    CommPoint free_after;
  };
  Allocator& allocator_;
  DeviceContext& device_;
  MemoryCategory category_;
  size_t bytes_;
  Waiter wait_;
  size_t capacity_ = 0;
  size_t allocated_ = 0;
  std::deque<Entry> free_;
};

}  // namespace zero
