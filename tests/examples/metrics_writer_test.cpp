// zero-train's metrics file on a disk that fills: the failed write is an error naming the file,
// and the file keeps only whole records.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>

#include "driver/metrics_writer.h"
#include "tests/whole_file.h"
#include "zero/core/check.h"

namespace zero::driver {
namespace {

// A file-size limit stands in for a full file system: past it write() writes what fits, then
// fails (EFBIG; SIGXFSZ ignored), as it does with ENOSPC.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    EXPECT_EQ(getrlimit(RLIMIT_FSIZE, &saved_), 0);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
};

TEST(MetricsWriter, AFullDiskIsAnErrorAndTheFileKeepsWholeRecords) {
  const std::string path = testing::TempDir() + "metrics_full_" + std::to_string(getpid());
  const JsonRecord record{{"event", "step"}, {"text", std::string(40, 'x')}};
  const std::string line = record.dump() + "\n";
  {
    MetricsWriter metrics;
    metrics.open(path, MetricsWriter::Mode::kTruncate);
    const FileSizeLimit limit(line.size() + line.size() / 2);
    metrics.write(record);
    try {
      metrics.write(record);
      FAIL() << "the second record does not fit, and no error was raised";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot write metrics file '" + path + "': "),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(read_whole_file(path), line) << "the half-written record is cut off";
  unlink(path.c_str());
}

TEST(MetricsWriter, ADeviceThatIsFullIsAnError) {
  MetricsWriter metrics;
  metrics.open("/dev/full", MetricsWriter::Mode::kTruncate);
  try {
    metrics.write(JsonRecord{{"event", "init"}});
    FAIL() << "writing to /dev/full raised no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "cannot write metrics file '/dev/full': No space left on device"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zero::driver
