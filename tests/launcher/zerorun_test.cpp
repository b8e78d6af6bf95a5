// The zerorun executable end to end: the printed dry-run command (one host, or two from a
// hostfile), real two-rank jobs whose exit codes come back through mpirun, variables and the
// node-local rank reaching the ranks, and the errors (exit code 2) for bad flags, bad hostfiles,
// a missing program and a missing mpirun.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/run_program.h"
#include "zero/launcher/launch_command.h"

namespace {

using Words = std::vector<std::string>;
using Variables = std::vector<std::pair<std::string, std::string>>;
using zero::testing::ProgramOutcome;
using zero::testing::throw_errno;

// This process's environment minus every variable zerorun forwards, plus `variables`: a job sees
// only the variables its test sets.
std::vector<std::string> job_environment(const Variables& variables) {
  const std::vector<std::string> inherited = zero::launcher::current_host().environment;
  const std::vector<std::string> forwarded = zero::launcher::forwarded_variables(inherited);
  std::set<std::string> replaced(forwarded.begin(), forwarded.end());
  for (const auto& [name, value] : variables) replaced.insert(name);
  std::vector<std::string> environment;
  for (const std::string& entry : inherited) {
    if (replaced.count(entry.substr(0, entry.find('='))) == 0) environment.push_back(entry);
  }
  for (const auto& [name, value] : variables) environment.push_back(name + "=" + value);
  return environment;
}

ProgramOutcome run_zerorun(const Words& args, const Variables& variables = {}) {
  return zero::testing::run_program(ZERORUN_PATH, args, job_environment(variables));
}

std::string find_mpirun() {
  const char* path = std::getenv("PATH");
  return zero::launcher::find_executable("mpirun", path != nullptr ? path : "");
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Zerorun, DryRunPrintsTheMpirunCommand) {
  const std::string mpirun = find_mpirun();
  ASSERT_FALSE(mpirun.empty()) << "these tests need mpirun on PATH";
  const ProgramOutcome outcome = run_zerorun({"--dry-run", "-np", "4", "--", "/bin/echo", "hi"});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  std::string expected = mpirun + " -np 4";
  if (geteuid() == 0) expected += " --allow-run-as-root";
  if (zero::launcher::current_host().cores < 4) {
    expected += " --oversubscribe --bind-to none --mca mpi_yield_when_idle 1";
  }
  std::string out = outcome.out;
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string blas_core = zero::launcher::current_host().blas_core;
    if (!blas_core.empty()) expected += " -x OPENBLAS_CORETYPE=" + blas_core;
  } else {
    // job_environment() leaves the variable out, so zerorun goes by OpenBLAS's own choice of
    // core, which this process (its OpenBLAS started with the variable) cannot see: the flag
    // may or may not be there, naming one of the cores zerorun picks.
    for (const std::string core : {"Haswell", "SkylakeX"}) {
      const std::string flag = " -x OPENBLAS_CORETYPE=" + core;
      const size_t at = out.find(flag);
      if (at != std::string::npos) out.erase(at, flag.size());
    }
  }
  expected += " /bin/echo hi\n";
  EXPECT_EQ(out, expected);
  EXPECT_EQ(outcome.err, "");
}

TEST(Zerorun, DryRunForwardsZeroVariables) {
  const ProgramOutcome outcome = run_zerorun({"--dry-run", "-np", "1", "/bin/true"},
                                             {{"ZERO_TEST_B", "1"}, {"ZERO_TEST_A", "two words"}});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_TRUE(contains(outcome.out, " -x ZERO_TEST_A -x ZERO_TEST_B /bin/true\n")) << outcome.out;
}

