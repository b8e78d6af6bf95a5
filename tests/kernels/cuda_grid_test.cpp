// The CUDA kernels' per-thread bodies (cuda_kernel_bodies.h), run by g++ over their whole grid
// in loops: every block, every thread, every launch of a multi-tensor plan. Checks the indexing,
// the tails, the aligned and unaligned paths and the chunk tables against the scalar reference
// of dtype.h / optimizer_math.h, bit for bit. Needs no GPU and no nvcc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernel_bodies.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels::cuda {
namespace {

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// Sizes around the vector (4), the block step (1024) and the chunk (8192) boundaries.
const std::vector<size_t> kSizes = {0,    1,    3,    4,    5,     1023,  1024,
                                    1029, 8191, 8192, 8193, 16384, 24583, 40000};

// Runs body(block, thread, table) for every block and thread of every launch in the plan, the
// way the GPU would (in some order: the bodies share nothing between threads).
template <typename Tensor, typename Body>
void run_grid(const std::vector<LaunchTable<Tensor>>& plans, Body body) {
  for (const auto& table : plans) {
    for (uint32_t block = 0; block < table.blocks(); ++block) {
      for (uint32_t thread = 0; thread < kBlockThreads; ++thread) body(block, thread, table);
    }
  }
}

// Runs body(block, thread) for every block and thread of a single-tensor launch of n elements.
template <typename Body>
void run_element_grid(size_t n, const char* op, Body body) {
  const uint32_t blocks = element_blocks(n, op);
  for (uint32_t block = 0; block < blocks; ++block) {
    for (uint32_t thread = 0; thread < kBlockThreads; ++thread) body(block, thread);
  }
}

// Host memory with a chosen misalignment and guard bytes on both sides, so both the 16-byte
// and the element-at-a-time paths run, and a write outside the tensor shows up.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kGuardByte = 0xA5;

  GuardedBuffer(size_t bytes, size_t misalign) : bytes_(bytes), storage_(bytes + 3 * kGuard) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    const size_t lead = (kGuard - base % kGuard) % kGuard + kGuard + misalign;
    begin_ = storage_.data() + lead;
    std::memset(storage_.data(), kGuardByte, storage_.size());
  }
  void* data() { return begin_; }
  bool guards_intact() const {
    for (const uint8_t* p = storage_.data(); p < begin_; ++p) {
      if (*p != kGuardByte) return false;
    }
    for (const uint8_t* p = begin_ + bytes_; p < storage_.data() + storage_.size(); ++p) {
      if (*p != kGuardByte) return false;
    }
    return true;
  }
  template <typename T>
  T* as() {
    return static_cast<T*>(data());
  }

 private:
  size_t bytes_;
  std::vector<uint8_t> storage_;
  uint8_t* begin_;
};

void fill_random(void* data, DType dtype, size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) store_from_float(data, dtype, i, dist(rng));
}

std::vector<uint8_t> bytes_of(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  return std::vector<uint8_t>(p, p + n);
}

// --- launch plans ------------------------------------------------------------------------------

TEST(CudaGridPlan, EveryBlockMapsToItsTensorAndEmptyTensorsAreSkipped) {
  std::vector<ConstTensor> tensors;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < 200; ++i) sizes.push_back(i % 7 == 0 ? 0 : (i * 977) % 30000 + 1);
  for (size_t n : sizes) tensors.push_back({nullptr, n});
  const auto plans = plan_launches(tensors.data(), tensors.size(), kChunkElements,
                                   [](const ConstTensor& t) { return t.numel; });
  size_t next = 0;  // index into tensors of the next non-empty one
  for (const auto& table : plans) {
    ASSERT_GT(table.count, 0u);
    ASSERT_LE(table.count, kMaxTensorsPerLaunch);
    EXPECT_EQ(table.first_block[0], 0u);
    for (uint32_t i = 0; i < table.count; ++i) {
      while (sizes[next] == 0) ++next;
      EXPECT_EQ(table.tensors[i].numel, sizes[next]);
      const uint32_t blocks = table.first_block[i + 1] - table.first_block[i];
      EXPECT_EQ(blocks, (sizes[next] + kChunkElements - 1) / kChunkElements);
      for (uint32_t b = table.first_block[i]; b < table.first_block[i + 1]; ++b) {
        ASSERT_EQ(tensor_of_block(table, b), i);
      }
      ++next;
    }
  }
  while (next < sizes.size() && sizes[next] == 0) ++next;
  EXPECT_EQ(next, sizes.size());
  EXPECT_EQ(plans.size(), 3u);  // 171 non-empty tensors: 64 + 64 + 43
}

