// zerorun: starts a ZeRO job through mpirun. It adds the flags this runtime needs on every host
// (root, more ranks than cores, the hosts of a hostfile, forwarded variables) and then becomes
// mpirun, so the job's exit code is zerorun's. Exit code 2: zerorun itself could not start the
// job (bad flags, a bad hostfile, no mpirun, no program).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/launcher/launch_command.h"

int main(int argc, char** argv) {
  using namespace zero::launcher;
  const std::vector<std::string> args(argv + 1, argv + argc);

  LaunchRequest request;
  try {
    request = parse_arguments(args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "zerorun: %s\n%s", e.what(), usage_text());
    return 2;
  }
  if (request.help) {
    std::fputs(usage_text(), stdout);
    return 0;
  }

  std::vector<std::string> command;
  try {
    const std::vector<HostSlots> hosts =
        request.hostfile.empty() ? std::vector<HostSlots>{} : read_hostfile(request.hostfile);
    const std::string mpirun = resolve_mpirun();
    check_program(request.program[0]);
    command = build_mpirun_command(mpirun, request, current_host(), hosts);
  } catch (const std::runtime_error& e) {  // HostfileError or zero::Error
    std::fprintf(stderr, "zerorun: %s\n", e.what());
    return 2;
  }

  if (request.dry_run) {
    std::printf("%s\n", shell_join(command).c_str());
    return 0;
  }
  std::vector<char*> exec_argv;
  for (std::string& word : command) exec_argv.push_back(word.data());
  exec_argv.push_back(nullptr);
  execv(exec_argv[0], exec_argv.data());
  // execv returns only on failure.
  std::fprintf(stderr, "zerorun: cannot run %s: %s\n", exec_argv[0], std::strerror(errno));
  return 2;
}
