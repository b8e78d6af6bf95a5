// Shared by the grid tests of the CUDA kernels' per-thread bodies: the dtypes and sizes they
// sweep, the loops that run a body over its whole grid, and guarded host buffers.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernel_bodies.h"

namespace zero::kernels::cuda {

inline const std::vector<DType> kDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// Sizes around the vector (4), the block step (1024) and the chunk (8192) boundaries.
inline const std::vector<size_t> kSizes = {0,    1,    3,    4,    5,     1023,  1024,
                                           1029, 8191, 8192, 8193, 16384, 24583, 40000};

// Runs body(block, thread, table) for every block and thread of every launch in the plan, the
// way the GPU would (in some order: the bodies share nothing between threads).
template <typename Tensor, typename Body>
void run_grid(const std::vector<LaunchTable<Tensor>>& plans, Body body) {
  for (const auto& table : plans) {
    for (uint32_t block = 0; block < table.blocks(); ++block) {
      for (uint32_t thread = 0; thread < kBlockThreads; ++thread) body(block, thread, table);
    }
  }
}

// Runs body(block, thread) for every block and thread of a single-tensor launch of n elements.
template <typename Body>
void run_element_grid(size_t n, const char* op, Body body) {
  const uint32_t blocks = element_blocks(n, op);
  for (uint32_t block = 0; block < blocks; ++block) {
    for (uint32_t thread = 0; thread < kBlockThreads; ++thread) body(block, thread);
  }
}

// Host memory with a chosen misalignment and guard bytes on both sides, so both the 16-byte
// and the element-at-a-time paths run, and a write outside the tensor shows up.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kGuardByte = 0xA5;

  GuardedBuffer(size_t bytes, size_t misalign) : bytes_(bytes), storage_(bytes + 3 * kGuard) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    const size_t lead = (kGuard - base % kGuard) % kGuard + kGuard + misalign;
    begin_ = storage_.data() + lead;
    std::memset(storage_.data(), kGuardByte, storage_.size());
  }
  void* data() { return begin_; }
  bool guards_intact() const {
    for (const uint8_t* p = storage_.data(); p < begin_; ++p) {
      if (*p != kGuardByte) return false;
    }
    for (const uint8_t* p = begin_ + bytes_; p < storage_.data() + storage_.size(); ++p) {
      if (*p != kGuardByte) return false;
    }
    return true;
  }
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }

 private:
  size_t bytes_;
  std::vector<uint8_t> storage_;
  uint8_t* begin_;
};

inline void fill_random(void* data, DType dtype, size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) store_from_float(data, dtype, i, dist(rng));
}

inline std::vector<uint8_t> bytes_of(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  return std::vector<uint8_t>(p, p + n);
}

}  // namespace zero::kernels::cuda
