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
#include <sstream>
#include <thread>
#include <utility>

#include "zero/core/check.h"
#include "zero/kernels/blas_core.h"

extern char** environ;

namespace zero::launcher {

namespace {

// The number after a count flag (-np, --num_gpus): digits only (no sign, no spaces, no suffix),
// at least 1, fits an int.
int parse_count(const std::string& flag, const std::string& text) {
  const bool digits_only = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits_only) throw UsageError(flag + " needs a positive whole number, got '" + text + "'");
  errno = 0;
  const long value = std::strtol(text.c_str(), nullptr, 10);
  if (errno == ERANGE || value > INT_MAX) throw UsageError(flag + " " + text + " is too large");
  if (value < 1) throw UsageError(flag + " must be at least 1, got " + text);
  return static_cast<int>(value);
}

// The words of a hostfile line, split at spaces and tabs.
std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  size_t start = 0;
  while (true) {
    start = line.find_first_not_of(" \t\r", start);
    if (start == std::string::npos) return words;
    const size_t end = line.find_first_of(" \t\r", start);
    words.push_back(line.substr(start, end == std::string::npos ? end : end - start));
    if (end == std::string::npos) return words;
    start = end;
  }
}

// Whether `name` starts with `prefix` and has more after it.
bool has_prefix(const std::string& name, const std::string& prefix) {
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0;
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
  return "usage: zerorun [-np N | --hostfile FILE] [--num_gpus G] [--tp T] [--pp P] [--dry-run] "
         "[--] program [args...]\n"
         "  -np N            start N ranks (N >= 1); with a hostfile, at most its total slots\n"
         "  --hostfile FILE  run on the hosts of FILE, one 'host slots=N' per line ('#' "
         "comments);\n"
         "                   ranks fill the hosts in order, one per slot, unbound to cores\n"
         "  --num_gpus G     at most G ranks per host (each host's slots are capped at G);\n"
         "                   without -np or a hostfile, start G ranks on this host\n"
         "  --tp T           the program's tensor-parallel size: each T consecutive ranks on\n"
         "                   one host (slots used in whole groups); give the program its own\n"
         "                   --tp T too\n"
         "  --pp P           the program's pipeline stages: the ranks must divide into P stages\n"
         "                   of whole tensor-parallel groups; each stage takes consecutive\n"
         "                   ranks, so its ranks fill consecutive hosts; give the program its\n"
         "                   own --pp P too\n"
         "  --dry-run        print the mpirun command instead of running it\n"
         "  -h, --help       print this text\n"
         "environment: ZERO_MPIRUN names the mpirun to use (default: mpirun on PATH);\n"
         "             ZERO_* and NCCL_* variables, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,\n"
         "             OPENBLAS_CORETYPE, CUDA_VISIBLE_DEVICES and the sanitizers' ASAN_, LSAN_,\n"
         "             UBSAN_ and TSAN_OPTIONS are passed on to the ranks;\n"
         "             without a hostfile and OPENBLAS_CORETYPE, ranks on a CPU that OpenBLAS\n"
         "             does not recognise get the core type that suits it (AVX2 or AVX-512)\n";
}

