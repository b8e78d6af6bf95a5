// zero-train's start-up check of the NVMe paths (the offloads' nvme_path and the activation
// spill's --checkpoint-nvme-path): each directory must take an O_DIRECT file of its bytes, and
// the files every rank of a node will make on one file system must fit in its free space
// together, which a rank checking alone cannot see (two ranks sharing a tmpfs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero::examples {

// One file a rank will make under an NVMe path.
struct NvmeFileNeed {
  std::string dir;
  uint64_t bytes = 0;
  std::string what;  // whose file: "rank 0's offloaded optimizer state"
};

// What one rank will write to one file system (st_dev), and the free space it saw there.
struct FileSystemShare {
  int rank = 0;
  uint64_t device = 0;
  uint64_t free_bytes = 0;
  uint64_t bytes = 0;
  std::string dir;
};

// The shares of one node's ranks summed by file system: a message naming the first file system
// (by its first directory) whose shares pass its free space, with the sum, the free space and
// each rank's bytes; "" when all fit.
std::string overcommitted_file_system(const std::vector<FileSystemShare>& shares);

// Collective over MPI_COMM_WORLD: checks this rank's files (check_nvme_directory: the path
// exists, is a directory, takes an O_DIRECT file, has room for the file alone), then the sums
// over each node's ranks by file system. Returns the same message on every rank: the first
// failing rank's problem, or "" when every file fits.
std::string nvme_space_problem(const std::vector<NvmeFileNeed>& mine);

}  // namespace zero::examples
