// The per-thread bodies of the CUDA kernels (kernels/cuda/*.cu) and the launch plans that feed
// them. Each body is a function of (block index, thread index, arguments): the .cu files call it
// with blockIdx.x and threadIdx.x, and tests/kernels/cuda_grid_test.cpp, built by g++ on
// machines without a GPU, calls it for every block and thread of the same grid in loops. That
// checks the indexing, the tails and the multi-tensor tables exactly, leaving a GPU session only
// speed and what a loop cannot see. Private to kernels/ (not installed): the .cu files include it
// from their folder, the test by its path from the repository root.
//
// Work division: every kernel hands each block one chunk of one tensor (kChunkElements elements,
// or kChunkBytes bytes for copies). Thread t of a block takes vectors t, t + 256, t + 512, ... of
// the chunk, so a warp's accesses are contiguous, and each vector is one 16-byte access when the
// tensor's pointers allow it (elements past the last whole vector go one at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "zero/core/check.h"
#include "zero/core/dtype.h"
#include "zero/kernels/cuda_kernels.h"
#include "zero/kernels/optimizer_math.h"

namespace zero::kernels::cuda {

constexpr uint32_t kBlockThreads = 256;
constexpr uint32_t kVectorElements = 4;  // element kernels: 4 floats = one 16-byte access
constexpr uint32_t kVectorBytes = 16;    // copy kernels
constexpr uint32_t kStepsPerBlock = 8;   // vectors per thread per block
constexpr size_t kChunkElements = size_t{kBlockThreads} * kVectorElements * kStepsPerBlock;
constexpr size_t kChunkBytes = size_t{kBlockThreads} * kVectorBytes * kStepsPerBlock;
// Tensors per launch: the table travels as a kernel argument, which must stay under 4 KB.
constexpr uint32_t kMaxTensorsPerLaunch = 64;
constexpr uint32_t kMaxBlocksPerLaunch = 0x7fffffffu;  // gridDim.x limit

// The tensors of one launch and the blocks each owns: tensor i owns blocks
// [first_block[i], first_block[i + 1]), and first_block[count] is the grid size.
template <typename Tensor>
struct LaunchTable {
  Tensor tensors[kMaxTensorsPerLaunch];
  uint32_t first_block[kMaxTensorsPerLaunch + 1];
  uint32_t count;
  uint32_t blocks() const { return first_block[count]; }
};

// The tensor that owns `block`: the last i with first_block[i] <= block (binary search; tensors
// with no blocks never enter a table, so the ranges are non-empty).
template <typename Tensor>
ZERO_HD uint32_t tensor_of_block(const LaunchTable<Tensor>& table, uint32_t block) {
  uint32_t lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const uint32_t mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Splits tensors into launches: consecutive tensors fill a table until it holds
// kMaxTensorsPerLaunch tensors or its grid would pass kMaxBlocksPerLaunch. units(tensor) is the
// tensor's size in the units a block's chunk counts (elements or bytes).
template <typename Tensor, typename Units>
std::vector<LaunchTable<Tensor>> plan_launches(const Tensor* tensors, size_t count,
                                               size_t units_per_block, Units units) {
  std::vector<LaunchTable<Tensor>> plans;
  LaunchTable<Tensor> table{};
  for (size_t i = 0; i < count; ++i) {
    const size_t n = units(tensors[i]);
    if (n == 0) continue;
    const size_t blocks = (n - 1) / units_per_block + 1;
    ZERO_CHECK(blocks <= kMaxBlocksPerLaunch,
               "tensor " << i << " has " << n << " elements, more than one launch can cover");
    if (table.count == kMaxTensorsPerLaunch ||
        (table.count > 0 && table.blocks() + blocks > kMaxBlocksPerLaunch)) {
      plans.push_back(table);
      table = LaunchTable<Tensor>{};
    }
    table.tensors[table.count] = tensors[i];
    table.first_block[table.count + 1] = table.blocks() + static_cast<uint32_t>(blocks);
    table.count += 1;
  }
  if (table.count > 0) plans.push_back(table);
  return plans;
}

// --- vector access ---------------------------------------------------------------------------

struct alignas(16) Floats4 {
  float x[4];
};
struct alignas(8) Halves4 {
  uint16_t x[4];
};
struct alignas(16) Bytes16 {
  uint32_t x[4];
};

ZERO_HD bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// One aligned vector access: a single 16- (or 8-) byte load or store on the device; memcpy on
// the host, where the test's buffers carry no alignment promise to the compiler. The host form
// checks the alignment the device access needs, so the grid tests catch a body that takes the
// vector path for a misaligned pointer (the GPU would fault, memcpy would not).
template <typename V>
ZERO_HD V load_vector(const void* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<const V*>(p);
#else
  ZERO_CHECK(is_aligned(p, alignof(V)), "vector load from a misaligned address");
  V v;
  memcpy(&v, p, sizeof(V));
  return v;
#endif
}

template <typename V>
ZERO_HD void store_vector(void* p, const V& v) {
#if defined(__CUDA_ARCH__)
  *static_cast<V*>(p) = v;
#else
  ZERO_CHECK(is_aligned(p, alignof(V)), "vector store to a misaligned address");
  memcpy(p, &v, sizeof(V));
#endif
}

// Elements [i, i + 4) of a buffer of dtype D as floats, in one vector load.
template <DType D>
ZERO_HD void load4(const void* data, size_t i, float out[4]) {
  if constexpr (D == DType::kFloat32) {
    const Floats4 v = load_vector<Floats4>(static_cast<const float*>(data) + i);
    for (int k = 0; k < 4; ++k) out[k] = v.x[k];
  } else {
    const Halves4 v = load_vector<Halves4>(static_cast<const uint16_t*>(data) + i);
    for (int k = 0; k < 4; ++k) {
      out[k] = D == DType::kBFloat16 ? bf16_to_float(v.x[k]) : fp16_to_float(v.x[k]);
    }
  }
}

// Stores four floats as elements [i, i + 4) of dtype D (rounded as store_from_float does).
template <DType D>
ZERO_HD void store4(void* data, size_t i, const float in[4]) {
  if constexpr (D == DType::kFloat32) {
    Floats4 v;
    for (int k = 0; k < 4; ++k) v.x[k] = in[k];
    store_vector(static_cast<float*>(data) + i, v);
  } else {
    Halves4 v;
    for (int k = 0; k < 4; ++k) {
      v.x[k] = D == DType::kBFloat16 ? float_to_bf16(in[k]) : float_to_fp16(in[k]);
    }
    store_vector(static_cast<uint16_t*>(data) + i, v);
  }
}

// True when all four elements [i, i + 4) of dtype D may be read as one vector.
template <DType D>
ZERO_HD bool vector_aligned(const void* data) {
  return is_aligned(data, kVectorElements * (D == DType::kFloat32 ? 4 : 2));
}

// The chunk of a tensor of `numel` units that `block` covers, given the table's first block.
struct ChunkRange {
  size_t begin;
  size_t end;
};

ZERO_HD ChunkRange chunk_range(uint32_t block, uint32_t first_block, size_t chunk, size_t numel) {
  const size_t begin = static_cast<size_t>(block - first_block) * chunk;
  const size_t end = begin + chunk < numel ? begin + chunk : numel;
  return {begin, end};
}

// Start of vector `step` of `thread` within a chunk, in units of `vector_units`.
ZERO_HD size_t vector_start(const ChunkRange& r, uint32_t step, uint32_t thread,
                            size_t vector_units) {
  return r.begin + (static_cast<size_t>(step) * kBlockThreads + thread) * vector_units;
}

// --- fused AdamW -----------------------------------------------------------------------------

struct AdamWArgs {
  AdamWStepConstants c;
  float grad_scale;
  DeviceStepControl control;
};

// One element, exactly as the CPU kernels do it.
template <DType G, DType P>
ZERO_HD void adamw_element(const AdamWTensor& x, size_t i, float scale,
                           const AdamWStepConstants& c) {
  const float g = load_as_float(x.grad, G, i) * scale;
  adamw_update(x.master[i], x.m[i], x.v[i], g, c);
  if (x.param_out) store_from_float(x.param_out, P, i, x.master[i]);
}

template <DType G, DType P>
ZERO_HD void adamw_thread(uint32_t block, uint32_t thread, const LaunchTable<AdamWTensor>& table,
                          const AdamWArgs& args) {
  if (args.control.skip_flag && *args.control.skip_flag != 0) return;
  const float scale = args.control.grad_scale ? *args.control.grad_scale : args.grad_scale;
  const uint32_t t = tensor_of_block(table, block);
  const AdamWTensor& x = table.tensors[t];
  const ChunkRange r = chunk_range(block, table.first_block[t], kChunkElements, x.numel);
  const bool vectors = vector_aligned<DType::kFloat32>(x.master) &&
                       vector_aligned<DType::kFloat32>(x.m) &&
                       vector_aligned<DType::kFloat32>(x.v) && vector_aligned<G>(x.grad) &&
                       (x.param_out == nullptr || vector_aligned<P>(x.param_out));
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t i = vector_start(r, step, thread, kVectorElements);
    if (i >= r.end) return;
    if (vectors && i + kVectorElements <= r.end) {
      float p[4], m[4], v[4], g[4];
      load4<DType::kFloat32>(x.master, i, p);
      load4<DType::kFloat32>(x.m, i, m);
      load4<DType::kFloat32>(x.v, i, v);
      load4<G>(x.grad, i, g);
      for (int k = 0; k < 4; ++k) adamw_update(p[k], m[k], v[k], g[k] * scale, args.c);
      store4<DType::kFloat32>(x.master, i, p);
      store4<DType::kFloat32>(x.m, i, m);
      store4<DType::kFloat32>(x.v, i, v);
      if (x.param_out) store4<P>(x.param_out, i, p);
    } else {
      const size_t end = i + kVectorElements < r.end ? i + kVectorElements : r.end;
      for (size_t j = i; j < end; ++j) adamw_element<G, P>(x, j, scale, args.c);
    }
  }
}

// --- fused SGD -------------------------------------------------------------------------------

struct SgdArgs {
  SgdStepConstants c;
  float grad_scale;
  DeviceStepControl control;
};

// One element, exactly as the CPU kernels do it: sgd_update leaves the buffer alone when
// momentum is 0, so a null momentum buffer is replaced by a local that is never read.
template <DType G, DType P>
ZERO_HD void sgd_element(const SgdTensor& x, size_t i, float scale, const SgdStepConstants& c) {
  float unused_buf = 0.0f;
  const float g = load_as_float(x.grad, G, i) * scale;
  sgd_update(x.master[i], x.momentum ? x.momentum[i] : unused_buf, g, c);
  if (x.param_out) store_from_float(x.param_out, P, i, x.master[i]);
}

template <DType G, DType P>
ZERO_HD void sgd_thread(uint32_t block, uint32_t thread, const LaunchTable<SgdTensor>& table,
                        const SgdArgs& args) {
  if (args.control.skip_flag && *args.control.skip_flag != 0) return;
  const float scale = args.control.grad_scale ? *args.control.grad_scale : args.grad_scale;
  const uint32_t t = tensor_of_block(table, block);
  const SgdTensor& x = table.tensors[t];
  const ChunkRange r = chunk_range(block, table.first_block[t], kChunkElements, x.numel);
  // The buffer is only touched when momentum is on (as on the CPU), and only read after the
  // first step, which overwrites it with the gradient.
  const bool uses_momentum = x.momentum != nullptr && args.c.momentum != 0.0f;
  const bool reads_momentum = uses_momentum && !args.c.first_step;
  const bool vectors = vector_aligned<DType::kFloat32>(x.master) && vector_aligned<G>(x.grad) &&
                       (!uses_momentum || vector_aligned<DType::kFloat32>(x.momentum)) &&
                       (x.param_out == nullptr || vector_aligned<P>(x.param_out));
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t i = vector_start(r, step, thread, kVectorElements);
    if (i >= r.end) return;
    if (vectors && i + kVectorElements <= r.end) {
      float p[4], buf[4] = {0.0f, 0.0f, 0.0f, 0.0f}, g[4];
      load4<DType::kFloat32>(x.master, i, p);
      if (reads_momentum) load4<DType::kFloat32>(x.momentum, i, buf);
      load4<G>(x.grad, i, g);
      for (int k = 0; k < 4; ++k) sgd_update(p[k], buf[k], g[k] * scale, args.c);
      store4<DType::kFloat32>(x.master, i, p);
      if (uses_momentum) store4<DType::kFloat32>(x.momentum, i, buf);
      if (x.param_out) store4<P>(x.param_out, i, p);
    } else {
      const size_t end = i + kVectorElements < r.end ? i + kVectorElements : r.end;
      for (size_t j = i; j < end; ++j) sgd_element<G, P>(x, j, scale, args.c);
    }
  }
}

