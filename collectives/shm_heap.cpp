// First-fit bookkeeping of node-shared memory (shm_heap.h).
#include "shm_heap.h"

#include <iterator>

namespace zero::backend {

HeapSpace::HeapSpace(size_t bytes) {
  if (bytes > 0) free_.emplace(0, bytes);
}

std::optional<size_t> HeapSpace::take(size_t bytes, size_t alignment) {
  const size_t size = (bytes + alignment - 1) & ~(alignment - 1);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const size_t begin = it->first;
    const size_t end = begin + it->second;
    const size_t aligned = (begin + alignment - 1) & ~(alignment - 1);
    if (aligned + size > end) continue;
    free_.erase(it);
    // What the alignment skipped and what the range leaves stay free.
    if (aligned > begin) free_.emplace(begin, aligned - begin);
    if (aligned + size < end) free_.emplace(aligned + size, end - aligned - size);
    used_.emplace(aligned, size);
    return aligned;
  }
  return std::nullopt;
}

bool HeapSpace::give_back(size_t offset) {
  const auto used = used_.find(offset);
  if (used == used_.end()) return false;
  size_t begin = offset;
  size_t end = offset + used->second;
  used_.erase(used);
  const auto next = free_.lower_bound(end);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    free_.erase(next);
  }
  const auto after = free_.lower_bound(begin);
  if (after != free_.begin()) {
    const auto previous = std::prev(after);
    if (previous->first + previous->second == begin) {
      begin = previous->first;
      free_.erase(previous);
    }
  }
  free_.emplace(begin, end - begin);
  return true;
}

}  // namespace zero::backend
