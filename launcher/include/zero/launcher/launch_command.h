// zerorun's logic, kept apart from main() so tests can drive it without starting processes:
// parse the command line, look at the host, and build the mpirun command line.
//
//   zerorun -np N [--dry-run] [--] program [args...]
//
// becomes
//
//   mpirun -np N [--allow-run-as-root] [--oversubscribe --bind-to none
//          --mca mpi_yield_when_idle 1] [-x ZERO_NAME ...] program [args...]
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace zero::launcher {

// A command line zerorun cannot understand; main() prints the message and the usage, exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The usage text printed with a UsageError and for -h/--help.
const char* usage_text();

// What the user asked for.
struct LaunchRequest {
  int ranks = 0;
  bool dry_run = false;
  bool help = false;                 // -h/--help: print the usage and exit 0
  std::vector<std::string> program;  // the program and its arguments
};

// Parses zerorun's arguments (argv[1..]). Options come first; the first word that is not an
// option, or everything after "--", is the program and its arguments. Throws UsageError.
LaunchRequest parse_arguments(const std::vector<std::string>& args);

// What the command depends on besides the request, gathered once so building is pure.
struct HostFacts {
  bool is_root = false;                  // OpenMPI refuses root unless told
  unsigned cores = 1;                    // cores this process may run on
  std::vector<std::string> environment;  // "NAME=value" entries
};

// The facts of this process: geteuid(), the cores in its affinity mask (physical cores when
// the CPU topology is readable, as OpenMPI counts slots), and environ.
HostFacts current_host();

// The mpirun argv (argv[0] = mpirun). Ranks beyond the cores need --oversubscribe, and then
// waiting ranks must yield their core instead of spinning on it, and must not be bound to one.
// Every ZERO_* variable is forwarded with -x (OpenMPI forwards only some variables to remote
// nodes), in sorted order so the command is reproducible.
std::vector<std::string> build_mpirun_command(const std::string& mpirun,
                                              const LaunchRequest& request, const HostFacts& host);

// The executable `name` would run as: a name containing '/' is checked as a path, any other is
// searched in the ':'-separated `path_list` (an empty entry means the current directory, as in
// execvp). Returns "" when there is no executable regular file by that name.
std::string find_executable(const std::string& name, const std::string& path_list);

// mpirun to use: $ZERO_MPIRUN when set, else "mpirun" found on $PATH. Throws zero::Error with
// the places searched when there is none.
std::string resolve_mpirun();

// Throws zero::Error when program (as it would be found on $PATH) is missing or not executable.
void check_program(const std::string& program);

// The words joined with spaces, each quoted for a POSIX shell only where it needs quoting, so
// the printed line can be pasted back into a shell.
std::string shell_join(const std::vector<std::string>& words);

}  // namespace zero::launcher
