// Causal self-attention of the transformer kernels: one (sequence, head) pair per work item,
// tiles of query rows as GEMMs around the active path's softmax rows, and the flash-attention
// backward that recomputes the probabilities from the saved log-sum-exp. The GEMMs are
// OpenBLAS's fp32 ones, or oneDNN's bf16 ones (fp32 accumulation) for bf16 products where
// bf16_attention_in_bf16().
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "bf16_gemm.h"
#include "transformer_threads.h"
#include "zero/kernels/cpu_kernels.h"
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

// A tile GEMM's operand: fp32 values, or their bf16 copy (raw bits) for bf16 products; the
// GEMM runs on whichever its operands carry (both the same).
struct TileOperand {
  const float* fp32 = nullptr;
  const uint16_t* bf16 = nullptr;
  TileOperand offset(size_t n) const {
    return {fp32 ? fp32 + n : nullptr, bf16 ? bf16 + n : nullptr};
  }
};

// C [M, N] = alpha op(A) op(B) + beta C, row-major, as cblas_sgemm: OpenBLAS for fp32 operands,
// oneDNN's bf16 matmul for bf16 ones.
void tile_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, TileOperand A, int lda,
               TileOperand B, int ldb, float beta, float* C, int ldc) {
#if ZERO_HAVE_DNNL
  if (A.bf16 != nullptr) {
    detail::bf16_gemm(trans_a, trans_b, M, N, K, alpha, A.bf16, lda, B.bf16, ldb, beta, C, ldc);
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A.fp32, lda, B.fp32, ldb, beta,
              C, ldc);
}

// One (sequence, head) pair: q at the sequence's q channels of the head, k at +C and v at +2C,
// rows `stride` (3C) apart, as fp32 values or their bf16 copies; dq, dk and dv likewise in dqkv.
struct HeadPair {
  TileOperand q, k, v;
  size_t stride;
  size_t T;
  size_t head_size;
  float scale;
};

// Per-thread scratch of one pair's tiles: the probabilities and the scores' gradient (rows x
// keys, compact) in fp32, and with bf16 products the bf16 copy of the tile that feeds a GEMM.
struct TileScratch {
  TileScratch(int T, bool bf16) : p(tile_floats(T)), ds(tile_floats(T)) {
    if (bf16) rounded.resize(tile_floats(T));
  }
  // The tile x (rows x keys) as the next GEMM's operand: itself, or rounded to bf16.
  TileOperand operand(const float* x, size_t n) {
    if (rounded.empty()) return {x, nullptr};
    cast(x, DType::kFloat32, rounded.data(), DType::kBFloat16, n, KernelOptions{});
    return {nullptr, rounded.data()};
  }
  std::vector<float> p, ds;
  std::vector<uint16_t> rounded;
};

