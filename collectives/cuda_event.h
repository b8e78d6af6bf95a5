// The DeviceEvent of CUDA streams, shared by cuda_stream.cpp and nccl_communicator.cpp (not a
// public header: it needs cuda_runtime.h). Events are created with cudaEventBlockingSync, so a
// host thread waiting on one sleeps instead of spinning on a core its rank may need.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>

#include "zero/collectives/stream.h"

namespace zero {

class CudaEvent final : public DeviceEvent {
 public:
  // An event of `device`, not yet recorded: waiting on it before record() is an error, which
  // catches a grouped collective waited on before its group was issued.
  explicit CudaEvent(int device);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Captures the work issued on `stream` so far.
  void record(cudaStream_t stream);

  void synchronize() const override;
  bool query() const override;

  // The recorded event, for cudaStreamWaitEvent (throws when not recorded yet).
  cudaEvent_t recorded_handle() const;

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
  std::atomic<bool> recorded_{false};
};

// Makes `device` current for the scope and restores the previous one after, so a call never
// leaves the caller on another GPU.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

// An Event recorded now on `stream` of `device`.
Event record_cuda_event(cudaStream_t stream, int device);

// Makes `stream` wait for `event`: on the device for a CUDA event, on the host otherwise.
void cuda_stream_wait(cudaStream_t stream, const Event& event);

}  // namespace zero
