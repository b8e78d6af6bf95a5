// oneDNN matmul primitives, one per shape, cached for the process.
#include "bf16_gemm.h"

#include <omp.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"
#include "zero/core/check.h"

namespace zero::kernels::detail {
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// The sizes, leading dimensions, whether alpha is other than 1 (its value is given at each run:
// a loss's gradient scale may change from call to call), beta, whether C is bf16 and whether a
// bias is added.
using ShapeKey = std::tuple<bool, bool, int, int, int, int, int, int, bool, float, bool, bool>;

struct Primitive {
  dnnl::matmul matmul;
  memory::desc a, b, c;
  memory::desc bias;        // [1, N] fp32, broadcast over the rows (empty: none)
  memory::desc scratchpad;  // what one execution needs beside its operands
};

memory::desc matrix(int rows, int cols, bool transposed, int ld, memory::data_type type) {
  const memory::dims dims = {rows, cols};
  const memory::dims strides = transposed ? memory::dims{1, ld} : memory::dims{ld, 1};
  return memory::desc(dims, type, strides);
}

std::shared_ptr<const Primitive> primitive_for(const ShapeKey& key) {
  static std::mutex mutex;
  static std::map<ShapeKey, std::shared_ptr<const Primitive>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  const auto [trans_a, trans_b, M, N, K, lda, ldb, ldc, scaled, beta, c_bf16, has_bias] = key;
  auto made = std::make_shared<Primitive>();
  made->a = matrix(M, K, trans_a, lda, memory::data_type::bf16);
  made->b = matrix(K, N, trans_b, ldb, memory::data_type::bf16);
  made->c = matrix(M, N, false, ldc, c_bf16 ? memory::data_type::bf16 : memory::data_type::f32);
  dnnl::primitive_attr attr;
  // Our threads run one primitive at once on different blocks: each gives its own scratchpad
  // (the library's own is shared, per primitive or by all as oneDNN was built: a bf16 C's fp32
  // accumulators there came out mixed between the threads' blocks).
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (scaled) attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  if (has_bias) made->bias = memory::desc({1, N}, memory::data_type::f32, {N, 1});
  const dnnl::matmul::desc desc = has_bias
                                      ? dnnl::matmul::desc(made->a, made->b, made->bias, made->c)
                                      : dnnl::matmul::desc(made->a, made->b, made->c);
  const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  made->matmul = dnnl::matmul(pd);
  made->scratchpad = pd.scratchpad_desc();
  cache.emplace(key, made);
  return made;
}

void run_bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
                   int lda, const uint16_t* B, int ldb, float beta, void* C, bool c_bf16, int ldc,
                   const float* bias) {
  if (M == 0 || N == 0) return;
  // oneDNN would scale the bias with the products.
  ZERO_CHECK(bias == nullptr || alpha == 1.0f,
             "bf16_gemm: a bias goes with alpha 1 only, got alpha " << alpha);
  // oneDNN parallelizes over OpenMP's threads of the calling thread; the callers split the work
  // over their own threads already, so each call runs on one.
  thread_local const bool single_threaded = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)single_threaded;
  try {
    const std::shared_ptr<const Primitive> p = primitive_for(ShapeKey{
        trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha != 1.0f, beta, c_bf16, bias != nullptr});
    thread_local dnnl::stream stream(cpu_engine());
    memory a(p->a, cpu_engine(), const_cast<uint16_t*>(A));
    memory b(p->b, cpu_engine(), const_cast<uint16_t*>(B));
    memory c(p->c, cpu_engine(), C);
    thread_local std::vector<uint8_t> scratchpad;
    if (scratchpad.size() < p->scratchpad.get_size()) scratchpad.resize(p->scratchpad.get_size());
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, a},
        {DNNL_ARG_WEIGHTS, b},
        {DNNL_ARG_DST, c},
        {DNNL_ARG_SCRATCHPAD, memory(p->scratchpad, cpu_engine(), scratchpad.data())}};
    if (bias != nullptr) {
      args.emplace(DNNL_ARG_BIAS, memory(p->bias, cpu_engine(), const_cast<float*>(bias)));
    }
    if (alpha != 1.0f) {
      args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES,
                   memory({{1}, memory::data_type::f32, {1}}, cpu_engine(), &alpha));
    }
    p->matmul.execute(stream, args);
    stream.wait();
  } catch (const dnnl::error& e) {
    ZERO_FAIL("oneDNN bf16 matmul of [" << M << ", " << K << "] x [" << K << ", " << N
                                        << "] failed: " << e.what());
  }
}

}  // namespace

void bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, float* C, int ldc,
               const float* bias) {
  run_bf16_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, false, ldc, bias);
}

void bf16_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t* A,
               int lda, const uint16_t* B, int ldb, float beta, uint16_t* C, int ldc) {
  run_bf16_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, true, ldc, nullptr);
}

const uint16_t* round_to_bf16(int slot, const float* x, size_t n, const KernelOptions& opt) {
  thread_local std::vector<uint16_t> buffers[3];
  std::vector<uint16_t>& buffer = buffers[slot];
  if (buffer.size() < n) buffer.resize(n);
  cast(x, DType::kFloat32, buffer.data(), DType::kBFloat16, n, opt);
  return buffer.data();
}

std::string bf16_gemm_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    default:
      return "no AVX-512";
  }
}

}  // namespace zero::kernels::detail