TEST(CudaGridPlan, NoTensorsMeansNoLaunch) {
  EXPECT_TRUE(plan_launches(static_cast<const ConstTensor*>(nullptr), 0, kChunkElements,
                            [](const ConstTensor& t) { return t.numel; })
                  .empty());
}

// --- fused AdamW -------------------------------------------------------------------------------

struct AdamWCase {
  GuardedBuffer master, m, v, grad, param;
  size_t n;
  AdamWCase(size_t count, DType g, DType p, size_t misalign)
      : master(count * 4, misalign * 4),
        m(count * 4, misalign * 4),
        v(count * 4, 0),
        grad(count * dtype_size(g), misalign * dtype_size(g)),
        param(count * dtype_size(p), 0),
        n(count) {}
};

template <DType G, DType P>
void check_adamw_grid(bool with_param_out) {
  const auto c = adamw_step_constants(1e-3f, 0.9, 0.999, 1e-8f, 0.01f, 3);
  const float grad_scale = 0.5f;
  std::mt19937 rng(static_cast<unsigned>(G) * 16 + static_cast<unsigned>(P));
  std::vector<std::unique_ptr<AdamWCase>> cases;
  std::vector<AdamWTensor> tensors;
  // Misalignment 1 sends a tensor down the element-at-a-time path throughout.
  for (size_t misalign : {0, 1}) {
    for (size_t n : kSizes) {
      cases.push_back(std::make_unique<AdamWCase>(n, G, P, misalign));
      AdamWCase& k = *cases.back();
      fill_random(k.master.data(), DType::kFloat32, n, rng, -1.0f, 1.0f);
      fill_random(k.m.data(), DType::kFloat32, n, rng, -0.1f, 0.1f);
      fill_random(k.v.data(), DType::kFloat32, n, rng, 0.0f, 0.01f);
      fill_random(k.grad.data(), G, n, rng, -2.0f, 2.0f);
      tensors.push_back({k.master.as<float>(), k.m.as<float>(), k.v.as<float>(), k.grad.data(),
                         with_param_out ? k.param.data() : nullptr, n});
    }
  }
  // Reference: the scalar loop of the CPU kernels, element by element, on copies.
  std::vector<std::vector<float>> want_master, want_m, want_v;
  std::vector<std::vector<uint8_t>> want_param, param_before;
  for (auto& k : cases) {
    std::vector<float> p(k->master.as<float>(), k->master.as<float>() + k->n);
    std::vector<float> m(k->m.as<float>(), k->m.as<float>() + k->n);
    std::vector<float> v(k->v.as<float>(), k->v.as<float>() + k->n);
    param_before.push_back(bytes_of(k->param.data(), k->n * dtype_size(P)));
    std::vector<uint8_t> out = param_before.back();
    for (size_t i = 0; i < k->n; ++i) {
      adamw_update(p[i], m[i], v[i], load_as_float(k->grad.data(), G, i) * grad_scale, c);
      store_from_float(out.data(), P, i, p[i]);
    }
    want_master.push_back(p);
    want_m.push_back(m);
    want_v.push_back(v);
    want_param.push_back(with_param_out ? out : param_before.back());
  }

  const AdamWArgs args{c, grad_scale, {}};
  run_grid(plan_launches(tensors.data(), tensors.size(), kChunkElements,
                         [](const AdamWTensor& t) { return t.numel; }),
           [&](uint32_t b, uint32_t t, const LaunchTable<AdamWTensor>& table) {
             adamw_thread<G, P>(b, t, table, args);
           });

  for (size_t i = 0; i < cases.size(); ++i) {
    AdamWCase& k = *cases[i];
    SCOPED_TRACE("tensor " + std::to_string(i) + " of " + std::to_string(k.n) + " elements");
    // An empty tensor's expected vector has no storage: memcmp may not see its null pointer.
    if (k.n > 0) {
      EXPECT_EQ(std::memcmp(k.master.data(), want_master[i].data(), k.n * 4), 0);
      EXPECT_EQ(std::memcmp(k.m.data(), want_m[i].data(), k.n * 4), 0);
      EXPECT_EQ(std::memcmp(k.v.data(), want_v[i].data(), k.n * 4), 0);
    }
    EXPECT_EQ(bytes_of(k.param.data(), k.n * dtype_size(P)), want_param[i]);
    EXPECT_TRUE(k.master.guards_intact() && k.m.guards_intact() && k.v.guards_intact() &&
                k.grad.guards_intact() && k.param.guards_intact());
  }
}

