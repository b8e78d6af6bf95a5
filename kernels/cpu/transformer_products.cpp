// The products of the transformer kernels: matmul_forward and matmul_backward as GEMMs cut into
// fixed blocks over the kernel pool, each block one single-threaded OpenBLAS sgemm, or a oneDNN
// bf16 matmul when the caller asks for bf16 products and the CPU has the arithmetic.
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "bf16_gemm.h"
#include "transformer_threads.h"
#include "zero/kernels/transformer_kernels.h"

// OpenBLAS's own extensions; Debian's cblas.h declares them only when it is OpenBLAS's copy.
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace zero::kernels {

void detail::single_threaded_blas() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

namespace {

using detail::add_column_sums;
using detail::check_buffer;
using detail::check_sizes;
using detail::parallel_for;
using detail::product;
using detail::single_threaded_blas;

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

// One block of a blocked GEMM: OpenBLAS's sgemm for fp32 operands, oneDNN's bf16 matmul for
// bf16 ones (raw bits), both single-threaded.
void gemm_block(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K, float alpha,
                const float* A, int lda, const float* B, int ldb, float beta, float* C, int ldc,
                const float* bias) {
  ZERO_CHECK(bias == nullptr, "internal error: OpenBLAS's sgemm adds no bias");
  cblas_sgemm(CblasRowMajor, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#if ZERO_HAVE_DNNL
void gemm_block(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K, float alpha,
                const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, float* C,
                int ldc, const float* bias) {
  detail::bf16_gemm(trans_a == CblasTrans, trans_b == CblasTrans, M, N, K, alpha, A, lda, B, ldb,
                    beta, C, ldc, bias);
}

void gemm_block(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K, float alpha,
                const uint16_t* A, int lda, const uint16_t* B, int ldb, float beta, uint16_t* C,
                int ldc, const float* bias) {
  ZERO_CHECK(bias == nullptr, "internal error: a bf16 C takes no bias");
  detail::bf16_gemm(trans_a == CblasTrans, trans_b == CblasTrans, M, N, K, alpha, A, lda, B, ldb,
                    beta, C, ldc);
}
#endif

// Whether a blocked GEMM of C [M, N] cuts C into blocks of rows (else of columns). OpenBLAS's
// sgemm: along the larger dimension, for balance. oneDNN's bf16 matmul: always by rows, which
// keeps each block's stores in whole rows of C: the LM head's forward (2048 x 384 x 50257) cut
// into 64 strips of ~786 of the 50257 columns ran at 173 GFLOP/s, against 284 in 8 blocks of 256
// rows, each repacking the whole 384 x 50257 weight (AMX, one thread); its share of the bf16
// GPT-2's step fell from about 520 to 330 ms.
template <typename T>
bool cuts_by_rows(int M, int N) {
  return std::is_same<T, uint16_t>::value || M >= N;
}

// C [M, N] = alpha A [M, K] @ B [K, N] + beta C, row-major, each operand optionally transposed
// as in cblas_sgemm; A and B fp32, or bf16 (raw bits) for bf16 products, whose C may be bf16 too
// (a gradient added into: beta 1), and whose fp32 C may take a bias [N] added to every row
// (alpha 1).
template <typename T, typename CT>
void blocked_gemm(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K,
                  float alpha, const T* A, int lda, const T* B, int ldb, float beta, CT* C, int ldc,
                  const KernelOptions& opt, const float* bias = nullptr) {
  if (M == 0 || N == 0) return;
  ZERO_CHECK(bias == nullptr || K > 0, "internal error: an empty product adds no bias");
  if (K == 0) {  // an empty sum; OpenBLAS would reject the leading dimensions of 0
    if constexpr (std::is_same<CT, float>::value) {
      for (int row = 0; row < M; ++row) {
        for (int col = 0; col < N; ++col) C[product(row, ldc) + col] *= beta;
      }
    } else {
      ZERO_CHECK(beta == 1.0f, "a bf16 C is only added to (beta 1), got beta " << beta);
    }
    return;
  }
  ZERO_CHECK(opt.threads >= 1, "KernelOptions.threads must be at least 1, got " << opt.threads);
  single_threaded_blas();
  const bool by_rows = cuts_by_rows<T>(M, N);
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
        gemm_block(trans_a, trans_b, size, N, K, alpha, a, lda, B, ldb, beta,
                   C + product(first, ldc), ldc, bias);
      } else {
        const T* b = B + (trans_b == CblasNoTrans ? first : product(first, ldb));
        gemm_block(trans_a, trans_b, M, size, K, alpha, A, lda, b, ldb, beta, C + first, ldc,
                   bias != nullptr ? bias + first : nullptr);
      }
    }
  });
}

