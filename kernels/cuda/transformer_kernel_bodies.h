// The per-thread bodies of the GPT-2 kernels (kernels/cuda/transformer.cu), in the manner of
// cuda_kernel_bodies.h: functions of (block, thread, arguments) that the .cu kernels call with
// blockIdx.x and threadIdx.x, and that tests/kernels/cuda_transformer_grid_test.cpp, built by g++,
// calls for every block and thread of the same grid.
//
// A kernel that reduces within a block is split into phases at its barriers: a phase body
// returns the thread's partial (or writes into the block's scratch array, shared memory on the
// GPU), tree_level adds (or maxes) the block's partials in a fixed tree, and the next phase
// reads the result. The .cu kernel puts __syncthreads() between phases; the grid test runs each
// phase for every thread of the block before the next one. Both see the same operations in the
// same order, so every result is reproducible run to run. Reductions over rows (dweight, dbias,
// dwpe, dwte) are ordered the same way: no float atomics anywhere.
//
// Shapes, conventions and argument names are those of zero/kernels/transformer_kernels.h.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "zero/core/check.h"
#include "zero/core/dtype.h"

namespace zero::kernels::cuda::transformer {

// Element-wise kernels: thread `thread` of block `block` owns element block * 256 + thread.
constexpr uint32_t kElementThreads = 256;
// Row kernels (layernorm, cross-entropy, attention): one block per row; thread t takes the
// row's elements t, t + 128, ... and the block reduces its partials with tree_level.
constexpr uint32_t kRowThreads = 128;
// Column sums over rows (dweight, dbias): a block owns 32 adjacent columns (one per lane, so a
// warp reads 32 contiguous floats of a row); its 8 slices of 32 threads each take every 8th row,
// then the tree adds the slices.
constexpr uint32_t kColumnLanes = 32;
constexpr uint32_t kColumnSlices = 8;
constexpr uint32_t kColumnThreads = kColumnLanes * kColumnSlices;
// embedding_backward's dwte: token ids are split into this many classes (id mod 32), each with
// its own threads, so rows of different tokens are added in parallel while the rows of any one
// token are still added by one thread, in order.
constexpr uint32_t kEmbeddingBuckets = 32;
// attention keeps a row of scores (forward, backward's query pass) or two (backward's key pass)
// in shared memory: T floats each, within the 48 KB a block gets without opting in.
constexpr int kMaxAttentionT = 48 * 1024 / (2 * sizeof(float));
constexpr uint32_t kMaxGridBlocks = 0x7fffffffu;  // gridDim.x limit

// Blocks for `units` work items at `per_block` each.
inline uint32_t grid_blocks(size_t units, size_t per_block, const char* op) {
  const size_t blocks = units == 0 ? 0 : (units - 1) / per_block + 1;
  ZERO_CHECK(blocks <= kMaxGridBlocks, op << ": " << units << " work items need too many blocks");
  return static_cast<uint32_t>(blocks);
}

// --- block reductions -------------------------------------------------------------------------

struct SumOp {
  ZERO_HD static float apply(float a, float b) { return a + b; }
};
struct MaxOp {
  ZERO_HD static float apply(float a, float b) { return a > b ? a : b; }
};

// One level of a block's reduction tree: for half = threads / 2, ..., stop (a barrier before each
// level), threads below `half` fold in their partner's value. With stop 1, shared[0] ends with
// the block's result; with stop kColumnLanes (column sums), shared[0..31] hold one per column.
template <typename Op>
ZERO_HD void tree_level(float* shared, uint32_t thread, uint32_t half) {
  if (thread < half) shared[thread] = Op::apply(shared[thread], shared[thread + half]);
}

// --- column sums over rows ----------------------------------------------------------------------

// The column and the first row of a thread of a column-sum block.
struct ColumnSlot {
  size_t column;
  size_t first_row;
};

ZERO_HD ColumnSlot column_slot(uint32_t block, uint32_t thread) {
  return {static_cast<size_t>(block) * kColumnLanes + thread % kColumnLanes, thread / kColumnLanes};
}

// Partial column sum of x [rows, cols]: rows first_row, first_row + 8, ... in order.
ZERO_HD float column_sum_partial(uint32_t block, uint32_t thread, const float* x, int rows,
                                 int cols) {
  const ColumnSlot s = column_slot(block, thread);
  float sum = 0.0f;
  if (s.column >= static_cast<size_t>(cols)) return sum;
  for (size_t r = s.first_row; r < static_cast<size_t>(rows); r += kColumnSlices) {
    sum += x[r * cols + s.column];
  }
  return sum;
}

// After the tree: lane `thread` of the first slice adds its column's total into dst.
ZERO_HD void column_sum_finish(uint32_t block, uint32_t thread, const float* shared, float* dst,
                               int cols) {
  const ColumnSlot s = column_slot(block, thread);
  if (thread < kColumnLanes && s.column < static_cast<size_t>(cols))
    dst[s.column] += shared[thread];
}

// --- embedding ---------------------------------------------------------------------------------

// The rows of wte a kernel sees: [first, first + rows) of the vocabulary, the whole table with
// first 0 and rows kAllRows, one tensor-parallel rank's rows otherwise (its vocabulary-parallel
// embedding and head).
constexpr int kAllRows = 0x7fffffff;

// out[b, t, c] = wte[token - first, c] + wpe[t, c], a token outside the rows adding 0 and a null
// wpe (the tensor-parallel ranks but the first) nothing.
ZERO_HD void embedding_forward_thread(uint32_t block, uint32_t thread, float* out,
                                      const float* tokens, const float* wte, const float* wpe,
                                      int first, int rows, int B, int T, int C) {
  const size_t i = static_cast<size_t>(block) * kElementThreads + thread;
  if (i >= static_cast<size_t>(B) * T * C) return;
  const size_t bt = i / C, c = i % C, t = bt % T;
  const int64_t row = static_cast<int64_t>(tokens[bt]) - first;
  const float w = row >= 0 && row < rows ? wte[static_cast<size_t>(row) * C + c] : 0.0f;
  out[i] = w + (wpe != nullptr ? wpe[t * C + c] : 0.0f);
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in order: element (t, c) per thread.
ZERO_HD void embedding_backward_wpe_thread(uint32_t block, uint32_t thread, float* dwpe,
                                           const float* dout, int B, int T, int C) {
  const size_t i = static_cast<size_t>(block) * kElementThreads + thread;
  const size_t tc = static_cast<size_t>(T) * C;
  if (i >= tc) return;
  float sum = dwpe[i];
  for (size_t b = 0; b < static_cast<size_t>(B); ++b) sum += dout[b * tc + i];
  dwpe[i] = sum;
}

// Blocks of the dwte pass: kEmbeddingBuckets per group of kElementThreads channels.
inline uint32_t embedding_wte_blocks(int C) {
  return grid_blocks(static_cast<size_t>(C), kElementThreads, "embedding_backward") *
         kEmbeddingBuckets;
}

// dwte[token - first, c] += dout[b, t, c] for the tokens in the rows: the thread owns channel c
// of every row in its bucket and walks all B * T positions in order, so each dwte element has
// one writer and a fixed order.
ZERO_HD void embedding_backward_wte_thread(uint32_t block, uint32_t thread, float* dwte,
                                           const float* dout, const float* tokens, int first,
                                           int rows, int B, int T, int C) {
  const uint32_t bucket = block % kEmbeddingBuckets;
  const size_t c = static_cast<size_t>(block / kEmbeddingBuckets) * kElementThreads + thread;
  if (c >= static_cast<size_t>(C)) return;
  const size_t positions = static_cast<size_t>(B) * T;
  for (size_t bt = 0; bt < positions; ++bt) {
    const int64_t row = static_cast<int64_t>(tokens[bt]) - first;
    if (row < 0 || row >= rows || static_cast<uint64_t>(row) % kEmbeddingBuckets != bucket) {
      continue;
    }
    dwte[static_cast<size_t>(row) * C + c] += dout[bt * C + c];
  }
}

// --- layernorm ---------------------------------------------------------------------------------

// Forward, block n: the row's sum, then its squared deviations from the mean (two passes, so
// the variance does not cancel), then the output.
ZERO_HD float layernorm_sum_partial(uint32_t block, uint32_t thread, const float* inp, int C) {
  const float* x = inp + static_cast<size_t>(block) * C;
  float sum = 0.0f;
  for (size_t c = thread; c < static_cast<size_t>(C); c += kRowThreads) sum += x[c];
  return sum;
}

ZERO_HD float layernorm_var_partial(uint32_t block, uint32_t thread, const float* inp, int C,
                                    float mean) {
  const float* x = inp + static_cast<size_t>(block) * C;
  float sum = 0.0f;
  for (size_t c = thread; c < static_cast<size_t>(C); c += kRowThreads) {
    const float d = x[c] - mean;
    sum += d * d;
  }
  return sum;
}

// A row's mean from its sum (also the mean of dnorm and of dnorm * norm in the backward).
ZERO_HD float row_mean(float sum, int C) {
  return sum / static_cast<float>(C);
}

ZERO_HD float layernorm_rstd(float squared_deviations, int C, float eps) {
  return 1.0f / sqrtf(row_mean(squared_deviations, C) + eps);
}

ZERO_HD void layernorm_forward_out(uint32_t block, uint32_t thread, float* out, float* mean_out,
                                   float* rstd_out, const float* inp, const float* weight,
                                   const float* bias, int C, float mean, float rstd) {
  const size_t row = static_cast<size_t>(block) * C;
  for (size_t c = thread; c < static_cast<size_t>(C); c += kRowThreads) {
    out[row + c] = (inp[row + c] - mean) * rstd * weight[c] + bias[c];
  }
  if (thread == 0) {
    mean_out[block] = mean;
    rstd_out[block] = rstd;
  }
}

// Backward, block n: the row's sums of weight * dout and of weight * dout * norm, which every
// element of dinp needs. Both partials of a thread, reduced as two trees.
struct LayernormRowSums {
  float dnorm;
  float dnorm_norm;
};

ZERO_HD LayernormRowSums layernorm_backward_partial(uint32_t block, uint32_t thread,
                                                    const float* dout, const float* inp,
                                                    const float* weight, const float* mean,
                                                    const float* rstd, int C) {
  const size_t row = static_cast<size_t>(block) * C;
  LayernormRowSums s{0.0f, 0.0f};
  for (size_t c = thread; c < static_cast<size_t>(C); c += kRowThreads) {
    const float norm = (inp[row + c] - mean[block]) * rstd[block];
    const float dnorm = weight[c] * dout[row + c];
    s.dnorm += dnorm;
    s.dnorm_norm += dnorm * norm;
  }
  return s;
}

// dinp += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd, given the row's two sums.
ZERO_HD void layernorm_backward_dinp(uint32_t block, uint32_t thread, float* dinp,
                                     const float* dout, const float* inp, const float* weight,
                                     const float* mean, const float* rstd, int C,
                                     LayernormRowSums sums) {
  const size_t row = static_cast<size_t>(block) * C;
  const float dnorm_mean = row_mean(sums.dnorm, C);
  const float dnorm_norm_mean = row_mean(sums.dnorm_norm, C);
  for (size_t c = thread; c < static_cast<size_t>(C); c += kRowThreads) {
    const float norm = (inp[row + c] - mean[block]) * rstd[block];
    const float dnorm = weight[c] * dout[row + c];
    dinp[row + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd[block];
  }
}

// dweight and dbias, a column-sum block: the thread's partials of dout * norm and of dout.
ZERO_HD LayernormRowSums layernorm_params_partial(uint32_t block, uint32_t thread,
                                                  const float* dout, const float* inp,
                                                  const float* mean, const float* rstd, int N,
                                                  int C) {
  const ColumnSlot s = column_slot(block, thread);
  LayernormRowSums sums{0.0f, 0.0f};  // dnorm: of dout (dbias), dnorm_norm: dout * norm
  if (s.column >= static_cast<size_t>(C)) return sums;
  for (size_t r = s.first_row; r < static_cast<size_t>(N); r += kColumnSlices) {
    const size_t i = r * C + s.column;
    sums.dnorm += dout[i];
    sums.dnorm_norm += dout[i] * ((inp[i] - mean[r]) * rstd[r]);
  }
  return sums;
}

// --- matmul bias ---------------------------------------------------------------------------------

// out[n, oc] += bias[oc], element-wise over N * OC.
ZERO_HD void add_bias_thread(uint32_t block, uint32_t thread, float* out, const float* bias, int N,
                             int OC) {
  const size_t i = static_cast<size_t>(block) * kElementThreads + thread;
  if (i >= static_cast<size_t>(N) * OC) return;
  out[i] += bias[i % OC];
}

// --- GELU ----------------------------------------------------------------------------------------

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

ZERO_HD void gelu_forward_thread(uint32_t block, uint32_t thread, float* out, const float* inp,
                                 size_t n) {
  const size_t i = static_cast<size_t>(block) * kElementThreads + thread;
  if (i >= n) return;
  const float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x)));
}

