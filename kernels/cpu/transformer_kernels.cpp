// The row-wise transformer kernels: embeddings, LayerNorm, GELU and the fused softmax +
// cross-entropy. Each checks its arguments, splits rows (or columns, for sums over rows) over the
// kernel pool and calls the active path's loops (transformer_paths.h). The products are in
// transformer_products.cpp, attention in transformer_attention.cpp.
// Sums over rows (the gradients of shared parameters) are split by columns, each column summed
// over the rows in order, so that no result depends on the thread count.
#include "zero/kernels/transformer_kernels.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "transformer_threads.h"

namespace zero::kernels {

using detail::active_transformer_path;
using detail::add_column_sums;
using detail::check_buffer;
using detail::check_sizes;
using detail::kColumnGranule;
using detail::parallel_for;
using detail::product;
using detail::TransformerPath;

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
namespace {

// dwpe[t, :] += dout[row, :] for each of `rows` rows, t = row % T, in row order per column.
void add_position_gradients(float* dwpe, const float* dout, size_t rows, int T, int C,
                            const KernelOptions& opt) {
  parallel_for(C, rows, kColumnGranule, opt, [&](size_t begin, size_t end) {
    for (size_t row = 0; row < rows; ++row) {
      const float* d = dout + row * C;
      float* position_grad = dwpe + (row % T) * C;
      for (size_t c = begin; c < end; ++c) position_grad[c] += d[c];
    }
  });
}

void check_16bit(DType dtype, const char* kernel) {
  ZERO_CHECK(dtype == DType::kBFloat16 || dtype == DType::kFloat16,
             kernel << ": the table must be bf16 or fp16, got " << dtype_name(dtype));
}

}  // namespace

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
      for (size_t c = begin; c < end; ++c) token_grad[c] += d[c];
    }
  });
  add_position_gradients(dwpe, dout, rows, T, C, opt);
}

void embedding_forward_16bit(float* out, const float* tokens, const void* wte, DType wte_dtype,
                             const float* wpe, int B, int T, int C, const KernelOptions& opt) {
  check_sizes("embedding_forward_16bit", {B, T, C});
  check_16bit(wte_dtype, "embedding_forward_16bit");
  const size_t rows = product(B, T);
  check_buffer(out, rows * C, "embedding_forward_16bit", "out");
  check_buffer(tokens, rows, "embedding_forward_16bit", "tokens");
  check_buffer(wpe, product(T, C), "embedding_forward_16bit", "wpe");
  check_buffer(wte, C, "embedding_forward_16bit", "wte");
  const size_t row_bytes = static_cast<size_t>(C) * 2;
  parallel_for(rows, C, 1, opt, [&](size_t begin, size_t end) {
    for (size_t row = begin; row < end; ++row) {
      const void* token_row =
          static_cast<const char*>(wte) + static_cast<size_t>(tokens[row]) * row_bytes;
      const float* position_row = wpe + (row % T) * C;
      float* o = out + row * C;
      cast(token_row, wte_dtype, o, DType::kFloat32, static_cast<size_t>(C), KernelOptions{1});
      for (int c = 0; c < C; ++c) o[c] += position_row[c];
    }
  });
}

