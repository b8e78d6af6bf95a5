// The GPT-2's operations on host memory: the CPU kernels, each split over `threads`.
#include "models/gpt2_ops.h"

#include <algorithm>
#include <cmath>

#include "zero/core/check.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::models {

namespace {

class CpuGpt2Ops : public Gpt2Ops {
 public:
  explicit CpuGpt2Ops(int threads) : opt_{threads} {}

  void embedding_forward(float* out, const float* tokens, const float* wte, const float* wpe, int B,
                         int T, int C) override {
    kernels::embedding_forward(out, tokens, wte, wpe, B, T, C, opt_);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens, int B,
                          int T, int C) override {
    kernels::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, opt_);
  }
  bool embeds_16bit_tables() const override { return true; }
  void embedding_forward_16bit(float* out, const float* tokens, const void* wte, DType wte_dtype,
                               const float* wpe, int B, int T, int C) override {
    kernels::embedding_forward_16bit(out, tokens, wte, wte_dtype, wpe, B, T, C, opt_);
  }
  void embedding_backward_16bit(void* dwte, DType dwte_dtype, float* dwpe, const float* dout,
                                const float* tokens, int B, int T, int C) override {
    kernels::embedding_backward_16bit(dwte, dwte_dtype, dwpe, dout, tokens, B, T, C, opt_);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override {
    kernels::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps, opt_);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    kernels::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, opt_);
  }
  void matmul_forward(float* out, const float* inp, kernels::MatrixWeight weight, const float* bias,
                      int N, int C, int OC, kernels::WeightLayout layout) override {
    kernels::matmul_forward(out, inp, weight, bias, N, C, OC, layout, opt_);
  }
  void matmul_backward(float* dinp, kernels::MatrixGradient dweight, float* dbias,
                       const float* dout, const float* inp, kernels::MatrixWeight weight, int N,
                       int C, int OC, kernels::WeightLayout layout) override {
    kernels::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, layout, opt_);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    kernels::gelu_forward(out, inp, n, opt_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    kernels::gelu_backward(dinp, inp, dout, n, opt_);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                         int NH) override {
    kernels::attention_forward(out, lse, qkv, B, T, C, NH, opt_);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int C, int NH) override {
    kernels::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, opt_);
  }
  void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                             int N, int V) override {
    kernels::cross_entropy_forward(losses, lse, logits, targets, N, V, V, opt_);
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                              const int32_t* targets, float dloss, int N, int V) override {
    kernels::cross_entropy_backward(dlogits, logits, lse, targets, dloss, N, V, V, opt_);
  }
  // The vocabulary-parallel operations (tensor parallelism): plain loops.
  void embedding_forward_rows(float* out, const float* tokens, const float* wte_rows,
                              const float* wpe, int first, int rows, int B, int T, int C) override {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        float* o = out + (static_cast<size_t>(b) * T + t) * C;
        const int row = static_cast<int>(tokens[b * T + t]) - first;
        const float* w = row >= 0 && row < rows ? wte_rows + static_cast<size_t>(row) * C : nullptr;
        const float* p = wpe != nullptr ? wpe + static_cast<size_t>(t) * C : nullptr;
        for (int c = 0; c < C; ++c) o[c] = (w ? w[c] : 0.0f) + (p ? p[c] : 0.0f);
      }
    }
  }
  void embedding_backward_rows(float* dwte_rows, float* dwpe, const float* dout,
                               const float* tokens, int first, int rows, int B, int T,
                               int C) override {
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
        const int row = static_cast<int>(tokens[b * T + t]) - first;
        if (row >= 0 && row < rows) {
          float* w = dwte_rows + static_cast<size_t>(row) * C;
          for (int c = 0; c < C; ++c) w[c] += d[c];
        }
      }
    }
    // The positions' gradient as the whole table's kernel sums it (over b, in order).
    for (int t = 0; t < T; ++t) {
      float* p = dwpe + static_cast<size_t>(t) * C;
      for (int b = 0; b < B; ++b) {
        const float* d = dout + (static_cast<size_t>(b) * T + t) * C;
        for (int c = 0; c < C; ++c) p[c] += d[c];
      }
    }
  }
  void cross_entropy_partials(float* lse, float* target_logits, const float* logits,
                              const int32_t* targets, int first, int N, int V, int Vp) override {
    for (int n = 0; n < N; ++n) {
      const float* row = logits + static_cast<size_t>(n) * Vp;
      float max = row[0];
      for (int v = 1; v < V; ++v) max = std::max(max, row[v]);
      double sum = 0.0;
      for (int v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
      lse[n] = static_cast<float>(max + std::log(sum));
      const int column = targets[n] - first;
      target_logits[n] = column >= 0 && column < V ? row[column] : 0.0f;
    }
  }
  void cross_entropy_backward_partial(float* dlogits, const float* logits, const float* lse,
                                      const int32_t* targets, int first, float dloss, int N, int V,
                                      int Vp) override {
    for (int n = 0; n < N; ++n) {
      const size_t at = static_cast<size_t>(n) * Vp;
      for (int v = 0; v < V; ++v) dlogits[at + v] = std::exp(logits[at + v] - lse[n]) * dloss;
      for (int v = V; v < Vp; ++v) dlogits[at + v] = 0.0f;
      const int column = targets[n] - first;
      if (column >= 0 && column < V) dlogits[at + column] -= dloss;
    }
  }
  void add(float* dst, const float* src, size_t n) override {
    kernels::accumulate(dst, src, n, opt_);
  }
  const int32_t* targets(const std::vector<int32_t>& ids) override { return ids.data(); }
  void set_bf16_products(bool bf16) override { opt_.bf16_products = bf16; }
  bool takes_bf16_weights() const override {
    return opt_.bf16_products && kernels::bf16_products_in_bf16();
  }
  bool fuses_loss_gradient() const override { return takes_bf16_weights(); }
  void cross_entropy_forward_bf16_gradient(float* losses, float* lse, float* logits,
                                           const int32_t* targets, int N, int V) override {
    kernels::cross_entropy_forward_bf16_gradient(losses, lse, logits, targets, N, V, V, opt_);
  }
  // The bf16 rows sit in the first half of each fp32 row: 2 V bf16 values apart.
  void matmul_backward_scaled_bf16(float* dinp, kernels::MatrixGradient dweight,
                                   const float* gradient, float scale, const float* inp,
                                   kernels::MatrixWeight weight, int N, int C, int OC,
                                   kernels::WeightLayout layout) override {
    const kernels::ScaledBf16Gradient dout{reinterpret_cast<const uint16_t*>(gradient),
                                           2 * static_cast<size_t>(OC), scale};
    kernels::matmul_backward_scaled_bf16(dinp, dweight, dout, inp, weight, N, C, OC, layout, opt_);
  }

 private:
  kernels::KernelOptions opt_;
};

}  // namespace

