// The CUDA device context: a compute stream of its own, memory from the device's stream-ordered
// pool, and the element operations as the kernels of zero/kernels/cuda_kernels.h.
#include "cuda_device.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "zero/collectives/cuda_stream.h"
#include "zero/core/check.h"
#include "zero/kernels/cuda_check.h"
#include "zero/kernels/cuda_kernels.h"

namespace zero {

namespace {

// cudaMallocHost: page-locked host memory, zero-filled like every allocation here.
class PinnedHostMemory : public MemoryResource {
 public:
  void* allocate(size_t bytes) override {
    void* data = nullptr;
    const cudaError_t status = cudaMallocHost(&data, bytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so later checks do not report it again
      return nullptr;
    }
    ZERO_CUDA_CHECK(status);
    std::memset(data, 0, bytes);
    return data;
  }
  void deallocate(void* data, size_t) noexcept override {
    const cudaError_t status = cudaFreeHost(data);
    if (status != cudaSuccess) {
      std::fprintf(stderr, "zero: %s:%d: cudaFreeHost failed: %s\n", __FILE__, __LINE__,
                   cudaGetErrorString(status));
    }
  }
  std::string memory_name() const override { return "pinned host memory"; }
};

class CudaDeviceContext : public DeviceContext {
 public:
  explicit CudaDeviceContext(int index) : index_(index) {
    const int count = count_cuda_devices();
    ZERO_CHECK(index >= 0 && index < count,
               "cannot use cuda:" << index << ": this process sees " << count << " CUDA device(s)");
    ZERO_CUDA_CHECK(cudaSetDevice(index));
    compute_ = make_cuda_stream("compute", index);
    stream_ = cuda_stream_handle(*compute_);
    // Keep freed memory in the pool instead of returning it to the driver at every
    // synchronization: the engine frees and allocates the same sizes every step.
    cudaMemPool_t pool = nullptr;
    ZERO_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, index));
    uint64_t keep_all = UINT64_MAX;
    ZERO_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  }

  ~CudaDeviceContext() override {
    // Pending work may still read the workspace; a destructor has no one to report errors to.
    if (sum_workspace_ != nullptr) cudaFreeAsync(sum_workspace_, stream_);
    cudaStreamSynchronize(stream_);
    if (copies_) cudaStreamSynchronize(cuda_stream_handle(*copies_));
  }

