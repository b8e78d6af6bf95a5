#include "examples/nvme_space.h"

#include <mpi.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>

#include "examples/run_checks.h"
#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"
#include "zero/runtime/memory.h"
#include "zero/runtime/nvme_file.h"

namespace zero::examples {

namespace {

// A share as one line ("rank device free bytes dir"; the directory last, as it may hold spaces).
std::string encoded(const FileSystemShare& share) {
  std::ostringstream out;
  out << share.rank << " " << share.device << " " << share.free_bytes << " " << share.bytes << " "
      << share.dir << "\n";
  return out.str();
}

std::vector<FileSystemShare> decoded(const std::string& text) {
  std::vector<FileSystemShare> shares;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    FileSystemShare share;
    fields >> share.rank >> share.device >> share.free_bytes >> share.bytes;
    fields.get();
    std::getline(fields, share.dir);
    shares.push_back(share);
  }
  return shares;
}

// This rank's files checked one by one, and its shares of each file system; the first problem
// in `problem`.
std::vector<FileSystemShare> checked_shares(const std::vector<NvmeFileNeed>& mine, int rank,
                                            std::string* problem) {
  std::vector<FileSystemShare> shares;
  for (const NvmeFileNeed& need : mine) {
    try {
      check_nvme_directory(need.dir, need.bytes, need.what);
      struct stat dir {};
      struct statvfs fs {};
      ZERO_CHECK(
          ::stat(need.dir.c_str(), &dir) == 0 && ::statvfs(need.dir.c_str(), &fs) == 0,
          "nvme_path " << need.dir << ": cannot read its file system: " << std::strerror(errno));
      shares.push_back({rank, static_cast<uint64_t>(dir.st_dev),
                        static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize, need.bytes, need.dir});
    } catch (const Error& e) {
      *problem = e.what();
      return {};
    }
  }
  return shares;
}

}  // namespace

std::string overcommitted_file_system(const std::vector<FileSystemShare>& shares) {
  std::vector<uint64_t> devices;  // in the order first seen, so the message is deterministic
  for (const FileSystemShare& share : shares) {
    if (std::find(devices.begin(), devices.end(), share.device) == devices.end()) {
      devices.push_back(share.device);
    }
  }
  for (uint64_t device : devices) {
    uint64_t total = 0;
    bool overflow = false;
    uint64_t free_bytes = UINT64_MAX;
    std::map<int, uint64_t> by_rank;
    const FileSystemShare* first = nullptr;
    for (const FileSystemShare& share : shares) {
      if (share.device != device) continue;
      if (first == nullptr) first = &share;
      overflow = overflow || __builtin_add_overflow(total, share.bytes, &total) ||
                 __builtin_add_overflow(by_rank[share.rank], share.bytes, &by_rank[share.rank]);
      // The ranks saw it at slightly different moments: the least they saw is what is sure.
      free_bytes = std::min(free_bytes, share.free_bytes);
    }
    if (!overflow && total <= free_bytes) continue;
    std::ostringstream each;
    for (const auto& [rank, bytes] : by_rank) {
      each << (each.tellp() > 0 ? ", " : "") << "rank " << rank << ": " << bytes;
    }
    std::ostringstream out;
    out << "nvme_path " << first->dir << ": its file system has " << free_bytes << " bytes ("
        << human_bytes(free_bytes) << ") free, but the " << by_rank.size()
        << " rank(s) on this node write ";
    if (overflow) {
      out << "more than 2^64 bytes";
    } else {
      out << total << " bytes (" << human_bytes(total) << ")";
    }
    out << " to it (" << each.str() << ")";
    return out.str();
  }
  return "";
}

std::string nvme_space_problem(const std::vector<NvmeFileNeed>& mine) {
  int rank = 0;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  std::string problem;
  const std::vector<FileSystemShare> shares = checked_shares(mine, rank, &problem);
  // The ranks of a node may share a file system: their shares are summed there (st_dev names a
  // file system on one node only).
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  std::string mine_encoded;
  for (const FileSystemShare& share : shares) mine_encoded += encoded(share);
  std::vector<FileSystemShare> node_shares;
  for (const std::string& text : all_gather_strings(mine_encoded, node)) {
    for (const FileSystemShare& share : decoded(text)) node_shares.push_back(share);
  }
  MPI_Comm_free(&node);
  if (problem.empty()) problem = overcommitted_file_system(node_shares);
  // Agreed across the world: every rank returns the first failing rank's message.
  const std::vector<int> failed = failed_ranks(!problem.empty());
  if (failed.empty()) return "";
  return all_gather_strings(problem, MPI_COMM_WORLD)[static_cast<size_t>(failed.front())];
}

}  // namespace zero::examples
