// The public transformer kernels: check arguments, split rows, columns, (sequence, head) pairs
// or GEMM blocks over threads, and call the active path's loops (transformer_paths.h) or
// OpenBLAS.
// Sums over rows (the gradients of shared parameters) are split by columns, each column summed
// over the rows in order, so that no result depends on the thread count.
#include "zero/kernels/transformer_kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "bf16_gemm.h"
#include "thread_pool.h"
#include "transformer_paths.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_features.h"

// OpenBLAS's own extensions; Debian's cblas.h declares them only when it is OpenBLAS's copy.
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace zero::kernels {
namespace {

using detail::TransformerPath;

// Waking a pooled worker costs a few microseconds, so each one must get at least this much work
// (in elements read or written, roughly).
constexpr size_t kMinWorkPerThread = size_t{1} << 15;
// Column ranges start on multiples of 16 floats (64 bytes), so no two threads write one line.
constexpr size_t kColumnGranule = 16;

const TransformerPath& active_path() {
  switch (kernel_isa()) {
    case KernelIsa::kAvx512:
      return detail::kTransformerAvx512Path;
    case KernelIsa::kAvx2:
      return detail::kTransformerAvx2Path;
    case KernelIsa::kScalar:
      break;
  }
  return detail::kTransformerScalarPath;
}

// Runs fn(begin, end) over items [0, items) split into contiguous chunks, one per thread of the
// kernel pool, each starting on a multiple of `granule`; work_per_item sizes how many threads
// are worth waking.
// The calling thread takes the first chunk. Every item is processed by exactly one call.
template <typename Fn>
void parallel_for(size_t items, size_t work_per_item, size_t granule, const KernelOptions& opt,
                  Fn&& fn) {
  ZERO_CHECK(opt.threads >= 1, "KernelOptions.threads must be at least 1, got " << opt.threads);
  size_t threads = std::min({static_cast<size_t>(opt.threads), (items + granule - 1) / granule,
                             items * work_per_item / kMinWorkPerThread});
  detail::run_chunks_on_pool(items, threads, granule, fn);
}

void check_sizes(const char* kernel, std::initializer_list<int> sizes) {
  for (int size : sizes) ZERO_CHECK(size >= 0, kernel << ": negative size " << size);
}

void check_buffer(const void* p, size_t n, const char* kernel, const char* name) {
  ZERO_CHECK(p != nullptr || n == 0, kernel << ": " << name << " is null for " << n << " values");
}

size_t product(int a, int b) {
  return static_cast<size_t>(a) * static_cast<size_t>(b);
}

// OpenBLAS returns different bits for different thread counts (it splits the work its own
// way), so every GEMM runs as fixed blocks of rows or columns of C, whichever of its dimensions
// is larger: the blocks depend on the shapes alone, our threads take whole blocks, and OpenBLAS
// runs single-threaded inside each. Each block repacks the whole other operand, so blocks are
// as wide as balance allows: kGemmBlock until that would make more than kGemmMaxBlocks of them,
// wider past that (the LM head's 50257 vocabulary columns: ~800 wide, where the repacking costs
// a few %). At the GPT-2 benchmark's 2048 rows, 256-row blocks ran the block GEMMs (QKV, MLP,
// projections and their backward) 10-25 % faster than 128-row ones, one thread, SkylakeX
// kernels; 512 gained nothing more, and 8 blocks still balance over the threads we run.
constexpr int kGemmBlock = 256;
constexpr int kGemmMaxBlocks = 64;

// Our threads split the GEMMs; OpenBLAS runs single-threaded inside each call.
void single_threaded_blas() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

// One block of a blocked GEMM: OpenBLAS's sgemm for fp32 operands, oneDNN's bf16 matmul for
// bf16 ones (raw bits), both single-threaded.
void gemm_block(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K,
                const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

#if ZERO_HAVE_DNNL
void gemm_block(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K,
                const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C,
                int ldc) {
  detail::bf16_gemm(trans_a == CblasTrans, trans_b == CblasTrans, M, N, K, 1.0f, A, lda, B, ldb,
                    beta, C, ldc);
}
#endif

// C [M, N] = A [M, K] @ B [K, N] + beta C, row-major, each operand optionally transposed as in
// cblas_sgemm; A and B fp32, or bf16 (raw bits) for bf16 products.
template <typename T>
void blocked_gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K, const T* A,
                  int lda, const T* B, int ldb, float beta, float* C, int ldc,
                  const KernelOptions& opt) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum; OpenBLAS would reject the leading dimensions of 0
    for (int row = 0; row < M; ++row) {
      for (int col = 0; col < N; ++col) C[product(row, ldc) + col] *= beta;
    }
    return;
  }
  ZERO_CHECK(opt.threads >= 1, "KernelOptions.threads must be at least 1, got " << opt.threads);
  single_threaded_blas();
  const bool by_rows = M >= N;
  const int extent = by_rows ? M : N;
  const int wanted_blocks = std::min((extent + kGemmBlock - 1) / kGemmBlock, kGemmMaxBlocks);
  const int block_size = (extent + wanted_blocks - 1) / wanted_blocks;
  const size_t blocks = (extent + block_size - 1) / block_size;
  const size_t work_per_block = static_cast<size_t>(block_size) * (by_rows ? N : M) * K;
  parallel_for(blocks, work_per_block, 1, opt, [&](size_t begin, size_t end) {
    for (size_t block = begin; block < end; ++block) {
      const int first = static_cast<int>(block) * block_size;
      const int size = std::min(block_size, extent - first);
      if (by_rows) {
        const T* a = A + (trans_a == CblasNoTrans ? product(first, lda) : first);
        gemm_block(trans_a, trans_b, size, N, K, a, lda, B, ldb, beta, C + product(first, ldc),
                   ldc);
      } else {
        const T* b = B + (trans_b == CblasNoTrans ? first : product(first, ldb));
        gemm_block(trans_a, trans_b, M, size, K, A, lda, b, ldb, beta, C + first, ldc);
      }
    }
  });
}

