// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header size, a JSON header naming each tensor's dtype, shape and data_offsets, then the raw
// data. Checkpoint saves and zero-checkpoint export write the model in it.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint_format.h"
#include "zero/kernels/check.h"
#include "zero/kernels/dtype.h"
#include "zero/runtime/safetensors.h"

namespace zero {

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       DType dtype,
                       const std::vector<std::pair<std::string, std::string>>& metadata) {
  ZERO_CHECK(dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16,
             "safetensors export supports fp32, bf16 and fp16, not " << dtype_name(dtype));
  // The header lists tensors in data order; ordered_json keeps that order for readers' sake.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& entry : metadata) meta[entry.first] = entry.second;
    header["__metadata__"] = meta;
  }
  const size_t elem = dtype_size(dtype);
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    ZERO_CHECK(!t.name.empty() && t.name != "__metadata__" && !header.contains(t.name),
               "safetensors: bad or duplicate tensor name '" << t.name << "'");
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    ZERO_CHECK(numel == t.values->size(), "safetensors: tensor '" << t.name << "' has "
                                                                  << t.values->size()
                                                                  << " values for its shape");
    const char* type = dtype == DType::kFloat32    ? "F32"
                       : dtype == DType::kBFloat16 ? "BF16"
                                                   : "F16";
    header[t.name] = {
        {"dtype", type}, {"shape", t.shape}, {"data_offsets", {offset, offset + numel * elem}}};
    offset += numel * elem;
  }
  std::string text = header.dump();
  // Pad the header with spaces (the spec allows trailing whitespace) so the data starts 8-byte
  // aligned, as Hugging Face's writer does: readers may then map the tensors in place.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  const uint64_t header_size = text.size();

  // Written to a temporary name and renamed, so a failed export leaves no truncated file.
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0, "cannot create " << tmp << ": " << std::strerror(errno));
  try {
    checkpoint_files::write_fully(fd, &header_size, sizeof(header_size), tmp);
    checkpoint_files::write_fully(fd, text.data(), text.size(), tmp);
    std::vector<uint16_t> half;
    for (const NamedTensor& t : tensors) {
      if (dtype == DType::kFloat32) {
        checkpoint_files::write_fully(fd, t.values->data(), t.values->size() * sizeof(float), tmp);
        continue;
      }
      half.resize(t.values->size());
      for (size_t i = 0; i < half.size(); ++i) {
        const float v = (*t.values)[i];
        half[i] = dtype == DType::kBFloat16 ? float_to_bf16(v) : float_to_fp16(v);
      }
      checkpoint_files::write_fully(fd, half.data(), half.size() * sizeof(uint16_t), tmp);
    }
    ZERO_CHECK(::fsync(fd) == 0, "fsync of " << tmp << " failed: " << std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  const int rc = ::close(fd);
  if (rc != 0) ::unlink(tmp.c_str());
  ZERO_CHECK(rc == 0, "cannot close " << tmp << ": " << std::strerror(errno));
  ZERO_CHECK(::rename(tmp.c_str(), path.c_str()) == 0,
             "cannot rename " << tmp << " to " << path << ": " << std::strerror(errno));
}

}  // namespace zero
