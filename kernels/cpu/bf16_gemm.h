// bf16 GEMMs through oneDNN: bf16 inputs, fp32 accumulation and output. Built only with
// oneDNN (ZERO_HAVE_DNNL); transformer_products.cpp runs its products here when asked for bf16
// products on a CPU with bf16 arithmetic.
#pragma once

#include <cstdint>
#include <string>

#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels::detail {

// C [M, N] = alpha op(A) [M, K] op(B) [K, N] + bias + beta C, row-major, A and B bf16 (raw
// bits), C fp32, bias (optional, with alpha 1 only) fp32 [N], added to every row in fp32 after
// the products' sum, before beta C; op transposes when trans_* is set, as cblas_sgemm's. Runs on
// the calling thread alone (oneDNN's own threads are held to 1), so callers split the work as
// they do OpenBLAS's. The primitive of each distinct shape (sizes, leading dimensions, whether
// alpha is 1, beta, C's dtype, whether there is a bias) is created once and reused (creating one
// costs far more than running a small one); alpha's value is given at each run.
void bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
               const float* bias = nullptr);
// The same into a bf16 C: each value computed in fp32 (alpha op(A) op(B) + beta C) and rounded
// to nearest even once, as adding an fp32 product into a bf16 gradient does.
void bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, uint16_t* C, int ldc);

// n values of x rounded to bf16 (opt's threads) into operand buffer `slot` (0-2) of the calling
// thread, which holds them until its next call with that slot: the products' operands (0 and 1,
// and 2 for matmul_backward's dout) and attention's q, k, v (0) and output gradient (1). The
// buffers are kept between calls (the largest is the LM head's gradient, N x V), so that no call
// pays for fresh pages; they are not in the memory plan.
const uint16_t* round_to_bf16(int slot, const float* x, size_t n, const KernelOptions& opt);

// What oneDNN runs the bf16 primitives on ("avx512_core_amx", "avx512_core_bf16", ...).
std::string bf16_gemm_isa();

}  // namespace zero::kernels::detail
