// The GPT-2 kernels of cuda_transformer_kernels.h. The per-thread work is in
// transformer_kernel_bodies.h; the kernels here only put the barriers between its phases and
// the reduction trees around them. The GEMMs are cuBLAS's.
#include "transformer_kernel_bodies.h"
#include "zero/kernels/cublas_check.h"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_transformer_kernels.h"

namespace zero::kernels::cuda {

using namespace transformer;

namespace {

// All threads of a row block get the tree's result. The barrier in front lets the block reuse
// `shared` right after an earlier reduction whose result its threads were still reading.
template <typename Op>
__device__ float row_reduce(float* shared, float value) {
  __syncthreads();
  shared[threadIdx.x] = value;
  for (uint32_t half = kRowThreads / 2; half >= 1; half /= 2) {
    __syncthreads();
    tree_level<Op>(shared, threadIdx.x, half);
  }
  __syncthreads();
  return shared[0];
}

// Leaves one total per column in shared[0 .. kColumnLanes), visible to the whole block.
__device__ void column_reduce(float* shared, float value) {
  shared[threadIdx.x] = value;
  for (uint32_t half = kColumnThreads / 2; half >= kColumnLanes; half /= 2) {
    __syncthreads();
    tree_level<SumOp>(shared, threadIdx.x, half);
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kElementThreads)
    embedding_forward_kernel(float* out, const float* tokens, const float* wte, const float* wpe,
                             int first, int rows, int B, int T, int C) {
  embedding_forward_thread(blockIdx.x, threadIdx.x, out, tokens, wte, wpe, first, rows, B, T, C);
}

__global__ void __launch_bounds__(kElementThreads)
    embedding_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  embedding_backward_wpe_thread(blockIdx.x, threadIdx.x, dwpe, dout, B, T, C);
}

__global__ void __launch_bounds__(kElementThreads)
    embedding_backward_wte_kernel(float* dwte, const float* dout, const float* tokens, int first,
                                  int rows, int B, int T, int C) {
  embedding_backward_wte_thread(blockIdx.x, threadIdx.x, dwte, dout, tokens, first, rows, B, T, C);
}

__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                             const float* weight, const float* bias, int C, float eps) {
  __shared__ float shared[kRowThreads];
  const float m = row_mean(
      row_reduce<SumOp>(shared, layernorm_sum_partial(blockIdx.x, threadIdx.x, inp, C)), C);
  const float s = layernorm_rstd(
      row_reduce<SumOp>(shared, layernorm_var_partial(blockIdx.x, threadIdx.x, inp, C, m)), C, eps);
  layernorm_forward_out(blockIdx.x, threadIdx.x, out, mean, rstd, inp, weight, bias, C, m, s);
}

__global__ void __launch_bounds__(kRowThreads)
    layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd,
                                   int C) {
  __shared__ float shared[2][kRowThreads];
  const LayernormRowSums partial =
      layernorm_backward_partial(blockIdx.x, threadIdx.x, dout, inp, weight, mean, rstd, C);
  LayernormRowSums sums;
  sums.dnorm = row_reduce<SumOp>(shared[0], partial.dnorm);
  sums.dnorm_norm = row_reduce<SumOp>(shared[1], partial.dnorm_norm);
  layernorm_backward_dinp(blockIdx.x, threadIdx.x, dinp, dout, inp, weight, mean, rstd, C, sums);
}

__global__ void __launch_bounds__(kColumnThreads)
    layernorm_backward_params_kernel(float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* mean, const float* rstd, int N,
                                     int C) {
  __shared__ float dbias_shared[kColumnThreads];
  __shared__ float dweight_shared[kColumnThreads];
  const LayernormRowSums partial =
      layernorm_params_partial(blockIdx.x, threadIdx.x, dout, inp, mean, rstd, N, C);
  column_reduce(dbias_shared, partial.dnorm);
  column_reduce(dweight_shared, partial.dnorm_norm);
  column_sum_finish(blockIdx.x, threadIdx.x, dbias_shared, dbias, C);
  column_sum_finish(blockIdx.x, threadIdx.x, dweight_shared, dweight, C);
}

