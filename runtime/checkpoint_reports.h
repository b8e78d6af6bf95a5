// How the ranks of a collective checkpoint save or load (checkpoint_save.cpp,
// checkpoint_load.cpp) agree on each phase. Every rank does its own file I/O; after each phase
// the ranks exchange one fixed-size report each (an all-gather), so a failure anywhere becomes
// the same zero::Error everywhere and no rank is left waiting in a collective the others
// skipped. Private to runtime/.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/runtime/config.h"

namespace zero::checkpoint_reports {

// One rank's outcome of a phase. 512 bytes, all-gathered as raw bytes.
struct RankReport {
  uint64_t failed = 0;  // 0 ok, kFailed, or kConfigMismatch (a ConfigError: the user's to fix)
  uint64_t size = 0;    // save: bytes of the rank's shard file
  uint64_t crc32c = 0;  // save: its checksum
  char message[488] = {};
};
static_assert(sizeof(RankReport) == 512, "reports travel as 256 two-byte elements");
constexpr uint64_t kFailed = 1;
constexpr uint64_t kConfigMismatch = 2;

// Runs `work` and reports how it ended: a ConfigError as kConfigMismatch, any other exception
// as kFailed, each with its message.
template <typename Work>
RankReport attempt(Work work) {
  RankReport report;
  try {
    work();
  } catch (const ConfigError& e) {
    report.failed = kConfigMismatch;
    std::snprintf(report.message, sizeof(report.message), "%s", e.what());
  } catch (const std::exception& e) {
    report.failed = kFailed;
    std::snprintf(report.message, sizeof(report.message), "%s", e.what());
  }
  return report;
}

// Collective over `comm`: every rank's report, by rank.
std::vector<RankReport> exchange(Communicator& comm, const RankReport& mine);

bool any_failed(const std::vector<RankReport>& reports);

// Throws what the failed reports say: a ConfigError when every failure is a config mismatch,
// else zero::Error "`what` failed; on rank R: MESSAGE" for each rank that failed.
[[noreturn]] void throw_failure(const std::string& what, const std::vector<RankReport>& reports);

// Collective over `comm`: exchanges the reports and throws (throw_failure) on every rank when
// any failed.
void agree(Communicator& comm, const std::string& what, const RankReport& mine);

}  // namespace zero::checkpoint_reports