template <DType G>
void check_adamw_grid_all_params() {
  check_adamw_grid<G, DType::kFloat32>(true);
  check_adamw_grid<G, DType::kBFloat16>(true);
  check_adamw_grid<G, DType::kFloat16>(true);
  check_adamw_grid<G, DType::kBFloat16>(false);
}

TEST(CudaGridAdamW, Fp32GradsMatchScalarReferenceBitwise) {
  check_adamw_grid_all_params<DType::kFloat32>();
}
TEST(CudaGridAdamW, Bf16GradsMatchScalarReferenceBitwise) {
  check_adamw_grid_all_params<DType::kBFloat16>();
}
TEST(CudaGridAdamW, Fp16GradsMatchScalarReferenceBitwise) {
  check_adamw_grid_all_params<DType::kFloat16>();
}

TEST(CudaGridAdamW, MatchesTheCpuKernel) {
  // The engine's CPU path (AVX2 where present) and the CUDA body on the same 2-byte shard.
  const size_t n = 50001;
  std::mt19937 rng(7);
  std::vector<float> master(n), m(n), v(n, 0.0f);
  std::vector<uint16_t> grad(n), param(n);
  fill_random(master.data(), DType::kFloat32, n, rng, -1.0f, 1.0f);
  fill_random(m.data(), DType::kFloat32, n, rng, -0.1f, 0.1f);
  fill_random(grad.data(), DType::kBFloat16, n, rng, -3.0f, 3.0f);
  std::vector<float> cpu_master = master, cpu_m = m, cpu_v = v;
  std::vector<uint16_t> cpu_param(n);
  const auto c = adamw_step_constants(3e-4f, 0.9, 0.95, 1e-8f, 0.1f, 1);
  kernels::fused_adamw(cpu_master.data(), cpu_m.data(), cpu_v.data(), grad.data(), DType::kBFloat16,
                       0.25f, cpu_param.data(), DType::kBFloat16, n, c);
  AdamWTensor tensor{master.data(), m.data(), v.data(), grad.data(), param.data(), n};
  const AdamWArgs args{c, 0.25f, {}};
  run_grid(plan_launches(&tensor, 1, kChunkElements, [](const AdamWTensor& t) { return t.numel; }),
           [&](uint32_t b, uint32_t t, const LaunchTable<AdamWTensor>& table) {
             adamw_thread<DType::kBFloat16, DType::kBFloat16>(b, t, table, args);
           });
  EXPECT_EQ(std::memcmp(master.data(), cpu_master.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(m.data(), cpu_m.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(v.data(), cpu_v.data(), n * 4), 0);
  EXPECT_EQ(param, cpu_param);
}

TEST(CudaGridAdamW, SkipFlagLeavesEverythingAndDeviceScaleReplacesHostScale) {
  const size_t n = 9001;
  std::mt19937 rng(3);
  std::vector<float> master(n), m(n), v(n), grad(n);
  fill_random(master.data(), DType::kFloat32, n, rng, -1.0f, 1.0f);
  fill_random(grad.data(), DType::kFloat32, n, rng, -1.0f, 1.0f);
  const std::vector<float> master0 = master;
  const auto c = adamw_step_constants(1e-2f, 0.9, 0.999, 1e-8f, 0.0f, 1);
  AdamWTensor tensor{master.data(), m.data(), v.data(), grad.data(), nullptr, n};
  const auto plans =
      plan_launches(&tensor, 1, kChunkElements, [](const AdamWTensor& t) { return t.numel; });

  int skip = 1;
  float device_scale = 0.125f;
  AdamWArgs args{c, 1.0f, {&skip, &device_scale}};
  auto run = [&] {
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<AdamWTensor>& table) {
      adamw_thread<DType::kFloat32, DType::kFloat32>(b, t, table, args);
    });
  };
  run();
  EXPECT_EQ(master, master0);
  EXPECT_EQ(m, std::vector<float>(n, 0.0f));

  skip = 0;
  run();
  std::vector<float> want = master0, want_m(n, 0.0f), want_v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) adamw_update(want[i], want_m[i], want_v[i], grad[i] * 0.125f, c);
  EXPECT_EQ(master, want);
  EXPECT_EQ(m, want_m);
}

// --- fused SGD ----------------------------------------------------------------------------------

// Which of a tensor's buffers starts one element past alignment (each alone must turn the
// tensor's vector path off).
enum class Misaligned { kNone, kMaster, kMomentum, kGrad, kParam };

struct SgdCase {
  GuardedBuffer master, momentum, grad, param;
  size_t n;
  SgdCase(size_t count, DType g, DType p, Misaligned which)
      : master(count * 4, which == Misaligned::kMaster ? 4 : 0),
        momentum(count * 4, which == Misaligned::kMomentum ? 4 : 0),
        grad(count * dtype_size(g), which == Misaligned::kGrad ? dtype_size(g) : 0),
        param(count * dtype_size(p), which == Misaligned::kParam ? dtype_size(p) : 0),
        n(count) {}
};