__global__ void __launch_bounds__(kElementThreads)
    add_bias_kernel(float* out, const float* bias, int N, int OC) {
  add_bias_thread(blockIdx.x, threadIdx.x, out, bias, N, OC);
}

__global__ void __launch_bounds__(kColumnThreads)
    column_sum_kernel(float* dst, const float* x, int rows, int cols) {
  __shared__ float shared[kColumnThreads];
  column_reduce(shared, column_sum_partial(blockIdx.x, threadIdx.x, x, rows, cols));
  column_sum_finish(blockIdx.x, threadIdx.x, shared, dst, cols);
}

__global__ void __launch_bounds__(kElementThreads)
    gelu_forward_kernel(float* out, const float* inp, size_t n) {
  gelu_forward_thread(blockIdx.x, threadIdx.x, out, inp, n);
}

__global__ void __launch_bounds__(kElementThreads)
    gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
  gelu_backward_thread(blockIdx.x, threadIdx.x, dinp, inp, dout, n);
}

__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_forward_kernel(float* losses, float* lse, const float* logits,
                                 const int32_t* targets, int V, int Vp) {
  __shared__ float shared[kRowThreads];
  const float max =
      row_reduce<MaxOp>(shared, cross_entropy_max_partial(blockIdx.x, threadIdx.x, logits, V, Vp));
  const float sum = row_reduce<SumOp>(
      shared, cross_entropy_sum_partial(blockIdx.x, threadIdx.x, logits, V, Vp, max));
  cross_entropy_forward_finish(blockIdx.x, threadIdx.x, losses, lse, logits, targets, Vp, max, sum);
}

__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_partials_kernel(float* lse, float* target_logits, const float* logits,
                                  const int32_t* targets, int first, int V, int Vp) {
  __shared__ float shared[kRowThreads];
  const float max =
      row_reduce<MaxOp>(shared, cross_entropy_max_partial(blockIdx.x, threadIdx.x, logits, V, Vp));
  const float sum = row_reduce<SumOp>(
      shared, cross_entropy_sum_partial(blockIdx.x, threadIdx.x, logits, V, Vp, max));
  cross_entropy_partials_finish(blockIdx.x, threadIdx.x, lse, target_logits, logits, targets, first,
                                V, Vp, max, sum);
}

__global__ void __launch_bounds__(kElementThreads)
    cross_entropy_backward_kernel(float* dlogits, const float* logits, const float* lse,
                                  const int32_t* targets, int first, float dloss, int N, int V,
                                  int Vp) {
  cross_entropy_backward_thread(blockIdx.x, threadIdx.x, dlogits, logits, lse, targets, first,
                                dloss, N, V, Vp);
}

// Dynamic shared memory: the row's T scores.
__global__ void __launch_bounds__(kRowThreads)
    attention_forward_kernel(float* out, float* lse, const float* qkv, int T, int C, int NH) {
  extern __shared__ float scores[];
  __shared__ float shared[kRowThreads];
  const float max = row_reduce<MaxOp>(
      shared, attention_scores_partial(blockIdx.x, threadIdx.x, qkv, T, C, NH, scores));
  // row_reduce ends with a barrier, so phase 3 sees every thread's exponentials.
  const float sum =
      row_reduce<SumOp>(shared, attention_exp_partial(blockIdx.x, threadIdx.x, T, scores, max));
  attention_forward_out(blockIdx.x, threadIdx.x, out, lse, qkv, T, C, NH, scores, max, sum);
}

// Dynamic shared memory: ds for the query row's T keys.
__global__ void __launch_bounds__(kRowThreads)
    attention_dq_kernel(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int T, int C, int NH) {
  extern __shared__ float ds[];
  attention_dq_scores(blockIdx.x, threadIdx.x, dout, qkv, out, lse, T, C, NH, ds);
  __syncthreads();
  attention_dq_out(blockIdx.x, threadIdx.x, dqkv, qkv, T, C, NH, ds);
}

