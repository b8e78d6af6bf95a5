// CUDA streams and events behind the Stream and Event of stream.h: the stream issues work on a
// cudaStream_t at once, and its events are CUDA events, so two CUDA streams order each other on
// the device and the host only waits when it asks to.
#include "zero/collectives/cuda_stream.h"

#include <cstdio>
#include <utility>

#include "cuda_event.h"
#include "zero/kernels/cuda_check.h"

namespace zero {

ScopedDevice::ScopedDevice(int device) {
  ZERO_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) ZERO_CUDA_CHECK(cudaSetDevice(device));
}

ScopedDevice::~ScopedDevice() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

CudaEvent::CudaEvent(int device) : device_(device) {
  ScopedDevice on(device_);
  ZERO_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, cudaEventBlockingSync | cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  // Destroying a pending event is allowed: CUDA releases it once the work completes.
  if (cudaEventDestroy(event_) != cudaSuccess) {
    std::fprintf(stderr, "zero: cudaEventDestroy failed in ~CudaEvent\n");
  }
}

void CudaEvent::record(cudaStream_t stream) {
  ScopedDevice on(device_);
  ZERO_CUDA_CHECK(cudaEventRecord(event_, stream));
  recorded_ = true;
}

void CudaEvent::synchronize() const {
  ZERO_CUDA_CHECK(cudaEventSynchronize(recorded_handle()));
}

bool CudaEvent::query() const {
  if (!recorded_) return false;
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  ZERO_CUDA_CHECK(status);
  return true;
}

cudaEvent_t CudaEvent::recorded_handle() const {
  ZERO_CHECK(recorded_,
             "waited on a CUDA event that was never recorded (a collective issued inside a group "
             "runs only once the group ends)");
  return event_;
}

Event record_cuda_event(cudaStream_t stream, int device) {
  auto event = std::make_shared<CudaEvent>(device);
  event->record(stream);
  return Event(std::shared_ptr<const DeviceEvent>(std::move(event)));
}

void cuda_stream_wait(cudaStream_t stream, const Event& event) {
  if (const auto* cuda = dynamic_cast<const CudaEvent*>(event.device_event())) {
    ZERO_CUDA_CHECK(cudaStreamWaitEvent(stream, cuda->recorded_handle(), 0));
  } else {
    // A CPU event (or another device's): nothing is issued after this call until it completes.
    event.wait();
  }
}

namespace {

class CudaBackend final : public Stream::Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    ScopedDevice on(device_);
    ZERO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  // Waits for the stream's work, like the CPU stream's drain, then destroys it.
  ~CudaBackend() override {
    const cudaError_t synced = cudaStreamSynchronize(stream_);
    const cudaError_t destroyed = cudaStreamDestroy(stream_);
    if (synced != cudaSuccess || destroyed != cudaSuccess) {
      std::fprintf(stderr, "zero: closing a CUDA stream failed: %s\n",
                   cudaGetErrorString(synced != cudaSuccess ? synced : destroyed));
    }
  }

  Event enqueue(std::function<void()> work) override {
    {
      ScopedDevice on(device_);
      work();
    }
    return record();
  }

  void wait(const Event& event) override { cuda_stream_wait(stream_, event); }

  Event record() override { return record_cuda_event(stream_, device_); }

  void synchronize() override { record().wait(); }

  void set_delay_for_testing(std::chrono::microseconds) override {
    ZERO_FAIL("set_delay_for_testing is for CPU streams only");
  }

  void* native_handle() const override { return stream_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Stream> make_cuda_stream(std::string name, int device) {
  int count = 0;
  ZERO_CUDA_CHECK(cudaGetDeviceCount(&count));
  ZERO_CHECK(device >= 0 && device < count,
             "CUDA device " << device << " does not exist (" << count << " devices)");
  return std::make_unique<Stream>(std::move(name), std::make_unique<CudaBackend>(device));
}

CUstream_st* cuda_stream_handle(const Stream& stream) {
  void* handle = stream.native_handle();
  ZERO_CHECK(handle != nullptr,
             "stream '" << stream.name() << "' is a CPU stream, not a CUDA stream");
  return static_cast<cudaStream_t>(handle);
}

}  // namespace zero
