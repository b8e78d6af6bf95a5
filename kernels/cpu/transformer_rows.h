// Causal attention and log-sum-exp written once over a set of vector primitives, which each
// path supplies as a struct of static functions in its own anonymous namespace (so every
// instantiation is local to its translation unit and the AVX2 one can never stand in for the
// scalar one at link time):
//   float dot(const float* a, const float* b, size_t n)
//   void axpy(float* y, float a, const float* x, size_t n)          y += a * x
//   void scale(float* y, float a, size_t n)                          y *= a
//   float max(const float* x, size_t n)                              n >= 1
//   float exp_shift(float* y, const float* x, float shift, float factor, size_t n)
//       y = exp(x - shift) * factor (y may be x, or null when only the sum is wanted);
//       returns the sum of exp(x - shift)
//   float log(float x)
// These templates call nothing else, for the same reason.
#pragma once

#include <cstddef>
#include <cstring>

namespace zero::kernels::detail {

template <typename Ops>
float logsumexp_row(const float* x, size_t n) {
  float max = Ops::max(x, n);
  float sum = Ops::exp_shift(nullptr, x, max, 1.0f, n);
  return max + Ops::log(sum);
}

// One (sequence, head) pair; pointers as in TransformerPath::attention_forward. Query row i
// sees keys 0..i: its scaled scores go to `scores`, become exp(score - max) in place, and
// weigh the values; the sum of the weights divides once at the end.
template <typename Ops>
void attention_forward_head(float* out, float* lse, const float* qkv, size_t T, size_t C,
                            size_t head_size, float scale, float* scores) {
  const size_t stride = 3 * C;
  for (size_t i = 0; i < T; ++i) {
    const float* q = qkv + i * stride;
    for (size_t j = 0; j <= i; ++j) {
      scores[j] = Ops::dot(q, qkv + j * stride + C, head_size) * scale;
    }
    float max = Ops::max(scores, i + 1);
    float sum = Ops::exp_shift(scores, scores, max, 1.0f, i + 1);
    float* o = out + i * C;
    std::memset(o, 0, head_size * sizeof(float));
    for (size_t j = 0; j <= i; ++j) Ops::axpy(o, scores[j], qkv + j * stride + 2 * C, head_size);
    Ops::scale(o, 1.0f / sum, head_size);
    lse[i] = max + Ops::log(sum);
  }
}

// The flash-attention backward for one pair: row i's probabilities p_j = exp(s_ij - lse_i) are
// recomputed into `probs`; with dp_j = dout_i . v_j and D_i = dout_i . out_i (= sum_j p_j dp_j),
// the score gradient is ds_j = p_j (dp_j - D_i). Rows j <= i of dk and dv gather from every
// later query row, so the whole head stays on one thread.
template <typename Ops>
void attention_backward_head(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, size_t T, size_t C, size_t head_size, float scale,
                             float* probs) {
  const size_t stride = 3 * C;
  for (size_t t = 0; t < T; ++t) {
    for (size_t part = 0; part < 3; ++part) {
      std::memset(dqkv + t * stride + part * C, 0, head_size * sizeof(float));
    }
  }
  for (size_t i = 0; i < T; ++i) {
    const float* q = qkv + i * stride;
    const float* d_out = dout + i * C;
    float* dq = dqkv + i * stride;
    for (size_t j = 0; j <= i; ++j) {
      probs[j] = Ops::dot(q, qkv + j * stride + C, head_size) * scale;
    }
    Ops::exp_shift(probs, probs, lse[i], 1.0f, i + 1);
    const float d_i = Ops::dot(d_out, out + i * C, head_size);
    for (size_t j = 0; j <= i; ++j) {
      const float* k = qkv + j * stride + C;
      const float* v = k + C;
      float* dk = dqkv + j * stride + C;
      float* dv = dk + C;
      float dp = Ops::dot(d_out, v, head_size);
      float ds = probs[j] * (dp - d_i) * scale;
      Ops::axpy(dv, probs[j], d_out, head_size);
      Ops::axpy(dq, ds, k, head_size);
      Ops::axpy(dk, ds, q, head_size);
    }
  }
}

}  // namespace zero::kernels::detail
