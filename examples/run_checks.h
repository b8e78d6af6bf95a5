// What zero-train checks before step 1, so that a mistake costs seconds, not a run: every rank
// runs the same job, every output path is writable, one job at a time uses a save directory,
// and the host has the memory the plan needs. Each check is collective where it must be (all
// ranks call it) and fails on every rank at once.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero::examples {

// Collective over `comm`: every rank's copy of `mine` (lengths first, then the bytes), by rank.
std::vector<std::string> all_gather_strings(const std::string& mine, MPI_Comm comm);

// Collective over MPI_COMM_WORLD: the ranks whose `failed` is true, in rank order (empty when
// none is). Every rank gets the same ranks, so a step that fails on some ranks only can stop
// every rank at once, with the first failing rank's message (all_gather_strings) or a pointer
// to it.
std::vector<int> failed_ranks(bool failed);

// One setting that must agree across ranks, by name (the flag or config key a user knows it
// by) and value as text.
struct Setting {
  std::string name;
  std::string value;
};

// Collective over MPI_COMM_WORLD: compares the settings of every rank (one exchange of a hash
// per setting; the values of the first differing one only when some differ). Returns "" when
// all agree, else a message naming the setting and each rank's value.
std::string first_disagreement(const std::vector<Setting>& settings);

// Why `path` cannot be written as a file (its directory missing or not writable, or the path a
// directory), or "" when it can. Creates nothing.
std::string unwritable_file(const std::string& path);

// Why `dir` cannot hold checkpoints (a file, or not creatable or writable), or "". Creates the
// directory (and its parents) when it is missing, as the first save would.
std::string unusable_save_dir(const std::string& dir);

// The newest step whose checkpoint `dir` holds (its step_N directories, and those in tp_rank_RR/
// of a tensor-parallel save), or nullopt when it holds none or cannot be read.
std::optional<long> newest_saved_step(const std::string& dir);

// Whether `path` is `dir` or lies under it, once both are made absolute and their symbolic links
// resolved (as far as they exist).
bool is_within(const std::string& path, const std::string& dir);

// An exclusive lock on a save directory for the life of the object (flock on a lock file in
// it): a second job that points at the same directory is refused at start instead of deleting
// the first one's temporary checkpoint directories.
class SaveDirLock {
 public:
  SaveDirLock() = default;
  // Throws std::runtime_error naming the directory when another process holds the lock.
  explicit SaveDirLock(const std::string& dir);
  ~SaveDirLock();
  SaveDirLock(SaveDirLock&& other) noexcept;
  SaveDirLock& operator=(SaveDirLock&& other) noexcept;
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Host memory one rank may use: the smallest of the cgroup's limit (v2 memory.max or v1
// limit_in_bytes) and MemAvailable, divided by the ranks on this node; 0 when neither can be
// read.
uint64_t host_memory_per_rank(int ranks_on_node);

// The cores a process may run on (its affinity mask), by number.
using CoreSet = std::vector<int>;

// Host threads for a rank of a GPU run (its host AdamW with the optimizer offloaded), as
// DeepSpeed's CPU Adam takes the cores it is given, but without two ranks counting one core
// twice: each core is shared among the node's ranks that may run on it, and a rank takes the sum
// of its shares, rounded down, at least 1. Ranks bound apart (mpirun --bind-to core) take their
// own cores; ranks that share a mask (mpirun binding to a socket, a Slurm or docker cpuset,
// taskset mpirun) divide it; unbound ranks divide the node's online cores. `node_masks` holds
// every rank's mask on this node (an empty one, unreadable, counts as every online core), `me`
// is this rank's place among them.
int threads_per_rank(const std::vector<CoreSet>& node_masks, size_t me, int online_cores);

// The cores this process may run on (sched_getaffinity); empty when they cannot be read.
CoreSet this_process_cores();

// This node's ranks (MPI_COMM_TYPE_SHARED), among which the host's memory is divided, and this
// rank's host threads (threads_per_rank over the masks of those ranks, `mine` being this
// rank's). Collective over MPI_COMM_WORLD; an MPI failure is a zero::Error naming the call.
struct NodeShare {
  int ranks = 1;
  int host_threads = 1;
};
NodeShare node_share(const CoreSet& mine);

// This process's resident memory now (VmRSS) and its peak so far (VmHWM), from
// /proc/self/status; 0 where it cannot be read.
uint64_t resident_bytes();
uint64_t peak_resident_bytes();

}  // namespace zero::examples