// ZERO_BF16_PRODUCTS=fp32 keeps bf16 products in fp32 (to compare the two); unset or "bf16":
// bf16 where the CPU has the arithmetic. Read once.
bool environment_keeps_fp32_products() {
  static const bool keeps = [] {
    const char* value = std::getenv("ZERO_BF16_PRODUCTS");
    if (value == nullptr || value[0] == '\0' || std::strcmp(value, "bf16") == 0) return false;
    ZERO_CHECK(std::strcmp(value, "fp32") == 0,
               "ZERO_BF16_PRODUCTS='" << value << "' is neither bf16 nor fp32");
    return true;
  }();
  return keeps;
}

// An operand of matmul_forward's and matmul_backward's products: `size` fp32 values, and their
// bf16 copy when the caller rounded them already (else null).
struct Operand {
  const float* values;
  size_t size;
  const uint16_t* bf16 = nullptr;
};

#if ZERO_HAVE_DNNL
// Whether opt's products run in bf16 here.
bool products_in_bf16(const KernelOptions& opt) {
  return opt.bf16_products && bf16_products_in_bf16();
}

// n values of x rounded to bf16 into operand `slot` (0-2) of this thread. The buffers are kept
// between calls (the largest is the LM head's gradient, N x V), so that no product pays for
// fresh pages.
const uint16_t* round_to_bf16(int slot, const float* x, size_t n, const KernelOptions& opt) {
  thread_local std::vector<uint16_t> buffers[3];
  std::vector<uint16_t>& buffer = buffers[slot];
  if (buffer.size() < n) buffer.resize(n);
  cast(x, DType::kFloat32, buffer.data(), DType::kBFloat16, n, opt);
  return buffer.data();
}
#endif

