// The public kernel functions: check arguments, pick the path (the best body the CPU runs,
// cpu_features.h), split large ranges over threads, and call the path's loop on each chunk.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "kernel_paths.h"
#include "thread_pool.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_features.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels {
namespace {

using detail::KernelPath;

// Waking a pooled worker costs a few microseconds (a futex wake and a context switch), so each
// one must get enough elements to amortize it; chunks start on multiples of 64 elements so they
// begin on a cache line when the buffer does, and no two threads write the same line.
constexpr size_t kMinElementsPerThread = size_t{1} << 15;
constexpr size_t kChunkAlignment = 64;

const KernelPath& active_path() {
  switch (kernel_isa()) {
    case KernelIsa::kAvx512:
      return detail::kAvx512Path;
    case KernelIsa::kAvx2:
      return detail::kAvx2Path;
    case KernelIsa::kScalar:
      break;
  }
  return detail::kScalarPath;
}

bool valid_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16;
}

const void* advance(const void* p, DType t, size_t i) {
  return static_cast<const char*>(p) + i * dtype_size(t);
}

void* advance(void* p, DType t, size_t i) {
  return static_cast<char*>(p) + i * dtype_size(t);
}

// Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread of the kernel
// pool, each chunk starting on a multiple of `alignment`. The calling thread takes the first
// chunk. Each chunk is processed exactly as a single-threaded call would process those elements.
template <typename Fn>
void run_chunks(size_t n, const KernelOptions& opt, size_t alignment, Fn&& fn) {
  ZERO_CHECK(opt.threads >= 1, "KernelOptions.threads must be at least 1, got " << opt.threads);
  const size_t threads = std::min(static_cast<size_t>(opt.threads), n / kMinElementsPerThread);
  detail::run_chunks_on_pool(n, threads, alignment, fn);
}

void check_buffer(const void* p, size_t n, const char* name) {
  ZERO_CHECK(p != nullptr || n == 0, name << " is null for " << n << " elements");
}

void check_dtype(DType t, const char* name) {
  ZERO_CHECK(valid_dtype(t), name << " has unknown dtype value " << static_cast<int>(t));
}

// flatten and unflatten: the tensors' elements, taken in order, form one range of
// total_elements that threads split like any other kernel's range.
// Exactly one of flat_in (unflatten) and flat_out (flatten) is non-null.
void copy_slots(const TensorSlot* tensors, size_t count, const void* flat_in, void* flat_out,
                DType dtype, const KernelOptions& opt) {
  check_dtype(dtype, "flat buffer");
  ZERO_CHECK(tensors != nullptr || count == 0, "tensor list is null for " << count << " tensors");
  size_t total_elements = 0;
  for (size_t t = 0; t < count; ++t) {
    check_buffer(tensors[t].data, tensors[t].numel, "tensor data");
    total_elements += tensors[t].numel;
  }
  check_buffer(flat_out ? flat_out : flat_in, total_elements, "flat buffer");
  size_t element = dtype_size(dtype);
  run_chunks(total_elements, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    size_t position = 0;  // index of tensors[t]'s first element in the concatenated range
    for (size_t t = 0; t < count && position < end; ++t) {
      const TensorSlot& slot = tensors[t];
      size_t lo = std::max(begin, position);
      size_t hi = std::min(end, position + slot.numel);
      if (lo < hi) {
        size_t tensor_byte = (lo - position) * element;
        size_t flat_byte = (slot.offset + lo - position) * element;
        size_t bytes = (hi - lo) * element;
        if (flat_out) {
          std::memcpy(static_cast<char*>(flat_out) + flat_byte,
                      static_cast<const char*>(slot.data) + tensor_byte, bytes);
        } else {
          std::memcpy(static_cast<char*>(slot.data) + tensor_byte,
                      static_cast<const char*>(flat_in) + flat_byte, bytes);
        }
      }
      position += slot.numel;
    }
  });
}

}  // namespace

bool cpu_has_avx2() {
  return kernel_isa() != KernelIsa::kScalar;
}

void force_scalar_for_testing(bool force) {
  if (force) {
    force_kernel_isa_for_testing(KernelIsa::kScalar);
  } else {
    reset_kernel_isa_for_testing();
  }
}