// --- single-tensor element-wise: cast, add, scale ----------------------------------------------

// Blocks of a single-tensor launch of n elements: block b covers [b * kChunkElements, ...).
inline uint32_t element_blocks(size_t n, const char* op) {
  const size_t blocks = n == 0 ? 0 : (n - 1) / kChunkElements + 1;
  ZERO_CHECK(blocks <= kMaxBlocksPerLaunch, op << " of " << n << " elements is too large");
  return static_cast<uint32_t>(blocks);
}

// dst = src converted to D (round to nearest even when narrowing).
template <DType S, DType D>
ZERO_HD void cast_thread(uint32_t block, uint32_t thread, const void* src, void* dst, size_t n) {
  const ChunkRange r = chunk_range(block, 0, kChunkElements, n);
  const bool vectors = vector_aligned<S>(src) && vector_aligned<D>(dst);
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t i = vector_start(r, step, thread, kVectorElements);
    if (i >= r.end) return;
    if (vectors && i + kVectorElements <= r.end) {
      float x[4];
      load4<S>(src, i, x);
      store4<D>(dst, i, x);
    } else {
      const size_t end = i + kVectorElements < r.end ? i + kVectorElements : r.end;
      for (size_t j = i; j < end; ++j) store_from_float(dst, D, j, load_as_float(src, S, j));
    }
  }
}