// The products of matmul_forward and matmul_backward in the precision opt asks for: A and B
// rounded to bf16 (unless they come rounded) and multiplied in bf16 (fp32 accumulation) where
// opt.bf16_products and bf16_products_in_bf16(), else fp32.
void matrix_product(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K,
                    Operand A, int lda, Operand B, int ldb, float beta, float* C, int ldc,
                    const KernelOptions& opt) {
#if ZERO_HAVE_DNNL
  if (products_in_bf16(opt)) {
    const uint16_t* a = A.bf16 ? A.bf16 : round_to_bf16(0, A.values, A.size, opt);
    const uint16_t* b = B.bf16 ? B.bf16 : round_to_bf16(1, B.values, B.size, opt);
    blocked_gemm(trans_a, trans_b, M, N, K, a, lda, b, ldb, beta, C, ldc, opt);
    return;
  }
#endif
  blocked_gemm(trans_a, trans_b, M, N, K, A.values, lda, B.values, ldb, beta, C, ldc, opt);
}

// sums[c] += the sum over rows n of value(n, c) for c in [0, C), rows added in order. Threads
// take column ranges; each range sums into a zeroed local buffer first, so += adds one total.
template <typename Value>
void add_column_sums(float* sums, size_t rows, size_t C, const KernelOptions& opt, Value&& value) {
  parallel_for(C, rows, kColumnGranule, opt, [&](size_t begin, size_t end) {
    std::vector<float> local(end - begin, 0.0f);
    for (size_t n = 0; n < rows; ++n) {
      for (size_t c = begin; c < end; ++c) local[c - begin] += value(n, c);
    }
    for (size_t c = begin; c < end; ++c) sums[c] += local[c - begin];
  });
}

}  // namespace

bool bf16_products_in_bf16() {
#if ZERO_HAVE_DNNL
  return cpu_features().has_bf16_arithmetic() && !environment_keeps_fp32_products();
#else
  return false;
#endif
}

std::string bf16_products_description() {
  if (environment_keeps_fp32_products()) return "fp32 (ZERO_BF16_PRODUCTS=fp32)";
#if ZERO_HAVE_DNNL
  if (bf16_products_in_bf16()) return "oneDNN bf16 (" + detail::bf16_gemm_isa() + ")";
  return "fp32 (this CPU has neither avx512_bf16 nor amx_bf16)";
#else
  return "fp32 (built without oneDNN)";
#endif
}

void embedding_forward(float* out, const float* tokens, const float* wte, const float* wpe, int B,
                       int T, int C, const KernelOptions& opt) {
  check_sizes("embedding_forward", {B, T, C});
  const size_t rows = product(B, T);
  check_buffer(out, rows * C, "embedding_forward", "out");
  check_buffer(tokens, rows, "embedding_forward", "tokens");
  check_buffer(wpe, product(T, C), "embedding_forward", "wpe");
  check_buffer(wte, rows * C, "embedding_forward", "wte");
  parallel_for(rows, C, 1, opt, [&](size_t begin, size_t end) {
    for (size_t row = begin; row < end; ++row) {
      const float* token_row = wte + static_cast<size_t>(tokens[row]) * C;
      const float* position_row = wpe + (row % T) * C;
      float* o = out + row * C;
      for (int c = 0; c < C; ++c) o[c] = token_row[c] + position_row[c];
    }
  });
}

// A token's row of dwte gathers every position holding it, so threads split the columns and
// each walks all positions in order.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const float* tokens, int B,
                        int T, int C, const KernelOptions& opt) {
  check_sizes("embedding_backward", {B, T, C});
  const size_t rows = product(B, T);
  check_buffer(dout, rows * C, "embedding_backward", "dout");
  check_buffer(tokens, rows, "embedding_backward", "tokens");
  check_buffer(dwpe, product(T, C), "embedding_backward", "dwpe");
  check_buffer(dwte, rows * C, "embedding_backward", "dwte");
  parallel_for(C, rows, kColumnGranule, opt, [&](size_t begin, size_t end) {
    for (size_t row = 0; row < rows; ++row) {
      const float* d = dout + row * C;
      float* token_grad = dwte + static_cast<size_t>(tokens[row]) * C;
      float* position_grad = dwpe + (row % T) * C;
      for (size_t c = begin; c < end; ++c) {
        token_grad[c] += d[c];
        position_grad[c] += d[c];
      }
    }
  });
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C, float eps, const KernelOptions& opt) {
  check_sizes("layernorm_forward", {N, C});
  const size_t n = product(N, C);
  check_buffer(out, n, "layernorm_forward", "out");
  check_buffer(inp, n, "layernorm_forward", "inp");
  check_buffer(mean, N, "layernorm_forward", "mean");
  check_buffer(rstd, N, "layernorm_forward", "rstd");
  check_buffer(weight, C, "layernorm_forward", "weight");
  check_buffer(bias, C, "layernorm_forward", "bias");
  const TransformerPath& path = active_path();
  parallel_for(N, C, 1, opt, [&](size_t begin, size_t end) {
    path.layernorm_forward(out + begin * C, mean + begin, rstd + begin, inp + begin * C, weight,
                           bias, end - begin, C, eps);
  });
}

