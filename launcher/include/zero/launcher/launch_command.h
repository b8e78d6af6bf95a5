// zerorun's logic, kept apart from main() so tests can drive it without starting processes:
// parse the command line, read the hostfile, look at the host, and build the mpirun command.
//
//   zerorun [-np N | --hostfile FILE] [--num_gpus G] [--tp T] [--dry-run] [--] program [args...]
//
// On this host alone (no hostfile) it becomes
//
//   mpirun -np N [--allow-run-as-root] [--oversubscribe --bind-to none
//          --mca mpi_yield_when_idle 1] [-x OPENBLAS_CORETYPE=CORE] [-x NAME ...]
//          program [args...]
//
// and over the hosts of a hostfile
//
//   mpirun -np N [--allow-run-as-root] --host h1:s1,h2:s2 --map-by slot --bind-to none
//          [-x NAME ...] program [args...]
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

// A hostfile zerorun cannot use (the message names the file, and the line of a bad line:
// "hosts:3: ..."), or a rank count its hosts cannot hold. main() prints it and exits 2.
class HostfileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The usage text printed with a UsageError and for -h/--help.
const char* usage_text();

// What the user asked for.
struct LaunchRequest {
  int ranks = 0;         // -np; 0 when not given (then the hostfile or --num_gpus decides)
  std::string hostfile;  // --hostfile; empty: every rank runs on this host
  int num_gpus = 0;      // --num_gpus; 0 when not given: at most this many ranks per host
  // --tp: the job's tensor-parallel size; each group of this many consecutive ranks is placed
  // on one host (1: no constraint).
  int tensor_parallel = 1;
  // --pp: the job's pipeline stages; each stage is ranks / pp consecutive ranks, which fill the
  // hosts in order, so a stage's ranks share its hosts (1: no pipeline). The ranks must divide
  // into pp stages of whole tensor-parallel groups.
  int pipeline_stages = 1;
  bool dry_run = false;
  bool help = false;                 // -h/--help: print the usage and exit 0
  std::vector<std::string> program;  // the program and its arguments
};

// Parses zerorun's arguments (argv[1..]). Options come first; the first word that is not an
// option, or everything after "--", is the program and its arguments. Without a hostfile,
// -np or --num_gpus must say how many ranks to start, and -np may not exceed --num_gpus.
// Throws UsageError.
LaunchRequest parse_arguments(const std::vector<std::string>& args);

// One line of a hostfile: a host and how many ranks it may run.
struct HostSlots {
  std::string host;
  int slots = 0;
};

inline bool operator==(const HostSlots& a, const HostSlots& b) {
  return a.host == b.host && a.slots == b.slots;
}

// Parses hostfile text in DeepSpeed's format: one "host slots=N" per line, '#' starts a comment
// that runs to the end of the line, blank lines are skipped. `file_name` only labels messages.
// Throws HostfileError naming file:line and the problem: a missing slots=, slots that are not a
// positive whole number, a host listed twice, an unknown token, slots that add up to more than
// an int holds (mpirun's -np), or no host at all.
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& file_name);

// Reads and parses the hostfile at `path`; HostfileError when it cannot be read.
std::vector<HostSlots> read_hostfile(const std::string& path);

// What the command depends on besides the request, gathered once so building is pure.
struct HostFacts {
  bool is_root = false;                  // OpenMPI refuses root unless told
  unsigned cores = 1;                    // cores this process may run on
  std::vector<std::string> environment;  // "NAME=value" entries
  // The OpenBLAS core type the ranks should load when OpenBLAS would pick slower kernels than
  // this CPU can run (zero/kernels/blas_core.h); "" when its own choice is fine.
  std::string blas_core;
};

// The facts of this process: geteuid(), the cores in its affinity mask (physical cores when
// the CPU topology is readable, as OpenMPI counts slots), environ, and the better OpenBLAS core
// for this CPU.
HostFacts current_host();

// The variables forwarded to every rank with -x, sorted and each once: every ZERO_* and NCCL_*
// variable, and OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, OPENBLAS_CORETYPE and
// CUDA_VISIBLE_DEVICES when set.
// (OpenMPI passes only a few variables of its own to ranks on other hosts.)
std::vector<std::string> forwarded_variables(const std::vector<std::string>& environment);

// The mpirun argv (argv[0] = mpirun).
//
// Without hosts, every rank runs here: ranks beyond the cores need --oversubscribe, and then
// waiting ranks must yield their core instead of spinning on it, and must not be bound to one.
// When host.blas_core names a core and the user has not set OPENBLAS_CORETYPE, the ranks get
// OPENBLAS_CORETYPE=host.blas_core: OpenBLAS reads it only when it loads, so it must be in the
// ranks' environment from their start. Not with hosts: their CPUs are not this one, and a core
// type a CPU cannot run stops the program on an illegal instruction.
//
// With hosts (from a hostfile), each host's slots are capped at request.num_gpus when it is
// set, then rounded down to a multiple of request.tensor_parallel so that no tensor-parallel
// group spans two hosts (its all-reduces, two per layer each way, stay on the host's links; a
// host with fewer slots than a group is left out); the rank count is request.ranks when set,
// else the sum of the slots, and it may not exceed that sum (HostfileError). Ranks fill the hosts
// in order (--map-by slot), so the ranks of one host are consecutive and a rank's node-local rank
// picks its GPU. Ranks are not bound to cores (--bind-to none): each runs a compute thread, a
// communication thread and often BLAS/OpenMP threads, which a one-core binding would squeeze onto a
// single core.
std::vector<std::string> build_mpirun_command(const std::string& mpirun,
                                              const LaunchRequest& request, const HostFacts& host,
                                              const std::vector<HostSlots>& hosts = {});

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