// dst += src, each sum computed in fp32 and rounded once to D (as kernels::accumulate does).
template <DType D, DType S>
ZERO_HD void add_thread(uint32_t block, uint32_t thread, void* dst, const void* src, size_t n) {
  const ChunkRange r = chunk_range(block, 0, kChunkElements, n);
  const bool vectors = vector_aligned<D>(dst) && vector_aligned<S>(src);
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t i = vector_start(r, step, thread, kVectorElements);
    if (i >= r.end) return;
    if (vectors && i + kVectorElements <= r.end) {
      float sum[4], addend[4];
      load4<D>(dst, i, sum);
      load4<S>(src, i, addend);
      for (int k = 0; k < 4; ++k) sum[k] += addend[k];
      store4<D>(dst, i, sum);
    } else {
      const size_t end = i + kVectorElements < r.end ? i + kVectorElements : r.end;
      for (size_t j = i; j < end; ++j) {
        store_from_float(dst, D, j, load_as_float(dst, D, j) + load_as_float(src, S, j));
      }
    }
  }
}

// x *= alpha, the product computed in fp32 and rounded once to D (as kernels::scale does).
template <DType D>
ZERO_HD void scale_thread(uint32_t block, uint32_t thread, void* x, float alpha, size_t n) {
  const ChunkRange r = chunk_range(block, 0, kChunkElements, n);
  const bool vectors = vector_aligned<D>(x);
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t i = vector_start(r, step, thread, kVectorElements);
    if (i >= r.end) return;
    if (vectors && i + kVectorElements <= r.end) {
      float e[4];
      load4<D>(x, i, e);
      for (int k = 0; k < 4; ++k) e[k] *= alpha;
      store4<D>(x, i, e);
    } else {
      const size_t end = i + kVectorElements < r.end ? i + kVectorElements : r.end;
      for (size_t j = i; j < end; ++j) store_from_float(x, D, j, load_as_float(x, D, j) * alpha);
    }
  }
}

