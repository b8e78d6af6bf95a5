#include "driver/metrics_writer.h"

#include <cmath>

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

void MetricsWriter::open(const std::string& path, Mode mode) {
  out_.open(path, mode == Mode::kAppend ? std::ios::app : std::ios::trunc);
  ZERO_CHECK(out_.good(), "cannot open metrics file '" << path << "' for writing");
}

void MetricsWriter::write(const JsonRecord& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << "\n";
  out_.flush();
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
