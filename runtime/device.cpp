// The CPU device context, and the choice between it and the CUDA one (cuda_device.cpp).
#include "zero/runtime/device.h"

#include <cstring>

#include "zero/core/check.h"
#include "zero/kernels/cpu_kernels.h"
#if ZERO_HAVE_CUDA
#include "cuda_device.h"
#endif

namespace zero {

namespace {

// The compute stream is the calling thread: its work is finished when each call returns, so an
// event recorded on it is already complete, and waiting for another stream's event blocks.
class CpuDeviceContext : public DeviceContext {
 public:
  explicit CpuDeviceContext(int kernel_threads) : options_{kernel_threads} {
    ZERO_CHECK(kernel_threads >= 1, "kernel threads must be at least 1, got " << kernel_threads);
  }

  void* allocate(size_t bytes) override { return host_memory().allocate(bytes); }
  void deallocate(void* data, size_t bytes) noexcept override {
    host_memory().deallocate(data, bytes);
  }
  std::string memory_name() const override { return host_memory().memory_name(); }

  Device device() const override { return Device::cpu(); }
  MemoryResource& pinned_memory() override { return host_memory(); }
  std::optional<DriverMemory> driver_memory() const override { return std::nullopt; }
  Event record() override { return Event(); }
  void wait(const Event& event) override { event.wait(); }
  void synchronize() override {}
  void synchronize_device() override {}
  CUstream_st* cuda_stream() const override { return nullptr; }

  void copy_to_host(void* host, const void* source, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, source, bytes);
  }
  void copy_from_host(void* dest, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(dest, host, bytes);
  }
  Event copy_to_host_async(void* host, const void* source, size_t bytes) override {
    copy_to_host(host, source, bytes);
    return Event();
  }
  Event copy_from_host_async(void* dest, const void* host, size_t bytes) override {
    copy_from_host(dest, host, bytes);
    return Event();
  }
  void zero(void* data, size_t bytes, Stream*) override {
    if (bytes > 0) std::memset(data, 0, bytes);
  }
  void copy(void* dest, const void* source, size_t bytes, Stream*) override {
    if (bytes > 0 && dest != source) std::memcpy(dest, source, bytes);
  }
  void cast(const void* source, DType source_dtype, void* dest, DType dest_dtype, size_t n,
            Stream*) override {
    kernels::cast(source, source_dtype, dest, dest_dtype, n, options_);
  }
  void add(void* dest, DType dest_dtype, const void* source, DType source_dtype, size_t n,
           Stream*) override {
    kernels::accumulate(dest, dest_dtype, source, source_dtype, n, options_);
  }
  void scale(void* x, DType dtype, float alpha, size_t n, Stream*) override {
    kernels::scale(x, dtype, alpha, n, options_);
  }
  void quantize_int8(const void* source, DType source_dtype, size_t n, size_t block, int8_t* values,
                     float* scales, Stream*) override {
    kernels::quantize_int8(source, source_dtype, n, block, values, scales, options_);
  }
  void dequantize_int8(const int8_t* values, const float* scales, size_t n, size_t block,
                       void* dest, DType dest_dtype, Stream*) override {
    kernels::dequantize_int8(values, scales, n, block, dest, dest_dtype, options_);
  }
  void sum_squares(const void* x, DType dtype, size_t n, float* out) override {
    *out = static_cast<float>(kernels::sum_squares(x, dtype, n, options_));
  }
  void apply_optimizer(const Optimizer& optimizer, const std::vector<ShardUpdate>& shards,
                       DType grad_dtype, float grad_scale, DType param_dtype) override {
    for (const ShardUpdate& u : shards) {
      optimizer.apply(u, grad_dtype, grad_scale, param_dtype, options_);
    }
  }

 private:
  kernels::KernelOptions options_;
};

}  // namespace

std::string device_name(const Device& device) {
  return device.is_cuda() ? "cuda:" + std::to_string(device.index) : "cpu";
}

int cuda_device_count() {
#if ZERO_HAVE_CUDA
  return count_cuda_devices();
#else
  return 0;
#endif
}

std::shared_ptr<DeviceContext> DeviceContext::create(const Device& device, int kernel_threads) {
  if (!device.is_cuda()) return std::make_shared<CpuDeviceContext>(kernel_threads);
#if ZERO_HAVE_CUDA
  return make_cuda_device_context(device.index);
#else
  ZERO_FAIL("cannot use " << device_name(device)
                          << ": this build has no CUDA support (configure with -DZERO_CUDA=ON on a "
                             "machine with the CUDA toolkit)");
#endif
}

}  // namespace zero
