#include "checkpoint_reports.h"

#include <algorithm>

#include "zero/core/check.h"

namespace zero::checkpoint_reports {

std::vector<RankReport> exchange(Communicator& comm, const RankReport& mine) {
  std::vector<RankReport> all(comm.world_size());
  comm.all_gather_bytes_sync(&mine, all.data(), sizeof(RankReport));
  return all;
}

bool any_failed(const std::vector<RankReport>& reports) {
  return std::any_of(reports.begin(), reports.end(), [](const RankReport& r) { return r.failed; });
}

[[noreturn]] void throw_failure(const std::string& what, const std::vector<RankReport>& reports) {
  // Every rank read the same manifest and config: a mismatch is the same message everywhere,
  // and a ConfigError (exit code 2 in zero-train) rather than a failure.
  const bool config_only = std::all_of(reports.begin(), reports.end(), [](const RankReport& r) {
    return r.failed == 0 || r.failed == kConfigMismatch;
  });
  if (config_only) {
    for (const RankReport& r : reports) {
      if (r.failed) throw ConfigError(r.message);
    }
  }
  std::string text = what + " failed";
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].failed) text += "; on rank " + std::to_string(r) + ": " + reports[r].message;
  }
  throw Error(text);
}

void agree(Communicator& comm, const std::string& what, const RankReport& mine) {
  const std::vector<RankReport> reports = exchange(comm, mine);
  if (any_failed(reports)) throw_failure(what, reports);
}

}  // namespace zero::checkpoint_reports
