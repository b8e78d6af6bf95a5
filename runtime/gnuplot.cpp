#include "zero/runtime/gnuplot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "zero/core/check.h"

extern char** environ;

namespace zero {

bool gnuplot_on_path() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((dir + "/gnuplot").c_str(), X_OK) == 0) return true;
  }
  return false;
}

void run_gnuplot(const std::string& script) {
  std::string program = "gnuplot";
  std::vector<char*> argv = {program.data(), const_cast<char*>(script.c_str()), nullptr};
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv.data(), environ);
  ZERO_CHECK(spawned == 0, "cannot run gnuplot for '" << script << "': " << std::strerror(spawned));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    ZERO_CHECK(errno == EINTR, "waiting for gnuplot: " << std::strerror(errno));
  }
  ZERO_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
             "gnuplot failed on '" << script << "' (status " << status << ")");
}

}  // namespace zero