void Gpt2Ops::embedding_forward_16bit(float*, const float*, const void*, DType, const float*, int,
                                      int, int) {
  ZERO_FAIL(
      "these GPT-2 operations take no 16-bit embedding table (embeds_16bit_tables() is "
      "false)");
}

void Gpt2Ops::embedding_backward_16bit(void*, DType, float*, const float*, const float*, int, int,
                                       int) {
  ZERO_FAIL(
      "these GPT-2 operations take no 16-bit embedding table (embeds_16bit_tables() is "
      "false)");
}

void Gpt2Ops::cross_entropy_forward_bf16_gradient(float*, float*, float*, const int32_t*, int,
                                                  int) {
  ZERO_FAIL(
      "these GPT-2 operations do not make the loss's gradient with the loss "
      "(fuses_loss_gradient() is false)");
}

void Gpt2Ops::matmul_backward_scaled_bf16(float*, kernels::MatrixGradient, const float*, float,
                                          const float*, kernels::MatrixWeight, int, int, int,
                                          kernels::WeightLayout) {
  ZERO_FAIL(
      "these GPT-2 operations do not make the loss's gradient with the loss "
      "(fuses_loss_gradient() is false)");
}

std::unique_ptr<Gpt2Ops> make_cpu_gpt2_ops(int threads) {
  return std::make_unique<CpuGpt2Ops>(threads);
}

#if !ZERO_HAVE_CUDA
std::unique_ptr<Gpt2Ops> make_cuda_gpt2_ops(std::shared_ptr<DeviceContext>) {
  ZERO_FAIL("the GPT-2 on a GPU needs a build with CUDA");
}
#endif

}  // namespace zero::models