void fused_adamw(float* master, float* m, float* v, const void* grad, DType grad_dtype,
                 float grad_scale, void* param_out, DType param_dtype, size_t n,
                 const AdamWStepConstants& c, const KernelOptions& opt) {
  check_buffer(master, n, "fused_adamw: master");
  check_buffer(m, n, "fused_adamw: m");
  check_buffer(v, n, "fused_adamw: v");
  check_buffer(grad, n, "fused_adamw: grad");
  check_dtype(grad_dtype, "fused_adamw: grad");
  if (param_out) check_dtype(param_dtype, "fused_adamw: param_out");
  const KernelPath& path = active_path();
  run_chunks(n, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    path.adamw(master + begin, m + begin, v + begin, advance(grad, grad_dtype, begin), grad_dtype,
               grad_scale, param_out ? advance(param_out, param_dtype, begin) : nullptr,
               param_dtype, end - begin, c);
  });
}

void fused_sgd(float* master, float* momentum_buf, const void* grad, DType grad_dtype,
               float grad_scale, void* param_out, DType param_dtype, size_t n,
               const SgdStepConstants& c, const KernelOptions& opt) {
  check_buffer(master, n, "fused_sgd: master");
  check_buffer(grad, n, "fused_sgd: grad");
  if (c.momentum != 0.0f) check_buffer(momentum_buf, n, "fused_sgd: momentum_buf (momentum != 0)");
  check_dtype(grad_dtype, "fused_sgd: grad");
  if (param_out) check_dtype(param_dtype, "fused_sgd: param_out");
  const KernelPath& path = active_path();
  run_chunks(n, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    path.sgd(master + begin, momentum_buf ? momentum_buf + begin : nullptr,
             advance(grad, grad_dtype, begin), grad_dtype, grad_scale,
             param_out ? advance(param_out, param_dtype, begin) : nullptr, param_dtype, end - begin,
             c);
  });
}

void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
          const KernelOptions& opt) {
  check_buffer(src, n, "cast: src");
  check_buffer(dst, n, "cast: dst");
  check_dtype(src_dtype, "cast: src");
  check_dtype(dst_dtype, "cast: dst");
  const KernelPath& path = active_path();
  run_chunks(n, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    if (src_dtype == dst_dtype) {
      std::memcpy(advance(dst, dst_dtype, begin), advance(src, src_dtype, begin),
                  (end - begin) * dtype_size(src_dtype));
    } else {
      path.cast(advance(src, src_dtype, begin), src_dtype, advance(dst, dst_dtype, begin),
                dst_dtype, end - begin);
    }
  });
}

// Threads take whole blocks: each chunk starts on a block boundary, so its blocks and scales
// are the ones a single-threaded call makes.
void quantize_int8(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                   float* scales, const KernelOptions& opt) {
  check_buffer(src, n, "quantize_int8: src");
  check_buffer(values, n, "quantize_int8: values");
  check_buffer(scales, n, "quantize_int8: scales");
  check_dtype(src_dtype, "quantize_int8: src");
  ZERO_CHECK(block > 0, "quantize_int8: the block size must be at least 1 element");
  const KernelPath& path = active_path();
  run_chunks(n, opt, block, [&](size_t begin, size_t end) {
    path.quantize_int8(advance(src, src_dtype, begin), src_dtype, end - begin, block,
                       values + begin, scales + begin / block);
  });
}

void dequantize_int8(const int8_t* values, const float* scales, size_t n, size_t block, void* dst,
                     DType dst_dtype, const KernelOptions& opt) {
  check_buffer(values, n, "dequantize_int8: values");
  check_buffer(scales, n, "dequantize_int8: scales");
  check_buffer(dst, n, "dequantize_int8: dst");
  check_dtype(dst_dtype, "dequantize_int8: dst");
  ZERO_CHECK(block > 0, "dequantize_int8: the block size must be at least 1 element");
  const KernelPath& path = active_path();
  run_chunks(n, opt, block, [&](size_t begin, size_t end) {
    path.dequantize_int8(values + begin, scales + begin / block, end - begin, block,
                         advance(dst, dst_dtype, begin), dst_dtype);
  });
}

