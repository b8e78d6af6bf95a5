// Causal self-attention of the transformer kernels: one (sequence, head) pair per work item,
// tiles of query rows as OpenBLAS GEMMs around the active path's softmax rows, and the
// flash-attention backward that recomputes the probabilities from the saved log-sum-exp.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "transformer_threads.h"
#include "zero/kernels/transformer_kernels.h"

namespace zero::kernels {
namespace {

using detail::active_transformer_path;
using detail::check_buffer;
using detail::check_sizes;
using detail::parallel_for;
using detail::product;
using detail::single_threaded_blas;
using detail::TransformerPath;

void check_attention(const char* kernel, int B, int T, int C, int NH) {
  check_sizes(kernel, {B, T, C, NH});
  ZERO_CHECK(NH > 0 && C % NH == 0,
             kernel << ": " << NH << " heads do not divide " << C << " channels");
  ZERO_CHECK(C > 0, kernel << ": heads of 0 channels");
}

// Attention runs over tiles of query rows: a tile's scores against every key it may see are one
// GEMM, as are the products they feed, where one query row at a time would stream each key and
// value row through a dot product and an axpy of head_size floats (3x slower at the GPT-2
// benchmark's T 256 and head size 64, SkylakeX kernels). The tile's keys run to its last row,
// so its first rows also score keys they cannot see (zeroed after the softmax): at 64 rows and T
// 256, a quarter more scores than the causal triangle, the price of GEMMs that size. (A zeroed
// probability still multiplies its key's values: a non-finite value in a later row of the tile
// reaches the earlier rows' results too, where the step's loss is non-finite anyway.)
constexpr size_t kAttentionTile = 64;

// Scratch for one tile's rows x keys (compact), the most of any tile of a sequence of T.
size_t tile_floats(int T) {
  return std::min(kAttentionTile, static_cast<size_t>(T)) * static_cast<size_t>(T);
}

// One (sequence, head) pair: q at the sequence's q channels of the head, k at +C and v at +2C,
// rows `stride` (3C) apart; dq, dk and dv likewise in dqkv.
struct HeadPair {
  const float* q;
  const float* k;
  const float* v;
  size_t stride;
  size_t T;
  size_t head_size;
  float scale;
};

// Query rows [first, first + rows) against keys [0, first + rows): p (rows x keys, compact)
// becomes each row's softmax over the keys at and before its own position, zeros past it, from
// the rows' log-sum-exp in `saved_lse`, or computed from the scores into `new_lse` if given.
void tile_probabilities(float* p, const HeadPair& h, size_t first, size_t rows,
                        const float* saved_lse, float* new_lse, const TransformerPath& path) {
  const size_t keys = first + rows;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
              static_cast<int>(keys), static_cast<int>(h.head_size), h.scale,
              h.q + first * h.stride, static_cast<int>(h.stride), h.k, static_cast<int>(h.stride),
              0.0f, p, static_cast<int>(keys));
  for (size_t r = 0; r < rows; ++r) {
    float* row = p + r * keys;
    const size_t seen = first + r + 1;
    const float lse =
        new_lse ? (new_lse[first + r] = path.logsumexp(row, seen)) : saved_lse[first + r];
    path.scaled_exp(row, row, lse, 1.0f, seen);
    std::fill(row + seen, row + keys, 0.0f);
  }
}

// out (rows C apart) = softmax(scale Q K^T, causal) V for the pair, and its rows' lse.
void attention_forward_pair(float* out, size_t out_stride, float* lse, const HeadPair& h, float* p,
                            const TransformerPath& path) {
  for (size_t first = 0; first < h.T; first += kAttentionTile) {
    const size_t rows = std::min(kAttentionTile, h.T - first);
    const size_t keys = first + rows;
    tile_probabilities(p, h, first, rows, nullptr, lse, path);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(h.head_size), static_cast<int>(keys), 1.0f, p,
                static_cast<int>(keys), h.v, static_cast<int>(h.stride), 0.0f,
                out + first * out_stride, static_cast<int>(out_stride));
  }
}