// --- flatten / unflatten ---------------------------------------------------------------------

// Copies each slot's bytes between the tensor and flat + offset * elem_size (to_flat: tensor ->
// flat). Chunks count bytes; elements are 2 or 4 bytes, so a 16-byte step never splits one.
template <bool kToFlat>
struct CopyArgs {
  std::conditional_t<kToFlat, void*, const void*> flat;
  uint32_t elem_size;
};

template <bool kToFlat>
ZERO_HD void copy_slots_thread(uint32_t block, uint32_t thread,
                               const LaunchTable<TensorSlot>& table,
                               const CopyArgs<kToFlat>& args) {
  const uint32_t t = tensor_of_block(table, block);
  const TensorSlot& slot = table.tensors[t];
  const size_t flat_offset = slot.offset * args.elem_size;
  const char* src;
  char* dst;
  if constexpr (kToFlat) {
    src = static_cast<const char*>(slot.data);
    dst = static_cast<char*>(args.flat) + flat_offset;
  } else {
    src = static_cast<const char*>(args.flat) + flat_offset;
    dst = static_cast<char*>(slot.data);
  }
  const ChunkRange r =
      chunk_range(block, table.first_block[t], kChunkBytes, slot.numel * args.elem_size);
  const bool vectors = is_aligned(src, kVectorBytes) && is_aligned(dst, kVectorBytes);
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t b = vector_start(r, step, thread, kVectorBytes);
    if (b >= r.end) return;
    if (vectors && b + kVectorBytes <= r.end) {
      store_vector(dst + b, load_vector<Bytes16>(src + b));
    } else {
      const size_t end = b + kVectorBytes < r.end ? b + kVectorBytes : r.end;
      for (size_t j = b; j < end; j += args.elem_size) memcpy(dst + j, src + j, args.elem_size);
    }
  }
}

