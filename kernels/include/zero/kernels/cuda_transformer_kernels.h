// The GPT-2 operations of transformer_kernels.h as CUDA kernels, on device memory: the same
// names, arguments and contracts (shapes, += versus overwrite, float token ids, WeightLayout),
// with KernelOptions replaced by the stream the work is enqueued on (and, for the GEMMs, the
// cuBLAS handle that runs them). Every function only enqueues work: no host synchronization,
// and no device value is read on the host, so the caller checks token ids and targets.
//
// Results match the CPU kernels to float rounding, not bitwise: the reductions sum in a
// different (but fixed) order. Every reduction, the row sums of dweight, dbias, dwpe and dwte
// included, runs in an order set by the shapes alone, without float atomics, so the same inputs
// give the same bits on every run.
//
// Like cuda_kernels.h, this header needs no CUDA headers: CUstream_st* is cudaStream_t and
// cublasContext* is cublasHandle_t.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero/kernels/transformer_kernels.h"

struct CUstream_st;
struct cublasContext;

namespace zero::kernels::cuda {

void embedding_forward(float* out, const float* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, CUstream_st* stream);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens, int B,
                        int T, int C, CUstream_st* stream);
// The vocabulary-parallel embedding of a tensor-parallel rank holding rows [first, first + rows)
// of wte (models/gpt2_ops.h has the contracts): a token outside them looks up zeros and adds
// nothing to dwte_rows; a null wpe is not added in forward.
void embedding_forward_rows(float* out, const float* tokens, const float* wte_rows,
                            const float* wpe, int first, int rows, int B, int T, int C,
                            CUstream_st* stream);
void embedding_backward_rows(float* dwte_rows, float* dwpe, const float* dout, const float* tokens,
                             int first, int rows, int B, int T, int C, CUstream_st* stream);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps, CUstream_st* stream);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, CUstream_st* stream);

// The GEMMs run on `handle` with cublasSgemm, after cublasSetStream(handle, stream); the handle
// must use host pointers for alpha and beta (cuBLAS's default). Its math mode is the caller's:
// the default computes in fp32, CUBLAS_TF32_TENSOR_OP_MATH trades precision for speed.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, WeightLayout layout, cublasContext* handle, CUstream_st* stream);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, WeightLayout layout,
                     cublasContext* handle, CUstream_st* stream);

void gelu_forward(float* out, const float* inp, size_t n, CUstream_st* stream);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, CUstream_st* stream);

// T is at most 6144: a block keeps up to two rows of T scores in shared memory.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       CUstream_st* stream);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, CUstream_st* stream);

// targets is a device array too.
void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V, int Vp, CUstream_st* stream);
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            CUstream_st* stream);
// The vocabulary-parallel cross-entropy over this rank's V columns (tokens first .. first +
// V - 1) of logits [N, Vp]: each row's lse over them and the target's logit where the target is
// this rank's (else 0); backward with the whole vocabulary's lse, the padding zeroed.
void cross_entropy_partials(float* lse, float* target_logits, const float* logits,
                            const int32_t* targets, int first, int N, int V, int Vp,
                            CUstream_st* stream);
void cross_entropy_backward_partial(float* dlogits, const float* logits, const float* lse,
                                    const int32_t* targets, int first, float dloss, int N, int V,
                                    int Vp, CUstream_st* stream);

}  // namespace zero::kernels::cuda
