// The safetensors format, as checkpoint saves and zero-checkpoint export write the model.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zero/kernels/dtype.h"

namespace zero {

// Writes tensors in the safetensors format (8-byte little-endian header length, a JSON header
// naming each tensor's dtype "F32", "BF16" or "F16", shape and data_offsets, then the raw data in
// the order given). `dtype` is kFloat32, kBFloat16 or kFloat16 (rounded to nearest even).
// Throws zero::Error.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const std::vector<float>* values;
};
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       DType dtype,
                       const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace zero