// sech^2 as 1 - tanh^2: cosh overflows for large arguments, tanh saturates to 1 cleanly.
ZERO_HD void gelu_backward_thread(uint32_t block, uint32_t thread, float* dinp, const float* inp,
                                  const float* dout, size_t n) {
  const size_t i = static_cast<size_t>(block) * kElementThreads + thread;
  if (i >= n) return;
  const float x = inp[i];
  const float th = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
  const float sech2 = 1.0f - th * th;
  const float grad =
      0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  dinp[i] = grad * dout[i];
}

// --- softmax + cross-entropy -----------------------------------------------------------------

// Forward, block n: the row's maximum over the V real columns, then the sum of exp(x - max),
// then (thread 0) lse and the loss.
ZERO_HD float cross_entropy_max_partial(uint32_t block, uint32_t thread, const float* logits, int V,
                                        int Vp) {
  const float* x = logits + static_cast<size_t>(block) * Vp;
  float m = -INFINITY;
  for (size_t v = thread; v < static_cast<size_t>(V); v += kRowThreads) m = x[v] > m ? x[v] : m;
  return m;
}

ZERO_HD float cross_entropy_sum_partial(uint32_t block, uint32_t thread, const float* logits, int V,
                                        int Vp, float max) {
  const float* x = logits + static_cast<size_t>(block) * Vp;
  float sum = 0.0f;
  for (size_t v = thread; v < static_cast<size_t>(V); v += kRowThreads) sum += expf(x[v] - max);
  return sum;
}

