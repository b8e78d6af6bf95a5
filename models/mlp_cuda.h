// The GPU math of the example MLP (mlp_cuda.cu, built with CUDA only): cuBLAS GEMMs and a few
// element kernels, all enqueued on the given stream (the compute stream of the engine's device).
// Matrices are row-major fp32 in device memory, as the CPU path's OpenBLAS calls take them.
#pragma once

#include <cstddef>
#include <memory>

struct CUstream_st;

namespace zero::models::gpu {

// A cuBLAS handle of the current device.
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // y[rows, n] = x[rows, k] · w[n, k]^T
  void x_wt(CUstream_st* stream, const float* x, const float* w, float* y, int rows, int k, int n);
  // dw[n, k] = g[rows, n]^T · x[rows, k]
  void gt_x(CUstream_st* stream, const float* g, const float* x, float* dw, int rows, int k, int n);
  // dx[rows, k] = g[rows, n] · w[n, k]
  void g_w(CUstream_st* stream, const float* g, const float* w, float* dx, int rows, int k, int n);

 private:
  struct Handle;
  std::unique_ptr<Handle> handle_;
};

// y[r, c] = y[r, c] + bias[c], then max(0, .) when relu.
void add_bias(CUstream_st* stream, float* y, const float* bias, int rows, int cols, bool relu);
// g[i] = 0 where y[i] <= 0 (the ReLU's backward, from its output).
void relu_backward(CUstream_st* stream, float* g, const float* y, size_t n);
// sums[c] = sum over r of g[r, c], each column added in row order.
void column_sums(CUstream_st* stream, const float* g, int rows, int cols, float* sums);
// diff[i] = p[i] - t[i]; grad[i] = 2 diff[i] / n (the mean squared error's gradient).
void mse_diff(CUstream_st* stream, const float* p, const float* t, float* diff, float* grad,
              size_t n);

}  // namespace zero::models::gpu