// How a step treats the momentum buffer.
enum class MomentumBuffer { kNull, kPresent };

template <DType G, DType P>
void check_sgd_grid(const SgdStepConstants& c, MomentumBuffer buffer, bool with_param_out) {
  const float grad_scale = 0.5f;
  std::mt19937 rng(29 + static_cast<unsigned>(G) * 16 + static_cast<unsigned>(P));
  std::vector<std::unique_ptr<SgdCase>> cases;
  std::vector<SgdTensor> tensors;
  for (Misaligned which : {Misaligned::kNone, Misaligned::kMaster, Misaligned::kMomentum,
                           Misaligned::kGrad, Misaligned::kParam}) {
    for (size_t n : kSizes) {
      cases.push_back(std::make_unique<SgdCase>(n, G, P, which));
      SgdCase& k = *cases.back();
      fill_random(k.master.data(), DType::kFloat32, n, rng, -1.0f, 1.0f);
      fill_random(k.momentum.data(), DType::kFloat32, n, rng, -0.1f, 0.1f);
      fill_random(k.grad.data(), G, n, rng, -2.0f, 2.0f);
      tensors.push_back({k.master.as<float>(),
                         buffer == MomentumBuffer::kPresent ? k.momentum.as<float>() : nullptr,
                         k.grad.data(), with_param_out ? k.param.data() : nullptr, n});
    }
  }
  // Reference: the CPU kernel on copies (a momentum buffer it is given but does not use stays
  // as it was, which the comparison then checks on the grid's side too).
  std::vector<std::vector<float>> want_master, want_momentum;
  std::vector<std::vector<uint8_t>> want_param;
  for (size_t i = 0; i < cases.size(); ++i) {
    SgdCase& k = *cases[i];
    std::vector<float> p(k.master.as<float>(), k.master.as<float>() + k.n);
    std::vector<float> buf(k.momentum.as<float>(), k.momentum.as<float>() + k.n);
    std::vector<uint8_t> out = bytes_of(k.param.data(), k.n * dtype_size(P));
    if (k.n > 0) {
      kernels::fused_sgd(p.data(), tensors[i].momentum ? buf.data() : nullptr, k.grad.data(), G,
                         grad_scale, with_param_out ? out.data() : nullptr, P, k.n, c);
    }
    want_master.push_back(p);
    want_momentum.push_back(buf);
    want_param.push_back(out);
  }

  const SgdArgs args{c, grad_scale, {}};
  run_grid(plan_launches(tensors.data(), tensors.size(), kChunkElements,
                         [](const SgdTensor& t) { return t.numel; }),
           [&](uint32_t b, uint32_t t, const LaunchTable<SgdTensor>& table) {
             sgd_thread<G, P>(b, t, table, args);
           });

  for (size_t i = 0; i < cases.size(); ++i) {
    SgdCase& k = *cases[i];
    SCOPED_TRACE(std::string(dtype_name(G)) + " grads, " + dtype_name(P) + " params, tensor " +
                 std::to_string(i) + " of " + std::to_string(k.n) + " elements");
    EXPECT_EQ(bytes_of(k.master.data(), k.n * 4), bytes_of(want_master[i].data(), k.n * 4));
    EXPECT_EQ(bytes_of(k.momentum.data(), k.n * 4), bytes_of(want_momentum[i].data(), k.n * 4));
    EXPECT_EQ(bytes_of(k.param.data(), k.n * dtype_size(P)), want_param[i]);
    EXPECT_TRUE(k.master.guards_intact() && k.momentum.guards_intact() && k.grad.guards_intact() &&
                k.param.guards_intact());
  }
}

// Every way a step can treat the momentum buffer, with and without weight decay.
template <DType G, DType P>
void check_sgd_grid_all_steps(bool with_param_out) {
  // Momentum 0: no buffer at all, or one that must stay untouched.
  check_sgd_grid<G, P>({0.1f, 0.0f, 0.01f, false}, MomentumBuffer::kNull, with_param_out);
  check_sgd_grid<G, P>({0.1f, 0.0f, 0.0f, true}, MomentumBuffer::kPresent, with_param_out);
  // Momentum on: the first step overwrites the buffer, later ones decay it.
  check_sgd_grid<G, P>({0.05f, 0.9f, 0.0f, true}, MomentumBuffer::kPresent, with_param_out);
  check_sgd_grid<G, P>({0.05f, 0.9f, 0.01f, false}, MomentumBuffer::kPresent, with_param_out);
}