LaunchRequest parse_arguments(const std::vector<std::string>& args) {
  LaunchRequest request;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-np" || arg == "--num_gpus" || arg == "--hostfile" || arg == "--tp" ||
        arg == "--pp") {
      if (i + 1 == args.size()) {
        throw UsageError(arg == "-np"          ? "-np needs a number of ranks"
                         : arg == "--num_gpus" ? "--num_gpus needs a number of GPUs per host"
                         : arg == "--tp"       ? "--tp needs a tensor-parallel size"
                         : arg == "--pp"       ? "--pp needs a number of pipeline stages"
                                               : "--hostfile needs a file name");
      }
      const std::string& value = args[++i];
      if (arg == "-np") request.ranks = parse_count(arg, value);
      if (arg == "--num_gpus") request.num_gpus = parse_count(arg, value);
      if (arg == "--tp") request.tensor_parallel = parse_count(arg, value);
      if (arg == "--pp") request.pipeline_stages = parse_count(arg, value);
      if (arg == "--hostfile") {
        if (value.empty()) throw UsageError("--hostfile needs a file name, got ''");
        request.hostfile = value;
      }
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
  if (request.hostfile.empty()) {
    if (request.ranks == 0 && request.num_gpus == 0) {
      throw UsageError("missing -np N (the number of ranks), --num_gpus G or --hostfile FILE");
    }
    // Without a hostfile every rank runs on this one host.
    if (request.num_gpus > 0 && request.ranks > request.num_gpus) {
      throw UsageError("-np " + std::to_string(request.ranks) + " exceeds --num_gpus " +
                       std::to_string(request.num_gpus) +
                       " (without a hostfile every rank runs on this host)");
    }
  }
  if (request.program.empty()) throw UsageError("no program to run");
  // With a hostfile --num_gpus caps each host's slots (rounded to whole groups later); without
  // one it may be the rank count.
  const int ranks = request.ranks > 0          ? request.ranks
                    : request.hostfile.empty() ? request.num_gpus
                                               : 0;
  if (ranks > 0 && ranks % request.tensor_parallel != 0) {
    throw UsageError(std::to_string(ranks) + " ranks do not divide into tensor-parallel groups " +
                     "of --tp " + std::to_string(request.tensor_parallel));
  }
  const long stage_groups = static_cast<long>(request.tensor_parallel) * request.pipeline_stages;
  if (ranks > 0 && ranks % stage_groups != 0) {
    throw UsageError(std::to_string(ranks) + " ranks do not divide into --pp " +
                     std::to_string(request.pipeline_stages) +
                     " pipeline stages of tensor-parallel groups of " +
                     std::to_string(request.tensor_parallel));
  }
  return request;
}

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& file_name) {
  std::vector<HostSlots> hosts;
  std::vector<int> listed_on;  // line of each host, for the duplicate message
  long total_slots = 0;        // all hosts together become mpirun's -np, an int
  int line_number = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    line = line.substr(0, line.find('#'));
    const std::vector<std::string> words = split_words(line);
    if (words.empty()) continue;

    const std::string where = file_name + ":" + std::to_string(line_number) + ": ";
    const std::string& host = words[0];
    if (host.find('=') != std::string::npos) {
      throw HostfileError(where + "missing host name before '" + host + "'");
    }
    if (host[0] == '-') {
      // mpirun passes the name to ssh, which would read it as an option (-oProxyCommand=...).
      throw HostfileError(where + "host name '" + host +
                          "' may not start with '-' (ssh would read it as an option)");
    }
    if (host.find_first_of(",:") != std::string::npos) {
      // mpirun's --host list is host:slots,host:slots; such a name would be misread.
      throw HostfileError(where + "host name '" + host + "' may not contain ',' or ':'");
    }
    std::string slots_text;
    bool have_slots = false;
    for (size_t w = 1; w < words.size(); ++w) {
      if (words[w].compare(0, 6, "slots=") != 0) {
        throw HostfileError(where + "unknown token '" + words[w] + "' (expected 'host slots=N')");
      }
      if (have_slots) throw HostfileError(where + "slots given twice for host '" + host + "'");
      slots_text = words[w].substr(6);
      have_slots = true;
    }
    if (!have_slots) throw HostfileError(where + "host '" + host + "' has no slots=N");
    int slots = 0;
    try {
      slots = parse_count("slots", slots_text);
    } catch (const UsageError& e) {
      throw HostfileError(where + e.what());
    }
    for (size_t h = 0; h < hosts.size(); ++h) {
      if (hosts[h].host == host) {
        throw HostfileError(where + "host '" + host + "' is already listed on line " +
                            std::to_string(listed_on[h]));
      }
    }
    total_slots += slots;
    if (total_slots > INT_MAX) {
      throw HostfileError(where + "the hosts' slots add up to more than " +
                          std::to_string(INT_MAX));
    }
    hosts.push_back({host, slots});
    listed_on.push_back(line_number);
  }
  if (hosts.empty()) throw HostfileError(file_name + ": no hosts listed");
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw HostfileError("cannot read hostfile '" + path + "': " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw HostfileError("cannot read hostfile '" + path + "': " + std::strerror(errno));
  return parse_hostfile(text.str(), path);
}

HostFacts current_host() {
  HostFacts host;
  host.is_root = geteuid() == 0;
  host.cores = count_cores();
  for (char** entry = environ; *entry != nullptr; ++entry) host.environment.emplace_back(*entry);
  host.blas_core = kernels::better_blas_core();
  return host;
}

