// The device layer on the CPU: host tensors, the CPU device context's operations against the
// CPU kernels, and the errors for a device this build or machine cannot give.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/runtime/device.h"
#include "zero/runtime/model.h"

namespace zero {
namespace {

using testing::expect_error_naming;

TEST(Tensor, HostTensorsCopyDeeplyAndMoveCheaply) {
  Tensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(a.numel(), 6u);
  EXPECT_EQ(a.device(), nullptr);
  Tensor b = a;
  b.data()[0] = 42.0f;
  EXPECT_EQ(a.data()[0], 1.0f) << "a copy must not share storage";
  const float* storage = b.data();
  Tensor c = std::move(b);
  EXPECT_EQ(c.data(), storage);
  EXPECT_EQ(c.to_host(), (std::vector<float>{42, 2, 3, 4, 5, 6}));
  EXPECT_EQ(c.shape(), (std::vector<int64_t>{2, 3}));
}

TEST(Tensor, ACpuContextMeansHostMemory) {
  const std::shared_ptr<DeviceContext> cpu = DeviceContext::create(Device::cpu());
  const Tensor t = Tensor({3}, {1, 2, 3}).to(cpu);
  EXPECT_EQ(t.device(), nullptr);
  EXPECT_EQ(t.to_host(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(Tensor({4, 0}).numel(), 0u);
}

TEST(Tensor, BadShapesAndValueCountsAreErrors) {
  expect_error_naming([] { Tensor({2, -1}); }, "tensor dimensions must be >= 0, got -1");
  expect_error_naming(
      [] {
        Tensor({2, 2}, std::vector<float>{1, 2, 3});
      },
      "a tensor of 4 elements cannot take 3 values");
}

TEST(CpuDeviceContext, OperationsMatchTheCpuKernels) {
  const std::shared_ptr<DeviceContext> cpu = DeviceContext::create(Device::cpu(), 2);
  EXPECT_EQ(device_name(cpu->device()), "cpu");
  std::vector<float> x = {1.5f, -2.0f, 3.0f, 0.25f, 1e30f};
  std::vector<float> y = {0.5f, 0.5f, -1.0f, 2.0f, 1e30f};

  // add of fp32 into bf16 rounds once: the same as the scalar definition.
  std::vector<uint16_t> acc(x.size());
  cpu->cast(y.data(), DType::kFloat32, acc.data(), DType::kBFloat16, y.size());
  cpu->add(acc.data(), DType::kBFloat16, x.data(), DType::kFloat32, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(acc[i], float_to_bf16(bf16_to_float(float_to_bf16(y[i])) + x[i])) << i;
  }

  std::vector<float> sum = y;
  cpu->add(sum.data(), DType::kFloat32, x.data(), DType::kFloat32, x.size());
  std::vector<float> expected = y;
  kernels::accumulate(expected.data(), x.data(), x.size());
  EXPECT_EQ(sum, expected);

  float squares = 0.0f;
  cpu->sum_squares(x.data(), DType::kFloat32, x.size(), &squares);
  EXPECT_EQ(squares, static_cast<float>(kernels::sum_squares(x.data(), DType::kFloat32, x.size())));
  EXPECT_EQ(squares, std::numeric_limits<float>::infinity()) << "1e60 does not fit a float";

  std::vector<int8_t> values(x.size()), want_values(x.size());
  float scale = 0.0f, want_scale = 0.0f;
  cpu->quantize_int8(x.data(), DType::kFloat32, x.size(), 8, values.data(), &scale);
  kernels::quantize_int8(x.data(), DType::kFloat32, x.size(), 8, want_values.data(), &want_scale);
  EXPECT_EQ(values, want_values);
  EXPECT_EQ(scale, 1e30f / 127.0f);
  std::vector<float> back(x.size());
  cpu->dequantize_int8(values.data(), &scale, x.size(), 8, back.data(), DType::kFloat32);
  EXPECT_EQ(back[4], 1e30f / 127.0f * 127.0f);

  cpu->scale(x.data(), DType::kFloat32, 0.5f, x.size());
  EXPECT_EQ(x[0], 0.75f);
  cpu->zero(x.data(), x.size() * sizeof(float));
  EXPECT_EQ(x, std::vector<float>(x.size(), 0.0f));
}

// The memory timeline samples the driver only where there is one.
TEST(CpuDeviceContext, HasNoDriverToReportItsMemory) {
  EXPECT_FALSE(DeviceContext::create(Device::cpu())->driver_memory().has_value());
}

TEST(CpuDeviceContext, ACudaDeviceThisBuildOrMachineCannotGiveIsAnError) {
#if ZERO_HAVE_CUDA
  const std::string expected = "cannot use cuda:" + std::to_string(cuda_device_count()) +
                               ": this process sees " + std::to_string(cuda_device_count()) +
                               " CUDA device(s)";
#else
  const std::string expected = "cannot use cuda:0: this build has no CUDA support";
#endif
  expect_error_naming([] { DeviceContext::create(Device::cuda(cuda_device_count())); }, expected);
}

}  // namespace
}  // namespace zero
