// Streams and events on CUDA streams, behind the Stream and Event of stream.h. Needs no CUDA
// headers (a cudaStream_t is a CUstream_st*), so code built without nvcc can hold and pass them.
// Only built when CUDA is found (ZERO_HAVE_CUDA).
#pragma once

#include <memory>
#include <string>

#include "zero/collectives/stream.h"

struct CUstream_st;

namespace zero {

// A Stream on a new CUDA stream of `device` that does not synchronize with the legacy default
// stream. enqueue(work) calls work at once; work issues device work on cuda_stream_handle().
// record() returns an event that completes on the device; wait(event) makes the stream wait on
// the device for a device event (cudaStreamWaitEvent), and blocks the caller for a CPU event.
// Waiting on its events from the host sleeps (blocking-sync events), never spins.
std::unique_ptr<Stream> make_cuda_stream(std::string name, int device);

// The cudaStream_t of a stream from make_cuda_stream (or a NCCL communicator's stream); throws
// zero::Error for a CPU stream.
CUstream_st* cuda_stream_handle(const Stream& stream);

}  // namespace zero
