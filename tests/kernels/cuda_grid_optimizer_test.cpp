// The CUDA optimizer kernels' per-thread bodies (cuda_kernel_bodies.h), run by g++ over their
// whole grid in loops: the multi-tensor launch plans, fused AdamW and fused SGD against the
// scalar reference and the CPU kernels, bit for bit. Needs no GPU and no nvcc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernel_bodies.h"
#include "tests/kernels/cuda_grid_util.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::kernels::cuda {
namespace {

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

}  // namespace
}  // namespace zero::kernels::cuda
