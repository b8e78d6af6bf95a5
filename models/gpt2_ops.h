// The GPT-2's operations on the memory its activations live in: the CPU kernels
// (kernels/transformer_kernels.h) on host memory, the CUDA kernels and cuBLAS
// (kernels/cuda_transformer_kernels.h) on a GPU's, on the engine's compute stream. The modules
// of gpt2.cpp call these and never ask which device they run on. Private to models/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "zero/kernels/transformer_kernels.h"
#include "zero/runtime/device.h"

namespace zero::models {

class Gpt2Ops {
 public:
  virtual ~Gpt2Ops() = default;

  // The kernels, with the arguments and conventions of transformer_kernels.h.
  virtual void embedding_forward(float* out, const float* tokens, const float* wte,
                                 const float* wpe, int B, int T, int C) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens,
                                  int B, int T, int C) = 0;
  // Whether the embedding takes a 16-bit table and its 16-bit gradient as they are
  // (kernels::embedding_*_16bit: the rows the tokens name alone), where otherwise the module
  // widens the whole table into fp32 and scatters into a zeroed fp32 copy of its gradient. The
  // two below are called only where this is true.
  virtual bool embeds_16bit_tables() const { return false; }
  virtual void embedding_forward_16bit(float* out, const float* tokens, const void* wte,
                                       DType wte_dtype, const float* wpe, int B, int T, int C);
  virtual void embedding_backward_16bit(void* dwte, DType dwte_dtype, float* dwpe,
                                        const float* dout, const float* tokens, int B, int T,
                                        int C);
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C,
                                 float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;
  // A bf16 weight only where takes_bf16_weights().
  virtual void matmul_forward(float* out, const float* inp, kernels::MatrixWeight weight,
                              const float* bias, int N, int C, int OC,
                              kernels::WeightLayout layout) = 0;
  // A bf16 weight gradient (kernels::MatrixGradient::bf16) only where takes_bf16_weights().
  virtual void matmul_backward(float* dinp, kernels::MatrixGradient dweight, float* dbias,
                               const float* dout, const float* inp, kernels::MatrixWeight weight,
                               int N, int C, int OC, kernels::WeightLayout layout) = 0;
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) = 0;
  virtual void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                                 int NH) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* lse, int B, int T, int C,
                                  int NH) = 0;
  virtual void cross_entropy_forward(float* losses, float* lse, const float* logits,
                                     const int32_t* targets, int N, int V) = 0;
  virtual void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                      const int32_t* targets, float dloss, int N, int V) = 0;

  // The vocabulary-parallel embedding and head (gpt2_tensor_parallel.h): this rank holds rows
  // [first, first + rows) of wte, and the logits of those columns.
  // out[b, t] = wte_rows[token - first] for a token in this rank's rows, else 0; plus wpe[t]
  // when wpe is not null.
  virtual void embedding_forward_rows(float* out, const float* tokens, const float* wte_rows,
                                      const float* wpe, int first, int rows, int B, int T,
                                      int C) = 0;
  // dwte_rows[token - first] += dout[b, t] for the tokens in this rank's rows; dwpe as
  // embedding_backward.
  virtual void embedding_backward_rows(float* dwte_rows, float* dwpe, const float* dout,
                                       const float* tokens, int first, int rows, int B, int T,
                                       int C) = 0;
  // Per row n of logits [N, Vp] (this rank's columns, of which the first V are tokens from
  // `first` on, the rest padding): lse[n] = log sum exp over the V, and target_logits[n] = the
  // target's logit when its column is this rank's, else 0.
  virtual void cross_entropy_partials(float* lse, float* target_logits, const float* logits,
                                      const int32_t* targets, int first, int N, int V, int Vp) = 0;
  // dlogits[n, v] = (exp(logits[n, v] - lse[n]) - [first + v == target[n]]) * dloss for v < V,
  // lse the whole vocabulary's; 0 in the padding; dlogits may be logits.
  virtual void cross_entropy_backward_partial(float* dlogits, const float* logits, const float* lse,
                                              const int32_t* targets, int first, float dloss, int N,
                                              int V, int Vp) = 0;

  // Whether the matrix products (matmul_*; attention's stay fp32) that follow take bf16 inputs with
  // fp32 accumulation: set by each module from its parameters' dtype. The CPU's honour it where the
  // CPU has bf16 arithmetic (transformer_kernels.h); elsewhere, and on a GPU, the products stay
  // fp32.
  virtual void set_bf16_products(bool bf16) { (void)bf16; }
  // Whether the products that follow take bf16 weights as they are (kernels::MatrixWeight::bf16):
  // they run in bf16. A module's bf16 working copy then goes to them without an fp32 copy.
  virtual bool takes_bf16_weights() const { return false; }

  // Whether the LM head makes its loss's gradient together with the loss, in bf16: the products
  // that follow run in bf16 (on the CPU, with the arithmetic), and the gradient they read goes
  // from the logits' memory to them once, where the separate backward would write fp32 values
  // for the products to round again. The two below are called only where this is true.
  virtual bool fuses_loss_gradient() const { return false; }
  // The losses and lse as cross_entropy_forward, and each row of logits [N, V] replaced by its
  // unscaled gradient, softmax - [v == target], as bf16 in the row's first half
  // (kernels::cross_entropy_forward_bf16_gradient).
  virtual void cross_entropy_forward_bf16_gradient(float* losses, float* lse, float* logits,
                                                   const int32_t* targets, int N, int V);
  // matmul_backward (no bias) for the output gradient `scale` times what
  // cross_entropy_forward_bf16_gradient left in `gradient` ([N, OC] logits).
  virtual void matmul_backward_scaled_bf16(float* dinp, kernels::MatrixGradient dweight,
                                           const float* gradient, float scale, const float* inp,
                                           kernels::MatrixWeight weight, int N, int C, int OC,
                                           kernels::WeightLayout layout);

  // dst[i] += src[i]: the residual connections.
  virtual void add(float* dst, const float* src, size_t n) = 0;
  // The targets in this memory (host memory as they are; a GPU copy, kept until the next call).
  virtual const int32_t* targets(const std::vector<int32_t>& ids) = 0;
};

// The CPU's, with `threads` per kernel.
std::unique_ptr<Gpt2Ops> make_cpu_gpt2_ops(int threads);
// The GPU's of a CUDA device context (builds with CUDA only; elsewhere a zero::Error).
std::unique_ptr<Gpt2Ops> make_cuda_gpt2_ops(std::shared_ptr<DeviceContext> device);

}  // namespace zero::models
