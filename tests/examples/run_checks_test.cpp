// zero-train's host checks on their own: a GPU run's host threads per rank, and what a save
// directory holds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "examples/run_checks.h"

namespace zero::examples {
namespace {

// Unbound, the node's online cores are shared out among its ranks, the remainder left over,
// and no rank gets fewer than one, however many share the node.
TEST(HostThreads, AnUnboundRankTakesItsShareOfTheCores) {
  EXPECT_EQ(threads_per_rank(16, 16, 1), 16);
  EXPECT_EQ(threads_per_rank(16, 16, 8), 2);
  EXPECT_EQ(threads_per_rank(16, 16, 3), 5);
  EXPECT_EQ(threads_per_rank(2, 2, 4), 1);
  EXPECT_EQ(threads_per_rank(1, 1, 0), 1);
  EXPECT_EQ(threads_per_rank(0, 16, 4), 4) << "an unreadable mask counts as unbound";
}

// A rank a launcher bound to some cores (mpirun --bind-to core or socket) has its share in
// its mask already: it takes all of them, not a share of them.
TEST(HostThreads, ABoundRankTakesTheCoresItWasGiven) {
  EXPECT_EQ(threads_per_rank(1, 16, 8), 1);
  EXPECT_EQ(threads_per_rank(8, 16, 2), 8);
  EXPECT_EQ(threads_per_rank(4, 16, 8), 4);
}

// Read from this process: at least one, never more than the machine's.
TEST(HostThreads, CountsTheCoresThisProcessMayUse) {
  const int alone = host_threads_per_rank(1);
  EXPECT_GE(alone, 1);
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
