// JSON output of the drivers, through nlohmann-json: zero-train's metrics (JSON lines, one record
// a line, flushed as written) and the benchmarks' --json files (one array, a record a line).
// Keys keep the order they are set in. JSON has no NaN or infinity: json_number makes a
// non-finite value (the norm of an overflowing step) null.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zero::driver {

using JsonRecord = nlohmann::ordered_json;

// `v`, or null when it is NaN or infinite.
JsonRecord json_number(double v);

// `v` rounded to `decimals` places after the point (what a %.Nf figure in a report shows).
double rounded(double v, int decimals);

class MetricsWriter {
 public:
  enum class Mode { kTruncate, kAppend };

  // Not open: write() does nothing.
  MetricsWriter() = default;
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  // Throws zero::Error "cannot open metrics file 'PATH' for writing: REASON".
  void open(const std::string& path, Mode mode);
  bool is_open() const { return fd_ >= 0; }
  // One record as one line, written through at once (a killed run keeps every record it wrote).
  // A write that fails (a full disk) throws zero::Error "cannot write metrics file 'PATH':
  // REASON", and the file is cut back to its last whole record.
  void write(const JsonRecord& record);

 private:
  std::string path_;
  int fd_ = -1;
};

// Writes `records` to `path` as one JSON array, a record a line; false when the file cannot be
// written.
bool write_json_array(const std::string& path, const std::vector<JsonRecord>& records);

}  // namespace zero::driver