template <DType G>
void check_sgd_grid_all_params() {
  check_sgd_grid_all_steps<G, DType::kFloat32>(true);
  check_sgd_grid_all_steps<G, DType::kBFloat16>(true);
  check_sgd_grid_all_steps<G, DType::kFloat16>(true);
  check_sgd_grid_all_steps<G, DType::kBFloat16>(false);
}

TEST(CudaGridSgd, Fp32GradsMatchTheCpuKernelBitwise) {
  check_sgd_grid_all_params<DType::kFloat32>();
}
TEST(CudaGridSgd, Bf16GradsMatchTheCpuKernelBitwise) {
  check_sgd_grid_all_params<DType::kBFloat16>();
}
TEST(CudaGridSgd, Fp16GradsMatchTheCpuKernelBitwise) {
  check_sgd_grid_all_params<DType::kFloat16>();
}

TEST(CudaGridSgd, SkipFlagLeavesEverythingAndDeviceScaleReplacesHostScale) {
  const size_t n = 9001;
  std::mt19937 rng(31);
  std::vector<float> master(n), momentum(n), grad(n);
  fill_random(master.data(), DType::kFloat32, n, rng, -1.0f, 1.0f);
  fill_random(momentum.data(), DType::kFloat32, n, rng, -0.1f, 0.1f);
  fill_random(grad.data(), DType::kFloat32, n, rng, -1.0f, 1.0f);
  const std::vector<float> master0 = master, momentum0 = momentum;
  const SgdStepConstants c{0.1f, 0.9f, 0.01f, false};
  SgdTensor tensor{master.data(), momentum.data(), grad.data(), nullptr, n};
  const auto plans =
      plan_launches(&tensor, 1, kChunkElements, [](const SgdTensor& t) { return t.numel; });

  int skip = 1;
  float device_scale = 0.125f;
  SgdArgs args{c, 1.0f, {&skip, &device_scale}};
  auto run = [&] {
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<SgdTensor>& table) {
      sgd_thread<DType::kFloat32, DType::kFloat32>(b, t, table, args);
    });
  };
  run();
  EXPECT_EQ(master, master0);
  EXPECT_EQ(momentum, momentum0);

  skip = 0;
  run();
  std::vector<float> want = master0, want_momentum = momentum0;
  kernels::fused_sgd(want.data(), want_momentum.data(), grad.data(), DType::kFloat32, 0.125f,
                     nullptr, DType::kFloat32, n, c);
  EXPECT_EQ(master, want);
  EXPECT_EQ(momentum, want_momentum);
}

// --- cast ---------------------------------------------------------------------------------------

template <DType S, DType D>
void check_cast_grid() {
  std::mt19937 rng(11);
  for (size_t misalign : {0, 1}) {
    for (size_t n : kSizes) {
      GuardedBuffer src(n * dtype_size(S), misalign * dtype_size(S));
      GuardedBuffer dst(n * dtype_size(D), 0);
      fill_random(src.data(), S, n, rng, -70000.0f, 70000.0f);  // past fp16's range too
      std::vector<uint8_t> want(n * dtype_size(D));
      for (size_t i = 0; i < n; ++i)
        store_from_float(want.data(), D, i, load_as_float(src.data(), S, i));
      run_element_grid(n, "cast", [&](uint32_t b, uint32_t t) {
        cast_thread<S, D>(b, t, src.data(), dst.data(), n);
      });
      EXPECT_EQ(bytes_of(dst.data(), want.size()), want) << "n " << n << " misalign " << misalign;
      EXPECT_TRUE(dst.guards_intact() && src.guards_intact());
    }
  }
}

TEST(CudaGridCast, AllDtypePairsMatchScalarReference) {
  check_cast_grid<DType::kFloat32, DType::kBFloat16>();
  check_cast_grid<DType::kFloat32, DType::kFloat16>();
  check_cast_grid<DType::kBFloat16, DType::kFloat32>();
  check_cast_grid<DType::kFloat16, DType::kFloat32>();
  check_cast_grid<DType::kBFloat16, DType::kFloat16>();
  check_cast_grid<DType::kFloat16, DType::kBFloat16>();
}

// --- add and scale ------------------------------------------------------------------------------

