// Shared by the GPU tests: the skip when no device is present, and device buffers that free
// themselves.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "zero/kernels/cuda_check.h"

namespace zero::testing {

// Empty when a CUDA device is usable, else why not (for the skip message).
inline std::string why_no_cuda_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return cudaGetErrorString(status);
  if (count == 0) return "cudaGetDeviceCount found none";
  return "";
}

// Each GPU test begins with this. CTest's SKIP_REGULAR_EXPRESSION matches the message.
#define ZERO_SKIP_WITHOUT_CUDA_DEVICE()                                        \
  do {                                                                         \
    const std::string zero_no_device_ = ::zero::testing::why_no_cuda_device(); \
    if (!zero_no_device_.empty()) {                                            \
      GTEST_SKIP() << "no CUDA device: skipping (" << zero_no_device_ << ")";  \
    }                                                                          \
  } while (0)

// `bytes` of device memory at `device`, copied to the host (the comparisons are bytewise).
inline std::vector<uint8_t> download_bytes(const void* device, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  ZERO_CUDA_CHECK(cudaMemcpy(out.data(), device, bytes, cudaMemcpyDeviceToHost));
  return out;
}

// The bytes of host floats, to compare with download_bytes.
inline std::vector<uint8_t> bytes_of(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(float));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A device allocation of `bytes` (RAII; not copyable).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    ZERO_CUDA_CHECK(cudaMalloc(&data_, bytes == 0 ? 1 : bytes));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

  void upload(const void* host, size_t bytes, size_t offset = 0) {
    ZERO_CUDA_CHECK(
        cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice));
  }
  std::vector<uint8_t> download(size_t bytes, size_t offset = 0) const {
    return download_bytes(static_cast<const char*>(data_) + offset, bytes);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

}  // namespace zero::testing