// A hostfile in the working directory of the test, removed when the test ends.
class Hostfile {
 public:
  explicit Hostfile(const std::string& text) {
    char name[] = "/tmp/zerorun_test_hosts_XXXXXX";
    const int fd = mkstemp(name);
    if (fd < 0) throw_errno("mkstemp");
    close(fd);
    path_ = name;
    std::ofstream(path_) << text;
  }
  ~Hostfile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string root_flag() {
  return geteuid() == 0 ? " --allow-run-as-root" : "";
}

TEST(Zerorun, DryRunWithTwoHostHostfile) {
  const Hostfile hosts("# cluster\nnode-a slots=4\n\nnode-b slots=2  # spare\n");
  const ProgramOutcome outcome =
      run_zerorun({"--hostfile", hosts.path(), "--dry-run", "--", "/bin/echo", "hi"},
                  {{"ZERO_STAGE", "3"}, {"OMP_NUM_THREADS", "1"}, {"NCCL_DEBUG", "INFO"}});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.out, find_mpirun() + " -np 6" + root_flag() +
                             " --host node-a:4,node-b:2 --map-by slot --bind-to none"
                             " -x NCCL_DEBUG -x OMP_NUM_THREADS -x ZERO_STAGE /bin/echo hi\n");
  EXPECT_EQ(outcome.err, "");
}

TEST(Zerorun, DryRunWithHostfileNpAndNumGpus) {
  const Hostfile hosts("node-a slots=4\nnode-b slots=2\n");
  const ProgramOutcome capped =
      run_zerorun({"--hostfile", hosts.path(), "--num_gpus", "1", "--dry-run", "/bin/true"});
  ASSERT_EQ(capped.exit_code, 0) << capped.err;
  EXPECT_EQ(capped.out, find_mpirun() + " -np 2" + root_flag() +
                            " --host node-a:1,node-b:1 --map-by slot --bind-to none /bin/true\n");

  const ProgramOutcome fewer =
      run_zerorun({"--hostfile", hosts.path(), "-np", "3", "--dry-run", "/bin/true"});
  ASSERT_EQ(fewer.exit_code, 0) << fewer.err;
  EXPECT_EQ(fewer.out, find_mpirun() + " -np 3" + root_flag() +
                           " --host node-a:4,node-b:2 --map-by slot --bind-to none /bin/true\n");

  const ProgramOutcome too_many =
      run_zerorun({"--hostfile", hosts.path(), "-np", "7", "/bin/true"});
  EXPECT_EQ(too_many.exit_code, 2);
  EXPECT_EQ(too_many.err,
            "zerorun: -np 7 exceeds the 6 slots of hostfile '" + hosts.path() + "'\n");
  EXPECT_EQ(too_many.out, "");
}