// Dynamic shared memory: p, then ds, for the key row's T queries.
__global__ void __launch_bounds__(kRowThreads)
    attention_dkv_kernel(float* dqkv, const float* dout, const float* qkv, const float* out,
                         const float* lse, int T, int C, int NH) {
  extern __shared__ float pair_scratch[];
  float* p = pair_scratch;
  float* ds = pair_scratch + T;
  attention_dkv_scores(blockIdx.x, threadIdx.x, dout, qkv, out, lse, T, C, NH, p, ds);
  __syncthreads();
  attention_dkv_out(blockIdx.x, threadIdx.x, dqkv, dout, qkv, T, C, NH, p, ds);
}

void check_dims(const char* op, int a, int b, int c) {
  ZERO_CHECK(a >= 0 && b >= 0 && c >= 0,
             op << ": negative dimension among " << a << ", " << b << ", " << c);
}

// Row-major C[m, n] = op(A) op(B) (+ C when accumulate), as cuBLAS's column-major
// C^T = op(B)^T op(A)^T: the row-major buffers read column-major are the transposes, so the
// operands swap places and keep their transposition flags.
void row_major_sgemm(cublasContext* handle, CUstream_st* stream, bool transpose_a, bool transpose_b,
                     int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                     float* c, bool accumulate) {
  const float one = 1.0f;
  const float beta = accumulate ? 1.0f : 0.0f;
  ZERO_CUBLAS_CHECK(cublasSetStream(handle, stream));
  ZERO_CUBLAS_CHECK(cublasSgemm(handle, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, b, ldb, a,
                                lda, &beta, c, n));
}

}  // namespace

void embedding_forward(float* out, const float* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, CUstream_st* stream) {
  embedding_forward_rows(out, tokens, wte, wpe, 0, kAllRows, B, T, C, stream);
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens, int B,
                        int T, int C, CUstream_st* stream) {
  embedding_backward_rows(dwte, dwpe, dout, tokens, 0, kAllRows, B, T, C, stream);
}

