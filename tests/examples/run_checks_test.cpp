// zero-train's host checks on their own: a GPU run's host threads per rank, and what a save
// directory holds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>
#include <vector>

#include "examples/run_checks.h"

namespace zero::examples {
namespace {

CoreSet cores(int first, int count) {
  CoreSet set(static_cast<size_t>(count));
  std::iota(set.begin(), set.end(), first);
  return set;
}

// Every rank's threads, from the masks of all of them.
std::vector<int> threads_of(const std::vector<CoreSet>& masks, int online_cores) {
  std::vector<int> threads;
  for (size_t rank = 0; rank < masks.size(); ++rank) {
    threads.push_back(threads_per_rank(masks, rank, online_cores));
  }
  return threads;
}

// Unbound, the node's online cores are shared out among its ranks, the remainder left over,
// and no rank gets fewer than one, however many share the node.
TEST(HostThreads, UnboundRanksShareTheNode) {
  EXPECT_EQ(threads_of({cores(0, 16)}, 16), std::vector<int>({16}));
  EXPECT_EQ(threads_of(std::vector<CoreSet>(8, cores(0, 16)), 16), std::vector<int>(8, 2));
  EXPECT_EQ(threads_of(std::vector<CoreSet>(3, cores(0, 16)), 16), std::vector<int>(3, 5));
  EXPECT_EQ(threads_of(std::vector<CoreSet>(4, cores(0, 2)), 2), std::vector<int>(4, 1));
  EXPECT_EQ(threads_of(std::vector<CoreSet>(4, CoreSet{}), 16), std::vector<int>(4, 4))
      << "an unreadable mask counts as every online core";
}

// Ranks a launcher bound apart (mpirun --bind-to core, or to sockets one rank each) take the
// cores they were given.
TEST(HostThreads, RanksBoundApartTakeTheirOwnCores) {
  EXPECT_EQ(threads_of({cores(0, 8), cores(8, 8)}, 16), std::vector<int>({8, 8}));
  EXPECT_EQ(threads_of({{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}, 16), std::vector<int>(8, 1));
  EXPECT_EQ(threads_of({cores(0, 4), cores(4, 12)}, 16), std::vector<int>({4, 12}));
}

// Ranks that share one mask smaller than the node (mpirun binding to a socket, a Slurm or
// docker cpuset, taskset mpirun) divide it: 8 ranks in one 32-core cpuset of a 64-core node
// take 4 threads each, not 32.
TEST(HostThreads, RanksSharingAMaskDivideIt) {
  EXPECT_EQ(threads_of(std::vector<CoreSet>(8, cores(0, 32)), 64), std::vector<int>(8, 4));
  EXPECT_EQ(threads_of(std::vector<CoreSet>(2, cores(0, 8)), 16), std::vector<int>(2, 4));
  // Two sockets, two ranks on each.
  EXPECT_EQ(threads_of({cores(0, 8), cores(0, 8), cores(8, 8), cores(8, 8)}, 16),
            std::vector<int>(4, 4));
  // Overlapping masks: the core both may use counts half for each.
  EXPECT_EQ(threads_of({cores(0, 3), cores(2, 3)}, 16), std::vector<int>({2, 2}));
  EXPECT_EQ(threads_of(std::vector<CoreSet>(3, {0}), 16), std::vector<int>(3, 1));
}

// Read from this process: at least one, never more than the machine's.
TEST(HostThreads, CountsTheCoresThisProcessMayUse) {
  const CoreSet mine = this_process_cores();
  EXPECT_FALSE(mine.empty());
  const int alone = threads_per_rank({mine}, 0, static_cast<int>(mine.size()));
  EXPECT_EQ(alone, static_cast<int>(mine.size()));
  const unsigned machine = std::thread::hardware_concurrency();
  if (machine > 0) {
    EXPECT_LE(alone, static_cast<int>(machine));
  }
}

// The newest step directory counts, in the save directory or a tensor-parallel rank's; an
// unfinished save's temporary directory, files and other names do not.
TEST(SaveDir, NewestSavedStep) {
  namespace fs = std::filesystem;
  const fs::path dir = testing::TempDir() + "save_dir_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_EQ(newest_saved_step(dir.string()), std::nullopt);
  fs::create_directories(dir / ".tmp_step_00000009");
  fs::create_directories(dir / "step_x");
  std::ofstream(dir / "step_00000008") << "a file, not a step directory";
  EXPECT_EQ(newest_saved_step(dir.string()), std::nullopt);
  fs::create_directories(dir / "step_00000002");
  fs::create_directories(dir / "step_00000004");
  EXPECT_EQ(newest_saved_step(dir.string()), 4);
  fs::create_directories(dir / "tp_rank_01" / "step_00000006");
  EXPECT_EQ(newest_saved_step(dir.string()), 6);
  EXPECT_EQ(newest_saved_step((dir / "missing").string()), std::nullopt);
  fs::remove_all(dir);
}

TEST(SaveDir, IsWithin) {
  namespace fs = std::filesystem;
  const fs::path dir = testing::TempDir() + "within_" + std::to_string(getpid());
  fs::create_directories(dir / "run" / "step_00000002");
  fs::create_directory_symlink(dir / "run", dir / "link");
  const std::string run = (dir / "run").string();
  EXPECT_TRUE(is_within(run, run));
  EXPECT_TRUE(is_within(run + "/", run));
  EXPECT_TRUE(is_within(run + "/step_00000002", run));
  EXPECT_TRUE(is_within(run + "/latest", run + "/"));
  EXPECT_TRUE(is_within((dir / "link" / "step_00000002").string(), run)) << "through a link";
  EXPECT_TRUE(is_within(run + "/../run/step_00000002", run));
  EXPECT_FALSE(is_within(run + "2", run)) << "a sibling whose name starts alike";
  EXPECT_FALSE(is_within(dir.string(), run));
  EXPECT_FALSE(is_within((dir / "other").string(), run));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zero::examples