// dinp row by row on the active path; dweight and dbias as column sums of dout * norm and dout.
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C, const KernelOptions& opt) {
  check_sizes("layernorm_backward", {N, C});
  const size_t n = product(N, C);
  check_buffer(dinp, n, "layernorm_backward", "dinp");
  check_buffer(dout, n, "layernorm_backward", "dout");
  check_buffer(inp, n, "layernorm_backward", "inp");
  check_buffer(dweight, C, "layernorm_backward", "dweight");
  check_buffer(dbias, C, "layernorm_backward", "dbias");
  check_buffer(weight, C, "layernorm_backward", "weight");
  check_buffer(mean, N, "layernorm_backward", "mean");
  check_buffer(rstd, N, "layernorm_backward", "rstd");
  const TransformerPath& path = active_path();
  parallel_for(N, C, 1, opt, [&](size_t begin, size_t end) {
    path.layernorm_backward_input(dinp + begin * C, dout + begin * C, inp + begin * C, weight,
                                  mean + begin, rstd + begin, end - begin, C);
  });
  const size_t cols = C;
  add_column_sums(dweight, N, cols, opt, [&](size_t row, size_t c) {
    return dout[row * cols + c] * ((inp[row * cols + c] - mean[row]) * rstd[row]);
  });
  add_column_sums(dbias, N, cols, opt, [&](size_t row, size_t c) { return dout[row * cols + c]; });
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, WeightLayout layout, const KernelOptions& opt) {
  check_sizes("matmul_forward", {N, C, OC});
  check_buffer(out, product(N, OC), "matmul_forward", "out");
  check_buffer(inp, product(N, C), "matmul_forward", "inp");
  check_buffer(weight, product(C, OC), "matmul_forward", "weight");
  // The bias is written first and the GEMM adds onto it (beta = 1).
  if (bias) {
    parallel_for(N, OC, 1, opt, [&](size_t begin, size_t end) {
      for (size_t row = begin; row < end; ++row) {
        std::memcpy(out + row * OC, bias, static_cast<size_t>(OC) * sizeof(float));
      }
    });
  }
  const bool in_out = layout == WeightLayout::kInOut;
  matrix_product(CblasNoTrans, in_out ? CblasNoTrans : CblasTrans, N, OC, C,
                 Operand{inp, product(N, C)}, C, Operand{weight, product(C, OC)}, in_out ? OC : C,
                 bias ? 1.0f : 0.0f, out, OC, opt);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, WeightLayout layout,
                     const KernelOptions& opt) {
  check_sizes("matmul_backward", {N, C, OC});
  check_buffer(dout, product(N, OC), "matmul_backward", "dout");
  check_buffer(inp, product(N, C), "matmul_backward", "inp");
  check_buffer(weight, product(C, OC), "matmul_backward", "weight");
  check_buffer(dweight, product(C, OC), "matmul_backward", "dweight");
  const bool in_out = layout == WeightLayout::kInOut;
  const Operand x{inp, product(N, C)}, w{weight, product(C, OC)};
  // dout is an operand of both products: with bf16 products, rounded once for both.
  Operand d{dout, product(N, OC)};
#if ZERO_HAVE_DNNL
  if (products_in_bf16(opt)) d.bf16 = round_to_bf16(2, dout, d.size, opt);
#endif
  // The weight's gradient first: it is the last reader of inp, which dinp may overwrite.
  if (in_out) {
    // dW [C, OC] += inp^T @ dout.
    matrix_product(CblasTrans, CblasNoTrans, C, OC, N, x, C, d, OC, 1.0f, dweight, OC, opt);
  } else {
    // dW [OC, C] += dout^T @ inp.
    matrix_product(CblasTrans, CblasNoTrans, OC, C, N, d, OC, x, C, 1.0f, dweight, C, opt);
  }
  if (dbias) {
    const size_t cols = OC;
    add_column_sums(dbias, N, cols, opt,
                    [&](size_t row, size_t c) { return dout[row * cols + c]; });
  }
  if (dinp) {
    // dinp [N, C] = dout [N, OC] @ W^T, where W^T is [OC, C].
    matrix_product(CblasNoTrans, in_out ? CblasTrans : CblasNoTrans, N, C, OC, d, OC, w,
                   in_out ? OC : C, 0.0f, dinp, C, opt);
  }
}