TEST(Zerorun, BadHostfileExits2NamingTheLine) {
  const Hostfile hosts("node-a slots=4\nnode-b slots=two\n");
  const ProgramOutcome outcome = run_zerorun({"--hostfile", hosts.path(), "/bin/true"});
  EXPECT_EQ(outcome.exit_code, 2);
  EXPECT_EQ(outcome.err,
            "zerorun: " + hosts.path() + ":2: slots needs a positive whole number, got 'two'\n");
  EXPECT_EQ(outcome.out, "");

  const ProgramOutcome missing = run_zerorun({"--hostfile", "/nonexistent/hosts", "/bin/true"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err,
            "zerorun: cannot read hostfile '/nonexistent/hosts': No such file or directory\n");
}

// A real job from a hostfile naming this host: every rank learns its node-local rank from
// OpenMPI, and the two local ranks are 0 and 1 (each rank checks its own; a bad one fails the job).
TEST(Zerorun, HostfileJobRanksKnowTheirLocalRank) {
  const Hostfile hosts("localhost slots=2\n");
  const Words probe = {"--hostfile",
                       hosts.path(),
                       "--",
                       "/bin/sh",
                       "-c",
                       "test \"$OMPI_COMM_WORLD_LOCAL_RANK\" = \"$OMPI_COMM_WORLD_RANK\" && "
                       "test \"$OMPI_COMM_WORLD_SIZE\" = 2 && test \"$ZERO_TEST_PROBE\" = yes"};
  const ProgramOutcome outcome = run_zerorun(probe, {{"ZERO_TEST_PROBE", "yes"}});
  EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
}

TEST(Zerorun, JobExitCodeComesBack) {
  const ProgramOutcome ok = run_zerorun({"-np", "2", "--", "/bin/true"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  const ProgramOutcome failed = run_zerorun({"-np", "2", "--", "/bin/false"});
  EXPECT_NE(failed.exit_code, 0) << failed.err;
}

// Each rank checks the variable itself, so a rank that did not receive it fails the job.
TEST(Zerorun, RanksSeeZeroVariables) {
  const Words probe = {"-np", "2", "--", "/bin/sh", "-c", "test \"$ZERO_TEST_PROBE\" = yes"};
  EXPECT_EQ(run_zerorun(probe, {{"ZERO_TEST_PROBE", "yes"}}).exit_code, 0);
  EXPECT_NE(run_zerorun(probe, {{"ZERO_TEST_PROBE", "no"}}).exit_code, 0);
}

// ZERO_MPIRUN replaces mpirun: with /bin/echo as "mpirun" the job prints its own arguments.
TEST(Zerorun, ZeroMpirunOverridesPathSearch) {
  const ProgramOutcome outcome =
      run_zerorun({"-np", "2", "/bin/true"}, {{"ZERO_MPIRUN", "/bin/echo"}});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.out.compare(0, 6, "-np 2 "), 0) << outcome.out;
  EXPECT_TRUE(contains(outcome.out, " /bin/true\n")) << outcome.out;
}

TEST(Zerorun, BadFlagsPrintUsageAndExit2) {
  for (const Words& args :
       {Words{}, Words{"-np"}, Words{"-np", "0", "/bin/true"}, Words{"-np", "two", "/bin/true"},
        Words{"-np", "2"}, Words{"--bogus", "-np", "2", "/bin/true"}, Words{"--hostfile"},
        Words{"--num_gpus", "0", "/bin/true"}, Words{"--num_gpus", "1", "-np", "2", "/bin/true"}}) {
    const ProgramOutcome outcome = run_zerorun(args);
    EXPECT_EQ(outcome.exit_code, 2) << outcome.err;
    EXPECT_TRUE(contains(outcome.err, "usage: zerorun")) << outcome.err;
    EXPECT_EQ(outcome.out, "");
  }
}

TEST(Zerorun, HelpPrintsUsageAndExits0) {
  const ProgramOutcome outcome = run_zerorun({"--help"});
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_TRUE(contains(outcome.out, "usage: zerorun")) << outcome.out;
}

TEST(Zerorun, MissingProgramOrMpirunExit2) {
  const ProgramOutcome no_program = run_zerorun({"-np", "2", "/nonexistent/zero_program"});
  EXPECT_EQ(no_program.exit_code, 2);
  EXPECT_TRUE(contains(no_program.err, "/nonexistent/zero_program")) << no_program.err;

  const ProgramOutcome not_executable = run_zerorun({"-np", "2", "/etc/passwd"});
  EXPECT_EQ(not_executable.exit_code, 2);
  EXPECT_TRUE(contains(not_executable.err, "not executable")) << not_executable.err;

  const ProgramOutcome no_mpirun =
      run_zerorun({"-np", "2", "/bin/true"}, {{"ZERO_MPIRUN", "/nonexistent/mpirun"}});
  EXPECT_EQ(no_mpirun.exit_code, 2);
  EXPECT_TRUE(contains(no_mpirun.err, "ZERO_MPIRUN")) << no_mpirun.err;

  const ProgramOutcome mpirun_not_on_path = run_zerorun({"-np", "2", "/bin/true"}, {{"PATH", "/"}});
  EXPECT_EQ(mpirun_not_on_path.exit_code, 2);
  EXPECT_TRUE(contains(mpirun_not_on_path.err, "mpirun not found")) << mpirun_not_on_path.err;
}

}  // namespace