void embedding_backward_16bit(void* dwte, DType dwte_dtype, float* dwpe, const float* dout,
                              const float* tokens, int B, int T, int C, const KernelOptions& opt) {
  check_sizes("embedding_backward_16bit", {B, T, C});
  check_16bit(dwte_dtype, "embedding_backward_16bit");
  const size_t rows = product(B, T);
  check_buffer(dout, rows * C, "embedding_backward_16bit", "dout");
  check_buffer(tokens, rows, "embedding_backward_16bit", "tokens");
  check_buffer(dwpe, product(T, C), "embedding_backward_16bit", "dwpe");
  add_position_gradients(dwpe, dout, rows, T, C, opt);
  if (dwte == nullptr) return;
  // The positions grouped by token, each group in position order.
  std::vector<uint32_t> order(rows);
  for (size_t row = 0; row < rows; ++row) order[row] = static_cast<uint32_t>(row);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return tokens[a] < tokens[b]; });
  std::vector<size_t> group_starts;
  for (size_t i = 0; i < rows; ++i) {
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) group_starts.push_back(i);
  }
  group_starts.push_back(rows);
  const size_t row_bytes = static_cast<size_t>(C) * 2;
  parallel_for(group_starts.size() - 1, C, 1, opt, [&](size_t begin, size_t end) {
    std::vector<float> sum(static_cast<size_t>(C));
    for (size_t g = begin; g < end; ++g) {
      // From 0 and in position order, as into a zeroed fp32 table.
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (size_t i = group_starts[g]; i < group_starts[g + 1]; ++i) {
        const float* d = dout + static_cast<size_t>(order[i]) * C;
        for (int c = 0; c < C; ++c) sum[c] += d[c];
      }
      void* token_grad = static_cast<char*>(dwte) +
                         static_cast<size_t>(tokens[order[group_starts[g]]]) * row_bytes;
      accumulate(token_grad, dwte_dtype, sum.data(), DType::kFloat32, static_cast<size_t>(C),
                 KernelOptions{1});
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
  const TransformerPath& path = active_transformer_path();
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
  ZERO_CHECK((dweight == nullptr) == (dbias == nullptr),
             "layernorm_backward: dweight and dbias are computed together; one of them is null");
  check_buffer(dout, n, "layernorm_backward", "dout");
  check_buffer(inp, n, "layernorm_backward", "inp");
  check_buffer(mean, N, "layernorm_backward", "mean");
  check_buffer(rstd, N, "layernorm_backward", "rstd");
  if (dinp != nullptr) {
    check_buffer(weight, C, "layernorm_backward", "weight");
    const TransformerPath& path = active_transformer_path();
    parallel_for(N, C, 1, opt, [&](size_t begin, size_t end) {
      path.layernorm_backward_input(dinp + begin * C, dout + begin * C, inp + begin * C, weight,
                                    mean + begin, rstd + begin, end - begin, C);
    });
  }
  if (dweight == nullptr) return;
  const size_t cols = C;
  add_column_sums(dweight, N, cols, opt, [&](size_t row, size_t c) {
    return dout[row * cols + c] * ((inp[row * cols + c] - mean[row]) * rstd[row]);
  });
  add_column_sums(dbias, N, cols, opt, [&](size_t row, size_t c) { return dout[row * cols + c]; });
}

void gelu_forward(float* out, const float* inp, size_t n, const KernelOptions& opt) {
  check_buffer(out, n, "gelu_forward", "out");
  check_buffer(inp, n, "gelu_forward", "inp");
  const TransformerPath& path = active_transformer_path();
  parallel_for(n, 1, kColumnGranule, opt, [&](size_t begin, size_t end) {
    path.gelu_forward(out + begin, inp + begin, end - begin);
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n,
                   const KernelOptions& opt) {
  check_buffer(dinp, n, "gelu_backward", "dinp");
  check_buffer(inp, n, "gelu_backward", "inp");
  check_buffer(dout, n, "gelu_backward", "dout");
  const TransformerPath& path = active_transformer_path();
  parallel_for(n, 1, kColumnGranule, opt, [&](size_t begin, size_t end) {
    path.gelu_backward(dinp + begin, inp + begin, dout + begin, end - begin);
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
  const TransformerPath& path = active_transformer_path();
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
  const TransformerPath& path = active_transformer_path();
  parallel_for(N, Vp, 1, opt, [&](size_t begin, size_t end) {
    for (size_t n = begin; n < end; ++n) {
      float* d = dlogits + n * Vp;
      path.scaled_exp(d, logits + n * Vp, lse[n], dloss, V);
      d[targets[n]] -= dloss;
      std::memset(d + V, 0, static_cast<size_t>(Vp - V) * sizeof(float));
    }
  });
}

void cross_entropy_forward_bf16_gradient(float* losses, float* lse, float* logits,
                                         const int32_t* targets, int N, int V, int Vp,
                                         const KernelOptions& opt) {
  check_cross_entropy("cross_entropy_forward_bf16_gradient", targets, N, V, Vp);
  check_buffer(losses, N, "cross_entropy_forward_bf16_gradient", "losses");
  check_buffer(lse, N, "cross_entropy_forward_bf16_gradient", "lse");
  check_buffer(logits, product(N, Vp), "cross_entropy_forward_bf16_gradient", "logits");
  const TransformerPath& path = active_transformer_path();
  const size_t padding = static_cast<size_t>(Vp - V) * sizeof(float);
  parallel_for(N, Vp, 1, opt, [&](size_t begin, size_t end) {
    // Each row's gradient is made in fp32 in a row of this thread's (a GPT-2 vocabulary's 200 KB
    // stay in L2), then rounded into the row's first half: rounding in place would overwrite
    // values not yet read.
    std::vector<float> gradient(static_cast<size_t>(Vp));
    for (size_t n = begin; n < end; ++n) {
      float* row = logits + n * Vp;
      lse[n] = path.softmax(gradient.data(), row, V);
      losses[n] = lse[n] - row[targets[n]];
      gradient[targets[n]] -= 1.0f;
      std::memset(gradient.data() + V, 0, padding);
      cast(gradient.data(), DType::kFloat32, row, DType::kBFloat16, static_cast<size_t>(Vp),
           KernelOptions{1});
    }
  });
}

}  // namespace zero::kernels
