// What the public transformer kernels (transformer_kernels.cpp, transformer_products.cpp,
// transformer_attention.cpp) share: the active path, the split of work over the kernel pool,
// argument checks and the column sums of parameter gradients. Private to kernels/; included by
// translation units built without ISA flags only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <vector>

#include "thread_pool.h"
#include "transformer_paths.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_features.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels::detail {

// Waking a pooled worker costs a few microseconds, so each one must get at least this much work
// (in elements read or written, roughly).
constexpr size_t kMinWorkPerThread = size_t{1} << 15;
// Column ranges start on multiples of 16 floats (64 bytes), so no two threads write one line.
constexpr size_t kColumnGranule = 16;

inline const TransformerPath& active_transformer_path() {
  switch (kernel_isa()) {
    case KernelIsa::kAvx512:
      return kTransformerAvx512Path;
    case KernelIsa::kAvx2:
      return kTransformerAvx2Path;
    case KernelIsa::kScalar:
      break;
  }
  return kTransformerScalarPath;
}

// Runs fn(begin, end) over items [0, items) split into contiguous chunks, one per thread of the
// kernel pool, each starting on a multiple of `granule`; work_per_item sizes how many threads
// are worth waking.
// The calling thread takes the first chunk. Every item is processed by exactly one call.
template <typename Fn>
void parallel_for(size_t items, size_t work_per_item, size_t granule, const KernelOptions& opt,
                  Fn&& fn) {
  ZERO_CHECK(opt.threads >= 1, "KernelOptions.threads must be at least 1, got " << opt.threads);
  size_t threads = std::min({static_cast<size_t>(opt.threads), (items + granule - 1) / granule,
                             items * work_per_item / kMinWorkPerThread});
  run_chunks_on_pool(items, threads, granule, fn);
}

inline void check_sizes(const char* kernel, std::initializer_list<int> sizes) {
  for (int size : sizes) ZERO_CHECK(size >= 0, kernel << ": negative size " << size);
}

inline void check_buffer(const void* p, size_t n, const char* kernel, const char* name) {
  ZERO_CHECK(p != nullptr || n == 0, kernel << ": " << name << " is null for " << n << " values");
}

inline size_t product(int a, int b) {
  return static_cast<size_t>(a) * static_cast<size_t>(b);
}

// sums[c] += the sum over rows n of value(n, c) for c in [0, C), rows added in order. Threads
// take column ranges; each range sums into a zeroed local buffer first, so += adds one total.
template <typename Value>
void add_column_sums(float* sums, size_t rows, size_t C, const KernelOptions& opt, Value&& value) {
  parallel_for(C, rows, kColumnGranule, opt, [&](size_t begin, size_t end) {
    std::vector<float> local(end - begin, 0.0f);
    for (size_t n = 0; n < rows; ++n) {
      for (size_t c = begin; c < end; ++c) local[c - begin] += value(n, c);
    }
    for (size_t c = begin; c < end; ++c) sums[c] += local[c - begin];
  });
}

// Our threads split the GEMMs; OpenBLAS runs single-threaded inside each call
// (transformer_products.cpp).
void single_threaded_blas();

}  // namespace zero::kernels::detail
