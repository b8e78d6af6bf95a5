// zerorun's command building: argument parsing, host facts, PATH search and the mpirun argv.
// Everything the command depends on arrives as arguments, so tests can build it for any host.
#include "zero/launcher/launch_command.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

#include "zero/kernels/check.h"

extern char** environ;

namespace zero::launcher {

namespace {

// The number after -np: digits only (no sign, no spaces, no suffix), at least 1, fits an int.
int parse_ranks(const std::string& text) {
  const bool digits_only = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits_only) throw UsageError("-np needs a positive whole number, got '" + text + "'");
  errno = 0;
  const long value = std::strtol(text.c_str(), nullptr, 10);
  if (errno == ERANGE || value > INT_MAX) throw UsageError("-np " + text + " is too large");
  if (value < 1) throw UsageError("-np must be at least 1, got " + text);
  return static_cast<int>(value);
}

// Reads one integer from a sysfs file; false when the file is missing or unreadable.
bool read_sysfs_int(const std::string& path, int* value) {
  std::ifstream in(path);
  return static_cast<bool>(in >> *value);
}

// Cores this process may run on. OpenMPI gives one slot per physical core (hyperthreads do not
// count), so we count distinct (package, core) pairs of the CPUs in our affinity mask; without
// a readable topology, the CPUs themselves.
unsigned count_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    // No mask to read (unusual); the online CPUs are the best remaining guess.
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0) return static_cast<unsigned>(online);
    return std::max(1u, std::thread::hardware_concurrency());
  }
  std::set<std::pair<int, int>> physical_cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string topology = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    int package = 0;
    int core = 0;
    if (!read_sysfs_int(topology + "physical_package_id", &package) ||
        !read_sysfs_int(topology + "core_id", &core)) {
      return static_cast<unsigned>(std::max(1, CPU_COUNT(&allowed)));
    }
    physical_cores.insert({package, core});
  }
  return static_cast<unsigned>(std::max<size_t>(1, physical_cores.size()));
}

bool is_executable_file(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

// $PATH, or execvp's fallback when it is unset.
std::string search_path() {
  const char* path = std::getenv("PATH");
  return path != nullptr ? path : "/bin:/usr/bin";
}

bool needs_no_quoting(const std::string& word) {
  return !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::strchr("@%+=:,./-_", c) != nullptr;
  });
}

}  // namespace

const char* usage_text() {
  return "usage: zerorun -np N [--dry-run] [--] program [args...]\n"
         "  -np N      start N ranks (N >= 1) through mpirun\n"
         "  --dry-run  print the mpirun command instead of running it\n"
         "  -h, --help print this text\n"
         "environment: ZERO_MPIRUN names the mpirun to use (default: mpirun on PATH);\n"
         "             every ZERO_* variable is passed on to the ranks\n";
}

LaunchRequest parse_arguments(const std::vector<std::string>& args) {
  LaunchRequest request;
  bool have_ranks = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-np") {
      if (i + 1 == args.size()) throw UsageError("-np needs a number of ranks");
      request.ranks = parse_ranks(args[++i]);
      have_ranks = true;
    } else if (arg == "--dry-run") {
      request.dry_run = true;
    } else if (arg == "-h" || arg == "--help") {
      request.help = true;
    } else if (!arg.empty() && arg[0] == '-') {
      throw UsageError("unknown option '" + arg + "'");
    } else {
      break;  // the program
    }
  }
  request.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (request.help) return request;
  if (!have_ranks) throw UsageError("missing -np N (the number of ranks)");
  if (request.program.empty()) throw UsageError("no program to run");
  return request;
}

HostFacts current_host() {
  HostFacts host;
  host.is_root = geteuid() == 0;
  host.cores = count_cores();
  for (char** entry = environ; *entry != nullptr; ++entry) host.environment.emplace_back(*entry);
  return host;
}

std::vector<std::string> build_mpirun_command(const std::string& mpirun,
                                              const LaunchRequest& request, const HostFacts& host) {
  ZERO_CHECK(request.ranks >= 1, "the number of ranks must be at least 1, got " << request.ranks);
  ZERO_CHECK(!request.program.empty(), "no program to run");
  std::vector<std::string> command = {mpirun, "-np", std::to_string(request.ranks)};
  if (host.is_root) command.push_back("--allow-run-as-root");
  if (static_cast<unsigned>(request.ranks) > host.cores) {
    command.insert(command.end(),
                   {"--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"});
  }
  std::set<std::string> forwarded;
  for (const std::string& entry : host.environment) {
    const std::string name = entry.substr(0, entry.find('='));
    if (name.size() > 5 && name.compare(0, 5, "ZERO_") == 0) forwarded.insert(name);
  }
  for (const std::string& name : forwarded) command.insert(command.end(), {"-x", name});
  command.insert(command.end(), request.program.begin(), request.program.end());
  return command;
}

std::string find_executable(const std::string& name, const std::string& path_list) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return is_executable_file(name) ? name : "";
  size_t start = 0;
  while (true) {
    const size_t end = path_list.find(':', start);
    std::string dir = path_list.substr(start, end == std::string::npos ? end : end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    if (end == std::string::npos) return "";
    start = end + 1;
  }
}

std::string resolve_mpirun() {
  const char* chosen = std::getenv("ZERO_MPIRUN");
  if (chosen != nullptr && chosen[0] != '\0') {
    const std::string found = find_executable(chosen, search_path());
    ZERO_CHECK(!found.empty(), "ZERO_MPIRUN=" << chosen << " is not an executable file");
    return found;
  }
  const std::string found = find_executable("mpirun", search_path());
  ZERO_CHECK(!found.empty(), "mpirun not found on PATH (" << search_path()
                                                          << "); install OpenMPI or set "
                                                             "ZERO_MPIRUN to its mpirun");
  return found;
}

void check_program(const std::string& program) {
  if (!find_executable(program, search_path()).empty()) return;
  ZERO_CHECK(program.find('/') != std::string::npos,
             "program '" << program << "' not found on PATH (" << search_path() << ")");
  struct stat info;
  ZERO_CHECK(stat(program.c_str(), &info) == 0,
             "program '" << program << "': " << std::strerror(errno));
  ZERO_CHECK(S_ISREG(info.st_mode), "program '" << program << "' is not a regular file");
  ZERO_FAIL("program '" << program << "' is not executable");
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& word : words) {
    if (!line.empty()) line += ' ';
    if (needs_no_quoting(word)) {
      line += word;
      continue;
    }
    // Single quotes keep everything literal; a single quote itself is closed, escaped, reopened.
    line += '\'';
    for (char c : word) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += '\'';
  }
  return line;
}

}  // namespace zero::launcher