// The CPU's result for dst += src: kernels::accumulate for equal dtypes, else the one rounding of
// ParamRef::add_f32 (store_from_float of the fp32 sum) that the CPU path uses for mixed dtypes.
template <DType D, DType S>
std::vector<uint8_t> cpu_add(const void* dst, const void* src, size_t n) {
  std::vector<uint8_t> out = bytes_of(dst, n * dtype_size(D));
  if (n == 0) return out;
  if constexpr (D == S) {
    kernels::accumulate(out.data(), src, D, n);
  } else {
    for (size_t i = 0; i < n; ++i) {
      store_from_float(out.data(), D, i,
                       load_as_float(out.data(), D, i) + load_as_float(src, S, i));
    }
  }
  return out;
}

template <DType D, DType S>
void check_add_grid() {
  std::mt19937 rng(17 + static_cast<unsigned>(D) * 3 + static_cast<unsigned>(S));
  // Each pointer misaligned on its own sends the whole tensor down the element-at-a-time path.
  for (size_t dst_misalign : {0, 1}) {
    for (size_t src_misalign : {0, 1}) {
      for (size_t n : kSizes) {
        GuardedBuffer dst(n * dtype_size(D), dst_misalign * dtype_size(D));
        GuardedBuffer src(n * dtype_size(S), src_misalign * dtype_size(S));
        // Sums past 65504 overflow fp16: both sides must round them to infinity alike.
        fill_random(dst.data(), D, n, rng, -40000.0f, 40000.0f);
        fill_random(src.data(), S, n, rng, -40000.0f, 40000.0f);
        const std::vector<uint8_t> want = cpu_add<D, S>(dst.data(), src.data(), n);
        run_element_grid(n, "add", [&](uint32_t b, uint32_t t) {
          add_thread<D, S>(b, t, dst.data(), src.data(), n);
        });
        EXPECT_EQ(bytes_of(dst.data(), want.size()), want)
            << dtype_name(S) << " into " << dtype_name(D) << ", n " << n << " misalign "
            << dst_misalign << "/" << src_misalign;
        EXPECT_TRUE(dst.guards_intact() && src.guards_intact());
      }
    }
  }
}

template <DType D>
void check_add_grid_all_sources() {
  check_add_grid<D, DType::kFloat32>();
  check_add_grid<D, DType::kBFloat16>();
  check_add_grid<D, DType::kFloat16>();
}

TEST(CudaGridAdd, IntoFp32MatchesCpuForEverySourceDtype) {
  check_add_grid_all_sources<DType::kFloat32>();
}
TEST(CudaGridAdd, IntoBf16MatchesCpuForEverySourceDtype) {
  check_add_grid_all_sources<DType::kBFloat16>();
}
TEST(CudaGridAdd, IntoFp16MatchesCpuForEverySourceDtype) {
  check_add_grid_all_sources<DType::kFloat16>();
}

TEST(CudaGridAdd, SourceMayBeTheDestination) {
  const size_t n = 8197;
  std::vector<uint16_t> x(n);
  std::mt19937 rng(19);
  fill_random(x.data(), DType::kBFloat16, n, rng, -5.0f, 5.0f);
  std::vector<uint16_t> want = x;
  for (size_t i = 0; i < n; ++i) want[i] = float_to_bf16(bf16_to_float(x[i]) * 2.0f);
  run_element_grid(n, "add", [&](uint32_t b, uint32_t t) {
    add_thread<DType::kBFloat16, DType::kBFloat16>(b, t, x.data(), x.data(), n);
  });
  EXPECT_EQ(x, want);
}

template <DType D>
void check_scale_grid() {
  std::mt19937 rng(23 + static_cast<unsigned>(D));
  for (float alpha : {0.37f, 3.0f, -1.0f / 3.0f}) {
    for (size_t misalign : {0, 1}) {
      for (size_t n : kSizes) {
        GuardedBuffer x(n * dtype_size(D), misalign * dtype_size(D));
        // 3 * 30000 overflows fp16; tiny values meet its subnormals.
        fill_random(x.data(), D, n, rng, -30000.0f, 30000.0f);
        if (n > 2) store_from_float(x.data(), D, 2, 1e-6f);
        std::vector<uint8_t> want = bytes_of(x.data(), n * dtype_size(D));
        if (n > 0) kernels::scale(want.data(), D, alpha, n);
        run_element_grid(
            n, "scale", [&](uint32_t b, uint32_t t) { scale_thread<D>(b, t, x.data(), alpha, n); });
        EXPECT_EQ(bytes_of(x.data(), want.size()), want)
            << dtype_name(D) << " alpha " << alpha << ", n " << n << " misalign " << misalign;
        EXPECT_TRUE(x.guards_intact());
      }
    }
  }
}

TEST(CudaGridScale, EveryDtypeMatchesTheCpuKernel) {
  check_scale_grid<DType::kFloat32>();
  check_scale_grid<DType::kBFloat16>();
  check_scale_grid<DType::kFloat16>();
}