ZERO_HD void cross_entropy_forward_finish(uint32_t block, uint32_t thread, float* losses,
                                          float* lse, const float* logits, const int32_t* targets,
                                          int Vp, float max, float sum) {
  if (thread != 0) return;
  const float l = max + logf(sum);
  lse[block] = l;
  losses[block] = l - logits[static_cast<size_t>(block) * Vp + targets[block]];
}

// The vocabulary-parallel forward's last phase, after the same two reductions over this rank's
// V columns: the rank's lse of each row, and the target's logit where the target's column is
// this rank's (tokens [first, first + V)), else 0, for the group to combine.
ZERO_HD void cross_entropy_partials_finish(uint32_t block, uint32_t thread, float* lse,
                                           float* target_logits, const float* logits,
                                           const int32_t* targets, int first, int V, int Vp,
                                           float max, float sum) {
  if (thread != 0) return;
  lse[block] = max + logf(sum);
  const int64_t column = static_cast<int64_t>(targets[block]) - first;
  target_logits[block] =
      column >= 0 && column < V ? logits[static_cast<size_t>(block) * Vp + column] : 0.0f;
}

// Element-wise over N * Vp: column v is token first + v (first 0 for the whole vocabulary, lse
// the whole vocabulary's either way). Each element is read, then written, by the same thread,
// so dlogits may be logits.
ZERO_HD void cross_entropy_backward_thread(uint32_t block, uint32_t thread, float* dlogits,
                                           const float* logits, const float* lse,
                                           const int32_t* targets, int first, float dloss, int N,
                                           int V, int Vp) {
  const size_t i = static_cast<size_t>(block) * kElementThreads + thread;
  if (i >= static_cast<size_t>(N) * Vp) return;
  const size_t n = i / Vp, v = i % Vp;
  if (v >= static_cast<size_t>(V)) {
    dlogits[i] = 0.0f;
    return;
  }
  const float p = expf(logits[i] - lse[n]);
  const float indicator = static_cast<int64_t>(v) + first == targets[n] ? 1.0f : 0.0f;
  dlogits[i] = (p - indicator) * dloss;
}