std::vector<std::string> forwarded_variables(const std::vector<std::string>& environment) {
  // The sanitizers' options too: a sanitized build's ranks on other hosts start from a clean
  // environment, and would otherwise run without the suppressions the job was given.
  static const std::set<std::string> kSingles = {
      "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "CUDA_VISIBLE_DEVICES",
      "ASAN_OPTIONS",    "LSAN_OPTIONS",         "UBSAN_OPTIONS",     "TSAN_OPTIONS"};
  std::set<std::string> names;
  for (const std::string& entry : environment) {
    const std::string name = entry.substr(0, entry.find('='));
    if (has_prefix(name, "ZERO_") || has_prefix(name, "NCCL_") || kSingles.count(name) > 0) {
      names.insert(name);
    }
  }
  return {names.begin(), names.end()};
}

std::vector<std::string> build_mpirun_command(const std::string& mpirun,
                                              const LaunchRequest& request, const HostFacts& host,
                                              const std::vector<HostSlots>& hosts) {
  ZERO_CHECK(!request.program.empty(), "no program to run");
  std::vector<std::string> placement;  // the flags that say where ranks run
  int ranks = request.ranks;
  if (hosts.empty()) {
    if (ranks == 0) ranks = request.num_gpus;
    ZERO_CHECK(ranks >= 1, "the number of ranks must be at least 1, got " << ranks);
    if (static_cast<unsigned>(ranks) > host.cores) {
      placement = {"--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"};
    }
  } else {
    std::string host_list;
    int total_slots = 0;
    const int group = request.tensor_parallel;
    for (const HostSlots& entry : hosts) {
      ZERO_CHECK(entry.slots >= 1, "host '" << entry.host << "' has " << entry.slots << " slots");
      int slots = request.num_gpus > 0 ? std::min(entry.slots, request.num_gpus) : entry.slots;
      slots -= slots % group;
      if (slots == 0) continue;
      ZERO_CHECK(slots <= INT_MAX - total_slots,
                 "the hosts' slots add up to more than " << INT_MAX);
      host_list += (host_list.empty() ? "" : ",") + entry.host + ":" + std::to_string(slots);
      total_slots += slots;
    }
    if (total_slots == 0) {
      throw HostfileError("no host of hostfile '" + request.hostfile + "' has the " +
                          std::to_string(group) + " slots of a whole tensor-parallel group (--tp)");
    }
    if (ranks == 0) ranks = total_slots;
    if (ranks > total_slots) {
      std::string limits;
      if (request.num_gpus > 0) {
        limits += "at most " + std::to_string(request.num_gpus) + " per host with --num_gpus";
      }
      if (group > 1) {
        limits += (limits.empty() ? "" : ", ") +
                  std::string("in whole tensor-parallel groups of ") + std::to_string(group) +
                  " per host with --tp";
      }
      throw HostfileError("-np " + std::to_string(ranks) + " exceeds the " +
                          std::to_string(total_slots) + " slots of hostfile '" + request.hostfile +
                          "'" + (limits.empty() ? "" : " (" + limits + ")"));
    }
    ZERO_CHECK(ranks % group == 0,
               ranks << " ranks do not divide into tensor-parallel groups of " << group);
    ZERO_CHECK(ranks % (group * request.pipeline_stages) == 0,
               ranks << " ranks do not divide into --pp " << request.pipeline_stages
                     << " pipeline stages of tensor-parallel groups of " << group);
    placement = {"--host", host_list, "--map-by", "slot", "--bind-to", "none"};
  }

  std::vector<std::string> command = {mpirun, "-np", std::to_string(ranks)};
  if (host.is_root) command.push_back("--allow-run-as-root");
  command.insert(command.end(), placement.begin(), placement.end());
  const std::vector<std::string> forwarded = forwarded_variables(host.environment);
  const bool user_set_core =
      std::find(forwarded.begin(), forwarded.end(), "OPENBLAS_CORETYPE") != forwarded.end();
  if (hosts.empty() && !host.blas_core.empty() && !user_set_core) {
    command.insert(command.end(), {"-x", "OPENBLAS_CORETYPE=" + host.blas_core});
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
