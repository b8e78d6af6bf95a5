#include "driver/metrics_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "zero/core/check.h"

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
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      if (done > 0 && start >= 0 && ::ftruncate(fd_, start) != 0) {
        ZERO_FAIL("cannot write metrics file '"
                  << path_ << "': " << std::strerror(error)
                  << "; its last record is cut short (cutting it off failed too: "
                  << std::strerror(errno) << ")");
      }
      ZERO_FAIL("cannot write metrics file '" << path_ << "': " << std::strerror(error));
    }
    done += static_cast<size_t>(n);
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
