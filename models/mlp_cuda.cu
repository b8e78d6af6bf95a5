// The example MLP's GPU math: see mlp_cuda.h.
#include "models/mlp_cuda.h"
#include "zero/kernels/cublas_check.h"
#include "zero/kernels/cuda_check.h"

namespace zero::models::gpu {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

__global__ void add_bias_kernel(float* y, const float* bias, int rows, int cols, bool relu) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<size_t>(rows) * cols) return;
  const float v = y[i] + bias[i % cols];
  y[i] = relu && v <= 0.0f ? 0.0f : v;
}

__global__ void relu_backward_kernel(float* g, const float* y, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && y[i] <= 0.0f) g[i] = 0.0f;
}

__global__ void column_sums_kernel(const float* g, int rows, int cols, float* sums) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += g[static_cast<size_t>(r) * cols + c];
  sums[c] = sum;
}

__global__ void mse_diff_kernel(const float* p, const float* t, float* diff, float* grad,
                                size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float d = p[i] - t[i];
  diff[i] = d;
  grad[i] = 2.0f * d / static_cast<float>(n);
}

}  // namespace

struct Blas::Handle {
  cublasHandle_t handle = nullptr;
};

Blas::Blas() : handle_(std::make_unique<Handle>()) {
  ZERO_CUBLAS_CHECK(cublasCreate(&handle_->handle));
}

Blas::~Blas() {
  cublasDestroy(handle_->handle);
}

// cuBLAS is column-major: a row-major [r, c] matrix is its column-major transpose [c, r] with
// leading dimension c, so each product below is computed transposed, with the operands swapped.
// C[m, n] = op(A)[m, k] · op(B)[k, n], all column-major.
static void sgemm(cublasHandle_t handle, CUstream_st* stream, cublasOperation_t op_a,
                  cublasOperation_t op_b, int m, int n, int k, const float* a, int lda,
                  const float* b, int ldb, float* c, int ldc) {
  const float one = 1.0f, zero = 0.0f;
  ZERO_CUBLAS_CHECK(cublasSetStream(handle, stream));
  ZERO_CUBLAS_CHECK(cublasSgemm(handle, op_a, op_b, m, n, k, &one, a, lda, b, ldb, &zero, c, ldc));
}

void Blas::x_wt(CUstream_st* stream, const float* x, const float* w, float* y, int rows, int k,
                int n) {
  // y^T[n, rows] = w[n, k] · x^T[k, rows]
  sgemm(handle_->handle, stream, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, w, k, x, k, y, n);
}

void Blas::gt_x(CUstream_st* stream, const float* g, const float* x, float* dw, int rows, int k,
                int n) {
  // dw^T[k, n] = x^T[k, rows] · g[rows, n]
  sgemm(handle_->handle, stream, CUBLAS_OP_N, CUBLAS_OP_T, k, n, rows, x, k, g, n, dw, k);
}

void Blas::g_w(CUstream_st* stream, const float* g, const float* w, float* dx, int rows, int k,
               int n) {
  // dx^T[k, rows] = w^T[k, n] · g^T[n, rows]
  sgemm(handle_->handle, stream, CUBLAS_OP_N, CUBLAS_OP_N, k, rows, n, w, k, g, n, dx, k);
}

void add_bias(CUstream_st* stream, float* y, const float* bias, int rows, int cols, bool relu) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, bias, rows, cols, relu);
  ZERO_CUDA_CHECK_LAUNCH();
}

void relu_backward(CUstream_st* stream, float* g, const float* y, size_t n) {
  if (n == 0) return;
  relu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(g, y, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

void column_sums(CUstream_st* stream, const float* g, int rows, int cols, float* sums) {
  if (cols == 0) return;
  column_sums_kernel<<<blocks_for(static_cast<size_t>(cols)), kThreads, 0, stream>>>(g, rows, cols,
                                                                                     sums);
  ZERO_CUDA_CHECK_LAUNCH();
}

void mse_diff(CUstream_st* stream, const float* p, const float* t, float* diff, float* grad,
              size_t n) {
  if (n == 0) return;
  mse_diff_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p, t, diff, grad, n);
  ZERO_CUDA_CHECK_LAUNCH();
}

}  // namespace zero::models::gpu
