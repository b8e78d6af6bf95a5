#include "driver/metrics_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "zero/core/check.h"
#include "zero/core/write_fully.h"

namespace zero::driver {

JsonRecord json_number(double v) {
  if (!std::isfinite(v)) return nullptr;
  return v;
}

double rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

MetricsWriter::~MetricsWriter() {
  // Every record was written through: a close has nothing left to lose.
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::open(const std::string& path, Mode mode) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == Mode::kAppend ? O_APPEND : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, 0644);
  ZERO_CHECK(fd >= 0,
             "cannot open metrics file '" << path << "' for writing: " << std::strerror(errno));
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  path_ = path;
}

void MetricsWriter::write(const JsonRecord& record) {
  if (fd_ < 0) return;
  const std::string line = record.dump() + "\n";
  // Where the record starts, to cut a partly written one off (a device such as /dev/full has
  // no end to seek to, and nothing to cut).
  const off_t start = ::lseek(fd_, 0, SEEK_END);
  try {
    write_fully(fd_, line.data(), line.size(), "metrics file '" + path_ + "'");
  } catch (const Error& e) {
    // The offset stands past what was written of the record.
    const off_t end = ::lseek(fd_, 0, SEEK_CUR);
    if (start >= 0 && end > start && ::ftruncate(fd_, start) != 0) {
      ZERO_FAIL(e.what() << "; its last record is cut short (cutting it off failed too: "
                         << std::strerror(errno) << ")");
    }
    throw;
  }
}

bool write_json_array(const std::string& path, const std::vector<JsonRecord>& records) {
  std::ofstream out(path, std::ios::trunc);
  if (!out.good()) return false;
  out << "[\n";
  for (size_t i = 0; i < records.size(); ++i) {
    out << "  " << records[i].dump() << (i + 1 < records.size() ? "," : "") << "\n";
  }
  out << "]\n";
  out.close();
  return !out.fail();
}

}  // namespace zero::driver