// --- flatten / unflatten
// --------------------------------------------------------------------------

TEST(CudaGridCopy, FlattenAndUnflattenManyTensorsWithGapsAndTails) {
  for (DType dtype : kDTypes) {
    const size_t elem = dtype_size(dtype);
    std::mt19937 rng(5);
    // 70 tensors: two launches. Offsets leave gaps, some of them unaligned to 16 bytes.
    std::vector<std::unique_ptr<GuardedBuffer>> tensors;
    std::vector<TensorSlot> slots;
    size_t offset = 0;
    for (size_t i = 0; i < 70; ++i) {
      const size_t n = kSizes[i % kSizes.size()] + (i / kSizes.size());
      const size_t misalign = i % 3 == 2 ? elem : 0;
      tensors.push_back(std::make_unique<GuardedBuffer>(n * elem, misalign));
      fill_random(tensors.back()->data(), dtype, n, rng, -1.0f, 1.0f);
      offset += i % 4;  // gap of 0-3 elements before the tensor
      slots.push_back({tensors.back()->data(), offset, n});
      offset += n;
    }
    GuardedBuffer flat(offset * elem, 0);
    std::memset(flat.data(), 0x5A, offset * elem);
    const CopyArgs<true> to_flat{flat.data(), static_cast<uint32_t>(elem)};
    const auto plans = plan_launches(slots.data(), slots.size(), kChunkBytes,
                                     [elem](const TensorSlot& s) { return slot_bytes(s, elem); });
    EXPECT_EQ(plans.size(), 2u);
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<TensorSlot>& table) {
      copy_slots_thread<true>(b, t, table, to_flat);
    });
    std::vector<uint8_t> want(offset * elem, 0x5A);
    for (const TensorSlot& s : slots)
      std::memcpy(want.data() + s.offset * elem, s.data, s.numel * elem);
    EXPECT_EQ(bytes_of(flat.data(), want.size()), want) << dtype_name(dtype);
    EXPECT_TRUE(flat.guards_intact());

    // Back out into poisoned tensors: each gets exactly its slice.
    std::vector<std::vector<uint8_t>> originals;
    for (const TensorSlot& s : slots) {
      originals.push_back(bytes_of(s.data, s.numel * elem));
      std::memset(s.data, 0xEE, s.numel * elem);
    }
    const CopyArgs<false> from_flat{flat.data(), static_cast<uint32_t>(elem)};
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<TensorSlot>& table) {
      copy_slots_thread<false>(b, t, table, from_flat);
    });
    for (size_t i = 0; i < slots.size(); ++i) {
      EXPECT_EQ(bytes_of(slots[i].data, slots[i].numel * elem), originals[i]) << "tensor " << i;
      EXPECT_TRUE(tensors[i]->guards_intact());
    }
  }
}

// --- finite check -------------------------------------------------------------------------------

template <DType D>
void check_finite_grid() {
  const std::vector<size_t> sizes = {1, 5, 8192, 8197, 20000};
  std::vector<std::vector<uint8_t>> storage;
  std::vector<ConstTensor> tensors;
  std::mt19937 rng(9);
  for (size_t n : sizes) {
    storage.emplace_back(n * dtype_size(D) + dtype_size(D));
    // The second half of the tensors starts one element in: unaligned.
    uint8_t* data = storage.back().data() + (tensors.size() % 2) * dtype_size(D);
    fill_random(data, D, n, rng, -60000.0f, 60000.0f);
    tensors.push_back({data, n});
  }
  const auto plans = plan_launches(tensors.data(), tensors.size(), kChunkElements,
                                   [](const ConstTensor& t) { return t.numel; });
  auto run = [&](int initial) {
    int flag = initial;
    run_grid(plans, [&](uint32_t b, uint32_t t, const LaunchTable<ConstTensor>& table) {
      check_finite_thread<D>(b, t, table, &flag);
    });
    return flag;
  };
  EXPECT_EQ(run(0), 0);
  EXPECT_EQ(run(1), 1);  // the flag is only ever set, never cleared
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const size_t n = tensors[ti].numel;
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      void* data = const_cast<void*>(tensors[ti].data);
      const float saved = load_as_float(data, D, pos);
      for (float value : bad) {
        store_from_float(data, D, pos, value);
        EXPECT_EQ(run(0), 1) << "tensor " << ti << " position " << pos << " value " << value;
      }
      store_from_float(data, D, pos, saved);
    }
  }
  EXPECT_EQ(run(0), 0);
}

