// The implementations the transformer kernels (transformer_kernels.cpp, transformer_attention.cpp)
// choose between for the loops that dominate their time: plain scalar loops
// (transformer_scalar.cpp), AVX2/FMA loops (transformer_avx2.cpp) and AVX-512 loops
// (transformer_avx512.cpp). Unlike the optimizer kernels, the paths need not agree bit for bit: the
// vector paths fuse multiply-adds and evaluate exp with their own polynomial, and a row's sums run
// over 8 lanes (AVX2) or 16 (AVX-512) before the lanes are added, so the AVX-512 results differ
// from the AVX2 ones in the sums' rounding only (the element-wise GELU and exp agree bit for bit).
// Each agrees with the exact (double precision) definitions to float rounding.
//
// Every entry works on whole rows, so a value never depends on how the dispatcher split the work
// over threads. Attention is GEMMs around the softmax rows' logsumexp and scaled_exp.
#pragma once

#include <cstddef>

namespace zero::kernels::detail {

// GELU's tanh approximation: gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// Both paths evaluate it as x * sigmoid(2u) = x / (1 + exp(-2u)), which is the same function
// without the cancellation 1 + tanh(u) suffers for negative x. exp's argument is capped at
// kGeluMaxExpArg so that it stays finite (gelu is then below 1e-36 in magnitude anyway).
constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluMaxExpArg = 88.0f;

struct TransformerPath {
  // `rows` rows of C values: out, mean and rstd as in layernorm_forward.
  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, size_t rows, size_t C,
                            float eps);
  // dinp += the gradient of `rows` rows (dweight and dbias are summed over columns elsewhere).
  void (*layernorm_backward_input)(float* dinp, const float* dout, const float* inp,
                                   const float* weight, const float* mean, const float* rstd,
                                   size_t rows, size_t C);
  void (*gelu_forward)(float* out, const float* inp, size_t n);
  void (*gelu_backward)(float* dinp, const float* inp, const float* dout, size_t n);
  // log(sum of exp(x[i])) over n values, computed around their maximum.
  float (*logsumexp)(const float* x, size_t n);
  // y[i] = exp(x[i] - shift) * factor; y may be x.
  void (*scaled_exp)(float* y, const float* x, float shift, float factor, size_t n);
  // y = softmax(x) over n values; returns logsumexp(x), the same bits as logsumexp's.
  float (*softmax)(float* y, const float* x, size_t n);
};

extern const TransformerPath kTransformerScalarPath;
extern const TransformerPath kTransformerAvx2Path;
extern const TransformerPath kTransformerAvx512Path;

}  // namespace zero::kernels::detail