// A ZERO_BF16_* choice in the environment: "bf16" (true), "fp32" (false), or unset or empty
// (none); anything else is an error naming the variable.
std::optional<bool> environment_bf16_choice(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') return std::nullopt;
  ZERO_CHECK(std::strcmp(value, "bf16") == 0 || std::strcmp(value, "fp32") == 0,
             name << "='" << value << "' is neither bf16 nor fp32");
  return std::strcmp(value, "bf16") == 0;
}

// ZERO_BF16_PRODUCTS=fp32 keeps bf16 products in fp32 (to compare the two); unset or "bf16":
// bf16 where the CPU has the arithmetic. Read once.
bool environment_keeps_fp32_products() {
  static const bool keeps = environment_bf16_choice("ZERO_BF16_PRODUCTS") == false;
  return keeps;
}

// An operand of matmul_forward's and matmul_backward's products: `size` fp32 values, and their
// bf16 copy when the caller rounded them already (else null). A bf16 weight comes without fp32
// values.
struct Operand {
  const float* values;
  size_t size;
  const uint16_t* bf16 = nullptr;
};

// An operand's fp32 values, which fp32 products need: a bf16 weight alone goes to bf16 products
// only (its caller asks takes_bf16_weights-style first).
const float* fp32_values(const Operand& x) {
  ZERO_CHECK(x.values != nullptr,
             "a bf16 weight (MatrixWeight::bf16) needs bf16 products: KernelOptions.bf16_products "
             "on a CPU where bf16_products_in_bf16(); these run in fp32");
  return x.values;
}

#if ZERO_HAVE_DNNL
// Whether opt's products run in bf16 here.
bool products_in_bf16(const KernelOptions& opt) {
  return opt.bf16_products && bf16_products_in_bf16();
}
#endif

// Whether matrix_product adds a bias itself: oneDNN's bf16 products add it to their sums as they
// store them, where OpenBLAS's sgemm needs it written into C first (beta 1), one more pass over C.
bool adds_bias(const KernelOptions& opt) {
#if ZERO_HAVE_DNNL
  return products_in_bf16(opt);
#else
  (void)opt;
  return false;
#endif
}

// The products of matmul_forward and matmul_backward in the precision opt asks for: A and B
// rounded to bf16 (unless they come rounded) and multiplied in bf16 (fp32 accumulation) where
// opt.bf16_products and bf16_products_in_bf16(), else fp32. C = alpha A B + bias + beta C, C fp32
// or, in bf16 products only, bf16 (a bf16 weight gradient added into, each value rounded once);
// a bias [N] only where adds_bias(opt).
template <typename CT>
void matrix_product(CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int M, int N, int K,
                    Operand A, int lda, Operand B, int ldb, float beta, CT* C, int ldc,
                    const KernelOptions& opt, float alpha = 1.0f, const float* bias = nullptr) {
#if ZERO_HAVE_DNNL
  if (products_in_bf16(opt)) {
    const uint16_t* a = A.bf16 ? A.bf16 : detail::round_to_bf16(0, A.values, A.size, opt);
    const uint16_t* b = B.bf16 ? B.bf16 : detail::round_to_bf16(1, B.values, B.size, opt);
    blocked_gemm(trans_a, trans_b, M, N, K, alpha, a, lda, b, ldb, beta, C, ldc, opt, bias);
    return;
  }
#endif
  if constexpr (std::is_same<CT, uint16_t>::value) {
    ZERO_FAIL(
        "a bf16 weight gradient (MatrixGradient::bf16) needs bf16 products: "
        "KernelOptions.bf16_products on a CPU where bf16_products_in_bf16(); these run in fp32");
  } else {
    blocked_gemm(trans_a, trans_b, M, N, K, alpha, fp32_values(A), lda, fp32_values(B), ldb, beta,
                 C, ldc, opt);
  }
}

