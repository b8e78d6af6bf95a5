// Runs one of the project's executables as a child process and captures its exit code, standard
// output and standard error, for the tests that check a tool end to end.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace zero::testing {

// Throws std::system_error naming `what` and the current errno.
[[noreturn]] inline void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

struct ProgramOutcome {
  int exit_code = -1;  // the program's exit status, or 128 + the signal that ended it
  std::string out;
  std::string err;
};

namespace run_program_detail {

// A temporary file that receives one output stream of the child. Files, not pipes, so a chatty
// child can never block on a full pipe while the parent waits for it.
class CaptureFile {
 public:
  CaptureFile() {
    char name[] = "/tmp/zero_run_program_XXXXXX";
    // Close-on-exec: the child keeps only the copy dup2 gives it as stdout or stderr.
    fd_ = mkostemp(name, O_CLOEXEC);
    if (fd_ < 0) throw_errno("run_program: mkostemp");
    path_ = name;
  }
  ~CaptureFile() {
    close(fd_);
    unlink(path_.c_str());
  }
  CaptureFile(const CaptureFile&) = delete;
  CaptureFile& operator=(const CaptureFile&) = delete;

  int fd() const { return fd_; }

  // Everything the child wrote, read from the start: the child moved the shared file offset.
  std::string contents() const {
    std::string text;
    char buffer[4096];
    while (true) {
      const ssize_t count = pread(fd_, buffer, sizeof buffer, static_cast<off_t>(text.size()));
      if (count < 0 && errno == EINTR) continue;
      if (count < 0) throw_errno("run_program: reading " + path_);
      if (count == 0) return text;
      text.append(buffer, static_cast<size_t>(count));
    }
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// Writes a failure of the forked child to its stderr with write(2): stdio would also flush the
// buffers it copied from the parent.
inline void child_report(const char* prefix, const char* subject) {
  const char* const reason = std::strerror(errno);
  for (const char* part : {prefix, subject, ": ", reason, "\n"}) {
    if (write(STDERR_FILENO, part, std::strlen(part)) < 0) return;
  }
}

inline std::vector<char*> null_terminated(const std::vector<std::string>& words) {
  std::vector<char*> pointers;
  for (const std::string& word : words) pointers.push_back(const_cast<char*>(word.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace run_program_detail

// Runs `program` (a path, not searched on PATH) with `args` and waits for it. The child inherits
// this process's environment unless `environment` ("NAME=value" entries) replaces all of it.
// A child that cannot start exits 126 (redirecting its output failed) or 127 (exec failed) with
// the reason on its stderr; failures in this process throw std::system_error.
inline ProgramOutcome run_program(const std::string& program, const std::vector<std::string>& args,
                                  const std::optional<std::vector<std::string>>& environment = {}) {
  using run_program_detail::CaptureFile;
  const CaptureFile out;
  const CaptureFile err;
  // Built before fork, so the child only redirects and execs.
  std::vector<std::string> words = {program};
  words.insert(words.end(), args.begin(), args.end());
  const std::vector<char*> argv = run_program_detail::null_terminated(words);
  const std::vector<char*> envp =
      environment ? run_program_detail::null_terminated(*environment) : std::vector<char*>{};

  const pid_t child = fork();
  if (child < 0) throw_errno("run_program: fork");
  if (child == 0) {
    if (dup2(out.fd(), STDOUT_FILENO) < 0 || dup2(err.fd(), STDERR_FILENO) < 0) {
      run_program_detail::child_report("run_program: dup2 for ", program.c_str());
      _exit(126);
    }
    if (environment) {
      execve(program.c_str(), argv.data(), envp.data());
    } else {
      execv(program.c_str(), argv.data());
    }
    run_program_detail::child_report("run_program: cannot exec ", program.c_str());
    _exit(127);
  }

  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) throw_errno("run_program: waitpid for " + program);
  }
  ProgramOutcome outcome;
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.out = out.contents();
  outcome.err = err.contents();
  return outcome;
}

}  // namespace zero::testing
