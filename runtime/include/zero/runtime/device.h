// Where the engine's buffers live and its compute runs: the CPU, or one CUDA GPU.
//
// A DeviceContext is a device's compute stream, its memory and the element operations the engine
// runs on its buffers. The engine is written once against it: on the CPU the compute stream is
// the calling thread and the operations are the vectorized CPU kernels; on CUDA it is a CUDA
// stream and the operations are the kernels of zero/kernels/cuda_kernels.h. Needs no CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/collectives/stream.h"
#include "zero/core/dtype.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/memory.h"

struct CUstream_st;

namespace zero {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // the CUDA device ordinal

  static Device cpu() { return Device{}; }
  static Device cuda(int index) { return Device{DeviceType::kCuda, index}; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  bool operator==(const Device& other) const {
    return type == other.type && (type == DeviceType::kCpu || index == other.index);
  }
  bool operator!=(const Device& other) const { return !(*this == other); }
};

// "cpu", "cuda:0".
std::string device_name(const Device& device);

// CUDA devices this process can use: 0 in a build without CUDA, and on a machine without a GPU
// or driver.
int cuda_device_count();

// A device's memory as its driver reports it (cudaMemGetInfo). Every process's allocations count
// against `free_bytes`, and so does what no Allocator counts: the CUDA context, cuBLAS's
// workspace, NCCL's buffers, the reserve of the memory pool the allocations come from.
struct DriverMemory {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

class DeviceContext : public MemoryResource {
 public:
  // The context of `device`. kernel_threads: threads per CPU kernel (CPU only). A CUDA device
  // becomes the calling thread's current device. Throws zero::Error naming the device when it does
  // not exist or the build has no CUDA.
  static std::shared_ptr<DeviceContext> create(const Device& device, int kernel_threads = 1);

  virtual Device device() const = 0;

  // The compute stream. record(): an event that completes when the work issued so far has run.
  // wait(event): later compute work runs after the event (on CUDA without blocking the host; on
  // the CPU by blocking). synchronize(): the host waits until the issued work has run.
  // synchronize_device(): the same for every stream of the device, copy streams included (as
  // torch.cuda.synchronize() does); on the CPU there is nothing to wait for.
  virtual Event record() = 0;
  virtual void wait(const Event& event) = 0;
  virtual void synchronize() = 0;
  virtual void synchronize_device() = 0;
  // The compute stream's cudaStream_t, for a module's own kernels and cuBLAS; null on the CPU.
  virtual CUstream_st* cuda_stream() const = 0;

  // Page-locked host memory, for the host side of copies to and from the device: the copy engine
  // reads and writes it directly, at full speed, where pageable memory goes through a bounce
  // buffer. Plain host memory on the CPU.
  virtual MemoryResource& pinned_memory() = 0;

  // The driver's figures for this device now, from a query that waits for no work. Nothing on
  // the CPU, which has no driver to ask. Throws zero::Error naming the failed call when the
  // driver fails.
  virtual std::optional<DriverMemory> driver_memory() const = 0;

  // Copies between host memory and this device's memory, after the compute work issued so far;
  // the host memory may be used as soon as they return.
  virtual void copy_to_host(void* host, const void* source, size_t bytes) = 0;
  virtual void copy_from_host(void* dest, const void* host, size_t bytes) = 0;
  // The same on a copy stream of the context's own, so they overlap compute (activation
  // checkpoints moved to pinned host memory in forward and brought back ahead of backward). Each
  // starts after the compute work issued so far and returns the event of its completion:
  // compute waits for it with wait(), and neither side's memory may be reused or freed before
  // it completes. The CPU copies at once and returns a completed event.
  virtual Event copy_to_host_async(void* host, const void* source, size_t bytes) = 0;
  virtual Event copy_from_host_async(void* dest, const void* host, size_t bytes) = 0;

  // Element operations on this device's memory. Each runs on the compute stream, or, when `on`
  // is given, on that stream (the communication stream, for work queued behind a collective).
  // On the CPU they run on the calling thread: the engine calls them from work it enqueues on
  // the stream, so they run in the stream's order all the same.
  virtual void zero(void* data, size_t bytes, Stream* on = nullptr) = 0;
  // Either side may also be pinned_memory(): a copy to or from the host in the stream's order
  // (the gradient shards that the optimizer offloaded to the host reads, behind their
  // reductions on the communication stream).
  virtual void copy(void* dest, const void* source, size_t bytes, Stream* on = nullptr) = 0;
  // n elements, rounded to nearest even when narrowing.
  virtual void cast(const void* source, DType source_dtype, void* dest, DType dest_dtype, size_t n,
                    Stream* on = nullptr) = 0;
  // dest[i] += source[i], computed in fp32 and rounded once to dest_dtype.
  virtual void add(void* dest, DType dest_dtype, const void* source, DType source_dtype, size_t n,
                   Stream* on = nullptr) = 0;
  // x[i] *= alpha.
  virtual void scale(void* x, DType dtype, float alpha, size_t n, Stream* on = nullptr) = 0;
  // Blockwise int8 (zero/kernels/quantize_math.h): n elements of `source` to n int8 `values` and
  // one fp32 scale per `block` elements (the last block may be shorter), and back into `dest`.
  virtual void quantize_int8(const void* source, DType source_dtype, size_t n, size_t block,
                             int8_t* values, float* scales, Stream* on = nullptr) = 0;
  virtual void dequantize_int8(const int8_t* values, const float* scales, size_t n, size_t block,
                               void* dest, DType dest_dtype, Stream* on = nullptr) = 0;
  // *out (one float in this device's memory) = sum of x[i]^2 over n elements, accumulated in
  // double and rounded once; on the compute stream.
  virtual void sum_squares(const void* x, DType dtype, size_t n, float* out) = 0;
  // One optimizer step over the shards (see Optimizer::apply), on the compute stream: one
  // multi-tensor launch on CUDA.
  virtual void apply_optimizer(const Optimizer& optimizer, const std::vector<ShardUpdate>& shards,
                               DType grad_dtype, float grad_scale, DType param_dtype) = 0;
};

}  // namespace zero