inline size_t slot_bytes(const TensorSlot& slot, size_t elem_size) {
  return slot.numel * elem_size;
}

// --- finite check and sum of squares -----------------------------------------------------------

// NaN and infinity have an all-ones exponent in every dtype; no conversion needed.
template <DType D>
ZERO_HD bool element_finite(const void* data, size_t i) {
  if constexpr (D == DType::kFloat32) {
    return (float_bits(static_cast<const float*>(data)[i]) & 0x7f800000u) != 0x7f800000u;
  } else {
    const uint16_t exponent = D == DType::kBFloat16 ? 0x7f80u : 0x7c00u;
    return (static_cast<const uint16_t*>(data)[i] & exponent) != exponent;
  }
}

template <DType D>
ZERO_HD void check_finite_thread(uint32_t block, uint32_t thread,
                                 const LaunchTable<ConstTensor>& table, int* flag) {
  if (*flag != 0) return;  // another block already found one: nothing left to learn
  const uint32_t t = tensor_of_block(table, block);
  const ConstTensor& x = table.tensors[t];
  const ChunkRange r = chunk_range(block, table.first_block[t], kChunkElements, x.numel);
  bool finite = true;
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t i = vector_start(r, step, thread, kVectorElements);
    if (i >= r.end) break;
    const size_t end = i + kVectorElements < r.end ? i + kVectorElements : r.end;
    for (size_t j = i; j < end; ++j) finite = finite && element_finite<D>(x.data, j);
  }
  // Every writer writes the same value, so the race between blocks is harmless.
  if (!finite) *flag = 1;
}

// Stage 1 of sum_squares: the thread's own elements, squared exactly in double and summed in
// index order. The block then adds its kBlockThreads partials with the tree below and writes one
// double per block; stage 2 (sum_partials_thread, one block) adds those in a fixed order too.
template <DType D>
ZERO_HD double sum_squares_thread(uint32_t block, uint32_t thread,
                                  const LaunchTable<ConstTensor>& table) {
  const uint32_t t = tensor_of_block(table, block);
  const ConstTensor& x = table.tensors[t];
  const ChunkRange r = chunk_range(block, table.first_block[t], kChunkElements, x.numel);
  const bool vectors = vector_aligned<D>(x.data);
  double sum = 0.0;
  for (uint32_t step = 0; step < kStepsPerBlock; ++step) {
    const size_t i = vector_start(r, step, thread, kVectorElements);
    if (i >= r.end) break;
    if (vectors && i + kVectorElements <= r.end) {
      float e[4];
      load4<D>(x.data, i, e);
      for (int k = 0; k < 4; ++k) sum += static_cast<double>(e[k]) * e[k];
    } else {
      const size_t end = i + kVectorElements < r.end ? i + kVectorElements : r.end;
      for (size_t j = i; j < end; ++j) {
        const double e = load_as_float(x.data, D, j);
        sum += e * e;
      }
    }
  }
  return sum;
}

// One level of a block's reduction tree: for half = kBlockThreads / 2, ..., 1 (a barrier before
// each level), threads below `half` add their partner's value. shared[0] ends with the total.
ZERO_HD void tree_sum_level(double* shared, uint32_t thread, uint32_t half) {
  if (thread < half) shared[thread] += shared[thread + half];
}

// Stage 2, per thread of its single block: partials thread, thread + 256, ... in order.
ZERO_HD double sum_partials_thread(uint32_t thread, const double* partials, size_t count) {
  double sum = 0.0;
  for (size_t i = thread; i < count; i += kBlockThreads) sum += partials[i];
  return sum;
}

// Stage 2's last step, on thread 0: round the total once to float and flag it when not finite
// (a finite double above FLT_MAX counts as an overflow too, since the float is what travels).
ZERO_HD void finish_sum_squares(double total, float* out, int* nonfinite_flag) {
  const float rounded = static_cast<float>(total);
  *out = rounded;
  const bool finite = (float_bits(rounded) & 0x7f800000u) != 0x7f800000u;
  if (nonfinite_flag && !finite) *nonfinite_flag = 1;
}

}  // namespace zero::kernels::cuda
