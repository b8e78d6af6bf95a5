#include "checkpoint_grid.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "checkpoint_format.h"
#include "zero/core/check.h"

namespace zero::checkpoint_grid {

namespace {

const char* const kResharding =
    "resharding across tensor-parallel sizes (splitting or merging each slice) is not built yet";

int size_of(const Engine& engine) {
  const Communicator* tp = engine.config().tensor_parallel;
  return tp == nullptr ? 1 : tp->world_size();
}

std::string rank_dir(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "tp_rank_%02d", rank);
  return checkpoint_files::join(dir, name);
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string own_dir(const Engine& engine, const std::string& dir) {
  const Communicator* tp = engine.config().tensor_parallel;
  return tp == nullptr ? dir : rank_dir(dir, tp->rank());
}

std::string own_source(const Engine& engine, const std::string& path) {
  const int size = size_of(engine);
  if (size == 1) {
    ZERO_CHECK(!is_dir(rank_dir(path, 0)),
               "checkpoint " << path << " was saved by a tensor-parallel run (it holds "
                             << rank_dir(path, 0)
                             << "), and this run has no tensor parallelism: " << kResharding);
    return path;
  }
  const std::string own = own_dir(engine, path);
  ZERO_CHECK(is_dir(own), "checkpoint "
                              << path << " has no " << own << ": it was not saved by a run "
                              << "with tensor-parallel size " << size << ", and " << kResharding);
  return own;
}

void check_grid(const Engine& engine, const CheckpointInfo& info) {
  const int size = size_of(engine);
  const int rank = size == 1 ? 0 : engine.config().tensor_parallel->rank();
  ZERO_CHECK(info.tensor_parallel_size == size && info.tensor_parallel_rank == rank,
             "checkpoint " << info.step_dir << " holds tensor-parallel rank "
                           << info.tensor_parallel_rank << " of " << info.tensor_parallel_size
                           << ", and this is rank " << rank << " of " << size << ": "
                           << kResharding);
}

void agree(const Engine& engine, const std::string& what, const std::exception_ptr& failure,
           long step) {
  Communicator* tp = engine.config().tensor_parallel;
  if (tp == nullptr) {
    if (failure) std::rethrow_exception(failure);
    return;
  }
  // One value per rank: its step, or all ones for a failure.
  const uint64_t failed = ~uint64_t{0};
  const std::vector<uint64_t> all =
      all_gather_u64(*tp, failure ? failed : static_cast<uint64_t>(step));
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 0; r < all.size(); ++r) {
    ZERO_CHECK(all[r] != failed,
               what << ": tensor-parallel rank " << r << " failed (its own message says why)");
    ZERO_CHECK(all[r] == all.front(),
               what << ": the tensor-parallel ranks' checkpoints are of different steps (rank 0: "
                    << all.front() << ", rank " << r << ": " << all[r]
                    << "); a save was interrupted on some ranks");
  }
}

}  // namespace zero::checkpoint_grid
