// The safetensors format (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header size, a JSON header naming each tensor's dtype, shape and data_offsets, then the raw
// data. Checkpoint saves and zero-checkpoint export write the model in it; load_safetensors
// reads it back.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint_format.h"
#include "zero/core/check.h"
#include "zero/core/dtype.h"
#include "zero/core/write_fully.h"
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
    header[t.name] = {{"dtype", safetensors_dtype_name(dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + numel * elem}}};
    offset += numel * elem;
  }
  std::string text = header.dump();
  // Pad the header with spaces (the spec allows trailing whitespace) so the data starts 8-byte
  // aligned, as Hugging Face's writer does: readers may then map the tensors in place.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  const uint64_t header_size = text.size();

  // Written to a temporary name and renamed, so a failed export leaves no truncated file. The
  // name carries the process id: two writers of one path never share (and delete) a temp file.
  struct stat target {};
  ZERO_CHECK(::stat(path.c_str(), &target) != 0 || !S_ISDIR(target.st_mode),
             path << " is a directory; give the safetensors file's name (e.g. " << path
                  << "/model.safetensors)");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0, "cannot create " << tmp << ": " << std::strerror(errno));
  try {
    write_fully(fd, &header_size, sizeof(header_size), tmp);
    write_fully(fd, text.data(), text.size(), tmp);
    std::vector<uint16_t> half;
    for (const NamedTensor& t : tensors) {
      if (dtype == DType::kFloat32) {
        write_fully(fd, t.values->data(), t.values->size() * sizeof(float), tmp);
        continue;
      }
      half.resize(t.values->size());
      for (size_t i = 0; i < half.size(); ++i) {
        const float v = (*t.values)[i];
        half[i] = dtype == DType::kBFloat16 ? float_to_bf16(v) : float_to_fp16(v);
      }
      write_fully(fd, half.data(), half.size() * sizeof(uint16_t), tmp);
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
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    ZERO_FAIL("cannot rename " << tmp << " to " << path << ": " << std::strerror(error));
  }
}

namespace {

// Reads exactly `size` bytes at `offset`, retrying short reads and EINTR.
void read_at(int fd, void* out, size_t size, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n > 0, "cannot read safetensors file "
                          << path << " at byte " << offset << ": "
                          << (n == 0 ? "unexpected end of file" : std::strerror(errno)));
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
}

// The header's entry for one tensor, checked: its dtype, shape and byte range in the data.
LoadedTensor tensor_of(const std::string& name, const nlohmann::json& entry, uint64_t data_size,
                       std::pair<uint64_t, uint64_t>* range, const std::string& path) {
  const auto bad = [&](const std::string& why) {
    ZERO_FAIL("safetensors file " << path << ": tensor '" << name << "' " << why);
  };
  if (!entry.is_object()) bad("is not a JSON object");
  LoadedTensor t;
  t.name = name;
  const nlohmann::json& dtype = entry.value("dtype", nlohmann::json());
  if (!dtype.is_string() || !parse_safetensors_dtype(dtype.get<std::string>(), &t.dtype)) {
    bad("has dtype " + dtype.dump() + "; F32, BF16 and F16 are read");
  }
  const nlohmann::json& shape = entry.value("shape", nlohmann::json());
  if (!shape.is_array()) bad("has no shape list");
  uint64_t numel = 1;
  for (const nlohmann::json& d : shape) {
    if (!d.is_number_unsigned()) bad("has a shape entry that is not a whole number >= 0");
    const uint64_t dim = d.get<uint64_t>();
    if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) bad("is too large");
    numel *= dim;
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  const nlohmann::json& offsets = entry.value("data_offsets", nlohmann::json());
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    bad("has no data_offsets [begin, end]");
  }
  range->first = offsets[0].get<uint64_t>();
  range->second = offsets[1].get<uint64_t>();
  if (range->first > range->second || range->second > data_size) {
    bad("has data_offsets outside the data");
  }
  if (numel > (range->second - range->first) / dtype_size(t.dtype) ||
      numel * dtype_size(t.dtype) != range->second - range->first) {
    bad("has " + std::to_string(range->second - range->first) + " bytes for " +
        std::to_string(numel) + " elements");
  }
  t.values.resize(numel);
  return t;
}

}  // namespace

LoadedSafetensors load_safetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open " << path << ": " << std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  ZERO_CHECK(::fstat(fd, &st) == 0, "cannot stat " << path << ": " << std::strerror(errno));
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  ZERO_CHECK(file_size >= 8,
             "safetensors file " << path << " is shorter than its 8-byte header size");
  uint64_t header_size = 0;
  read_at(fd, &header_size, sizeof(header_size), 0, path);
  // The format caps the header at 100 MB.
  ZERO_CHECK(header_size <= file_size - 8 && header_size <= 100'000'000,
             "safetensors file " << path << ": header size " << header_size
                                 << " does not fit the file of " << file_size << " bytes");
  std::string text(header_size, '\0');
  read_at(fd, text.data(), text.size(), 8, path);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ZERO_FAIL("safetensors file " << path << ": the header is not JSON: " << e.what());
  }
  ZERO_CHECK(header.is_object(), "safetensors file " << path << ": the header is not an object");

  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;
  LoadedSafetensors out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      ZERO_CHECK(it.value().is_object(),
                 "safetensors file " << path << ": __metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        ZERO_CHECK(m.value().is_string(), "safetensors file " << path << ": __metadata__ value of '"
                                                              << m.key() << "' is not a string");
        out.metadata.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    ranges.emplace_back();
    out.tensors.push_back(tensor_of(it.key(), it.value(), data_size, &ranges.back(), path));
  }
  // In data order; the ranges must tile the data without gaps or overlaps.
  std::vector<size_t> order(out.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t expected_begin = 0;
  for (size_t i : order) {
    ZERO_CHECK(ranges[i].first == expected_begin,
               "safetensors file " << path << ": tensor '" << out.tensors[i].name
                                   << "' starts at data byte " << ranges[i].first << ", expected "
                                   << expected_begin << " (the tensors must tile the data)");
    expected_begin = ranges[i].second;
  }
  ZERO_CHECK(expected_begin == data_size, "safetensors file " << path << ": the tensors cover "
                                                              << expected_begin << " of "
                                                              << data_size << " data bytes");

  LoadedSafetensors sorted;
  sorted.metadata = std::move(out.metadata);
  std::vector<char> bytes;
  for (size_t i : order) {
    LoadedTensor& t = out.tensors[i];
    if (t.values.empty()) {
      sorted.tensors.push_back(std::move(t));
      continue;
    }
    bytes.resize(ranges[i].second - ranges[i].first);
    read_at(fd, bytes.data(), bytes.size(), data_start + ranges[i].first, path);
    // Little-endian on disk, as in memory (checkpoint_files.cpp asserts the host is).
    if (t.dtype == DType::kFloat32) {
      std::memcpy(t.values.data(), bytes.data(), bytes.size());
    } else {
      for (size_t k = 0; k < t.values.size(); ++k) {
        uint16_t h = 0;
        std::memcpy(&h, bytes.data() + 2 * k, 2);
        t.values[k] = t.dtype == DType::kBFloat16 ? bf16_to_float(h) : fp16_to_float(h);
      }
    }
    sorted.tensors.push_back(std::move(t));
  }
  return sorted;
}

}  // namespace zero
