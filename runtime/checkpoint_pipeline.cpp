// The layout of a pipelined run's checkpoint (checkpoint_info.h): each stage's own checkpoint in
// DIR/pp_stage_SS and DIR/pipeline, which records the number of stages.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>

#include "checkpoint_format.h"
#include "zero/core/check.h"
#include "zero/core/write_fully.h"
#include "zero/runtime/checkpoint_info.h"

namespace zero {

namespace {

constexpr const char* kPipelineRecordName = "pipeline";

}  // namespace

std::string pipeline_stage_dir(const std::string& dir, int stage) {
  char name[32];
  std::snprintf(name, sizeof(name), "pp_stage_%02d", stage);
  return checkpoint_files::join(dir, name);
}

void write_pipeline_record(const std::string& dir, int stages) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ZERO_CHECK(!ec, "cannot create checkpoint directory " << dir << ": " << ec.message());
  const std::string path = checkpoint_files::join(dir, kPipelineRecordName);
  const std::string tmp = path + ".tmp";
  const std::string text = "stages " + std::to_string(stages) + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0, "cannot create " << tmp << ": " << std::strerror(errno));
  try {
    write_fully(fd, text.data(), text.size(), tmp);
    ZERO_CHECK(::fsync(fd) == 0, "fsync of " << tmp << " failed: " << std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ZERO_CHECK(::close(fd) == 0, "cannot close " << tmp << ": " << std::strerror(errno));
  ZERO_CHECK(::rename(tmp.c_str(), path.c_str()) == 0,
             "cannot rename " << tmp << " to " << path << ": " << std::strerror(errno));
  checkpoint_files::fsync_path(dir);
}

int read_pipeline_record(const std::string& dir) {
  const std::string path = checkpoint_files::join(dir, kPipelineRecordName);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return 0;
  std::istringstream text(checkpoint_files::read_small_file(path));
  std::string key;
  long stages = 0;
  text >> key >> stages;
  ZERO_CHECK(key == "stages" && stages >= 1 && stages <= 9999,
             path << " is not a pipeline record (\"stages N\")");
  for (int s = 0; s < stages; ++s) {
    ZERO_CHECK(std::filesystem::is_directory(pipeline_stage_dir(dir, s), ec),
               path << " records " << stages << " pipeline stages, and "
                    << pipeline_stage_dir(dir, s) << " is missing");
  }
  return static_cast<int>(stages);
}

std::vector<std::string> saved_stage_dirs(const std::string& dir) {
  const int stages = read_pipeline_record(dir);
  if (stages == 0) return {dir};
  std::vector<std::string> dirs;
  for (int s = 0; s < stages; ++s) dirs.push_back(pipeline_stage_dir(dir, s));
  return dirs;
}

std::vector<std::string> saved_parameter_names(const std::vector<std::string>& stage_dirs) {
  std::set<std::string> names;
  for (const std::string& stage_dir : stage_dirs) {
    const std::vector<CheckpointInfo> grid = read_checkpoint_grid(stage_dir);
    for (const ParamPlacement& p : grid.front().params) names.insert(p.name);
  }
  return {names.begin(), names.end()};
}

}  // namespace zero
