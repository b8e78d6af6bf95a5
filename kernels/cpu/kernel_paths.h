// The implementations dispatch.cpp chooses between: plain scalar loops (kernels_scalar.cpp),
// and the vector loops of kernel_loops.h on AVX2/F16C (kernels_avx2.cpp) or AVX-512
// (kernels_avx512.cpp). Each entry works on one contiguous range whose pointers are already
// offset; argument checks and threading live in dispatch.cpp only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/core/dtype.h"
#include "zero/kernels/optimizer_math.h"

namespace zero::kernels::detail {

struct KernelPath {
  void (*adamw)(float* master, float* m, float* v, const void* grad, DType grad_dtype,
                float grad_scale, void* param_out, DType param_dtype, size_t n,
                const AdamWStepConstants& c);
  void (*sgd)(float* master, float* momentum_buf, const void* grad, DType grad_dtype,
              float grad_scale, void* param_out, DType param_dtype, size_t n,
              const SgdStepConstants& c);
  // src_dtype != dst_dtype (equal dtypes are a memcpy in the dispatcher).
  void (*cast)(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);
  // One block of at most kSumSquaresBlock elements; see sum_squares_lane below.
  double (*sum_squares_block)(const void* x, DType dtype, size_t n);
  bool (*all_finite)(const void* x, DType dtype, size_t n);
  // dst[i] = dst[i] + src[i], added in fp32 and rounded once to dst_dtype.
  void (*accumulate)(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n);
  void (*scale)(void* x, DType dtype, float alpha, size_t n);
  void (*sum_in_order)(void* dst, const void* const* srcs, size_t sources, size_t offset,
                       DType dtype, size_t n);
  // `bytes` of src into each of `count` destinations, all at byte `offset`.
  void (*copy_to_all)(void* const* dsts, size_t count, const void* src, size_t offset,
                      size_t bytes);
  // Blockwise int8 over n elements starting on a block boundary (quantize_math.h).
  void (*quantize_int8)(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                        float* scales);
  void (*dequantize_int8)(const int8_t* values, const float* scales, size_t n, size_t block,
                          void* dst, DType dst_dtype);
};

// copy_to_all's piece: small enough to stay in the L2 cache between its copies, so src is read
// from memory once whatever the count.
constexpr size_t kCopyPieceBytes = size_t{64} << 10;

// The vector optimizer loops write working copies of at least this many elements (well past the
// L2 cache together with the state) with non-temporal stores: the copy is written without being
// read, so a cached store would first read every line from memory (2 more bytes per parameter
// for a 16-bit copy), and the copy is next read by the following forward pass, long after it
// would have left the cache anyway. Smaller copies stay cached for that next read.
constexpr size_t kStreamingMinElements = size_t{1} << 18;

// The AVX2 bodies of blockwise int8 (kernels_avx2.cpp), which the AVX-512 path uses too: a
// block's work is one pass of loads and one of stores, which AVX2 already keeps at memory speed.
void quantize_int8_avx2(const void* src, DType src_dtype, size_t n, size_t block, int8_t* values,
                        float* scales);
void dequantize_int8_avx2(const int8_t* values, const float* scales, size_t n, size_t block,
                          void* dst, DType dst_dtype);

extern const KernelPath kScalarPath;
extern const KernelPath kAvx2Path;
extern const KernelPath kAvx512Path;

// sum_squares is defined by its summation order so that every path and every thread count
// returns the same bits: the input is cut into blocks of kSumSquaresBlock elements (threads
// take whole blocks, block sums are added in order); inside a block, element i adds its exact
// square (a float squared fits in a double) into lane i % kSumSquaresLanes, and the lanes are
// combined by the fixed tree in reduce_sum_squares_lanes. The AVX2 loop keeps the 16 lanes in
// four registers, the AVX-512 loop in two; the scalar loop keeps them in an array.
constexpr size_t kSumSquaresBlock = size_t{1} << 16;
constexpr size_t kSumSquaresLanes = 16;

inline double reduce_sum_squares_lanes(const double* lanes) {
  double quarter[4];
  for (size_t q = 0; q < 4; ++q) {
    quarter[q] = (lanes[q] + lanes[q + 4]) + (lanes[q + 8] + lanes[q + 12]);
  }
  return (quarter[0] + quarter[1]) + (quarter[2] + quarter[3]);
}

}  // namespace zero::kernels::detail