// --- causal self-attention -------------------------------------------------------------------

// One block per (b, h, row) with block = (b * NH + h) * T + row; the row is the query row
// (forward, backward's dq pass) or the key row (backward's dk, dv pass).
struct AttentionRow {
  size_t b, h, row;
  int hs;       // channels per head
  float scale;  // 1 / sqrt(hs)
  size_t C3;    // the stride of a position in qkv
};

ZERO_HD AttentionRow attention_row(uint32_t block, int T, int C, int NH) {
  AttentionRow r;
  r.row = block % static_cast<uint32_t>(T);
  const size_t bh = block / static_cast<uint32_t>(T);
  r.h = bh % static_cast<size_t>(NH);
  r.b = bh / static_cast<size_t>(NH);
  r.hs = C / NH;
  r.scale = 1.0f / sqrtf(static_cast<float>(r.hs));
  r.C3 = 3 * static_cast<size_t>(C);
  return r;
}

ZERO_HD float head_dot(const float* a, const float* b, int hs) {
  float s = 0.0f;
  for (int c = 0; c < hs; ++c) s += a[c] * b[c];
  return s;
}

// Forward phase 1: scores[j] = scale * q_row . k_j for the thread's keys j <= row; returns their
// maximum.
ZERO_HD float attention_scores_partial(uint32_t block, uint32_t thread, const float* qkv, int T,
                                       int C, int NH, float* scores) {
  const AttentionRow r = attention_row(block, T, C, NH);
  const float* q = qkv + (r.b * T + r.row) * r.C3 + r.h * r.hs;
  float m = -INFINITY;
  for (size_t j = thread; j <= r.row; j += kRowThreads) {
    const float* k = qkv + (r.b * T + j) * r.C3 + C + r.h * r.hs;
    scores[j] = head_dot(q, k, r.hs) * r.scale;
    m = scores[j] > m ? scores[j] : m;
  }
  return m;
}

