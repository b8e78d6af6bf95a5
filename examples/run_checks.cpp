#include "examples/run_checks.h"

#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "driver/paths.h"
#include "zero/collectives/mpi_check.h"

namespace zero::examples {

namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace

std::vector<std::string> all_gather_strings(const std::string& mine, MPI_Comm comm) {
  int ranks = 0;
  ZERO_MPI_CHECK(MPI_Comm_size(comm, &ranks));
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(ranks));
  ZERO_MPI_CHECK(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  std::vector<int> offsets(static_cast<size_t>(ranks), 0);
  for (int r = 1; r < ranks; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(static_cast<size_t>(offsets.back() + lengths.back()), '\0');
  ZERO_MPI_CHECK(MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                                offsets.data(), MPI_CHAR, comm));
  std::vector<std::string> out;
  for (int r = 0; r < ranks; ++r) out.push_back(all.substr(offsets[r], lengths[r]));
  return out;
}

std::vector<int> failed_ranks(bool failed) {
  int world = 1;
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const int mine = failed ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(world));
  ZERO_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) {
    if (all[static_cast<size_t>(r)] != 0) ranks.push_back(r);
  }
  return ranks;
}

namespace {

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The first line of a file as a number, or 0 ("max" and unreadable files included).
uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return 0;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return 0;
  }
}

uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

std::string first_disagreement(const std::vector<Setting>& settings) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  // Same build, same flags parser: every rank has the same list of names in the same order.
  std::vector<uint64_t> mine;
  for (const Setting& s : settings) mine.push_back(fnv1a(s.name + '\0' + s.value));
  std::vector<uint64_t> all(mine.size() * static_cast<size_t>(world));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(),
                static_cast<int>(mine.size()), MPI_UINT64_T, MPI_COMM_WORLD);
  for (size_t i = 0; i < settings.size(); ++i) {
    bool same = true;
    for (int r = 1; r < world; ++r) same = same && all[r * mine.size() + i] == all[i];
    if (same) continue;
    const std::vector<std::string> values = all_gather_strings(settings[i].value, MPI_COMM_WORLD);
    std::ostringstream message;
    message << "the ranks run different jobs: " << settings[i].name << " is";
    for (int r = 0; r < world; ++r) {
      message << (r ? ", " : " ") << "'" << values[r] << "' on rank " << r;
    }
    message << "; every rank must be started with the same settings";
    return message.str();
  }
  return "";
}

std::string unwritable_file(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return "'" + path + "' is a directory, not a file";
    if (access(path.c_str(), W_OK) != 0) return "'" + path + "' is not writable";
    return "";
  }
  const std::string dir = directory_of(path);
  if (stat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return "the directory of '" + path + "' does not exist";
  }
  if (access(dir.c_str(), W_OK) != 0) return "the directory of '" + path + "' is not writable";
  return "";
}

std::string unusable_save_dir(const std::string& dir) {
  struct stat info {};
  if (stat(dir.c_str(), &info) == 0) {
    if (!S_ISDIR(info.st_mode)) return "'" + dir + "' exists and is not a directory";
  } else {
    // Missing parents too, as the first save would create them.
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) return "cannot create '" + dir + "': " + error.message();
  }
  if (access(dir.c_str(), W_OK) != 0) return "'" + dir + "' is not writable";
  return "";
}

namespace {

// The step of a step directory's name ("step_00000010" -> 10), or nullopt for another name
// (".tmp_step_N" of an unfinished save included).
std::optional<long> step_of(const std::string& name) {
  const std::string prefix = "step_";
  if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) {
    return std::nullopt;
  }
  long step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    const char c = name[i];
    if (c < '0' || c > '9' || step > (std::numeric_limits<long>::max() - 9) / 10) {
      return std::nullopt;
    }
    step = step * 10 + (c - '0');
  }
  return step;
}

// The entries of a directory by name, each with whether it is a directory; none when it cannot
// be read.
std::vector<std::pair<std::string, bool>> entries_of(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, bool>> entries;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    std::error_code type_error;
    entries.emplace_back(it->path().filename().string(), it->is_directory(type_error));
  }
  return entries;
}

}  // namespace

std::optional<long> newest_saved_step(const std::string& dir) {
  std::vector<std::filesystem::path> places = {dir};
  for (const auto& [name, is_directory] : entries_of(dir)) {
    if (is_directory && name.compare(0, 8, "tp_rank_") == 0) places.push_back(dir + "/" + name);
  }
  std::optional<long> newest;
  for (const std::filesystem::path& place : places) {
    for (const auto& [name, is_directory] : entries_of(place)) {
      const std::optional<long> step = step_of(name);
      if (step && is_directory && (!newest || *step > *newest)) newest = step;
    }
  }
  return newest;
}

