#include "zero/runtime/monitor.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>
#include <utility>

#include "zero/core/check.h"
#include "zero/core/write_fully.h"
#include "zero/proto/tensorboard_event.pb.h"
#include "zero/runtime/checkpoint_info.h"

namespace zero {

namespace {

// TensorFlow's kMaskDelta: a CRC stored next to the data it covers is masked, so that the CRC
// of a string holding CRCs is not degenerate.
constexpr uint32_t kMaskDelta = 0xa282ead8u;

double seconds_since_epoch() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void make_directory(const std::string& dir, const char* what) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  ZERO_CHECK(!error, "cannot create " << what << " directory '" << dir << "': " << error.message());
  ZERO_CHECK(::access(dir.c_str(), W_OK) == 0, "cannot write into "
                                                   << what << " directory '" << dir
                                                   << "': " << std::strerror(errno));
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t read_u32_le(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

void append_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Appends to `path` (created when missing) and closes it, every step checked.
void append_to_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0,
             "cannot open CSV file '" << path << "' for appending: " << std::strerror(errno));
  try {
    write_fully(fd, text.data(), text.size(), "CSV file '" + path + "'");
  } catch (...) {
    ::close(fd);
    throw;
  }
  ZERO_CHECK(::close(fd) == 0, "cannot write CSV file '" << path << "': " << std::strerror(errno));
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

// ---- TensorBoard

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  make_directory(log_dir, "tensorboard");
  const double now = seconds_since_epoch();
  char name[512];
  std::snprintf(name, sizeof(name), "events.out.tfevents.%010lld.%s.%d.0",
                static_cast<long long>(now), host_name().c_str(), static_cast<int>(::getpid()));
  path_ = (std::filesystem::path(log_dir) / name).string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd_ >= 0, "cannot open TensorBoard event file '"
                           << path_ << "' for writing: " << std::strerror(errno));
  tensorboard::Event version;
  version.set_wall_time(now);
  version.set_file_version("brain.Event:2");
  write_record(version.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write_scalar(const std::string& tag, double value, int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(seconds_since_epoch());
  event.set_step(step);
  tensorboard::Summary::Value* scalar = event.mutable_summary()->add_value();
  scalar->set_tag(tag);
  scalar->set_simple_value(static_cast<float>(value));
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_le(&record, data.size(), 8);
  append_le(&record, masked_crc32c(record.data(), 8), 4);
  record += data;
  append_le(&record, masked_crc32c(data.data(), data.size()), 4);
  write_fully(fd_, record.data(), record.size(), "TensorBoard event file '" + path_ + "'");
}

std::vector<std::string> read_tfrecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ZERO_CHECK(in, "cannot open TFRecord file '" << path << "': " << std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ZERO_CHECK(!in.bad(), "cannot read TFRecord file '" << path << "'");
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  std::vector<std::string> records;
  size_t at = 0;
  while (at < text.size()) {
    const std::string where = "TFRecord file '" + path + "', record " +
                              std::to_string(records.size()) + " at byte " + std::to_string(at);
    ZERO_CHECK(text.size() - at >= 12, where << ": the file ends inside the record's header");
    const uint64_t length = read_u64_le(bytes + at);
    ZERO_CHECK(read_u32_le(bytes + at + 8) == masked_crc32c(bytes + at, 8),
               where << ": the length's CRC does not match");
    ZERO_CHECK(length <= text.size() - at - 12 && text.size() - at - 12 - length >= 4,
               where << ": the file ends inside the record's " << length << " bytes");
    const unsigned char* data = bytes + at + 12;
    ZERO_CHECK(read_u32_le(data + length) == masked_crc32c(data, length),
               where << ": the data's CRC does not match");
    records.emplace_back(reinterpret_cast<const char*>(data), length);
    at += 12 + length + 4;
  }
  return records;
}

// ---- CSV

std::string python_float_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // The shortest round-trip digits and their exponent, then Python's layout of them.
  char buffer[64];
  const std::to_chars_result result =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  const std::string scientific(buffer, result.ptr);
  const size_t e = scientific.find('e');
  const bool negative = scientific[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (scientific[i] != '.') digits += scientific[i];
  }
  const int exponent = std::stoi(scientific.substr(e + 1));
  const int point = exponent + 1;  // digits before the decimal point
  const int count = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (point <= -4 || point > 16) {
    out += digits.substr(0, 1);
    if (count > 1) out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof(tail), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + tail;
  }
  if (point <= 0) return out + "0." + std::string(static_cast<size_t>(-point), '0') + digits;
  if (point >= count)
    return out + digits + std::string(static_cast<size_t>(point - count), '0') + ".0";
  return out + digits.substr(0, static_cast<size_t>(point)) + "." +
         digits.substr(static_cast<size_t>(point));
}

CsvMonitorWriter::CsvMonitorWriter(const std::string& log_dir) : log_dir_(log_dir) {
  make_directory(log_dir, "csv_monitor");
}

void CsvMonitorWriter::write(const MonitorEvent& event) {
  // As csvMonitor: the header is the name's last '/' part, the file the name with '/' and ' '
  // made '_'.
  const size_t slash = event.name.rfind('/');
  const std::string header = slash == std::string::npos ? event.name : event.name.substr(slash + 1);
  std::string file = event.name;
  for (char& c : file) {
    if (c == '/' || c == ' ') c = '_';
  }
  std::string text;
  if (std::find(started_.begin(), started_.end(), file) == started_.end()) {
    started_.push_back(file);
    text = "step," + header + "\r\n";
  }
  // Python's csv.writer ends rows with "\r\n".
  text += std::to_string(event.step) + "," + python_float_text(event.value) + "\r\n";
  append_to_file((std::filesystem::path(log_dir_) / (file + ".csv")).string(), text);
}

// ---- Both

Monitors::Monitors(const MonitorConfig& tensorboard, const MonitorConfig& csv_monitor) {
  if (tensorboard.enabled) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard.log_dir());
  }
  if (csv_monitor.enabled) csv_ = std::make_unique<CsvMonitorWriter>(csv_monitor.log_dir());
}

void Monitors::write_events(const std::vector<MonitorEvent>& events) {
  for (const MonitorEvent& event : events) {
    if (tensorboard_) tensorboard_->write_scalar(event.name, event.value, event.step);
    if (csv_) csv_->write(event);
  }
}

std::string Monitors::tensorboard_file() const {
  return tensorboard_ ? tensorboard_->path() : "";
}

}  // namespace zero