// Forward phase 2: scores[j] becomes exp(score - max) for the thread's keys; returns their sum.
ZERO_HD float attention_exp_partial(uint32_t block, uint32_t thread, int T, float* scores,
                                    float max) {
  const size_t row = block % static_cast<uint32_t>(T);
  float sum = 0.0f;
  for (size_t j = thread; j <= row; j += kRowThreads) {
    scores[j] = expf(scores[j] - max);
    sum += scores[j];
  }
  return sum;
}

// Forward phase 3: out[c] = sum over j of exp(score_j - max) v_j[c] / sum, channel c per
// thread; thread 0 saves the row's log-sum-exp.
ZERO_HD void attention_forward_out(uint32_t block, uint32_t thread, float* out, float* lse,
                                   const float* qkv, int T, int C, int NH, const float* scores,
                                   float max, float sum) {
  const AttentionRow r = attention_row(block, T, C, NH);
  float* o = out + (r.b * T + r.row) * C + r.h * r.hs;
  for (size_t c = thread; c < static_cast<size_t>(r.hs); c += kRowThreads) {
    float acc = 0.0f;
    for (size_t j = 0; j <= r.row; ++j) {
      acc += scores[j] * qkv[(r.b * T + j) * r.C3 + 2 * static_cast<size_t>(C) + r.h * r.hs + c];
    }
    o[c] = acc / sum;
  }
  if (thread == 0) lse[block] = max + logf(sum);
}

// Backward quantities of one (query i, key j) pair, i >= j: P = exp(scale q_i.k_j - lse_i) and
// dS = P (dout_i.v_j - dout_i.out_i), the gradient of the scaled score.
struct AttentionPair {
  float p;
  float ds;
};

