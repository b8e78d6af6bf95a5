#include "models/token_data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "zero/core/check.h"

namespace zero::models {

// Tokens are used in place from the mapping, so the file's little-endian uint16 must be the
// host's uint16.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are read in place");

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// A file descriptor closed on every path out of the function that opened it.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, so that a failing close (a write that did not reach the disk) is reported.
  int close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

void read_exactly(int fd, const std::string& file, void* out, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n =
        ::pread(fd, static_cast<char*>(out) + done, bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n >= 0, "cannot read " << file << ": " << errno_text());
    ZERO_CHECK(n > 0, file << " ended while its header was read");
    done += static_cast<size_t>(n);
  }
}

void write_all(int fd, const std::string& file, const void* data, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd, static_cast<const char*>(data) + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    ZERO_CHECK(n >= 0, "cannot write " << file << ": " << errno_text());
    done += static_cast<size_t>(n);
  }
}

int32_t little_endian_int32(const unsigned char* bytes) {
  const uint32_t value = static_cast<uint32_t>(bytes[0]) | static_cast<uint32_t>(bytes[1]) << 8 |
                         static_cast<uint32_t>(bytes[2]) << 16 |
                         static_cast<uint32_t>(bytes[3]) << 24;
  return static_cast<int32_t>(value);
}

void put_little_endian_int32(int32_t value, unsigned char* bytes) {
  const uint32_t v = static_cast<uint32_t>(value);
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<unsigned char>(v >> (8 * i));
}

std::vector<std::string> glob_sorted(const std::string& pattern) {
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> files;
  if (rc == 0) files.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  ::globfree(&matches);
  ZERO_CHECK(rc != GLOB_NOMATCH, "token data: '" << pattern << "' matches no file");
  ZERO_CHECK(rc == 0, "token data: cannot expand '" << pattern << "' (glob error " << rc << ")");
  // glob(3) sorts by the locale's collation; byte order is the same everywhere.
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<std::string> expand_token_files(const std::string& spec) {
  std::vector<std::string> files;
  size_t begin = 0;
  while (true) {
    const size_t comma = spec.find(',', begin);
    const std::string item = spec.substr(begin, comma - begin);
    ZERO_CHECK(!item.empty(), "token data: empty item in the file list '" << spec << "'");
    for (std::string& file : glob_sorted(item)) files.push_back(std::move(file));
    if (comma == std::string::npos) return files;
    begin = comma + 1;
  }
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  ZERO_CHECK(!tokens.empty(), "cannot write " << path << ": a token file needs at least one token");
  ZERO_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX),
             "cannot write " << path << ": " << tokens.size()
                             << " tokens do not fit the header's int32 count");
  unsigned char header[kTokenFileHeaderBytes] = {};
  put_little_endian_int32(kTokenFileMagic, header);
  put_little_endian_int32(kTokenFileVersion, header + 4);
  put_little_endian_int32(static_cast<int32_t>(tokens.size()), header + 8);

  // The process id keeps two writers of the same path from sharing a temporary file.
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  Fd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  ZERO_CHECK(fd.get() >= 0, "cannot create " << temp << ": " << errno_text());
  try {
    write_all(fd.get(), temp, header, sizeof header);
    write_all(fd.get(), temp, tokens.data(), tokens.size() * sizeof(uint16_t));
    ZERO_CHECK(::fsync(fd.get()) == 0, "cannot sync " << temp << ": " << errno_text());
    ZERO_CHECK(fd.close() == 0, "cannot close " << temp << ": " << errno_text());
    ZERO_CHECK(::rename(temp.c_str(), path.c_str()) == 0,
               "cannot rename " << temp << " to " << path << ": " << errno_text());
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
}

TokenData::TokenData(const std::string& spec) : spec_(spec) {
  try {
    for (const std::string& file : expand_token_files(spec)) {
      // Without blocking: a named pipe would block open() until a writer came; it is then
      // refused as not a regular file.
      Fd fd(::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
      ZERO_CHECK(fd.get() >= 0, "cannot open " << file << ": " << errno_text());
      struct stat st {};
      ZERO_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat " << file << ": " << errno_text());
      ZERO_CHECK(S_ISREG(st.st_mode), file << " is not a regular file");
      const size_t bytes = static_cast<size_t>(st.st_size);
      ZERO_CHECK(bytes >= kTokenFileHeaderBytes,
                 file << " is " << bytes << " bytes, shorter than the " << kTokenFileHeaderBytes
                      << "-byte header of an llm.c token file");
      unsigned char header[kTokenFileHeaderBytes];
      read_exactly(fd.get(), file, header, sizeof header);
      const int32_t magic = little_endian_int32(header);
      const int32_t version = little_endian_int32(header + 4);
      const int32_t count = little_endian_int32(header + 8);
      ZERO_CHECK(magic == kTokenFileMagic, file << " is not an llm.c token file (magic " << magic
                                                << ", expected " << kTokenFileMagic << ")");
      ZERO_CHECK(version == kTokenFileVersion, file << " has token-file version " << version
                                                    << "; only version " << kTokenFileVersion
                                                    << " (uint16 tokens) is supported");
      ZERO_CHECK(count > 0, file << " holds no tokens (its header's count is " << count << ")");
      const size_t expected = kTokenFileHeaderBytes + 2 * static_cast<size_t>(count);
      ZERO_CHECK(bytes >= expected, file << " is truncated: its header says " << count
                                         << " tokens (" << expected << " bytes) but it has "
                                         << bytes << " bytes");
      ZERO_CHECK(bytes == expected, file << " has " << bytes - expected
                                         << " trailing bytes after its " << count << " tokens");

      // Added before mapping, so that unmap_all() releases the mapping whatever fails next.
      Shard& shard = shards_.emplace_back();
      shard.file = file;
      void* mapping = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
      ZERO_CHECK(mapping != MAP_FAILED, "cannot map " << file << ": " << errno_text());
      shard.mapping = mapping;
      shard.mapping_bytes = bytes;
      shard.tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(mapping) +
                                                       kTokenFileHeaderBytes);
      shard.count = static_cast<size_t>(count);
      shard.start = size_;
      size_ += shard.count;
      ZERO_CHECK(fd.close() == 0, "cannot close " << file << ": " << errno_text());
    }
  } catch (...) {
    unmap_all();
    throw;
  }
}