void embedding_forward_rows(float* out, const float* tokens, const float* wte_rows,
                            const float* wpe, int first, int rows, int B, int T, int C,
                            CUstream_st* stream) {
  check_dims("embedding_forward", B, T, C);
  ZERO_CHECK(first >= 0 && rows >= 0,
             "embedding_forward: rows [" << first << ", +" << rows << ") of the vocabulary");
  const uint32_t blocks =
      grid_blocks(static_cast<size_t>(B) * T * C, kElementThreads, "embedding_forward");
  if (blocks == 0) return;
  embedding_forward_kernel<<<blocks, kElementThreads, 0, stream>>>(out, tokens, wte_rows, wpe,
                                                                   first, rows, B, T, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void embedding_backward_rows(float* dwte_rows, float* dwpe, const float* dout, const float* tokens,
                             int first, int rows, int B, int T, int C, CUstream_st* stream) {
  check_dims("embedding_backward", B, T, C);
  ZERO_CHECK(first >= 0 && rows >= 0,
             "embedding_backward: rows [" << first << ", +" << rows << ") of the vocabulary");
  if (static_cast<size_t>(B) * T * C == 0) return;
  embedding_backward_wpe_kernel<<<grid_blocks(static_cast<size_t>(T) * C, kElementThreads,
                                              "embedding_backward"),
                                  kElementThreads, 0, stream>>>(dwpe, dout, B, T, C);
  ZERO_CUDA_CHECK_LAUNCH();
  embedding_backward_wte_kernel<<<embedding_wte_blocks(C), kElementThreads, 0, stream>>>(
      dwte_rows, dout, tokens, first, rows, B, T, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps, CUstream_st* stream) {
  check_dims("layernorm_forward", N, C, 0);
  ZERO_CHECK(C > 0 || N == 0, "layernorm_forward: rows of 0 channels have no mean");
  if (N == 0) return;
  layernorm_forward_kernel<<<grid_blocks(N, 1, "layernorm_forward"), kRowThreads, 0, stream>>>(
      out, mean, rstd, inp, weight, bias, C, eps);
  ZERO_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, CUstream_st* stream) {
  check_dims("layernorm_backward", N, C, 0);
  ZERO_CHECK((dweight == nullptr) == (dbias == nullptr),
             "layernorm_backward: dweight and dbias are computed together; one of them is null");
  if (static_cast<size_t>(N) * C == 0) return;
  if (dinp != nullptr) {
    layernorm_backward_dinp_kernel<<<grid_blocks(N, 1, "layernorm_backward"), kRowThreads, 0,
                                     stream>>>(dinp, dout, inp, weight, mean, rstd, C);
    ZERO_CUDA_CHECK_LAUNCH();
  }
  if (dweight == nullptr) return;
  layernorm_backward_params_kernel<<<grid_blocks(C, kColumnLanes, "layernorm_backward"),
                                     kColumnThreads, 0, stream>>>(dweight, dbias, dout, inp, mean,
                                                                  rstd, N, C);
  ZERO_CUDA_CHECK_LAUNCH();
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, WeightLayout layout, cublasContext* handle,
                    CUstream_st* stream) {
  check_dims("matmul_forward", N, C, OC);
  ZERO_CHECK(C > 0, "matmul_forward: an inner dimension of 0 leaves cuBLAS nothing to write");
  if (static_cast<size_t>(N) * OC == 0) return;
  // out = inp @ W, W stored [C, OC] (kInOut) or as W^T [OC, C] (kOutIn).
  const bool out_in = layout == WeightLayout::kOutIn;
  row_major_sgemm(handle, stream, false, out_in, N, OC, C, inp, C, weight, out_in ? C : OC, out,
                  false);
  if (bias != nullptr) {
    add_bias_kernel<<<grid_blocks(static_cast<size_t>(N) * OC, kElementThreads, "matmul_forward"),
                      kElementThreads, 0, stream>>>(out, bias, N, OC);
    ZERO_CUDA_CHECK_LAUNCH();
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, WeightLayout layout,
                     cublasContext* handle, CUstream_st* stream) {
  check_dims("matmul_backward", N, C, OC);
  ZERO_CHECK(OC > 0, "matmul_backward: an inner dimension of 0 leaves cuBLAS nothing to write");
  if (static_cast<size_t>(N) * C == 0) return;
  const bool out_in = layout == WeightLayout::kOutIn;
  // dweight += inp^T @ dout [C, OC] for kInOut, or its transpose dout^T @ inp [OC, C]. First, on
  // the one stream: it is the last reader of inp, which dinp may overwrite.
  if (dweight != nullptr && out_in) {
    row_major_sgemm(handle, stream, true, false, OC, C, N, dout, OC, inp, C, dweight, true);
  } else if (dweight != nullptr) {
    row_major_sgemm(handle, stream, true, false, C, OC, N, inp, C, dout, OC, dweight, true);
  }
  if (dbias != nullptr) {
    column_sum_kernel<<<grid_blocks(OC, kColumnLanes, "matmul_backward"), kColumnThreads, 0,
                        stream>>>(dbias, dout, N, OC);
    ZERO_CUDA_CHECK_LAUNCH();
  }
  // dinp [N, C] = dout [N, OC] @ W^T, where W^T is the stored [OC, C] itself for kOutIn.
  if (dinp != nullptr) {
    row_major_sgemm(handle, stream, false, !out_in, N, C, OC, dout, OC, weight, out_in ? C : OC,
                    dinp, false);
  }
}

void gelu_forward(float* out, const float* inp, size_t n, CUstream_st* stream) {
  const uint32_t blocks = grid_blocks(n, kElementThreads, "gelu_forward");
  if (blocks == 0) return;
  gelu_forward_kernel<<<blocks, kElementThreads, 0, stream>>>(out, inp, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                   CUstream_st* stream) {
  const uint32_t blocks = grid_blocks(n, kElementThreads, "gelu_backward");
  if (blocks == 0) return;
  gelu_backward_kernel<<<blocks, kElementThreads, 0, stream>>>(dinp, inp, dout, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

namespace {
void check_attention(const char* op, int B, int T, int C, int NH) {
  check_dims(op, B, T, C);
  ZERO_CHECK(NH > 0 && C > 0 && C % NH == 0,
             op << ": " << C << " channels do not split into " << NH << " heads");
  ZERO_CHECK(T <= kMaxAttentionT, op << ": T = " << T << " is over the " << kMaxAttentionT
                                     << " positions whose scores fit in a block's shared memory");
}
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       CUstream_st* stream) {
  check_attention("attention_forward", B, T, C, NH);
  const uint32_t blocks = grid_blocks(static_cast<size_t>(B) * NH * T, 1, "attention_forward");
  if (blocks == 0) return;
  attention_forward_kernel<<<blocks, kRowThreads, T * sizeof(float), stream>>>(out, lse, qkv, T, C,
                                                                               NH);
  ZERO_CUDA_CHECK_LAUNCH();
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, CUstream_st* stream) {
  check_attention("attention_backward", B, T, C, NH);
  const uint32_t blocks = grid_blocks(static_cast<size_t>(B) * NH * T, 1, "attention_backward");
  if (blocks == 0) return;
  attention_dq_kernel<<<blocks, kRowThreads, T * sizeof(float), stream>>>(dqkv, dout, qkv, out, lse,
                                                                          T, C, NH);
  ZERO_CUDA_CHECK_LAUNCH();
  attention_dkv_kernel<<<blocks, kRowThreads, 2 * T * sizeof(float), stream>>>(dqkv, dout, qkv, out,
                                                                               lse, T, C, NH);
  ZERO_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V, int Vp, CUstream_st* stream) {
  check_dims("cross_entropy_forward", N, V, Vp);
  ZERO_CHECK(V > 0 && V <= Vp, "cross_entropy_forward: V = " << V << " with Vp = " << Vp);
  if (N == 0) return;
  cross_entropy_forward_kernel<<<grid_blocks(N, 1, "cross_entropy_forward"), kRowThreads, 0,
                                 stream>>>(losses, lse, logits, targets, V, Vp);
  ZERO_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            CUstream_st* stream) {
  cross_entropy_backward_partial(dlogits, logits, lse, targets, 0, dloss, N, V, Vp, stream);
}

void cross_entropy_partials(float* lse, float* target_logits, const float* logits,
                            const int32_t* targets, int first, int N, int V, int Vp,
                            CUstream_st* stream) {
  check_dims("cross_entropy_partials", N, V, Vp);
  ZERO_CHECK(V > 0 && V <= Vp && first >= 0,
             "cross_entropy_partials: V = " << V << " with Vp = " << Vp << ", first " << first);
  if (N == 0) return;
  cross_entropy_partials_kernel<<<grid_blocks(N, 1, "cross_entropy_partials"), kRowThreads, 0,
                                  stream>>>(lse, target_logits, logits, targets, first, V, Vp);
  ZERO_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward_partial(float* dlogits, const float* logits, const float* lse,
                                    const int32_t* targets, int first, float dloss, int N, int V,
                                    int Vp, CUstream_st* stream) {
  check_dims("cross_entropy_backward", N, V, Vp);
  ZERO_CHECK(V > 0 && V <= Vp && first >= 0,
             "cross_entropy_backward: V = " << V << " with Vp = " << Vp << ", first " << first);
  const uint32_t blocks =
      grid_blocks(static_cast<size_t>(N) * Vp, kElementThreads, "cross_entropy_backward");
  if (blocks == 0) return;
  cross_entropy_backward_kernel<<<blocks, kElementThreads, 0, stream>>>(
      dlogits, logits, lse, targets, first, dloss, N, V, Vp);
  ZERO_CUDA_CHECK_LAUNCH();
}

}  // namespace zero::kernels::cuda