ZERO_HD AttentionPair attention_pair(const AttentionRow& r, size_t i, size_t j, const float* dout,
                                     const float* qkv, const float* out, const float* lse, int T,
                                     int C, int NH) {
  const size_t head = r.h * r.hs;
  const float* q = qkv + (r.b * T + i) * r.C3 + head;
  const float* k = qkv + (r.b * T + j) * r.C3 + C + head;
  const float* v = qkv + (r.b * T + j) * r.C3 + 2 * static_cast<size_t>(C) + head;
  const float* dout_i = dout + (r.b * T + i) * C + head;
  const float* out_i = out + (r.b * T + i) * C + head;
  const size_t lse_row = (r.b * NH + r.h) * T + i;
  const float p = expf(head_dot(q, k, r.hs) * r.scale - lse[lse_row]);
  return {p, p * (head_dot(dout_i, v, r.hs) - head_dot(dout_i, out_i, r.hs))};
}

// Backward, dq pass (query row i): phase 1 fills ds[j] for the thread's keys j <= i.
ZERO_HD void attention_dq_scores(uint32_t block, uint32_t thread, const float* dout,
                                 const float* qkv, const float* out, const float* lse, int T, int C,
                                 int NH, float* ds) {
  const AttentionRow r = attention_row(block, T, C, NH);
  for (size_t j = thread; j <= r.row; j += kRowThreads) {
    ds[j] = attention_pair(r, r.row, j, dout, qkv, out, lse, T, C, NH).ds;
  }
}

// Phase 2: dq_i[c] = scale * sum over j <= i of ds[j] k_j[c], channel c per thread.
ZERO_HD void attention_dq_out(uint32_t block, uint32_t thread, float* dqkv, const float* qkv, int T,
                              int C, int NH, const float* ds) {
  const AttentionRow r = attention_row(block, T, C, NH);
  const size_t head = r.h * r.hs;
  for (size_t c = thread; c < static_cast<size_t>(r.hs); c += kRowThreads) {
    float acc = 0.0f;
    for (size_t j = 0; j <= r.row; ++j) acc += ds[j] * qkv[(r.b * T + j) * r.C3 + C + head + c];
    dqkv[(r.b * T + r.row) * r.C3 + head + c] = acc * r.scale;
  }
}

// Backward, dk/dv pass (key row j): phase 1 fills p[i - j] and ds[i - j] for the thread's
// queries i >= j.
ZERO_HD void attention_dkv_scores(uint32_t block, uint32_t thread, const float* dout,
                                  const float* qkv, const float* out, const float* lse, int T,
                                  int C, int NH, float* p, float* ds) {
  const AttentionRow r = attention_row(block, T, C, NH);
  for (size_t i = r.row + thread; i < static_cast<size_t>(T); i += kRowThreads) {
    const AttentionPair pair = attention_pair(r, i, r.row, dout, qkv, out, lse, T, C, NH);
    p[i - r.row] = pair.p;
    ds[i - r.row] = pair.ds;
  }
}

// Phase 2: dv_j[c] = sum over i >= j of p dout_i[c] and dk_j[c] = scale * sum of ds q_i[c].
ZERO_HD void attention_dkv_out(uint32_t block, uint32_t thread, float* dqkv, const float* dout,
                               const float* qkv, int T, int C, int NH, const float* p,
                               const float* ds) {
  const AttentionRow r = attention_row(block, T, C, NH);
  const size_t head = r.h * r.hs;
  for (size_t c = thread; c < static_cast<size_t>(r.hs); c += kRowThreads) {
    float dv = 0.0f, dk = 0.0f;
    for (size_t i = r.row; i < static_cast<size_t>(T); ++i) {
      dv += p[i - r.row] * dout[(r.b * T + i) * C + head + c];
      dk += ds[i - r.row] * qkv[(r.b * T + i) * r.C3 + head + c];
    }
    const size_t j = (r.b * T + r.row) * r.C3 + head + c;
    dqkv[j + C] = dk * r.scale;
    dqkv[j + 2 * static_cast<size_t>(C)] = dv;
  }
}

}  // namespace zero::kernels::cuda::transformer
