// Streams and events on CUDA streams: ordering between two CUDA streams on the device, and
// between a CUDA stream and a CPU stream in both directions.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "cuda_test_util.h"
#include "spin_kernel.h"
#include "zero/collectives/cuda_stream.h"

namespace zero {
namespace {

using zero::testing::DeviceBuffer;

class CudaStream : public ::testing::Test {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_F(CudaStream, WaitOrdersTwoCudaStreamsOnTheDevice) {
  auto producer = make_cuda_stream("producer", 0);
  auto consumer = make_cuda_stream("consumer", 0);
  const size_t n = 1 << 22;
  DeviceBuffer data(n), copy(n);
  for (int round = 1; round <= 3; ++round) {
    producer->enqueue([&] {
      // A slow kernel first, so a missing wait would let the consumer copy old bytes.
      testing::launch_spin(cuda_stream_handle(*producer), 20'000'000);
      ZERO_CUDA_CHECK(cudaMemsetAsync(data.data(), round, n, cuda_stream_handle(*producer)));
    });
    consumer->wait(producer->record());
    const Event copied = consumer->enqueue([&] {
      ZERO_CUDA_CHECK(cudaMemcpyAsync(copy.data(), data.data(), n, cudaMemcpyDeviceToDevice,
                                      cuda_stream_handle(*consumer)));
    });
    ASSERT_NE(copied.device_event(), nullptr);
    copied.wait();
    EXPECT_TRUE(copied.done());
    EXPECT_EQ(copy.download(n), std::vector<uint8_t>(n, static_cast<uint8_t>(round)));
  }
}

TEST_F(CudaStream, CpuAndCudaStreamsWaitForEachOther) {
  auto device = make_cuda_stream("device", 0);
  Stream host("host");
  const size_t n = 1 << 20;
  DeviceBuffer data(n);
  // CPU -> CUDA: the device stream issues nothing until the CPU item has run.
  std::atomic<int> value{0};
  const Event cpu_done = host.enqueue([&] { value = 7; });
  device->wait(cpu_done);
  EXPECT_EQ(value.load(), 7);
  // CUDA -> CPU: the worker sleeps in the device event until the memset has run.
  device->enqueue([&] {
    testing::launch_spin(cuda_stream_handle(*device), 20'000'000);
    ZERO_CUDA_CHECK(cudaMemsetAsync(data.data(), 9, n, cuda_stream_handle(*device)));
  });
  host.wait(device->record());
  std::vector<uint8_t> seen;
  host.enqueue([&] { seen = data.download(n); });
  host.synchronize();
  EXPECT_EQ(seen, std::vector<uint8_t>(n, 9));
}

TEST_F(CudaStream, HandleOfCpuStreamIsAnError) {
  Stream host("host");
  EXPECT_EQ(host.native_handle(), nullptr);
  EXPECT_THROW(cuda_stream_handle(host), Error);
  auto device = make_cuda_stream("device", 0);
  EXPECT_NE(device->native_handle(), nullptr);
  EXPECT_THROW(make_cuda_stream("nowhere", 1 << 20), Error);
}

}  // namespace
}  // namespace zero