// The flash-attention backward for the pair, a tile of query rows at a time: P recomputed from
// the saved lse; dP = dO V^T; with D_i = dout_i . out_i (= sum_j P_ij dP_ij) the scores'
// gradient dS = P (dP - D) scale; then dQ = dS K for the tile's rows, and dK += dS^T Q and
// dV += P^T dO for the keys it saw. dqkv's head channels are overwritten for all T rows.
void attention_backward_pair(float* dqkv, const float* dout, const float* out, size_t out_stride,
                             const float* lse, const HeadPair& h, float* p, float* ds,
                             const TransformerPath& path) {
  float* dq = dqkv;
  float* dk = dqkv + (h.k - h.q);
  float* dv = dqkv + (h.v - h.q);
  for (size_t t = 0; t < h.T; ++t) {
    std::memset(dk + t * h.stride, 0, h.head_size * sizeof(float));
    std::memset(dv + t * h.stride, 0, h.head_size * sizeof(float));
  }
  const int hs = static_cast<int>(h.head_size);
  const int stride = static_cast<int>(h.stride);
  const int ostride = static_cast<int>(out_stride);
  for (size_t first = 0; first < h.T; first += kAttentionTile) {
    const size_t rows = std::min(kAttentionTile, h.T - first);
    const int m = static_cast<int>(rows);
    const int keys = static_cast<int>(first + rows);
    const float* d_out = dout + first * out_stride;
    tile_probabilities(p, h, first, rows, lse, nullptr, path);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, keys, hs, 1.0f, d_out, ostride, h.v,
                stride, 0.0f, ds, keys);
    for (size_t r = 0; r < rows; ++r) {
      const float* o = out + (first + r) * out_stride;
      const float* g = d_out + r * out_stride;
      float d = 0.0f;
      for (size_t c = 0; c < h.head_size; ++c) d += g[c] * o[c];
      const float* pr = p + r * keys;
      float* dr = ds + r * keys;
      const size_t seen = first + r + 1;
      for (size_t j = 0; j < seen; ++j) dr[j] = pr[j] * (dr[j] - d) * h.scale;
      std::fill(dr + seen, dr + keys, 0.0f);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, keys, 1.0f, ds, keys, h.k, stride,
                0.0f, dq + first * h.stride, stride);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, m, 1.0f, ds, keys,
                h.q + first * h.stride, stride, 1.0f, dk, stride);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, m, 1.0f, p, keys, d_out, ostride,
                1.0f, dv, stride);
  }
}

HeadPair head_pair(const float* qkv, size_t pair, int T, int C, int NH) {
  const size_t b = pair / NH, h = pair % NH;
  const size_t head_size = C / NH;
  const float* q = qkv + b * T * 3 * C + h * head_size;
  return HeadPair{q,
                  q + C,
                  q + 2 * C,
                  3 * static_cast<size_t>(C),
                  static_cast<size_t>(T),
                  head_size,
                  1.0f / std::sqrt(static_cast<float>(head_size))};
}

// The offset of the pair's head channels of row 0 in a [B, T, C] array.
size_t pair_offset(size_t pair, int T, int C, int NH) {
  return pair / NH * T * C + pair % NH * (C / NH);
}

}  // namespace

// One (sequence, head) pair per work item, each costing about T^2 / 2 * head_size
// multiply-adds; OpenBLAS runs single-threaded inside, so each pair's bits are the same at
// every thread count.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       const KernelOptions& opt) {
  check_attention("attention_forward", B, T, C, NH);
  check_buffer(out, product(B, T) * C, "attention_forward", "out");
  check_buffer(lse, product(B, NH) * T, "attention_forward", "lse");
  check_buffer(qkv, product(B, T) * 3 * C, "attention_forward", "qkv");
  const TransformerPath& path = active_transformer_path();
  single_threaded_blas();
  parallel_for(product(B, NH), product(T, T) * (C / NH), 1, opt, [&](size_t begin, size_t end) {
    std::vector<float> p(tile_floats(T));
    for (size_t pair = begin; pair < end; ++pair) {
      attention_forward_pair(out + pair_offset(pair, T, C, NH), C, lse + pair * T,
                             head_pair(qkv, pair, T, C, NH), p.data(), path);
    }
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int B, int T, int C, int NH, const KernelOptions& opt) {
  check_attention("attention_backward", B, T, C, NH);
  check_buffer(dqkv, product(B, T) * 3 * C, "attention_backward", "dqkv");
  check_buffer(dout, product(B, T) * C, "attention_backward", "dout");
  check_buffer(qkv, product(B, T) * 3 * C, "attention_backward", "qkv");
  check_buffer(out, product(B, T) * C, "attention_backward", "out");
  check_buffer(lse, product(B, NH) * T, "attention_backward", "lse");
  const TransformerPath& path = active_transformer_path();
  single_threaded_blas();
  parallel_for(product(B, NH), product(T, T) * (C / NH), 1, opt, [&](size_t begin, size_t end) {
    std::vector<float> p(tile_floats(T)), ds(tile_floats(T));
    for (size_t pair = begin; pair < end; ++pair) {
      const HeadPair h = head_pair(qkv, pair, T, C, NH);
      const size_t offset = pair_offset(pair, T, C, NH);
      attention_backward_pair(dqkv + (h.q - qkv), dout + offset, out + offset, C, lse + pair * T, h,
                              p.data(), ds.data(), path);
    }
  });
}

}  // namespace zero::kernels