  void* allocate(size_t bytes) override {
    void* data = nullptr;
    const cudaError_t status = cudaMallocAsync(&data, bytes, stream_);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it so later checks do not report it again
      return nullptr;
    }
    ZERO_CUDA_CHECK(status);
    ZERO_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream_));
    return data;
  }
  // Stream-ordered: the memory returns to the pool once the compute work issued so far is done.
  // Work of other streams on it must be waited for first (the engine drains its communication
  // stream before it frees). A failure here follows an earlier, sticky CUDA error, which is the
  // one being reported: this only says so.
  void deallocate(void* data, size_t) noexcept override {
    const cudaError_t status = cudaFreeAsync(data, stream_);
    if (status != cudaSuccess) {
      std::fprintf(stderr, "zero: %s:%d: cudaFreeAsync failed: %s\n", __FILE__, __LINE__,
                   cudaGetErrorString(status));
    }
  }
  std::string memory_name() const override { return "memory of cuda:" + std::to_string(index_); }

  Device device() const override { return Device::cuda(index_); }
  MemoryResource& pinned_memory() override { return pinned_; }
  std::optional<DriverMemory> driver_memory() const override {
    // cudaMemGetInfo asks about the current device, which another context may have changed.
    ZERO_CUDA_CHECK(cudaSetDevice(index_));
    size_t free_bytes = 0, total_bytes = 0;
    ZERO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return DriverMemory{free_bytes, total_bytes};
  }
  Event record() override { return compute_->record(); }
  void wait(const Event& event) override { compute_->wait(event); }
  void synchronize() override { compute_->synchronize(); }
  void synchronize_device() override {
    ZERO_CUDA_CHECK(cudaSetDevice(index_));
    ZERO_CUDA_CHECK(cudaDeviceSynchronize());
  }
  CUstream_st* cuda_stream() const override { return stream_; }

  void copy_to_host(void* host, const void* source, size_t bytes) override {
    if (bytes == 0) return;
    ZERO_CUDA_CHECK(cudaMemcpyAsync(host, source, bytes, cudaMemcpyDeviceToHost, stream_));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_from_host(void* dest, const void* host, size_t bytes) override {
    if (bytes == 0) return;
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dest, host, bytes, cudaMemcpyHostToDevice, stream_));
    // The host buffer may be reused as soon as this returns.
    ZERO_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  Event copy_to_host_async(void* host, const void* source, size_t bytes) override {
    return copy_async(host, source, bytes, cudaMemcpyDeviceToHost);
  }
  Event copy_from_host_async(void* dest, const void* host, size_t bytes) override {
    return copy_async(dest, host, bytes, cudaMemcpyHostToDevice);
  }
  void zero(void* data, size_t bytes, Stream* on) override {
    if (bytes > 0) ZERO_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, stream_of(on)));
  }
  void copy(void* dest, const void* source, size_t bytes, Stream* on) override {
    if (bytes == 0 || dest == source) return;
    // Either side may be pinned host memory (device.h): unified addressing tells which.
    ZERO_CUDA_CHECK(cudaMemcpyAsync(dest, source, bytes, cudaMemcpyDefault, stream_of(on)));
  }
  void cast(const void* source, DType source_dtype, void* dest, DType dest_dtype, size_t n,
            Stream* on) override {
    kernels::cuda::cast(source, source_dtype, dest, dest_dtype, n, stream_of(on));
  }
  void add(void* dest, DType dest_dtype, const void* source, DType source_dtype, size_t n,
           Stream* on) override {
    kernels::cuda::add(dest, dest_dtype, source, source_dtype, n, stream_of(on));
  }
  void scale(void* x, DType dtype, float alpha, size_t n, Stream* on) override {
    kernels::cuda::scale(x, dtype, alpha, n, stream_of(on));
  }
  void quantize_int8(const void* source, DType source_dtype, size_t n, size_t block, int8_t* values,
                     float* scales, Stream* on) override {
    kernels::cuda::quantize_int8(source, source_dtype, n, block, values, scales, stream_of(on));
  }
  void dequantize_int8(const int8_t* values, const float* scales, size_t n, size_t block,
                       void* dest, DType dest_dtype, Stream* on) override {
    kernels::cuda::dequantize_int8(values, scales, n, block, dest, dest_dtype, stream_of(on));
  }
  void sum_squares(const void* x, DType dtype, size_t n, float* out) override {
    const kernels::cuda::ConstTensor tensor{x, n};
    const size_t needed = kernels::cuda::sum_squares_workspace_bytes(&tensor, 1);
    if (needed > sum_workspace_bytes_) {
      // Stream-ordered like every use of it, so the old workspace is free once the work before
      // is done. It is one double per 8192 elements: small next to the tensor.
      if (sum_workspace_ != nullptr) ZERO_CUDA_CHECK(cudaFreeAsync(sum_workspace_, stream_));
      sum_workspace_ = nullptr;
      sum_workspace_bytes_ = 0;
      ZERO_CUDA_CHECK(cudaMallocAsync(&sum_workspace_, needed, stream_));
      sum_workspace_bytes_ = needed;
    }
    kernels::cuda::sum_squares(&tensor, 1, dtype, out, sum_workspace_, sum_workspace_bytes_,
                               nullptr, stream_);
  }
  void apply_optimizer(const Optimizer& optimizer, const std::vector<ShardUpdate>& shards,
                       DType grad_dtype, float grad_scale, DType param_dtype) override {
    optimizer.apply_cuda(shards, grad_dtype, grad_scale, param_dtype, stream_);
  }

 private:
  cudaStream_t stream_of(Stream* on) const { return on ? cuda_stream_handle(*on) : stream_; }
  // On the copy stream (made at first use), after the compute work issued so far.
  Event copy_async(void* dest, const void* source, size_t bytes, cudaMemcpyKind kind) {
    if (!copies_) copies_ = make_cuda_stream("copy", index_);
    copies_->wait(compute_->record());
    if (bytes > 0) {
      ZERO_CUDA_CHECK(cudaMemcpyAsync(dest, source, bytes, kind, cuda_stream_handle(*copies_)));
    }
    return copies_->record();
  }

  int index_;
  PinnedHostMemory pinned_;
  std::unique_ptr<Stream> compute_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Stream> copies_;  // copy_*_async's
  void* sum_workspace_ = nullptr;   // sum_squares' partial sums
  size_t sum_workspace_bytes_ = 0;
};

}  // namespace

int count_cuda_devices() {
  int count = 0;
  // No driver or no device: there is nothing to use, which is an answer, not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::shared_ptr<DeviceContext> make_cuda_device_context(int index) {
  return std::make_shared<CudaDeviceContext>(index);
}

}  // namespace zero