TokenData::~TokenData() {
  unmap_all();
}

TokenData::TokenData(TokenData&& other) noexcept
    : spec_(std::move(other.spec_)),
      shards_(std::exchange(other.shards_, {})),
      size_(std::exchange(other.size_, 0)),
      max_token_(std::exchange(other.max_token_, std::nullopt)) {}

TokenData& TokenData::operator=(TokenData&& other) noexcept {
  if (this != &other) {
    unmap_all();
    spec_ = std::move(other.spec_);
    shards_ = std::exchange(other.shards_, {});
    size_ = std::exchange(other.size_, 0);
    max_token_ = std::exchange(other.max_token_, std::nullopt);
  }
  return *this;
}

void TokenData::unmap_all() noexcept {
  // munmap fails only for an invalid range, which these mappings never are.
  for (const Shard& shard : shards_) {
    if (shard.mapping != nullptr) ::munmap(shard.mapping, shard.mapping_bytes);
  }
  shards_.clear();
  size_ = 0;
}

std::vector<std::string> TokenData::files() const {
  std::vector<std::string> names;
  for (const Shard& shard : shards_) names.push_back(shard.file);
  return names;
}

size_t TokenData::shard_of(size_t position) const {
  const auto after = std::upper_bound(shards_.begin(), shards_.end(), position,
                                      [](size_t p, const Shard& shard) { return p < shard.start; });
  return static_cast<size_t>(after - shards_.begin()) - 1;
}

uint16_t TokenData::token(size_t position) const {
  ZERO_CHECK(position < size_, "token " << position << " is past the end of " << spec_ << " ("
                                        << size_ << " tokens)");
  const Shard& shard = shards_[shard_of(position)];
  return shard.tokens[position - shard.start];
}

void TokenData::read_tokens(size_t start, size_t count, uint16_t* out) const {
  ZERO_CHECK(start <= size_ && count <= size_ - start,
             "tokens [" << start << ", " << start + count << ") are past the end of " << spec_
                        << " (" << size_ << " tokens)");
  size_t s = count == 0 ? 0 : shard_of(start);
  while (count > 0) {
    const Shard& shard = shards_[s++];
    const size_t offset = start - shard.start;
    const size_t n = std::min(count, shard.count - offset);
    std::memcpy(out, shard.tokens + offset, n * sizeof(uint16_t));
    out += n;
    start += n;
    count -= n;
  }
}

uint16_t TokenData::max_token() const {
  if (!max_token_) {
    uint16_t largest = 0;
    for (const Shard& shard : shards_) {
      largest = std::max(largest, *std::max_element(shard.tokens, shard.tokens + shard.count));
    }
    max_token_ = largest;
  }
  return *max_token_;
}

std::optional<TokenLocation> TokenData::first_token_at_least(int limit) const {
  for (const Shard& shard : shards_) {
    const uint16_t* end = shard.tokens + shard.count;
    const uint16_t* bad =
        std::find_if(shard.tokens, end, [limit](uint16_t t) { return int{t} >= limit; });
    if (bad != end) {
      return TokenLocation{shard.file, static_cast<size_t>(bad - shard.tokens), *bad};
    }
  }
  return std::nullopt;
}

long TokenData::batches_per_pass(int B, int T) const {
  ZERO_CHECK(B >= 1 && T >= 1,
             "a batch needs B >= 1 sequences of T >= 1 tokens, got B = " << B << ", T = " << T);
  const size_t per_batch = static_cast<size_t>(B) * static_cast<size_t>(T);
  ZERO_CHECK(size_ >= per_batch + 1, spec_ << " holds " << size_ << " tokens; a batch of " << B
                                           << " x " << T << " needs at least " << per_batch + 1);
  return static_cast<long>((size_ - 1) / per_batch);
}

size_t TokenData::batch_start(long step, int B, int T) const {
  ZERO_CHECK(step >= 0, "batch step must be at least 0, got " << step);
  const long batches = batches_per_pass(B, T);
  return static_cast<size_t>(step % batches) * static_cast<size_t>(B) * static_cast<size_t>(T);
}

void TokenData::read_sequences(long step, int B, int T, int first_sequence, int count,
                               float* inputs, int32_t* targets) const {
  const size_t p = batch_start(step, B, T);
  ZERO_CHECK(first_sequence >= 0 && count >= 0 && first_sequence <= B - count,
             "sequences [" << first_sequence << ", " << first_sequence + count
                           << ") are not within a batch of " << B);
  const size_t t = static_cast<size_t>(T);
  std::vector<uint16_t> sequence(t + 1);
  for (int i = 0; i < count; ++i) {
    read_tokens(p + static_cast<size_t>(first_sequence + i) * t, t + 1, sequence.data());
    for (size_t j = 0; j < t; ++j) {
      inputs[static_cast<size_t>(i) * t + j] = static_cast<float>(sequence[j]);
      targets[static_cast<size_t>(i) * t + j] = static_cast<int32_t>(sequence[j + 1]);
    }
  }
}

}  // namespace zero::models