// The weight's gradient of matmul_backward's: dW [C, OC] (in-out layout) += alpha inp^T @ dout,
// or dW [OC, C] (out-in) += alpha dout^T @ inp, into fp32 or, in bf16 products, bf16.
template <typename CT>
void weight_gradient(CT* dW, const Operand& x, const Operand& d, int ld_d, int N, int C, int OC,
                     bool in_out, const KernelOptions& opt, float alpha) {
  if (in_out) {
    matrix_product(CblasTrans, CblasNoTrans, C, OC, N, x, C, d, ld_d, 1.0f, dW, OC, opt, alpha);
  } else {
    matrix_product(CblasTrans, CblasNoTrans, OC, C, N, d, ld_d, x, C, 1.0f, dW, C, opt, alpha);
  }
}

void weight_gradient(MatrixGradient dweight, const Operand& x, const Operand& d, int ld_d, int N,
                     int C, int OC, bool in_out, const KernelOptions& opt, float alpha) {
  if (dweight.bf16_bits != nullptr) {
    weight_gradient(dweight.bf16_bits, x, d, ld_d, N, C, OC, in_out, opt, alpha);
  } else {
    weight_gradient(dweight.values, x, d, ld_d, N, C, OC, in_out, opt, alpha);
  }
}

// A weight gradient in one dtype or the other, not both.
void check_weight_gradient(const MatrixGradient& dweight, const char* kernel) {
  ZERO_CHECK(dweight.values == nullptr || dweight.bf16_bits == nullptr,
             kernel << ": dweight has both fp32 and bf16 values; give one");
}

// A weight of n values in one dtype or the other, not both and not neither.
void check_weight(const MatrixWeight& weight, size_t n, const char* kernel) {
  ZERO_CHECK(weight.values == nullptr || weight.bf16_bits == nullptr,
             kernel << ": weight has both fp32 and bf16 values; give one");
  check_buffer(weight.values != nullptr ? static_cast<const void*>(weight.values)
                                        : static_cast<const void*>(weight.bf16_bits),
               n, kernel, "weight");
}

}  // namespace

bool bf16_products_in_bf16() {
#if ZERO_HAVE_DNNL
  return cpu_features().has_bf16_arithmetic() && !environment_keeps_fp32_products();
#else
  return false;
#endif
}

bool bf16_attention_in_bf16() {
#if ZERO_HAVE_DNNL
  static const bool in_bf16 = environment_bf16_choice("ZERO_BF16_ATTENTION")
                                  .value_or(detail::bf16_gemm_isa() == "avx512_core_bf16");
  return in_bf16 && bf16_products_in_bf16();
#else
  return false;
#endif
}

std::string bf16_products_description() {
  if (environment_keeps_fp32_products()) return "fp32 (ZERO_BF16_PRODUCTS=fp32)";
#if ZERO_HAVE_DNNL
  if (bf16_products_in_bf16()) {
    return "oneDNN bf16 (" + detail::bf16_gemm_isa() + "); attention products " +
           (bf16_attention_in_bf16() ? "bf16" : "fp32");
  }
  return "fp32 (this CPU has neither avx512_bf16 nor amx_bf16)";
#else
  return "fp32 (built without oneDNN)";
#endif
}

void matmul_forward(float* out, const float* inp, MatrixWeight weight, const float* bias, int N,
                    int C, int OC, WeightLayout layout, const KernelOptions& opt) {
  check_sizes("matmul_forward", {N, C, OC});
  check_buffer(out, product(N, OC), "matmul_forward", "out");
  check_buffer(inp, product(N, C), "matmul_forward", "inp");
  check_weight(weight, product(C, OC), "matmul_forward");
  // Where the product cannot add the bias, it is written first and the GEMM adds onto it (beta 1):
  // either way each output is the products' sum plus the bias, one fp32 addition.
  const bool bias_in_product = bias != nullptr && C > 0 && adds_bias(opt);
  if (bias != nullptr && !bias_in_product) {
    parallel_for(N, OC, 1, opt, [&](size_t begin, size_t end) {
      for (size_t row = begin; row < end; ++row) {
        std::memcpy(out + row * OC, bias, static_cast<size_t>(OC) * sizeof(float));
      }
    });
  }
  const bool in_out = layout == WeightLayout::kInOut;
  matrix_product(CblasNoTrans, in_out ? CblasNoTrans : CblasTrans, N, OC, C,
                 Operand{inp, product(N, C)}, C,
                 Operand{weight.values, product(C, OC), weight.bf16_bits}, in_out ? OC : C,
                 bias != nullptr && !bias_in_product ? 1.0f : 0.0f, out, OC, opt, 1.0f,
                 bias_in_product ? bias : nullptr);
}

