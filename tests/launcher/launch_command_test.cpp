// zerorun's command building without starting anything: argument parsing, the mpirun argv for
// hosts we describe (root or not, few or many cores, ZERO_* variables), PATH search, quoting.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "zero/kernels/check.h"
#include "zero/launcher/launch_command.h"

namespace zero::launcher {
namespace {

using Words = std::vector<std::string>;

TEST(ParseArguments, ReadsRanksDryRunAndProgram) {
  const LaunchRequest request =
      parse_arguments({"-np", "4", "--dry-run", "--", "/bin/echo", "hi", "there"});
  EXPECT_EQ(request.ranks, 4);
  EXPECT_TRUE(request.dry_run);
  EXPECT_FALSE(request.help);
  EXPECT_EQ(request.program, (Words{"/bin/echo", "hi", "there"}));
}

// Everything from the first non-option word on belongs to the program, options included.
TEST(ParseArguments, ProgramStartsAtFirstNonOption) {
  const LaunchRequest request = parse_arguments({"-np", "2", "train", "-np", "9", "--dry-run"});
  EXPECT_EQ(request.ranks, 2);
  EXPECT_FALSE(request.dry_run);
  EXPECT_EQ(request.program, (Words{"train", "-np", "9", "--dry-run"}));
}

TEST(ParseArguments, HelpNeedsNothingElse) {
  EXPECT_TRUE(parse_arguments({"--help"}).help);
  EXPECT_TRUE(parse_arguments({"-h"}).help);
}

void expect_usage_error(const Words& args, const std::string& needle) {
  try {
    parse_arguments(args);
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not name '" << needle << "'";
  }
}

TEST(ParseArguments, RejectsBadFlags) {
  expect_usage_error({}, "missing -np");
  expect_usage_error({"/bin/true"}, "missing -np");
  expect_usage_error({"-np"}, "-np needs a number");
  expect_usage_error({"-np", "0", "/bin/true"}, "at least 1");
  expect_usage_error({"-np", "-3", "/bin/true"}, "'-3'");
  expect_usage_error({"-np", "abc", "/bin/true"}, "'abc'");
  expect_usage_error({"-np", "2x", "/bin/true"}, "'2x'");
  expect_usage_error({"-np", "", "/bin/true"}, "''");
  expect_usage_error({"-np", "99999999999", "/bin/true"}, "too large");
  expect_usage_error({"-np", "2"}, "no program");
  expect_usage_error({"-np", "2", "--"}, "no program");
  expect_usage_error({"--frobnicate", "-np", "2", "/bin/true"}, "'--frobnicate'");
}

LaunchRequest request_for(int ranks, const Words& program) {
  LaunchRequest request;
  request.ranks = ranks;
  request.program = program;
  return request;
}

HostFacts host_with(bool is_root, unsigned cores, const Words& environment = {}) {
  HostFacts host;
  host.is_root = is_root;
  host.cores = cores;
  host.environment = environment;
  return host;
}

TEST(BuildMpirunCommand, PlainWhenNotRootAndRanksFit) {
  EXPECT_EQ(build_mpirun_command("/opt/mpi/mpirun", request_for(4, {"train", "--steps", "10"}),
                                 host_with(false, 8, {"PATH=/bin", "HOME=/root"})),
            (Words{"/opt/mpi/mpirun", "-np", "4", "train", "--steps", "10"}));
}

TEST(BuildMpirunCommand, RootIsAllowedExplicitly) {
  EXPECT_EQ(build_mpirun_command("mpirun", request_for(2, {"train"}), host_with(true, 8)),
            (Words{"mpirun", "-np", "2", "--allow-run-as-root", "train"}));
}

// As many ranks as cores fit; one more needs oversubscription, yielding and no binding.
TEST(BuildMpirunCommand, OversubscribesOnlyWhenRanksExceedCores) {
  EXPECT_EQ(build_mpirun_command("mpirun", request_for(2, {"train"}), host_with(false, 2)),
            (Words{"mpirun", "-np", "2", "train"}));
  EXPECT_EQ(build_mpirun_command("mpirun", request_for(3, {"train"}), host_with(false, 2)),
            (Words{"mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", "--mca",
                   "mpi_yield_when_idle", "1", "train"}));
}

// Only names that start with ZERO_ (and have more after it), each once, sorted.
TEST(BuildMpirunCommand, ForwardsZeroVariables) {
  const HostFacts host = host_with(false, 8,
                                   {"ZERO_STAGE=3", "PATH=/bin", "ZERO_A=x=y", "ZEROX=1",
                                    "MY_ZERO_C=2", "ZERO_=4", "ZERO_STAGE=1", "zero_lower=5"});
  EXPECT_EQ(build_mpirun_command("mpirun", request_for(2, {"train"}), host),
            (Words{"mpirun", "-np", "2", "-x", "ZERO_A", "-x", "ZERO_STAGE", "train"}));
}

TEST(BuildMpirunCommand, AllFlagsTogether) {
  EXPECT_EQ(
      build_mpirun_command("mpirun", request_for(4, {"/bin/echo", "hi"}),
                           host_with(true, 1, {"ZERO_LOG=debug"})),
      (Words{"mpirun", "-np", "4", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
             "--mca", "mpi_yield_when_idle", "1", "-x", "ZERO_LOG", "/bin/echo", "hi"}));
}

TEST(BuildMpirunCommand, RejectsRequestsParseWouldRefuse) {
  EXPECT_THROW(build_mpirun_command("mpirun", request_for(0, {"train"}), host_with(false, 2)),
               Error);
  EXPECT_THROW(build_mpirun_command("mpirun", request_for(2, {}), host_with(false, 2)), Error);
}

TEST(CurrentHost, DescribesThisProcess) {
  ASSERT_EQ(setenv("ZERO_LAUNCHER_TEST_PROBE", "1", 1), 0);
  const HostFacts host = current_host();
  EXPECT_EQ(host.is_root, geteuid() == 0);
  EXPECT_GE(host.cores, 1u);
  EXPECT_NE(
      std::find(host.environment.begin(), host.environment.end(), "ZERO_LAUNCHER_TEST_PROBE=1"),
      host.environment.end());
  ASSERT_EQ(unsetenv("ZERO_LAUNCHER_TEST_PROBE"), 0);
}

// A scratch directory with an executable, a plain file and a subdirectory.
class ScratchDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zero_launcher_test_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
    write_file(dir_ + "/tool", 0755);
    write_file(dir_ + "/data", 0644);
    ASSERT_EQ(mkdir((dir_ + "/sub").c_str(), 0755), 0);
  }
  void TearDown() override {
    std::remove((dir_ + "/tool").c_str());
    std::remove((dir_ + "/data").c_str());
    rmdir((dir_ + "/sub").c_str());
    rmdir(dir_.c_str());
  }
  static void write_file(const std::string& path, mode_t mode) {
    std::ofstream(path) << "#!/bin/sh\n";
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
  }
  std::string dir_;
};