// Query rows [first, first + rows) against keys [0, first + rows): p (rows x keys, compact)
// becomes each row's softmax over the keys at and before its own position, zeros past it, from
// the rows' log-sum-exp in `saved_lse`, or computed from the scores into `new_lse` if given.
void tile_probabilities(float* p, const HeadPair& h, size_t first, size_t rows,
                        const float* saved_lse, float* new_lse, const TransformerPath& path) {
  const size_t keys = first + rows;
  tile_gemm(false, true, static_cast<int>(rows), static_cast<int>(keys),
            static_cast<int>(h.head_size), h.scale, h.q.offset(first * h.stride),
            static_cast<int>(h.stride), h.k, static_cast<int>(h.stride), 0.0f, p,
            static_cast<int>(keys));
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
void attention_forward_pair(float* out, size_t out_stride, float* lse, const HeadPair& h,
                            TileScratch& scratch, const TransformerPath& path) {
  float* p = scratch.p.data();
  for (size_t first = 0; first < h.T; first += kAttentionTile) {
    const size_t rows = std::min(kAttentionTile, h.T - first);
    const size_t keys = first + rows;
    tile_probabilities(p, h, first, rows, nullptr, lse, path);
    tile_gemm(false, false, static_cast<int>(rows), static_cast<int>(h.head_size),
              static_cast<int>(keys), 1.0f, scratch.operand(p, rows * keys), static_cast<int>(keys),
              h.v, static_cast<int>(h.stride), 0.0f, out + first * out_stride,
              static_cast<int>(out_stride));
  }
}

// The flash-attention backward for the pair, a tile of query rows at a time: P recomputed from
// the saved lse; dP = dO V^T; with D_i = dout_i . out_i (= sum_j P_ij dP_ij) the scores'
// gradient dS = P (dP - D) scale; then dQ = dS K for the tile's rows, and dK += dS^T Q and
// dV += P^T dO for the keys it saw. dqkv's head channels are overwritten for all T rows.
// dout_operand is dout itself, or its bf16 copy for bf16 products; D reads the fp32 values.
void attention_backward_pair(float* dqkv, const float* dout, TileOperand dout_operand,
                             const float* out, size_t out_stride, const float* lse,
                             const HeadPair& h, TileScratch& scratch, const TransformerPath& path) {
  // k's channels follow q's C = stride / 3 channels later, v's as many after k's.
  float* dq = dqkv;
  float* dk = dq + h.stride / 3;
  float* dv = dk + h.stride / 3;
  for (size_t t = 0; t < h.T; ++t) {
    std::memset(dk + t * h.stride, 0, h.head_size * sizeof(float));
    std::memset(dv + t * h.stride, 0, h.head_size * sizeof(float));
  }
  float* p = scratch.p.data();
  float* ds = scratch.ds.data();
  const int hs = static_cast<int>(h.head_size);
  const int stride = static_cast<int>(h.stride);
  const int ostride = static_cast<int>(out_stride);
  for (size_t first = 0; first < h.T; first += kAttentionTile) {
    const size_t rows = std::min(kAttentionTile, h.T - first);
    const int m = static_cast<int>(rows);
    const int keys = static_cast<int>(first + rows);
    const float* d_out = dout + first * out_stride;
    const TileOperand d_out_operand = dout_operand.offset(first * out_stride);
    tile_probabilities(p, h, first, rows, lse, nullptr, path);
    tile_gemm(false, true, m, keys, hs, 1.0f, d_out_operand, ostride, h.v, stride, 0.0f, ds, keys);
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
    const size_t tile = rows * static_cast<size_t>(keys);
    const TileOperand ds_operand = scratch.operand(ds, tile);
    tile_gemm(false, false, m, hs, keys, 1.0f, ds_operand, keys, h.k, stride, 0.0f,
              dq + first * h.stride, stride);
    tile_gemm(true, false, keys, hs, m, 1.0f, ds_operand, keys, h.q.offset(first * h.stride),
              stride, 1.0f, dk, stride);
    // P's bf16 copy replaces dS's: both GEMMs that read dS have run.
    tile_gemm(true, false, keys, hs, m, 1.0f, scratch.operand(p, tile), keys, d_out_operand,
              ostride, 1.0f, dv, stride);
  }
}

// The offset of the pair's head channels of row 0 in a [B, T, C] array.
size_t pair_offset(size_t pair, int T, int C, int NH) {
  return pair / NH * T * C + pair % NH * (C / NH);
}

// The offset of the pair's q channels of row 0 in a [B, T, 3C] array (qkv or dqkv).
size_t qkv_offset(size_t pair, int T, int C, int NH) {
  return pair / NH * T * 3 * C + pair % NH * (C / NH);
}

// The pair's q, k and v in qkv (fp32) or in its bf16 copy qkv_bf16 (null for fp32 products).
HeadPair head_pair(const float* qkv, const uint16_t* qkv_bf16, size_t pair, int T, int C, int NH) {
  const size_t head_size = C / NH;
  const size_t q = qkv_offset(pair, T, C, NH);
  const TileOperand all = qkv_bf16 ? TileOperand{nullptr, qkv_bf16} : TileOperand{qkv, nullptr};
  return HeadPair{all.offset(q),
                  all.offset(q + C),
                  all.offset(q + 2 * static_cast<size_t>(C)),
                  3 * static_cast<size_t>(C),
                  static_cast<size_t>(T),
                  head_size,
                  1.0f / std::sqrt(static_cast<float>(head_size))};
}

// x's n values rounded to bf16 (detail::round_to_bf16's `slot`) where opt's attention products
// run in bf16; else null.
const uint16_t* bf16_copy(int slot, const float* x, size_t n, const KernelOptions& opt) {
#if ZERO_HAVE_DNNL
  if (opt.bf16_products && bf16_attention_in_bf16()) return detail::round_to_bf16(slot, x, n, opt);
#endif
  return nullptr;
}

}  // namespace

// One (sequence, head) pair per work item, each costing about T^2 / 2 * head_size
// multiply-adds; the GEMMs run single-threaded inside, so each pair's bits are the same at
// every thread count.
void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                       const KernelOptions& opt) {
  check_attention("attention_forward", B, T, C, NH);
  check_buffer(out, product(B, T) * C, "attention_forward", "out");
  check_buffer(lse, product(B, NH) * T, "attention_forward", "lse");
  check_buffer(qkv, product(B, T) * 3 * C, "attention_forward", "qkv");
  const TransformerPath& path = active_transformer_path();
  single_threaded_blas();
  const uint16_t* qkv_bf16 = bf16_copy(0, qkv, product(B, T) * 3 * C, opt);
  parallel_for(product(B, NH), product(T, T) * (C / NH), 1, opt, [&](size_t begin, size_t end) {
    TileScratch scratch(T, qkv_bf16 != nullptr);
    for (size_t pair = begin; pair < end; ++pair) {
      attention_forward_pair(out + pair_offset(pair, T, C, NH), C, lse + pair * T,
                             head_pair(qkv, qkv_bf16, pair, T, C, NH), scratch, path);
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
  const uint16_t* qkv_bf16 = bf16_copy(0, qkv, product(B, T) * 3 * C, opt);
  const uint16_t* dout_bf16 = bf16_copy(1, dout, product(B, T) * C, opt);
  parallel_for(product(B, NH), product(T, T) * (C / NH), 1, opt, [&](size_t begin, size_t end) {
    TileScratch scratch(T, qkv_bf16 != nullptr);
    for (size_t pair = begin; pair < end; ++pair) {
      const HeadPair h = head_pair(qkv, qkv_bf16, pair, T, C, NH);
      const size_t offset = pair_offset(pair, T, C, NH);
      const TileOperand dout_operand = dout_bf16 ? TileOperand{nullptr, dout_bf16 + offset}
                                                 : TileOperand{dout + offset, nullptr};
      attention_backward_pair(dqkv + qkv_offset(pair, T, C, NH), dout + offset, dout_operand,
                              out + offset, C, lse + pair * T, h, scratch, path);
    }
  });
}

}  // namespace zero::kernels
