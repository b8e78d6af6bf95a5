// The CUDA device context (cuda_device.cpp), built only with CUDA (ZERO_HAVE_CUDA).
#pragma once

#include <memory>

#include "zero/runtime/device.h"

namespace zero {

std::shared_ptr<DeviceContext> make_cuda_device_context(int index);
int count_cuda_devices();

}  // namespace zero