TEST_F(ScratchDir, FindExecutableSearchesThePathList) {
  const std::string path_list = "/nonexistent_zero_dir::" + dir_;
  EXPECT_EQ(find_executable("tool", path_list), dir_ + "/tool");
  EXPECT_EQ(find_executable("data", path_list), "");  // not executable
  EXPECT_EQ(find_executable("sub", path_list), "");   // a directory
  EXPECT_EQ(find_executable("missing", path_list), "");
  EXPECT_EQ(find_executable("", path_list), "");
  EXPECT_EQ(find_executable("tool", "/nonexistent_zero_dir"), "");
}

TEST_F(ScratchDir, FindExecutableTakesPathsAsGiven) {
  EXPECT_EQ(find_executable(dir_ + "/tool", ""), dir_ + "/tool");
  EXPECT_EQ(find_executable(dir_ + "/data", ""), "");
  EXPECT_EQ(find_executable(dir_ + "/missing", "/bin"), "");
}

TEST_F(ScratchDir, CheckProgramNamesTheProblem) {
  EXPECT_NO_THROW(check_program(dir_ + "/tool"));
  auto message_of = [](const std::string& program) {
    try {
      check_program(program);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of(dir_ + "/data").find("is not executable"), std::string::npos);
  EXPECT_NE(message_of(dir_ + "/sub").find("is not a regular file"), std::string::npos);
  EXPECT_NE(message_of(dir_ + "/missing").find("No such file"), std::string::npos);
  EXPECT_NE(message_of("zero_no_such_program_anywhere").find("not found on PATH"),
            std::string::npos);
}

TEST(ShellJoin, QuotesOnlyWhereNeeded) {
  EXPECT_EQ(shell_join({"/usr/bin/mpirun", "-np", "4", "a=b,c:d@e%f+g_h"}),
            "/usr/bin/mpirun -np 4 a=b,c:d@e%f+g_h");
  EXPECT_EQ(shell_join({"echo", "two words", "it's", "", "$HOME", "a*b"}),
            "echo 'two words' 'it'\\''s' '' '$HOME' 'a*b'");
}

}  // namespace
}  // namespace zero::launcher
