// The safetensors format: checkpoint saves and zero-checkpoint export write the model in it,
// and load_safetensors reads such a file back.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zero/core/dtype.h"

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

// A safetensors file read back (the GPT's weight import and the tests use it): every tensor in
// data order, widened to fp32, and the header's "__metadata__". Reads F32, BF16 and F16; checks
// the header size, the JSON, each tensor's dtype, shape and data_offsets against each other and
// that the offsets tile the data exactly, as the format requires. Throws zero::Error naming
// the file and the problem.
struct LoadedTensor {
  std::string name;
  DType dtype = DType::kFloat32;  // as stored
  std::vector<int64_t> shape;
  std::vector<float> values;
};
struct LoadedSafetensors {
  std::vector<LoadedTensor> tensors;  // in data order
  std::vector<std::pair<std::string, std::string>> metadata;
};
LoadedSafetensors load_safetensors(const std::string& path);

}  // namespace zero