void matmul_backward(float* dinp, MatrixGradient dweight, float* dbias, const float* dout,
                     const float* inp, MatrixWeight weight, int N, int C, int OC,
                     WeightLayout layout, const KernelOptions& opt) {
  check_sizes("matmul_backward", {N, C, OC});
  check_buffer(dout, product(N, OC), "matmul_backward", "dout");
  check_weight_gradient(dweight, "matmul_backward");
  if (!dweight.empty()) check_buffer(inp, product(N, C), "matmul_backward", "inp");
  if (dinp != nullptr) check_weight(weight, product(C, OC), "matmul_backward");
  const bool in_out = layout == WeightLayout::kInOut;
  const Operand x{inp, product(N, C)}, w{weight.values, product(C, OC), weight.bf16_bits};
  // dout is an operand of both products: with bf16 products, rounded once for both.
  Operand d{dout, product(N, OC)};
#if ZERO_HAVE_DNNL
  if (products_in_bf16(opt)) d.bf16 = detail::round_to_bf16(2, dout, d.size, opt);
#endif
  // The weight's gradient first: it is the last reader of inp, which dinp may overwrite.
  if (!dweight.empty()) weight_gradient(dweight, x, d, OC, N, C, OC, in_out, opt, 1.0f);
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

void matmul_backward_scaled_bf16(float* dinp, MatrixGradient dweight, ScaledBf16Gradient dout,
                                 const float* inp, MatrixWeight weight, int N, int C, int OC,
                                 WeightLayout layout, const KernelOptions& opt) {
  check_sizes("matmul_backward_scaled_bf16", {N, C, OC});
  ZERO_CHECK(dout.ld >= static_cast<size_t>(OC),
             "matmul_backward_scaled_bf16: the gradient's rows lie "
                 << dout.ld << " apart, fewer than its " << OC << " columns");
  check_buffer(dout.bits, N == 0 ? 0 : (N - 1) * dout.ld + OC, "matmul_backward_scaled_bf16",
               "dout");
  check_weight_gradient(dweight, "matmul_backward_scaled_bf16");
  if (!dweight.empty()) check_buffer(inp, product(N, C), "matmul_backward_scaled_bf16", "inp");
  if (dinp != nullptr) check_weight(weight, product(C, OC), "matmul_backward_scaled_bf16");
#if ZERO_HAVE_DNNL
  ZERO_CHECK(products_in_bf16(opt),
             "matmul_backward_scaled_bf16 needs bf16 products: KernelOptions.bf16_products on a "
             "CPU where bf16_products_in_bf16()");
  const bool in_out = layout == WeightLayout::kInOut;
  const int ld = static_cast<int>(dout.ld);
  const Operand x{inp, product(N, C)}, w{weight.values, product(C, OC), weight.bf16_bits};
  const Operand d{nullptr, 0, dout.bits};
  // The weight's gradient first, as matmul_backward: it is the last reader of inp.
  if (!dweight.empty()) weight_gradient(dweight, x, d, ld, N, C, OC, in_out, opt, dout.scale);
  if (dinp != nullptr) {
    matrix_product(CblasNoTrans, in_out ? CblasTrans : CblasNoTrans, N, C, OC, d, ld, w,
                   in_out ? OC : C, 0.0f, dinp, C, opt, dout.scale);
  }
#else
  (void)layout;
  (void)opt;
  ZERO_FAIL("matmul_backward_scaled_bf16 needs bf16 products, and this build has no oneDNN");
#endif
}

}  // namespace zero::kernels
