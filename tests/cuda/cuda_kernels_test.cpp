// The CUDA kernels on a device against the CPU kernels (the reference the engine's CPU path
// uses): bitwise for the element-wise kernels, to rounding for the sum of squares.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/kernels/cuda_kernels.h"

namespace zero::kernels::cuda {
namespace {

using zero::testing::bytes_of;
using zero::testing::DeviceBuffer;
using zero::testing::download_bytes;

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

std::vector<uint8_t> random_bytes(DType dtype, size_t n, std::mt19937& rng, float lo, float hi) {
  std::vector<uint8_t> out(n * dtype_size(dtype));
  std::uniform_real_distribution<float> dist(lo, hi);
  for (size_t i = 0; i < n; ++i) store_from_float(out.data(), dtype, i, dist(rng));
  return out;
}

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICE(); }
  void sync() { ZERO_CUDA_CHECK(cudaDeviceSynchronize()); }
};

// Several tensors in one call, one of them starting one element past 16-byte alignment (the
// element-at-a-time path), sizes across the vector and chunk tails.
TEST_F(CudaKernels, FusedAdamWMatchesCpuKernelBitwiseForEveryDtypePair) {
  const std::vector<size_t> sizes = {1, 8193, (size_t{1} << 20) + 3, 4099};
  const auto c = adamw_step_constants(1e-3f, 0.9, 0.999, 1e-8f, 0.01f, 5);
  for (DType g : kDTypes) {
    for (DType p : kDTypes) {
      std::mt19937 rng(static_cast<unsigned>(g) * 3 + static_cast<unsigned>(p));
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<AdamWTensor> tensors;
      struct Host {
        std::vector<float> master, m, v;
        std::vector<uint8_t> grad, param;
      };
      std::vector<Host> host;
      for (size_t t = 0; t < sizes.size(); ++t) {
        const size_t n = sizes[t], shift = t == 2 ? 1 : 0;  // tensor 2 is misaligned
        Host h;
        auto fill = [&](float lo, float hi) {
          std::vector<float> x(n);
          std::uniform_real_distribution<float> dist(lo, hi);
          for (float& e : x) e = dist(rng);
          return x;
        };
        h.master = fill(-1, 1);
        h.m = fill(-0.1f, 0.1f);
        h.v = fill(0, 0.01f);
        h.grad = random_bytes(g, n, rng, -2, 2);
        h.param.assign(n * dtype_size(p), 0xCD);  // poison: every element must be written
        auto device = [&](const void* src, size_t bytes, size_t elem) {
          keep.push_back(std::make_unique<DeviceBuffer>(bytes + elem));
          keep.back()->upload(src, bytes, shift * elem);
          return static_cast<char*>(keep.back()->data()) + shift * elem;
        };
        tensors.push_back({reinterpret_cast<float*>(device(h.master.data(), n * 4, 4)),
                           reinterpret_cast<float*>(device(h.m.data(), n * 4, 4)),
                           reinterpret_cast<float*>(device(h.v.data(), n * 4, 4)),
                           device(h.grad.data(), h.grad.size(), dtype_size(g)),
                           device(h.param.data(), h.param.size(), dtype_size(p)), n});
        host.push_back(std::move(h));
      }
      fused_adamw(tensors.data(), tensors.size(), g, p, 0.75f, c, {}, nullptr);
      sync();
      for (size_t t = 0; t < sizes.size(); ++t) {
        Host& h = host[t];
        const size_t n = sizes[t];
        kernels::fused_adamw(h.master.data(), h.m.data(), h.v.data(), h.grad.data(), g, 0.75f,
                             h.param.data(), p, n, c);
        SCOPED_TRACE(std::string(dtype_name(g)) + " grads, " + dtype_name(p) + " params, tensor " +
                     std::to_string(t));
        EXPECT_EQ(download_bytes(tensors[t].master, n * 4), bytes_of(h.master));
        EXPECT_EQ(download_bytes(tensors[t].m, n * 4), bytes_of(h.m));
        EXPECT_EQ(download_bytes(tensors[t].v, n * 4), bytes_of(h.v));
        EXPECT_EQ(download_bytes(tensors[t].param_out, h.param.size()), h.param);
      }
    }
  }
}

