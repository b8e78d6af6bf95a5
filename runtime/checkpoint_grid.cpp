#include "checkpoint_grid.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint_format.h"
#include "zero/core/check.h"

namespace zero::checkpoint_grid {

namespace {

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
  const Communicator* tp = engine.config().grid.tensor_parallel;
  return tp == nullptr ? dir : rank_dir(dir, tp->rank());
}

void agree(const Engine& engine, const std::string& what, const std::exception_ptr& failure,
           long step) {
  Communicator* tp = engine.host_tensor_parallel();
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

namespace zero {

namespace {

// The checkpoints of every tensor-parallel rank of the newest save in path/tp_rank_RR: rank 0's
// says how many ranks saved it, so directories of an earlier save at a larger size are left out.
std::vector<CheckpointInfo> read_rank_dirs(const std::string& path) {
  using checkpoint_grid::rank_dir;
  std::vector<CheckpointInfo> grid = {read_checkpoint_info(rank_dir(path, 0))};
  // Copies, not a reference into grid: push_back may reallocate it.
  const int saved_size = grid.front().tensor_parallel_size;
  const std::string first_dir = grid.front().step_dir;
  for (int r = 1; r < saved_size; ++r) {
    ZERO_CHECK(checkpoint_grid::is_dir(rank_dir(path, r)),
               "checkpoint " << path << ": tensor-parallel rank 0's checkpoint " << first_dir
                             << " was saved by " << saved_size << " ranks, and "
                             << rank_dir(path, r) << " is missing");
    grid.push_back(read_checkpoint_info(rank_dir(path, r)));
  }
  const CheckpointInfo& first = grid.front();
  for (size_t r = 0; r < grid.size(); ++r) {
    const CheckpointInfo& info = grid[r];
    ZERO_CHECK(info.tensor_parallel_size == first.tensor_parallel_size &&
                   info.tensor_parallel_rank == static_cast<int>(r),
               "checkpoint " << info.step_dir << " holds tensor-parallel rank "
                             << info.tensor_parallel_rank << " of " << info.tensor_parallel_size
                             << ", not rank " << r << " of " << grid.size());
    ZERO_CHECK(
        info.trainer.step == first.trainer.step && info.optimizer_step == first.optimizer_step,
        "checkpoint " << path << ": the tensor-parallel ranks' checkpoints are of "
                      << "different steps (rank 0: " << first.trainer.step << ", rank " << r << ": "
                      << info.trainer.step << "); a save was interrupted on some "
                      << "ranks");
    ZERO_CHECK(info.world_size == first.world_size && info.stage == first.stage &&
                   info.dtype == first.dtype && info.state_count == first.state_count,
               "checkpoint " << path << ": tensor-parallel rank " << r << "'s checkpoint "
                             << info.step_dir << " is not of the same run as rank 0's "
                             << first.step_dir << " (world size, stage, dtype or optimizer state "
                             << "differ)");
    ZERO_CHECK(info.params.size() == first.params.size(),
               "checkpoint " << info.step_dir << " has " << info.params.size()
                             << " parameters, tensor-parallel rank 0's " << first.params.size());
    for (size_t p = 0; p < info.params.size(); ++p) {
      const ParamPlacement& a = info.params[p];
      const ParamPlacement& b = first.params[p];
      ZERO_CHECK(a.name == b.name && a.split == b.split &&
                     full_shape(a.split, a.shape) == full_shape(b.split, b.shape),
                 "checkpoint " << info.step_dir << ": parameter " << p << " '" << a.name
                               << "' is not tensor-parallel rank 0's '" << b.name
                               << "' cut the same way");
    }
  }
  return grid;
}

}  // namespace

std::vector<CheckpointInfo> read_checkpoint_grid(const std::string& path) {
  const bool has_rank_dirs = checkpoint_grid::is_dir(checkpoint_grid::rank_dir(path, 0));
  // A save directory may hold both layouts, when a run resumed at another tensor-parallel size
  // saved into it: the newer save is the one to load.
  std::vector<CheckpointInfo> whole;
  try {
    whole.push_back(read_checkpoint_info(path));
  } catch (const Error&) {
    if (!has_rank_dirs) throw;
  }
  if (!whole.empty()) {
    const CheckpointInfo& info = whole.front();
    ZERO_CHECK(info.tensor_parallel_size == 1,
               "checkpoint " << info.step_dir << " holds the slices of tensor-parallel rank "
                             << info.tensor_parallel_rank << " of " << info.tensor_parallel_size
                             << " only: load the save directory that holds every rank's "
                             << "tp_rank_RR directory");
  }
  if (!has_rank_dirs) return whole;
  std::vector<CheckpointInfo> sliced = read_rank_dirs(path);
  if (whole.empty()) return sliced;
  const long whole_step = whole.front().trainer.step;
  const long sliced_step = sliced.front().trainer.step;
  ZERO_CHECK(whole_step != sliced_step,
             "checkpoint " << path << " holds step " << whole_step << " twice: whole in "
                           << whole.front().step_dir << " and as tensor-parallel slices in "
                           << sliced.front().step_dir << "; move one of them away");
  return whole_step > sliced_step ? whole : sliced;
}
}  // namespace zero
