// Checkpoint files: CRC32C, writing and fsyncing, the shard files' check and reader, and the
// entry points that read a checkpoint without MPI (resolving a path to its step directory, the
// manifest, verifying and reading the shards). checkpoint_save.cpp and checkpoint_load.cpp
// build the collective save and load on them; zero-checkpoint uses them directly.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>

#include "checkpoint_format.h"
#include "zero/core/check.h"

// Shard files hold host memory as written: little-endian fp32 is the format.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint files are little-endian");

namespace zero {

// ---- CRC32C: slicing-by-8 over tables built at compile time (reflected polynomial 0x82F63B78).
// Eight bytes per step through eight tables runs at a few GB/s, well ahead of the disk.
namespace {

struct Crc32cTables {
  uint32_t t[8][256];
};

constexpr Crc32cTables make_crc32c_tables() {
  Crc32cTables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    tables.t[0][i] = crc;
  }
  for (int k = 1; k < 8; ++k) {
    for (uint32_t i = 0; i < 256; ++i) {
      const uint32_t prev = tables.t[k - 1][i];
      tables.t[k][i] = (prev >> 8) ^ tables.t[0][prev & 0xffu];
    }
  }
  return tables;
}

constexpr Crc32cTables kCrc = make_crc32c_tables();

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = kCrc.t[7][word & 0xff] ^ kCrc.t[6][(word >> 8) & 0xff] ^ kCrc.t[5][(word >> 16) & 0xff] ^
          kCrc.t[4][(word >> 24) & 0xff] ^ kCrc.t[3][(word >> 32) & 0xff] ^
          kCrc.t[2][(word >> 40) & 0xff] ^ kCrc.t[1][(word >> 48) & 0xff] ^ kCrc.t[0][word >> 56];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = kCrc.t[0][(crc ^ *p++) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

namespace checkpoint_files {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

std::string step_dir_name(long step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08ld", step);
  return name;
}

std::string shard_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank_%05d.bin", rank);
  return name;
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::vector<uint64_t> unit_byte_offsets(const std::vector<CheckpointInfo::SavedUnit>& units,
                                        int state_count) {
  std::vector<uint64_t> offsets(units.size() + 1, 0);
  for (size_t u = 0; u < units.size(); ++u) {
    offsets[u + 1] = offsets[u] + units[u].shard * (1 + static_cast<uint64_t>(state_count)) * 4;
  }
  return offsets;
}
// ---- Files.

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open " << path << " to fsync it: " << errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  ZERO_CHECK(rc == 0, "fsync of " << path << " failed: " << errno_text());
}

std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open " << path << ": " << errno_text());
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      ::close(fd);
      errno = saved;
      ZERO_CHECK(n == 0, "cannot read " << path << ": " << errno_text());
      return text;
    }
    text.append(buffer, static_cast<size_t>(n));
  }
}

std::string check_shard_file(const CheckpointInfo& info, int rank) {
  const CheckpointInfo::File& file = info.files[rank];
  const std::string path = join(info.step_dir, file.name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return path + ": cannot open: " + errno_text();
  std::vector<char> buffer(1 << 20);
  uint64_t size = 0;
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string why = errno_text();
      ::close(fd);
      return path + ": read error: " + why;
    }
    if (n == 0) break;
    crc = crc32c(buffer.data(), static_cast<size_t>(n), crc);
    size += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (size != file.size) {
    return path + ": size is " + std::to_string(size) + " bytes, the manifest says " +
           std::to_string(file.size);
  }
  if (crc != file.crc32c) {
    char text[96];
    std::snprintf(text, sizeof(text),
                  ": checksum mismatch (CRC32C %08" PRIx32 ", the manifest says %08" PRIx32 ")",
                  crc, file.crc32c);
    return path + text;
  }
  return "";
}

ShardReader::ShardReader(const CheckpointInfo& info)
    : info_(info), unit_offsets_(unit_byte_offsets(info.units, info.state_count)) {}

ShardReader::~ShardReader() {
  for (auto& entry : fds_) ::close(entry.second);
}