TEST_F(CudaKernels, OverflowFlagSkipsTheStepWithoutTheHost) {
  const size_t n = 100000;
  std::mt19937 rng(1);
  std::vector<float> master(n, 0.5f), grad(n);
  for (float& x : grad) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  grad[77777] = std::numeric_limits<float>::infinity();
  DeviceBuffer d_master(n * 4), d_m(n * 4), d_v(n * 4), d_grad(n * 4), flag(sizeof(int));
  d_master.upload(master.data(), n * 4);
  d_grad.upload(grad.data(), n * 4);
  ZERO_CUDA_CHECK(cudaMemset(d_m.data(), 0, n * 4));
  ZERO_CUDA_CHECK(cudaMemset(d_v.data(), 0, n * 4));
  ZERO_CUDA_CHECK(cudaMemset(flag.data(), 0, sizeof(int)));

  const ConstTensor grads{d_grad.data(), n};
  check_finite(&grads, 1, DType::kFloat32, flag.as<int>(), nullptr);
  const AdamWTensor tensor{d_master.as<float>(), d_m.as<float>(), d_v.as<float>(),
                           d_grad.data(),        nullptr,         n};
  const auto c = adamw_step_constants(1e-2f, 0.9, 0.999, 1e-8f, 0.0f, 1);
  DeviceStepControl control;
  control.skip_flag = flag.as<int>();
  fused_adamw(&tensor, 1, DType::kFloat32, DType::kFloat32, 1.0f, c, control, nullptr);
  sync();
  int set = 0;
  ZERO_CUDA_CHECK(cudaMemcpy(&set, flag.data(), sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(set, 1);
  std::vector<uint8_t> unchanged(n * 4);
  std::memcpy(unchanged.data(), master.data(), n * 4);
  EXPECT_EQ(d_master.download(n * 4), unchanged);

  // Finite gradients, a scale read from the device: the step happens with that scale.
  grad[77777] = 0.25f;
  d_grad.upload(grad.data(), n * 4);
  ZERO_CUDA_CHECK(cudaMemset(flag.data(), 0, sizeof(int)));
  check_finite(&grads, 1, DType::kFloat32, flag.as<int>(), nullptr);
  DeviceBuffer scale(sizeof(float));
  const float host_scale = 0.5f;
  scale.upload(&host_scale, sizeof(float));
  control.grad_scale = scale.as<float>();
  fused_adamw(&tensor, 1, DType::kFloat32, DType::kFloat32, 123.0f, c, control, nullptr);
  sync();
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  kernels::fused_adamw(master.data(), m.data(), v.data(), grad.data(), DType::kFloat32, 0.5f,
                       nullptr, DType::kFloat32, n, c);
  std::vector<uint8_t> want(n * 4);
  std::memcpy(want.data(), master.data(), n * 4);
  EXPECT_EQ(d_master.download(n * 4), want);
}

TEST_F(CudaKernels, CastMatchesCpuForAllDtypePairs) {
  const size_t n = 300007;
  std::mt19937 rng(2);
  for (DType s : kDTypes) {
    for (DType d : kDTypes) {
      const auto src = random_bytes(s, n, rng, -70000, 70000);
      DeviceBuffer d_src(src.size()), d_dst(n * dtype_size(d));
      d_src.upload(src.data(), src.size());
      cast(d_src.data(), s, d_dst.data(), d, n, nullptr);
      sync();
      std::vector<uint8_t> want(n * dtype_size(d));
      kernels::cast(src.data(), s, want.data(), d, n);
      EXPECT_EQ(d_dst.download(want.size()), want) << dtype_name(s) << " -> " << dtype_name(d);
    }
  }
}

// Blockwise int8 both ways, bit for bit as the CPU's, with a short last block and a zero block.
TEST_F(CudaKernels, QuantizeInt8MatchesCpuForEveryDtype) {
  const size_t n = 3 * 4096 + 77;
  const size_t block = 4096;
  const size_t blocks = (n + block - 1) / block;
  std::mt19937 rng(9);
  for (DType dtype : kDTypes) {
    auto src = random_bytes(dtype, n, rng, -3, 3);
    std::memset(src.data() + block * dtype_size(dtype), 0, block * dtype_size(dtype));
    DeviceBuffer d_src(src.size()), d_values(n), d_scales(blocks * 4), d_back(src.size());
    d_src.upload(src.data(), src.size());
    quantize_int8(d_src.data(), dtype, n, block, static_cast<int8_t*>(d_values.data()),
                  static_cast<float*>(d_scales.data()), nullptr);
    dequantize_int8(static_cast<const int8_t*>(d_values.data()),
                    static_cast<const float*>(d_scales.data()), n, block, d_back.data(), dtype,
                    nullptr);
    sync();
    std::vector<uint8_t> values(n), scales(blocks * 4), back(src.size());
    kernels::quantize_int8(src.data(), dtype, n, block, reinterpret_cast<int8_t*>(values.data()),
                           reinterpret_cast<float*>(scales.data()));
    kernels::dequantize_int8(reinterpret_cast<const int8_t*>(values.data()),
                             reinterpret_cast<const float*>(scales.data()), n, block, back.data(),
                             dtype);
    EXPECT_EQ(d_values.download(n), values) << dtype_name(dtype);
    EXPECT_EQ(d_scales.download(scales.size()), scales) << dtype_name(dtype);
    EXPECT_EQ(d_back.download(back.size()), back) << dtype_name(dtype);
  }
}

// The CPU's dst += src: kernels::accumulate for equal dtypes, else one rounding of the fp32 sum
// (ParamRef::add_f32's store_from_float(load_as_float + value)).
std::vector<uint8_t> cpu_add(std::vector<uint8_t> dst, DType d, const std::vector<uint8_t>& src,
                             DType s, size_t n) {
  if (d == s) {
    kernels::accumulate(dst.data(), src.data(), d, n);
    return dst;
  }
  for (size_t i = 0; i < n; ++i) {
    store_from_float(dst.data(), d, i,
                     load_as_float(dst.data(), d, i) + load_as_float(src.data(), s, i));
  }
  return dst;
}

TEST_F(CudaKernels, AddMatchesCpuForAllDtypePairsAlignedAndNot) {
  const size_t n = 300007;
  std::mt19937 rng(8);
  for (DType d : kDTypes) {
    for (DType s : kDTypes) {
      // shift 1: the source starts one element past alignment (the element-at-a-time path).
      for (size_t shift : {0, 1}) {
        const auto dst = random_bytes(d, n, rng, -40000, 40000);
        const auto src = random_bytes(s, n, rng, -40000, 40000);
        DeviceBuffer d_dst(dst.size()), d_src(src.size() + dtype_size(s));
        d_dst.upload(dst.data(), dst.size());
        d_src.upload(src.data(), src.size(), shift * dtype_size(s));
        add(d_dst.data(), d, static_cast<char*>(d_src.data()) + shift * dtype_size(s), s, n,
            nullptr);
        sync();
        EXPECT_EQ(d_dst.download(dst.size()), cpu_add(dst, d, src, s, n))
            << dtype_name(s) << " into " << dtype_name(d) << ", shift " << shift;
      }
    }
  }
}

TEST_F(CudaKernels, ScaleMatchesCpuForEveryDtypeAlignedAndNot) {
  const size_t n = 300007;
  std::mt19937 rng(10);
  for (DType dtype : kDTypes) {
    for (size_t shift : {0, 1}) {
      std::vector<uint8_t> x = random_bytes(dtype, n, rng, -30000, 30000);
      DeviceBuffer d_x(x.size() + dtype_size(dtype));
      d_x.upload(x.data(), x.size(), shift * dtype_size(dtype));
      scale(static_cast<char*>(d_x.data()) + shift * dtype_size(dtype), dtype, 3.0f, n, nullptr);
      sync();
      kernels::scale(x.data(), dtype, 3.0f, n);
      EXPECT_EQ(d_x.download(x.size(), shift * dtype_size(dtype)), x)
          << dtype_name(dtype) << ", shift " << shift;
    }
  }
}

// Two steps on the same state (the first overwrites the momentum buffer, the second decays it),
// and a momentum-free step with no buffer at all, for every dtype pair.
TEST_F(CudaKernels, FusedSgdMatchesCpuKernelBitwiseForEveryDtypePair) {
  const std::vector<size_t> sizes = {1, 8193, (size_t{1} << 20) + 3, 4099};
  struct Step {
    SgdStepConstants c;
    bool momentum_buffer;  // false: the tensors pass a null momentum pointer
  };
  const std::vector<Step> steps = {{{0.05f, 0.9f, 0.01f, true}, true},
                                   {{0.05f, 0.9f, 0.01f, false}, true},
                                   {{0.1f, 0.0f, 0.01f, false}, false}};
  for (DType g : kDTypes) {
    for (DType p : kDTypes) {
      std::mt19937 rng(static_cast<unsigned>(g) * 3 + static_cast<unsigned>(p) + 40);
      std::vector<std::unique_ptr<DeviceBuffer>> keep;
      std::vector<SgdTensor> tensors;
      struct Host {
        std::vector<float> master, momentum;
        std::vector<uint8_t> grad, param;
      };
      std::vector<Host> host;
      for (size_t t = 0; t < sizes.size(); ++t) {
        const size_t n = sizes[t], shift = t == 2 ? 1 : 0;  // tensor 2 is misaligned
        Host h;
        std::uniform_real_distribution<float> dist(-1, 1);
        h.master.resize(n);
        for (float& e : h.master) e = dist(rng);
        h.momentum.assign(n, 0.0f);
        h.grad = random_bytes(g, n, rng, -2, 2);
        h.param.assign(n * dtype_size(p), 0xCD);  // poison: every element must be written
        auto device = [&](const void* src, size_t bytes, size_t elem) {
          keep.push_back(std::make_unique<DeviceBuffer>(bytes + elem));
          keep.back()->upload(src, bytes, shift * elem);
          return static_cast<char*>(keep.back()->data()) + shift * elem;
        };
        tensors.push_back({reinterpret_cast<float*>(device(h.master.data(), n * 4, 4)),
                           reinterpret_cast<float*>(device(h.momentum.data(), n * 4, 4)),
                           device(h.grad.data(), h.grad.size(), dtype_size(g)),
                           device(h.param.data(), h.param.size(), dtype_size(p)), n});
        host.push_back(std::move(h));
      }
      for (size_t s = 0; s < steps.size(); ++s) {
        const SgdStepConstants& c = steps[s].c;
        const bool with_momentum = steps[s].momentum_buffer;
        std::vector<SgdTensor> step_tensors = tensors;
        if (!with_momentum) {
          for (SgdTensor& t : step_tensors) t.momentum = nullptr;
        }
        fused_sgd(step_tensors.data(), step_tensors.size(), g, p, 0.75f, c, {}, nullptr);
        sync();
        for (size_t t = 0; t < sizes.size(); ++t) {
          Host& h = host[t];
          const size_t n = sizes[t];
          kernels::fused_sgd(h.master.data(), with_momentum ? h.momentum.data() : nullptr,
                             h.grad.data(), g, 0.75f, h.param.data(), p, n, c);
          SCOPED_TRACE(std::string(dtype_name(g)) + " grads, " + dtype_name(p) + " params, step " +
                       std::to_string(s) + ", tensor " + std::to_string(t));
          EXPECT_EQ(download_bytes(tensors[t].master, n * 4), bytes_of(h.master));
          EXPECT_EQ(download_bytes(tensors[t].momentum, n * 4), bytes_of(h.momentum));
          EXPECT_EQ(download_bytes(tensors[t].param_out, h.param.size()), h.param);
        }
      }
    }
  }
}

TEST_F(CudaKernels, FusedSgdSkipFlagAndDeviceScale) {
  const size_t n = 100000;
  std::mt19937 rng(12);
  std::vector<float> master(n), momentum(n), grad(n);
  for (float& x : master) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  for (float& x : grad) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  DeviceBuffer d_master(n * 4), d_momentum(n * 4), d_grad(n * 4), flag(sizeof(int)),
      d_scale(sizeof(float));
  d_master.upload(master.data(), n * 4);
  d_momentum.upload(momentum.data(), n * 4);
  d_grad.upload(grad.data(), n * 4);
  const int set = 1;
  flag.upload(&set, sizeof(int));
  const float device_scale = 0.5f;
  d_scale.upload(&device_scale, sizeof(float));
  const SgdTensor tensor{d_master.as<float>(), d_momentum.as<float>(), d_grad.data(), nullptr, n};
  const SgdStepConstants c{0.1f, 0.9f, 0.0f, true};
  DeviceStepControl control;
  control.skip_flag = flag.as<int>();
  control.grad_scale = d_scale.as<float>();
  fused_sgd(&tensor, 1, DType::kFloat32, DType::kFloat32, 123.0f, c, control, nullptr);
  sync();
  EXPECT_EQ(d_master.download(n * 4), bytes_of(master));

  ZERO_CUDA_CHECK(cudaMemset(flag.data(), 0, sizeof(int)));
  fused_sgd(&tensor, 1, DType::kFloat32, DType::kFloat32, 123.0f, c, control, nullptr);
  sync();
  kernels::fused_sgd(master.data(), momentum.data(), grad.data(), DType::kFloat32, 0.5f, nullptr,
                     DType::kFloat32, n, c);
  EXPECT_EQ(d_master.download(n * 4), bytes_of(master));
  EXPECT_EQ(d_momentum.download(n * 4), bytes_of(momentum));
}

TEST_F(CudaKernels, NullBuffersAreErrors) {
  DeviceBuffer x(4 * 16);
  EXPECT_THROW(add(nullptr, DType::kFloat32, x.data(), DType::kFloat32, 16, nullptr), Error);
  EXPECT_THROW(add(x.data(), DType::kFloat32, nullptr, DType::kBFloat16, 16, nullptr), Error);
  EXPECT_THROW(scale(nullptr, DType::kFloat16, 2.0f, 16, nullptr), Error);
  EXPECT_NO_THROW(scale(nullptr, DType::kFloat16, 2.0f, 0, nullptr));  // nothing to do
  const SgdStepConstants with_momentum{0.1f, 0.9f, 0.0f, false};
  const SgdTensor no_momentum{x.as<float>(), nullptr, x.data(), nullptr, 16};
  EXPECT_THROW(fused_sgd(&no_momentum, 1, DType::kFloat32, DType::kFloat32, 1.0f, with_momentum, {},
                         nullptr),
               Error);
  const SgdTensor no_grad{x.as<float>(), x.as<float>(), nullptr, nullptr, 16};
  EXPECT_THROW(
      fused_sgd(&no_grad, 1, DType::kFloat32, DType::kFloat32, 1.0f, with_momentum, {}, nullptr),
      Error);
  sync();
}

TEST_F(CudaKernels, FlattenAndUnflattenMatchCpu) {
  for (DType dtype : kDTypes) {
    const size_t elem = dtype_size(dtype);
    std::mt19937 rng(4);
    std::vector<std::unique_ptr<DeviceBuffer>> device;
    std::vector<std::vector<uint8_t>> host;
    std::vector<TensorSlot> device_slots, host_slots;
    size_t offset = 0;
    for (size_t i = 0; i < 90; ++i) {  // two launches
      const size_t n = (i * 7919) % 20000 + 1;
      offset += i % 3;
      host.push_back(random_bytes(dtype, n, rng, -1, 1));
      device.push_back(std::make_unique<DeviceBuffer>(n * elem));
      device.back()->upload(host.back().data(), n * elem);
      device_slots.push_back({device.back()->data(), offset, n});
      host_slots.push_back({host.back().data(), offset, n});
      offset += n;
    }
    std::vector<uint8_t> want(offset * elem, 0x11);
    DeviceBuffer flat(offset * elem);
    flat.upload(want.data(), want.size());
    kernels::flatten(host_slots.data(), host_slots.size(), want.data(), dtype);
    flatten(device_slots.data(), device_slots.size(), flat.data(), dtype, nullptr);
    sync();
    EXPECT_EQ(flat.download(want.size()), want) << dtype_name(dtype);
    for (auto& d : device) ZERO_CUDA_CHECK(cudaMemset(d->data(), 0xEE, d->bytes()));
    unflatten(flat.data(), device_slots.data(), device_slots.size(), dtype, nullptr);
    sync();
    for (size_t i = 0; i < host.size(); ++i) {
      EXPECT_EQ(device[i]->download(host[i].size()), host[i]) << "tensor " << i;
    }
  }
}

TEST_F(CudaKernels, SumSquaresAndFiniteCheckAgreeWithCpu) {
  for (DType dtype : kDTypes) {
    std::mt19937 rng(6);
    const std::vector<size_t> sizes = {5, 1 << 20, 123457};
    std::vector<std::vector<uint8_t>> host;
    std::vector<std::unique_ptr<DeviceBuffer>> device;
    std::vector<ConstTensor> tensors;
    double cpu = 0.0;
    for (size_t n : sizes) {
      host.push_back(random_bytes(dtype, n, rng, -3, 3));
      device.push_back(std::make_unique<DeviceBuffer>(host.back().size()));
      device.back()->upload(host.back().data(), host.back().size());
      tensors.push_back({device.back()->data(), n});
      cpu += kernels::sum_squares(host.back().data(), dtype, n);
    }
    DeviceBuffer workspace(sum_squares_workspace_bytes(tensors.data(), tensors.size()));
    DeviceBuffer out(sizeof(float)), flag(sizeof(int));
    ZERO_CUDA_CHECK(cudaMemset(flag.data(), 0, sizeof(int)));
    sum_squares(tensors.data(), tensors.size(), dtype, out.as<float>(), workspace.data(),
                workspace.bytes(), flag.as<int>(), nullptr);
    check_finite(tensors.data(), tensors.size(), dtype, flag.as<int>(), nullptr);
    sync();
    float got = 0.0f;
    int set = -1;
    ZERO_CUDA_CHECK(cudaMemcpy(&got, out.data(), sizeof(float), cudaMemcpyDeviceToHost));
    ZERO_CUDA_CHECK(cudaMemcpy(&set, flag.data(), sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_NEAR(got, cpu, cpu * 1e-6) << dtype_name(dtype);
    EXPECT_EQ(set, 0);

    // A NaN in the middle tensor: both kernels raise the flag.
    store_from_float(host[1].data(), dtype, 4242, std::numeric_limits<float>::quiet_NaN());
    device[1]->upload(host[1].data(), host[1].size());
    for (int which = 0; which < 2; ++which) {
      ZERO_CUDA_CHECK(cudaMemset(flag.data(), 0, sizeof(int)));
      if (which == 0) {
        sum_squares(tensors.data(), tensors.size(), dtype, out.as<float>(), workspace.data(),
                    workspace.bytes(), flag.as<int>(), nullptr);
      } else {
        check_finite(tensors.data(), tensors.size(), dtype, flag.as<int>(), nullptr);
      }
      sync();
      ZERO_CUDA_CHECK(cudaMemcpy(&set, flag.data(), sizeof(int), cudaMemcpyDeviceToHost));
      EXPECT_EQ(set, 1) << (which == 0 ? "sum_squares" : "check_finite");
    }
  }
}

TEST_F(CudaKernels, TooSmallWorkspaceIsAnError) {
  DeviceBuffer x(4 * 100000), out(sizeof(float));
  const ConstTensor t{x.data(), 100000};
  EXPECT_THROW(sum_squares(&t, 1, DType::kFloat32, out.as<float>(), nullptr, 0, nullptr, nullptr),
               Error);
}

}  // namespace
}  // namespace zero::kernels::cuda
