// Vectorized CPU kernels on local memory: no communication, no ownership. Each function picks
// the AVX-512 path when the CPU has it, else the AVX2/F16C path, else a scalar loop (checked
// once at run time, cpu_features.h); all produce the same results as the scalar reference
// built on dtype.h and optimizer_math.h. Pointers need no alignment beyond their element type's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.h"
#include "zero/kernels/optimizer_math.h"

namespace zero::kernels {

// Intra-rank parallelism: the range is split into `threads` contiguous chunks (1 = the calling
// thread only), each starting on a multiple of 64 elements; the calling thread runs the first
// and the workers of a persistent pool (started once, asleep between calls) the others.
// Ranges below 32768 elements per thread use fewer threads, down to the calling thread alone;
// so does a call made while another thread's call is using the pool.
// Every kernel returns the same bits for any thread count (sum_squares included: it sums in
// fixed blocks, see kernels/cpu/kernel_paths.h).
// bf16_products: matmul_forward's and matmul_backward's products round their inputs to bf16 and
// accumulate in fp32 where the CPU has bf16 arithmetic (transformer_kernels.h); fp32 otherwise.
// Attention's products too where bf16_attention_in_bf16() (transformer_kernels.h).
struct KernelOptions {
  int threads = 1;
  bool bf16_products = false;
};

// True when a vector path (AVX2+F16C+FMA, or AVX-512 beside them) is in use; which one, and
// how the environment caps the choice: cpu_features.h. ZERO_KERNELS_SCALAR=1 in the environment
// (read once, at the first kernel call) forces the scalar path.
bool cpu_has_avx2();

// Tests only: forces the scalar path (true) or returns to the normal choice (false) at any
// time, so one test binary can compare the paths (force_kernel_isa_for_testing picks any).
// Not for use while kernels run on other threads.
void force_scalar_for_testing(bool force);

// Fused AdamW over n elements of a flat shard. master, m, v: fp32 state, updated in place.
// grad: n elements of grad_dtype, multiplied by grad_scale before use (folds loss-scale
// removal, averaging and clipping into the same pass). param_out: when non-null, receives the
// updated master rounded to param_dtype (the working copy), in the same pass.
void fused_adamw(float* master, float* m, float* v, const void* grad, DType grad_dtype,
                 float grad_scale, void* param_out, DType param_dtype, size_t n,
                 const AdamWStepConstants& c, const KernelOptions& opt = {});

// Fused SGD with momentum, same conventions as fused_adamw (momentum_buf may be null when
// momentum is 0).
void fused_sgd(float* master, float* momentum_buf, const void* grad, DType grad_dtype,
               float grad_scale, void* param_out, DType param_dtype, size_t n,
               const SgdStepConstants& c, const KernelOptions& opt = {});

// Converts n elements from src_dtype to dst_dtype (round to nearest even when narrowing).
void cast(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n,
          const KernelOptions& opt = {});

// Sum of squares of n elements, accumulated in double (the local part of a global norm).
double sum_squares(const void* x, DType dtype, size_t n, const KernelOptions& opt = {});

// True when none of the n elements is NaN or infinite.
bool all_finite(const void* x, DType dtype, size_t n, const KernelOptions& opt = {});

// dst[i] += src[i] for n elements, dst and src of any dtypes: each sum is computed in fp32 and
// rounded once to dst's dtype (gradients added across micro-batches, a module's fp32 gradient
// added into a 16-bit one).
void accumulate(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n,
                const KernelOptions& opt = {});
// The same with both of one dtype.
void accumulate(float* dst, const float* src, size_t n, const KernelOptions& opt = {});
void accumulate(void* dst, const void* src, DType dtype, size_t n, const KernelOptions& opt = {});

// dst[i] = srcs[0][i] + srcs[1][i] + ... + srcs[sources - 1][i], added in that order in fp32
// and rounded once to dtype (every source and dst are of dtype): the reduction of a collective
// over shared memory, whose result must not depend on which rank arrives first. dst may be one
// of the sources.
void sum_in_order(void* dst, const void* const* srcs, size_t sources, DType dtype, size_t n,
                  const KernelOptions& opt = {});

// Copies `bytes` of src into each of `count` destinations (none overlapping src or each other):
// what an all-gather's push writes into every rank's output. src is read from memory once,
// a cache-sized piece at a time for all destinations, and the AVX2 path writes around the
// caches (non-temporal stores, fenced before it returns): a fused copy moves 1 + count bytes
// through memory per byte of src where count separate memcpy calls move 2 x count.
void copy_to_all(void* const* dsts, size_t count, const void* src, size_t bytes,
                 const KernelOptions& opt = {});

// Blockwise symmetric int8 quantization (quantize_math.h): n elements of src in blocks of
// `block` elements (the last may be shorter) to n int8 values and one fp32 scale per block
// (int8_block_count(n, block) of them). ZeRO++'s wire format for parameter all-gathers.
void quantize_int8(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                   float* scales, const KernelOptions& opt = {});
// Back: dst[i] = values[i] * scales[i / block], rounded to nearest even for a 16-bit dst.
void dequantize_int8(const int8_t* values, const float* scales, size_t n, size_t block, void* dst,
                     DType dst_dtype, const KernelOptions& opt = {});

// x[i] *= alpha.
void scale(void* x, DType dtype, float alpha, size_t n, const KernelOptions& opt = {});

// One tensor's place in a flat buffer: `numel` elements at element offset `offset`.
struct TensorSlot {
  void* data;
  size_t offset;
  size_t numel;
};

// Copies each tensor into flat at its offset (gaps between tensors are left untouched).
void flatten(const TensorSlot* tensors, size_t count, void* flat, DType dtype,
             const KernelOptions& opt = {});

// Copies each tensor's slice of flat back out into the tensor.
void unflatten(const void* flat, const TensorSlot* tensors, size_t count, DType dtype,
               const KernelOptions& opt = {});

}  // namespace zero::kernels
