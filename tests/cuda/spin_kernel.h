// A kernel that keeps the GPU busy for a while, for tests that must show an order (or a
// timeout) that a fast stream would hide.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace zero::testing {

// Enqueues one single-thread kernel on `stream` that spins for about `cycles` clock cycles
// (20M cycles: about 10 ms at 2 GHz).
void launch_spin(cudaStream_t stream, int64_t cycles);

}  // namespace zero::testing
