// The operations of a GPT-2 (models/gpt2) on the CPU, in fp32: embeddings, LayerNorm, GEMMs
// through OpenBLAS, GELU, causal self-attention and the fused softmax + cross-entropy. Each has
// its forward and its backward. Row-major arrays, llm.c's shapes: B sequences of T positions,
// C channels, NH heads of C / NH channels, vocabulary V padded to Vp columns.
//
// Gradient conventions: gradients of parameters (dweight, dbias, dwte, dwpe) are added into
// (+=), so micro-batches and the two uses of a tied embedding sum up. Gradients of inputs are
// overwritten, except layernorm_backward's dinp, which is added into: it lands on the residual
// stream, which already holds the gradient of the skip connection.
//
// Threads: opt.threads splits each kernel's rows (or columns, or attention's (sequence, head)
// pairs) over threads. The GEMMs run as fixed blocks of rows or columns spread over the same
// threads, each block one single-threaded OpenBLAS call (the kernels set OpenBLAS's thread count
// to 1), because OpenBLAS's own threading changes the bits with the thread count. Every kernel
// returns the same bits for any thread count. The AVX2 and scalar paths (cpu_kernels.h) agree
// with each other and with the exact definitions to float rounding, not bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels {

// out[b, t, :] = wte[token[b, t], :] + wpe[t, :]. Token ids arrive as floats (exact integers,
// the way the model's input tensor carries them) and must lie in [0, V): the caller checks.
void embedding_forward(float* out, const float* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, const KernelOptions& opt = {});
// dwte[token, :] += dout[b, t, :]; dwpe[t, :] += sum over b of dout[b, t, :].
void embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens, int B,
                        int T, int C, const KernelOptions& opt = {});
// The same with a 16-bit table (bf16 or fp16 bits: a mixed-precision run's working copy and
// gradient), touching only the rows the tokens name: forward widens those rows alone, where
// widening the whole table first reads and writes every row (a GPT-2 vocabulary's 50257) for a
// batch's few thousand. Backward sums each named row's dout rows in fp32 in position order and
// adds the sum into dwte's row, rounding once, and dwpe (fp32) as embedding_backward: the bits
// of embedding_backward into a zeroed fp32 table added into dwte, whose other rows it leaves as
// they are. dwte may be null (a frozen table): only dwpe then.
void embedding_forward_16bit(float* out, const float* tokens, const void* wte, DType wte_dtype,
                             const float* wpe, int B, int T, int C, const KernelOptions& opt = {});
void embedding_backward_16bit(void* dwte, DType dwte_dtype, float* dwpe, const float* dout,
                              const float* tokens, int B, int T, int C,
                              const KernelOptions& opt = {});

// out = (inp - mean) * rstd * weight + bias over the last dimension of inp [N, C]; mean and rstd
// [N] are saved for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps, const KernelOptions& opt = {});
// dinp += d/dinp; dweight += ...; dbias += .... Either part may be skipped: dinp null (weight
// is then not read), or dweight and dbias both null. Each part's numbers are those of the call
// that computes both (a zero-bubble schedule runs them apart).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, const KernelOptions& opt = {});

// Whether opt.bf16_products runs the products in bf16 in this process: the build has oneDNN, the
// CPU bf16 arithmetic (cpu_features.h), and ZERO_BF16_PRODUCTS is not "fp32" (read once).
// Where it does not, bf16_products is ignored and the products run in fp32 as without it.
bool bf16_products_in_bf16();
// Whether opt.bf16_products runs attention's products in bf16 too (attention_forward and
// attention_backward: q, k, v, the output's gradient, the probabilities and the scores'
// gradient rounded to bf16, fp32 accumulation; the softmax stays fp32). Where bf16 products run
// in bf16 and oneDNN runs on avx512_core_bf16; not on AMX, whose oneDNN ran the attention tiles'
// small GEMMs at 0.47x of OpenBLAS's fp32 (Intel Xeon), where avx512_core_bf16 runs them at
// 2.5-3x (AMD EPYC). ZERO_BF16_ATTENTION=bf16 or fp32 in the environment (read once) decides
// instead, for bf16 products that run in bf16.
bool bf16_attention_in_bf16();
// What bf16 products run on, for kernel_summary(): "oneDNN bf16 (avx512_core_bf16); attention
// products bf16", or why fp32.
std::string bf16_products_description();

// How a weight matrix is stored: [in, out] (Hugging Face GPT-2's Conv1D: out = inp @ W) or
// [out, in] (a tied LM head reading the token embedding: out = inp @ W^T).
enum class WeightLayout { kInOut, kOutIn };
// A weight matrix's values: fp32 (a pointer converts), or bf16 (raw bits) where a bf16 run's
// working copy holds them so and the products run in bf16 (opt.bf16_products where
// bf16_products_in_bf16()): they take them as they are, with no fp32 copy to round again. A bf16
// weight for fp32 products is a zero::Error.
struct MatrixWeight {
  MatrixWeight(const float* fp32) : values(fp32) {}  // NOLINT(google-explicit-constructor)
  static MatrixWeight bf16(const uint16_t* bits) {
    MatrixWeight weight(nullptr);
    weight.bf16_bits = bits;
    return weight;
  }
  const float* values = nullptr;
  const uint16_t* bf16_bits = nullptr;
};
// out[N, OC] = inp[N, C] @ W + bias (bias may be null).
void matmul_forward(float* out, const float* inp, MatrixWeight weight, const float* bias, int N,
                    int C, int OC, WeightLayout layout, const KernelOptions& opt = {});
