// The GPT-2's operations on a GPU: the CUDA kernels and cuBLAS GEMMs, on the compute stream of
// the engine's device context.
#include <cuda_runtime.h>

#include "models/gpt2_ops.h"
#include "zero/core/check.h"
#include "zero/kernels/cublas_check.h"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_transformer_kernels.h"

namespace zero::models {

namespace {

namespace cuda = kernels::cuda;

class CudaGpt2Ops : public Gpt2Ops {
 public:
  explicit CudaGpt2Ops(std::shared_ptr<DeviceContext> device)
      : device_(std::move(device)), stream_(device_->cuda_stream()) {
    ZERO_CUBLAS_CHECK(cublasCreate(&blas_));
    // fp32 GEMMs as the CPU computes them: no TF32 rounding of the inputs.
    ZERO_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  }
  ~CudaGpt2Ops() override {
    if (targets_ != nullptr) device_->deallocate(targets_, targets_bytes_);
    cublasDestroy(blas_);
  }
  CudaGpt2Ops(const CudaGpt2Ops&) = delete;
  CudaGpt2Ops& operator=(const CudaGpt2Ops&) = delete;

  void embedding_forward(float* out, const float* tokens, const float* wte, const float* wpe, int B,
                         int T, int C) override {
    cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, stream_);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens, int B,
                          int T, int C) override {
    cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, stream_);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, int N, int C, float eps) override {
    cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps, stream_);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, int N, int C) override {
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, stream_);
  }
  // Its products are fp32 (takes_bf16_weights() is false): every weight comes as fp32.
  void matmul_forward(float* out, const float* inp, kernels::MatrixWeight weight, const float* bias,
                      int N, int C, int OC, kernels::WeightLayout layout) override {
    check_fp32(weight, "matmul_forward");
    cuda::matmul_forward(out, inp, weight.values, bias, N, C, OC, layout, blas_, stream_);
  }
  void matmul_backward(float* dinp, kernels::MatrixGradient dweight, float* dbias,
                       const float* dout, const float* inp, kernels::MatrixWeight weight, int N,
                       int C, int OC, kernels::WeightLayout layout) override {
    check_fp32(weight, "matmul_backward");
    ZERO_CHECK(dweight.bf16_bits == nullptr,
               "matmul_backward: the GPU's products add into fp32 weight gradients only");
    cuda::matmul_backward(dinp, dweight.values, dbias, dout, inp, weight.values, N, C, OC, layout,
                          blas_, stream_);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    cuda::gelu_forward(out, inp, n, stream_);
  }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    cuda::gelu_backward(dinp, inp, dout, n, stream_);
  }
  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                         int NH) override {
    cuda::attention_forward(out, lse, qkv, B, T, C, NH, stream_);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* lse, int B, int T, int C, int NH) override {
    cuda::attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, stream_);
  }
  void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                             int N, int V) override {
    cuda::cross_entropy_forward(losses, lse, logits, targets, N, V, V, stream_);
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                              const int32_t* targets, float dloss, int N, int V) override {
    cuda::cross_entropy_backward(dlogits, logits, lse, targets, dloss, N, V, V, stream_);
  }
  // The vocabulary-parallel embedding and cross-entropy (tensor parallelism).
  void embedding_forward_rows(float* out, const float* tokens, const float* wte_rows,
                              const float* wpe, int first, int rows, int B, int T, int C) override {
    cuda::embedding_forward_rows(out, tokens, wte_rows, wpe, first, rows, B, T, C, stream_);
  }
  void embedding_backward_rows(float* dwte_rows, float* dwpe, const float* dout,
                               const float* tokens, int first, int rows, int B, int T,
                               int C) override {
    cuda::embedding_backward_rows(dwte_rows, dwpe, dout, tokens, first, rows, B, T, C, stream_);
  }
  void cross_entropy_partials(float* lse, float* target_logits, const float* logits,
                              const int32_t* targets, int first, int N, int V, int Vp) override {
    cuda::cross_entropy_partials(lse, target_logits, logits, targets, first, N, V, Vp, stream_);
  }
  void cross_entropy_backward_partial(float* dlogits, const float* logits, const float* lse,
                                      const int32_t* targets, int first, float dloss, int N, int V,
                                      int Vp) override {
    cuda::cross_entropy_backward_partial(dlogits, logits, lse, targets, first, dloss, N, V, Vp,
                                         stream_);
  }
  void add(float* dst, const float* src, size_t n) override {
    device_->add(dst, DType::kFloat32, src, DType::kFloat32, n);
  }
  const int32_t* targets(const std::vector<int32_t>& ids) override {
    const size_t bytes = ids.size() * sizeof(int32_t);
    if (bytes != targets_bytes_) {
      if (targets_ != nullptr) device_->deallocate(targets_, targets_bytes_);
      targets_ = device_->allocate(bytes);
      ZERO_CHECK(targets_ != nullptr || bytes == 0,
                 "out of " << device_->memory_name() << " for the GPT-2's targets");
      targets_bytes_ = bytes;
    }
    device_->copy_from_host(targets_, ids.data(), bytes);
    return static_cast<const int32_t*>(targets_);
  }

 private:
  static void check_fp32(const kernels::MatrixWeight& weight, const char* kernel) {
    ZERO_CHECK(weight.bf16_bits == nullptr,
               kernel << " on a GPU got a bf16 weight; its products take fp32 weights only");
  }

  std::shared_ptr<DeviceContext> device_;
  CUstream_st* stream_;
  cublasHandle_t blas_ = nullptr;
  void* targets_ = nullptr;
  size_t targets_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Gpt2Ops> make_cuda_gpt2_ops(std::shared_ptr<DeviceContext> device) {
  return std::make_unique<CudaGpt2Ops>(std::move(device));
}

}  // namespace zero::models