void gelu_forward(float* out, const float* inp, size_t n, const KernelOptions& opt) {
  check_buffer(out, n, "gelu_forward", "out");
  check_buffer(inp, n, "gelu_forward", "inp");
  const TransformerPath& path = active_path();
  parallel_for(n, 1, kColumnGranule, opt, [&](size_t begin, size_t end) {
    path.gelu_forward(out + begin, inp + begin, end - begin);
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                   const KernelOptions& opt) {
  check_buffer(dinp, n, "gelu_backward", "dinp");
  check_buffer(inp, n, "gelu_backward", "inp");
  check_buffer(dout, n, "gelu_backward", "dout");
  const TransformerPath& path = active_path();
  parallel_for(n, 1, kColumnGranule, opt, [&](size_t begin, size_t end) {
    path.gelu_backward(dinp + begin, inp + begin, dout + begin, end - begin);
  });
}

namespace {

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
  const TransformerPath& path = active_path();
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
  const TransformerPath& path = active_path();
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

namespace {

void check_cross_entropy(const char* kernel, const int32_t* targets, int N, int V, int Vp) {
  check_sizes(kernel, {N, V, Vp});
  ZERO_CHECK(V >= 1 && V <= Vp, kernel << ": V = " << V << " must lie in [1, Vp = " << Vp << "]");
  check_buffer(targets, N, kernel, "targets");
  for (int n = 0; n < N; ++n) {
    ZERO_CHECK(targets[n] >= 0 && targets[n] < V, kernel << ": target " << targets[n] << " of row "
                                                         << n << " is outside [0, " << V << ")");
  }
}

}  // namespace

void cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                           int N, int V, int Vp, const KernelOptions& opt) {
  check_cross_entropy("cross_entropy_forward", targets, N, V, Vp);
  check_buffer(losses, N, "cross_entropy_forward", "losses");
  check_buffer(lse, N, "cross_entropy_forward", "lse");
  check_buffer(logits, product(N, Vp), "cross_entropy_forward", "logits");
  const TransformerPath& path = active_path();
  parallel_for(N, V, 1, opt, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      const float* row = logits + n * Vp;
      lse[n] = path.logsumexp(row, V);
      losses[n] = lse[n] - row[targets[n]];
    }
  });
}

// Written in place row by row: every value of a row is read before it is overwritten, so
// dlogits may be logits.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int V, int Vp,
                            const KernelOptions& opt) {
  check_cross_entropy("cross_entropy_backward", targets, N, V, Vp);
  check_buffer(dlogits, product(N, Vp), "cross_entropy_backward", "dlogits");
  check_buffer(logits, product(N, Vp), "cross_entropy_backward", "logits");
  check_buffer(lse, N, "cross_entropy_backward", "lse");
  const TransformerPath& path = active_path();
  parallel_for(N, Vp, 1, opt, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      float* d = dlogits + n * Vp;
      path.scaled_exp(d, logits + n * Vp, lse[n], dloss, V);
      d[targets[n]] -= dloss;
      std::memset(d + V, 0, static_cast<size_t>(Vp - V) * sizeof(float));
    }
  });
}

}  // namespace zero::kernels