bool is_within(const std::string& path, const std::string& dir) {
  namespace fs = std::filesystem;
  const auto resolved = [](const std::string& p, bool* ok) {
    std::error_code absolute_error, canonical_error;
    const fs::path result = fs::weakly_canonical(fs::absolute(p, absolute_error), canonical_error);
    *ok = !absolute_error && !canonical_error;
    return result;
  };
  bool path_ok = false, dir_ok = false;
  const fs::path inner = resolved(path, &path_ok);
  const fs::path outer = resolved(dir, &dir_ok);
  return path_ok && dir_ok && driver::is_within(inner, outer);
}

SaveDirLock::SaveDirLock(const std::string& dir) {
  const std::string path = dir + "/.zero-train.lock";
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot open the lock file '" + path + "': " + std::strerror(errno));
  }
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    close(fd_);
    fd_ = -1;
    throw std::runtime_error("the save directory '" + dir +
                             "' is in use by another job (it holds " + path +
                             "); give each job its own --save-dir");
  }
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) close(fd_);  // closing releases the lock
}

SaveDirLock::SaveDirLock(SaveDirLock&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

SaveDirLock& SaveDirLock::operator=(SaveDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

uint64_t host_memory_per_rank(int ranks_on_node) {
  uint64_t limit = mem_available_bytes();
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t cgroup = read_number(path);
    if (cgroup > 0 && (limit == 0 || cgroup < limit)) limit = cgroup;
  }
  return limit / static_cast<uint64_t>(std::max(ranks_on_node, 1));
}

int threads_per_rank(const std::vector<CoreSet>& node_masks, size_t me, int online_cores) {
  CoreSet every_core(static_cast<size_t>(std::max(online_cores, 1)));
  std::iota(every_core.begin(), every_core.end(), 0);
  const auto cores_of = [&](size_t rank) -> const CoreSet& {
    return node_masks[rank].empty() ? every_core : node_masks[rank];
  };
  std::map<int, int> ranks_on_core;
  for (size_t rank = 0; rank < node_masks.size(); ++rank) {
    for (int core : cores_of(rank)) ++ranks_on_core[core];
  }
  double share = 0.0;
  for (int core : cores_of(me)) share += 1.0 / ranks_on_core[core];
  // The shares of a core sum to 1 in floating point only to within rounding: a rank's whole
  // cores are not lost to it.
  return std::max(1, static_cast<int>(std::floor(share + 1e-9)));
}

CoreSet this_process_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  CoreSet cores;
  for (int core = 0; core < CPU_SETSIZE; ++core) {
    if (CPU_ISSET(core, &allowed)) cores.push_back(core);
  }
  return cores;
}

NodeShare node_share(const CoreSet& mine) {
  int world_rank = 0;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
  int node_rank = 0, node_size = 1;
  ZERO_MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  ZERO_MPI_CHECK(MPI_Comm_size(node, &node_size));
  // Each mask as CPU_SETSIZE bits, so that every rank sends the same count.
  constexpr int kWords = CPU_SETSIZE / 64;
  std::vector<uint64_t> bits(kWords, 0);
  for (int core : mine) {
    ZERO_CHECK(core >= 0 && core < CPU_SETSIZE,
               "core " << core << " is outside the " << CPU_SETSIZE << " a mask can hold");
    bits[static_cast<size_t>(core / 64)] |= uint64_t{1} << (core % 64);
  }
  std::vector<uint64_t> all(static_cast<size_t>(kWords) * static_cast<size_t>(node_size));
  const int gathered =
      MPI_Allgather(bits.data(), kWords, MPI_UINT64_T, all.data(), kWords, MPI_UINT64_T, node);
  const int freed = MPI_Comm_free(&node);
  ZERO_MPI_CHECK(gathered);
  ZERO_MPI_CHECK(freed);
  std::vector<CoreSet> masks(static_cast<size_t>(node_size));
  for (size_t rank = 0; rank < masks.size(); ++rank) {
    for (int core = 0; core < CPU_SETSIZE; ++core) {
      if ((all[rank * kWords + static_cast<size_t>(core / 64)] >> (core % 64)) & 1) {
        masks[rank].push_back(core);
      }
    }
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int online_cores =
      online > 0 ? static_cast<int>(online) : static_cast<int>(std::thread::hardware_concurrency());
  return {node_size, threads_per_rank(masks, static_cast<size_t>(node_rank), online_cores)};
}

namespace {

// A "Name:   1234 kB" line of /proc/self/status, in bytes.
uint64_t status_kib_field(const std::string& name) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.compare(0, name.size() + 1, name + ":") != 0) continue;
    return std::strtoull(line.c_str() + name.size() + 1, nullptr, 10) * 1024;
  }
  return 0;
}

}  // namespace

uint64_t resident_bytes() {
  return status_kib_field("VmRSS");
}

uint64_t peak_resident_bytes() {
  return status_kib_field("VmHWM");
}

}  // namespace zero::examples
