// The bookkeeping of node-shared memory (SharedMemoryTransport::reserve_heap): which byte ranges
// of a rank's part of the window are handed out. First fit over a free list ordered by offset,
// neighbours merged on release: the engine allocates its few large buffers once and keeps them,
// so the list stays short and the simplest policy wastes nothing that matters.
#pragma once

#include <cstddef>
#include <map>
#include <optional>

namespace zero::backend {

class HeapSpace {
 public:
  // Offsets [0, bytes) are free.
  explicit HeapSpace(size_t bytes);

  // The offset of `bytes` (> 0, rounded up to `alignment`, a power of two) free bytes that
  // start on a multiple of `alignment`, now in use; none when no free range is large enough.
  std::optional<size_t> take(size_t bytes, size_t alignment);
  // Returns a range from take(); false for an offset take() did not hand out.
  bool give_back(size_t offset);
  // Nothing handed out.
  bool empty() const { return used_.empty(); }

 private:
  std::map<size_t, size_t> free_;  // offset -> bytes
  std::map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace zero::backend