TEST(CudaGridFinite, FindsNanAndInfinityInEveryTensorAndPosition) {
  check_finite_grid<DType::kFloat32>();
  check_finite_grid<DType::kBFloat16>();
  check_finite_grid<DType::kFloat16>();
}

// --- sum of squares
// --------------------------------------------------------------------------------

// Both stages as the .cu runs them: per block, kBlockThreads partials added by the tree, one
// double per block; then one block adds those with the same tree and rounds to float.
template <DType D>
float grid_sum_squares(const std::vector<ConstTensor>& tensors, int* flag) {
  const auto plans = plan_launches(tensors.data(), tensors.size(), kChunkElements,
                                   [](const ConstTensor& t) { return t.numel; });
  std::vector<double> partials;
  double shared[kBlockThreads];
  auto tree = [&] {
    for (uint32_t half = kBlockThreads / 2; half > 0; half /= 2) {
      for (uint32_t t = 0; t < kBlockThreads; ++t) tree_sum_level(shared, t, half);
    }
    return shared[0];
  };
  for (const auto& table : plans) {
    for (uint32_t b = 0; b < table.blocks(); ++b) {
      for (uint32_t t = 0; t < kBlockThreads; ++t) shared[t] = sum_squares_thread<D>(b, t, table);
      partials.push_back(tree());
    }
  }
  for (uint32_t t = 0; t < kBlockThreads; ++t) {
    shared[t] = sum_partials_thread(t, partials.data(), partials.size());
  }
  float out = -1.0f;
  finish_sum_squares(tree(), &out, flag);
  return out;
}

TEST(CudaGridSumSquares, SmallIntegersGiveTheExactSum) {
  // Squares of small integers add exactly in double in any order, so any element counted twice
  // or missed changes the result.
  for (DType dtype : kDTypes) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<ConstTensor> tensors;
    double exact = 0.0;
    for (size_t i = 0; i < 80; ++i) {  // two launches
      const size_t n = kSizes[i % kSizes.size()];
      storage.emplace_back((n + 1) * dtype_size(dtype));
      uint8_t* data = storage.back().data() + (i % 2) * dtype_size(dtype);
      for (size_t j = 0; j < n; ++j) {
        const float x = static_cast<float>(static_cast<int>((i * 31 + j * 7) % 9) - 4);
        store_from_float(data, dtype, j, x);
        exact += static_cast<double>(x) * x;
      }
      tensors.push_back({data, n});
    }
    int flag = 0;
    const float got = [&] {
      switch (dtype) {
        case DType::kFloat32:
          return grid_sum_squares<DType::kFloat32>(tensors, &flag);
        case DType::kBFloat16:
          return grid_sum_squares<DType::kBFloat16>(tensors, &flag);
        case DType::kFloat16:
          return grid_sum_squares<DType::kFloat16>(tensors, &flag);
      }
      return 0.0f;
    }();
    EXPECT_EQ(got, static_cast<float>(exact)) << dtype_name(dtype);
    EXPECT_EQ(flag, 0);
  }
}

TEST(CudaGridSumSquares, RandomValuesAgreeWithTheCpuKernelAndFlagNonFinite) {
  std::mt19937 rng(13);
  std::vector<float> a(100003), b(8192), c(7);
  fill_random(a.data(), DType::kFloat32, a.size(), rng, -3.0f, 3.0f);
  fill_random(b.data(), DType::kFloat32, b.size(), rng, -1e3f, 1e3f);
  fill_random(c.data(), DType::kFloat32, c.size(), rng, -1.0f, 1.0f);
  const std::vector<ConstTensor> tensors = {
      {a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}};
  const double cpu = kernels::sum_squares(a.data(), DType::kFloat32, a.size()) +
                     kernels::sum_squares(b.data(), DType::kFloat32, b.size()) +
                     kernels::sum_squares(c.data(), DType::kFloat32, c.size());
  int flag = 0;
  EXPECT_EQ(grid_sum_squares<DType::kFloat32>(tensors, &flag), static_cast<float>(cpu));
  EXPECT_EQ(flag, 0);
  EXPECT_EQ(grid_sum_squares<DType::kFloat32>({}, &flag), 0.0f);  // empty: one stage-2 launch

  b[4096] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(grid_sum_squares<DType::kFloat32>(tensors, &flag)));
  EXPECT_EQ(flag, 1);
  // Finite elements whose squares sum past FLT_MAX overflow the float that travels: flagged.
  b[4096] = 3e19f;
  b[4097] = 3e19f;
  flag = 0;
  EXPECT_TRUE(std::isinf(grid_sum_squares<DType::kFloat32>(tensors, &flag)));
  EXPECT_EQ(flag, 1);
}

}  // namespace
}  // namespace zero::kernels::cuda