int ShardReader::open_verified(int rank) {
  auto found = fds_.find(rank);
  if (found != fds_.end()) return found->second;
  const std::string problem = check_shard_file(info_, rank);
  ZERO_CHECK(problem.empty(), "corrupt checkpoint: " << problem);
  const std::string path = join(info_.step_dir, info_.files[rank].name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZERO_CHECK(fd >= 0, "cannot open " << path << ": " << errno_text());
  fds_[rank] = fd;
  return fd;
}

void ShardReader::read(int array, size_t param, size_t first, size_t count, float* out) {
  const ParamPlacement& p = info_.params[param];
  const CheckpointInfo::SavedUnit& unit = info_.units[p.unit];
  ZERO_CHECK(first + count <= p.numel && array >= 0 && array <= info_.state_count,
             "checkpoint read out of range: " << p.name << " array " << array);
  // Element e of the unit lives in rank e / shard's file, at index e % shard of each array.
  size_t element = p.offset + first;
  while (count > 0) {
    const int rank = static_cast<int>(element / unit.shard);
    const size_t index = element % unit.shard;
    const size_t n = std::min(count, unit.shard - index);
    const uint64_t at = unit_offsets_[p.unit] + (array * unit.shard + index) * sizeof(float);
    const int fd = open_verified(rank);
    char* dest = reinterpret_cast<char*>(out);
    size_t bytes = n * sizeof(float);
    uint64_t offset = at;
    while (bytes > 0) {
      const ssize_t got = ::pread(fd, dest, bytes, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      ZERO_CHECK(got > 0, "cannot read " << join(info_.step_dir, info_.files[rank].name)
                                         << " at byte " << offset << ": "
                                         << (got == 0 ? "unexpected end of file" : errno_text()));
      dest += got;
      offset += static_cast<uint64_t>(got);
      bytes -= static_cast<size_t>(got);
    }
    out += n;
    element += n;
    count -= n;
  }
}

GridReader::GridReader(const std::vector<CheckpointInfo>& grid) : grid_(grid) {
  ZERO_CHECK(!grid.empty(), "no checkpoint to read");
  const CheckpointInfo& first = grid.front();
  ZERO_CHECK(static_cast<int>(grid.size()) == first.tensor_parallel_size,
             "checkpoint " << first.step_dir << " holds the slices of tensor-parallel rank "
                           << first.tensor_parallel_rank << " of " << first.tensor_parallel_size
                           << ": the whole model needs every rank's (read_checkpoint_grid)");
  for (const CheckpointInfo& info : grid) readers_.push_back(std::make_unique<ShardReader>(info));
}

void GridReader::read(int rank, int array, size_t param, size_t first, size_t count, float* out) {
  readers_.at(static_cast<size_t>(rank))->read(array, param, first, count, out);
}

std::vector<int64_t> GridReader::whole_shape(size_t param) const {
  const ParamPlacement& p = grid_.front().params[param];
  return full_shape(p.split, p.shape);
}

std::vector<float> GridReader::read_whole(int array, size_t param) {
  const ParamPlacement& p = grid_.front().params[param];
  std::vector<std::vector<float>> slices(p.split.is_split() ? grid_.size() : 1);
  std::vector<const float*> pointers;
  for (size_t r = 0; r < slices.size(); ++r) {
    slices[r].resize(p.numel);
    read(static_cast<int>(r), array, param, 0, p.numel, slices[r].data());
    pointers.push_back(slices[r].data());
  }
  if (!p.split.is_split()) return std::move(slices.front());
  return merge_slices(p.split, whole_shape(param), pointers);
}

}  // namespace checkpoint_files

// ---- Public entry points that work without MPI.

namespace {

bool exists(const std::string& path, struct stat* st) {
  return ::stat(path.c_str(), st) == 0;
}

// A step directory, a save directory holding `latest`, or a `latest` file -> the step directory.
std::string resolve_step_dir(const std::string& path) {
  using checkpoint_files::join;
  struct stat st;
  ZERO_CHECK(exists(path, &st), "no checkpoint at " << path << ": " << std::strerror(errno));
  std::string pointer;
  if (S_ISDIR(st.st_mode)) {
    std::string trimmed = path;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const std::string base = trimmed.substr(trimmed.find_last_of('/') + 1);
    if (exists(join(path, checkpoint_files::kManifestName), &st)) {
      ZERO_CHECK(base.rfind(checkpoint_files::kTmpPrefix, 0) != 0,
                 path << " is an unfinished save (a crash interrupted it); load the checkpoint "
                         "its save directory's 'latest' names");
      return path;
    }
    pointer = join(path, checkpoint_files::kLatestName);
    ZERO_CHECK(exists(pointer, &st),
               path << " holds no checkpoint: it has neither " << checkpoint_files::kManifestName
                    << " (a step directory) nor a '" << checkpoint_files::kLatestName
                    << "' file (a save directory)");
  } else {
    pointer = path;
  }
  std::string name = checkpoint_files::read_small_file(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  // A 'latest' holds one directory name: a longer file is something else, quoted by its start.
  constexpr size_t kQuoted = 40;
  const bool is_name = !name.empty() && name.size() <= NAME_MAX &&
                       name.find_first_of("/\n") == std::string::npos && name != "." &&
                       name != "..";
  ZERO_CHECK(is_name,
             pointer << " does not name a step directory (it holds "
                     << (name.size() > kQuoted ? std::to_string(name.size()) + " bytes starting '" +
                                                     name.substr(0, kQuoted) + "...'"
                                               : "'" + name + "'")
                     << ")");
  const size_t slash = pointer.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : pointer.substr(0, slash);
  const std::string step_dir = join(parent, name);
  ZERO_CHECK(exists(join(step_dir, checkpoint_files::kManifestName), &st),
             pointer << " names " << name << ", but "
                     << join(step_dir, checkpoint_files::kManifestName) << " does not exist");
  return step_dir;
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const std::string step_dir = resolve_step_dir(path);
  const std::string manifest = checkpoint_files::join(step_dir, checkpoint_files::kManifestName);
  CheckpointInfo info =
      checkpoint_files::parse_manifest(checkpoint_files::read_small_file(manifest), manifest);
  info.step_dir = step_dir;
  return info;
}

std::vector<std::string> verify_checkpoint_files(const CheckpointInfo& info) {
  std::vector<std::string> problems;
  for (int r = 0; r < static_cast<int>(info.files.size()); ++r) {
    std::string problem = checkpoint_files::check_shard_file(info, r);
    if (!problem.empty()) problems.push_back(std::move(problem));
  }
  return problems;
}

std::vector<std::vector<float>> read_full_master(const std::vector<CheckpointInfo>& grid) {
  checkpoint_files::GridReader reader(grid);
  std::vector<std::vector<float>> out;
  for (size_t p = 0; p < grid.front().params.size(); ++p) out.push_back(reader.read_whole(0, p));
  return out;
}

}  // namespace zero