// The weight's gradient that matmul_backward adds into: fp32, or in bf16 products a bf16 run's
// bf16 gradient as it is (MatrixGradient::bf16), added to inside the products, each value the
// fp32 sum rounded once: the bits of adding an fp32 product into it, without the fp32 copy to
// zero, fill and add. A bf16 gradient for fp32 products is a zero::Error.
struct MatrixGradient {
  MatrixGradient(float* fp32) : values(fp32) {}  // NOLINT(google-explicit-constructor)
  static MatrixGradient bf16(uint16_t* bits) {
    MatrixGradient gradient(nullptr);
    gradient.bf16_bits = bits;
    return gradient;
  }
  bool empty() const { return values == nullptr && bf16_bits == nullptr; }
  float* values = nullptr;
  uint16_t* bf16_bits = nullptr;
};
// dinp = dout @ W^T (skipped when dinp is null; weight is then not read); dweight += inp^T @ dout
// in the weight's layout (skipped when dweight is empty; inp is then not read); dbias += the
// column sums of dout (skipped when dbias is null). dinp may be inp itself: the gradients of the
// weight and bias are complete before dinp is written.
void matmul_backward(float* dinp, MatrixGradient dweight, float* dbias, const float* dout,
                     const float* inp, MatrixWeight weight, int N, int C, int OC,
                     WeightLayout layout, const KernelOptions& opt = {});
// An output gradient as cross_entropy_forward_bf16_gradient leaves it: `scale` times the bf16
// values (raw bits) of a matrix [N, OC] whose rows start `ld` elements apart.
struct ScaledBf16Gradient {
  const uint16_t* bits;
  size_t ld;
  float scale;
};
// matmul_backward without a bias for such a gradient, scaled inside the products (their alpha):
// dinp = scale dout @ W^T, dweight += scale dout^T @ inp (dinp may be inp itself, as in
// matmul_backward: the weight's gradient is complete first). bf16 products only: a zero::Error
// where they run in fp32 (opt.bf16_products unset, or !bf16_products_in_bf16()).
void matmul_backward_scaled_bf16(float* dinp, MatrixGradient dweight, ScaledBf16Gradient dout,
                                 const float* inp, MatrixWeight weight, int N, int C, int OC,
                                 WeightLayout layout, const KernelOptions& opt = {});

// GELU with GPT-2's tanh approximation, element-wise over n values; dinp = gelu'(inp) * dout,
// which may be computed in place (dinp the same buffer as dout or inp).
void gelu_forward(float* out, const float* inp, size_t n, const KernelOptions& opt = {});
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                   const KernelOptions& opt = {});

// Causal self-attention. qkv [B, T, 3C] holds q, k and v side by side (head h uses channels
// [h * C/NH, (h + 1) * C/NH) of each); out [B, T, C] = softmax(q k^T / sqrt(C/NH), causal) v.
// lse [B, NH, T] saves each query row's log-sum-exp of the scaled scores, so backward recomputes
// the probabilities instead of keeping a T x T matrix per head.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       const KernelOptions& opt = {});
// dqkv [B, T, 3C] = the gradient of out with respect to qkv (overwritten), from dout and what
// forward saved (its qkv, out and lse).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH,
                        const KernelOptions& opt = {});

// Fused softmax + cross-entropy over logits [N, Vp] of which the first V columns are real (the
// rest pad the GEMM and never enter the loss). losses[n] = logsumexp(logits[n, :V]) -
// logits[n, target[n]]; lse [N] is saved for the backward. targets must lie in [0, V).
void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V, int Vp, const KernelOptions& opt = {});
// dlogits[n, v] = (softmax(logits[n])[v] - [v == target[n]]) * dloss for v < V, 0 in the
// padding. dlogits may be logits itself (the logits are then consumed).
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            const KernelOptions& opt = {});
// The forward and the gradient in one pass over the logits, for bf16 products and a loss whose
// gradient's scale is not known yet: losses and lse as cross_entropy_forward (the same bits),
// and each row of logits replaced by softmax(row) - [v == target] (0 in the padding), rounded
// to bf16, in the first half of the row's own memory: a bf16 matrix [N, Vp] with a leading
// dimension of 2 Vp, which matmul_backward_scaled_bf16 takes. Each row is read from
// memory once, where the forward, the backward and the products' rounding read the logits
// three times and write them twice. softmax is exp(x - max) / sum here, exp(x - lse) in
// cross_entropy_backward: the two round differently in fp32, within one bf16 step after rounding.
void cross_entropy_forward_bf16_gradient(float* losses, float* lse, float* logits,
                                         const int32_t* targets, int N, int V, int Vp,
                                         const KernelOptions& opt = {});

}  // namespace zero::kernels