// Block sums are kept per block and added in block order (see kernel_paths.h), so the result
// does not depend on the path or on the number of threads.
double sum_squares(const void* x, DType dtype, size_t n, const KernelOptions& opt) {
  check_buffer(x, n, "sum_squares: x");
  check_dtype(dtype, "sum_squares: x");
  const KernelPath& path = active_path();
  constexpr size_t block = detail::kSumSquaresBlock;
  std::vector<double> block_sums((n + block - 1) / block);
  run_chunks(n, opt, block, [&](size_t begin, size_t end) {
    for (size_t start = begin; start < end; start += block) {
      block_sums[start / block] =
          path.sum_squares_block(advance(x, dtype, start), dtype, std::min(block, end - start));
    }
  });
  double total = 0.0;
  for (double s : block_sums) total += s;
  return total;
}

bool all_finite(const void* x, DType dtype, size_t n, const KernelOptions& opt) {
  check_buffer(x, n, "all_finite: x");
  check_dtype(dtype, "all_finite: x");
  const KernelPath& path = active_path();
  // Chunks report through one shared flag; each stops scanning at its first non-finite element.
  std::atomic<bool> finite{true};
  run_chunks(n, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    if (!path.all_finite(advance(x, dtype, begin), dtype, end - begin)) finite.store(false);
  });
  return finite.load();
}

void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                const KernelOptions& opt) {
  check_buffer(dst, n, "accumulate: dst");
  check_buffer(src, n, "accumulate: src");
  check_dtype(dst_dtype, "accumulate: dst");
  check_dtype(src_dtype, "accumulate: src");
  const KernelPath& path = active_path();
  run_chunks(n, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    path.accumulate(advance(dst, dst_dtype, begin), dst_dtype, advance(src, src_dtype, begin),
                    src_dtype, end - begin);
  });
}

void accumulate(float* dst, const float* src, size_t n, const KernelOptions& opt) {
  accumulate(dst, DType::kFloat32, src, DType::kFloat32, n, opt);
}

void accumulate(void* dst, const void* src, DType dtype, size_t n, const KernelOptions& opt) {
  accumulate(dst, dtype, src, dtype, n, opt);
}

void scale(void* x, DType dtype, float alpha, size_t n, const KernelOptions& opt) {
  check_buffer(x, n, "scale: x");
  check_dtype(dtype, "scale: x");
  const KernelPath& path = active_path();
  run_chunks(n, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    path.scale(advance(x, dtype, begin), dtype, alpha, end - begin);
  });
}

void sum_in_order(void* dst, const void* const* srcs, size_t sources, DType dtype, size_t n,
                  const KernelOptions& opt) {
  check_buffer(dst, n, "sum_in_order: dst");
  check_dtype(dtype, "sum_in_order: dst");
  ZERO_CHECK(sources >= 1, "sum_in_order: needs at least one source");
  for (size_t k = 0; k < sources; ++k) check_buffer(srcs[k], n, "sum_in_order: source");
  const KernelPath& path = active_path();
  // The sources stay whole pointers and each chunk passes its offset: they are one array that
  // every chunk shares, and offsetting them would need a copy of it per chunk.
  run_chunks(n, opt, kChunkAlignment, [&](size_t begin, size_t end) {
    path.sum_in_order(dst, srcs, sources, begin, dtype, end - begin);
  });
}

void copy_to_all(void* const* dsts, size_t count, const void* src, size_t bytes,
                 const KernelOptions& opt) {
  ZERO_CHECK(bytes == 0 || src != nullptr, "copy_to_all: null source of " << bytes << " bytes");
  for (size_t k = 0; k < count; ++k) {
    ZERO_CHECK(bytes == 0 || dsts[k] != nullptr,
               "copy_to_all: destination " << k << " is null for " << bytes << " bytes");
  }
  const KernelPath& path = active_path();
  // Chunks of whole pieces, so each thread reads its part of src once.
  run_chunks(bytes, opt, detail::kCopyPieceBytes, [&](size_t begin, size_t end) {
    path.copy_to_all(dsts, count, src, begin, end - begin);
  });
}

void flatten(const TensorSlot* tensors, size_t count, void* flat, DType dtype,
             const KernelOptions& opt) {
  copy_slots(tensors, count, nullptr, flat, dtype, opt);
}

void unflatten(const void* flat, const TensorSlot* tensors, size_t count, DType dtype,
               const KernelOptions& opt) {
  copy_slots(tensors, count, flat, nullptr, dtype, opt);
}

}  // namespace zero::kernels
