// The GPT-2's operations on host memory: the CPU kernels, each split over `threads`.
#include "models/gpt2_ops.h"
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
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override {
    kernels::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps, opt_);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    kernels::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, opt_);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                      int C, int OC, kernels::WeightLayout layout) override {
    kernels::matmul_forward(out, inp, weight, bias, N, C, OC, layout, opt_);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int N, int C, int OC,
                       kernels::WeightLayout layout) override {
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
  void add(float* dst, const float* src, size_t n) override {
    kernels::accumulate(dst, src, n, opt_);
  }
  const int32_t* targets(const std::vector<int32_t>& ids) override { return ids.data(); }

 private:
  kernels::KernelOptions opt_;
};

}  // namespace

std::unique_ptr<Gpt2Ops> make_cpu_gpt2_ops(int threads) {
  return std::make_unique<CpuGpt2Ops>(threads);
}

#if !ZERO_HAVE_CUDA
std::unique_ptr<Gpt2Ops> make_cuda_gpt2_ops(std::shared_ptr<DeviceContext>) {
  ZERO_FAIL("the GPT-2 on a GPU needs a build with CUDA");
}
#endif

}  // namespace zero::models
