// zerorun's command building without starting anything: argument parsing, hostfiles, the mpirun
// argv for hosts we describe (root or not, few or many cores, forwarded variables, hostfile hosts
// capped by --num_gpus), PATH search, quoting.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "zero/core/check.h"
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

TEST(ParseArguments, ReadsHostfileAndNumGpus) {
  const LaunchRequest request =
      parse_arguments({"--hostfile", "hosts.txt", "--num_gpus", "2", "train", "--lr", "1"});
  EXPECT_EQ(request.hostfile, "hosts.txt");
  EXPECT_EQ(request.num_gpus, 2);
  EXPECT_EQ(request.ranks, 0);  // the hostfile decides
  EXPECT_EQ(request.program, (Words{"train", "--lr", "1"}));

  // -np may join a hostfile, and may exceed --num_gpus there: the hostfile has several hosts.
  const LaunchRequest both =
      parse_arguments({"--hostfile", "h", "--num_gpus", "2", "-np", "6", "t"});
  EXPECT_EQ(both.ranks, 6);
  EXPECT_EQ(both.num_gpus, 2);
}

// Without a hostfile, --num_gpus alone says how many ranks this host starts.
TEST(ParseArguments, NumGpusAloneIsEnoughOnOneHost) {
  const LaunchRequest request = parse_arguments({"--num_gpus", "3", "train"});
  EXPECT_EQ(request.ranks, 0);
  EXPECT_EQ(request.num_gpus, 3);
  EXPECT_TRUE(request.hostfile.empty());
  EXPECT_EQ(parse_arguments({"--num_gpus", "3", "-np", "3", "train"}).ranks, 3);
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
  expect_usage_error({"--num_gpus", "2"}, "no program");
  expect_usage_error({"--hostfile", "h"}, "no program");
  expect_usage_error({"--hostfile"}, "--hostfile needs a file name");
  expect_usage_error({"--hostfile", "", "/bin/true"}, "--hostfile needs a file name, got ''");
  expect_usage_error({"--num_gpus"}, "--num_gpus needs a number");
  expect_usage_error({"--num_gpus", "0", "/bin/true"}, "--num_gpus must be at least 1, got 0");
  expect_usage_error({"--num_gpus", "x", "/bin/true"},
                     "--num_gpus needs a positive whole number, got 'x'");
  expect_usage_error(
      {"--num_gpus", "2", "-np", "3", "/bin/true"},
      "-np 3 exceeds --num_gpus 2 (without a hostfile every rank runs on this host)");
  expect_usage_error({"--tp"}, "--tp needs a tensor-parallel size");
  expect_usage_error({"--tp", "0", "-np", "2", "/bin/true"}, "--tp must be at least 1, got 0");
  expect_usage_error({"--tp", "2", "-np", "3", "/bin/true"},
                     "3 ranks do not divide into tensor-parallel groups of --tp 2");
  expect_usage_error({"--tp", "2", "--num_gpus", "3", "/bin/true"},
                     "3 ranks do not divide into tensor-parallel groups of --tp 2");
  expect_usage_error({"--pp"}, "--pp needs a number of pipeline stages");
  expect_usage_error({"--pp", "0", "-np", "2", "/bin/true"}, "--pp must be at least 1, got 0");
  expect_usage_error({"--pp", "2", "--tp", "2", "-np", "6", "/bin/true"},
                     "6 ranks do not divide into --pp 2 pipeline stages of tensor-parallel "
                     "groups of 2");
  EXPECT_EQ(parse_arguments({"--pp", "2", "--tp", "2", "-np", "8", "t"}).pipeline_stages, 2);
  // With a hostfile --num_gpus caps each host, whose slots --tp then rounds to whole groups.
  EXPECT_EQ(parse_arguments({"--hostfile", "h", "--num_gpus", "3", "--tp", "2", "t"}).num_gpus, 3);
}

TEST(ParseHostfile, ReadsHostsSlotsCommentsAndBlankLines) {
  const std::string text =
      "# two training nodes\n"
      "\n"
      "node-a slots=4\n"
      "   \t \n"
      "\tnode-b\t  slots=2   # the small one\n"
      "10.0.0.7 slots=1";  // no newline at the end
  EXPECT_EQ(parse_hostfile(text, "hosts"),
            (std::vector<HostSlots>{{"node-a", 4}, {"node-b", 2}, {"10.0.0.7", 1}}));
}

std::string hostfile_error(const std::string& text) {
  try {
    parse_hostfile(text, "hosts");
  } catch (const HostfileError& e) {
    return e.what();
  }
  return "no error";
}

// Every bad line is named by file:line with what is wrong with it.
TEST(ParseHostfile, BadLinesNameFileLineAndProblem) {
  EXPECT_EQ(hostfile_error("node-a slots=4\nnode-b\n"), "hosts:2: host 'node-b' has no slots=N");
  EXPECT_EQ(hostfile_error("node-a slots=4 # slots=2\nnode-b # slots=2\n"),
            "hosts:2: host 'node-b' has no slots=N");
  EXPECT_EQ(hostfile_error("# header\nnode-a slots=four\n"),
            "hosts:2: slots needs a positive whole number, got 'four'");
  EXPECT_EQ(hostfile_error("node-a slots=0"), "hosts:1: slots must be at least 1, got 0");
  EXPECT_EQ(hostfile_error("node-a slots=-2"),
            "hosts:1: slots needs a positive whole number, got '-2'");
  EXPECT_EQ(hostfile_error("node-a slots=1.5"),
            "hosts:1: slots needs a positive whole number, got '1.5'");
  EXPECT_EQ(hostfile_error("node-a slots="),
            "hosts:1: slots needs a positive whole number, got ''");
  EXPECT_EQ(hostfile_error("node-a slots=99999999999"), "hosts:1: slots 99999999999 is too large");
  EXPECT_EQ(hostfile_error("node-a slots=4\n\nnode-b slots=2\nnode-a slots=1\n"),
            "hosts:4: host 'node-a' is already listed on line 1");
  EXPECT_EQ(hostfile_error("node-a slots=4 gpus=4\n"),
            "hosts:1: unknown token 'gpus=4' (expected 'host slots=N')");
  EXPECT_EQ(hostfile_error("node-a slots 4\n"),
            "hosts:1: unknown token 'slots' (expected 'host slots=N')");
  EXPECT_EQ(hostfile_error("node-a slots=4 slots=2\n"),
            "hosts:1: slots given twice for host 'node-a'");
  EXPECT_EQ(hostfile_error("slots=4\n"), "hosts:1: missing host name before 'slots=4'");
  EXPECT_EQ(hostfile_error("node-a,node-b slots=4\n"),
            "hosts:1: host name 'node-a,node-b' may not contain ',' or ':'");
  EXPECT_EQ(hostfile_error("node-a:2 slots=4\n"),
            "hosts:1: host name 'node-a:2' may not contain ',' or ':'");
  // A leading '-' would reach mpirun and ssh as an option (ssh -oProxyCommand=... runs it).
  EXPECT_EQ(hostfile_error("node-a slots=2\n-oProxyCommand=touch slots=1\n"),
            "hosts:2: missing host name before '-oProxyCommand=touch'");
  EXPECT_EQ(hostfile_error("node-a slots=2\n-evil slots=1\n"),
            "hosts:2: host name '-evil' may not start with '-' (ssh would read it as an option)");
  EXPECT_EQ(hostfile_error("# nothing but comments\n\n"), "hosts: no hosts listed");
  EXPECT_EQ(hostfile_error(""), "hosts: no hosts listed");
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

// The same forwarding rules for other variables: NCCL_* by prefix, four by exact name.
TEST(ForwardedVariables, PicksRuntimeThreadAndDeviceVariables) {
  EXPECT_EQ(forwarded_variables(
                {"NCCL_DEBUG=INFO", "NCCL_=1", "OMP_NUM_THREADS=2", "OMP_PROC_BIND=true",
                 "OPENBLAS_NUM_THREADS=1", "OPENBLAS_CORETYPE=Haswell", "CUDA_VISIBLE_DEVICES=0,1",
                 "CUDA_HOME=/usr/local/cuda", "ZERO_STAGE=3", "HOME=/root", "MY_NCCL_X=1"}),
            (Words{"CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE",
                   "OPENBLAS_NUM_THREADS", "ZERO_STAGE"}));
  EXPECT_EQ(forwarded_variables({}), Words{});
}

// A sanitized build's ranks on other hosts get the job's sanitizer options (suppressions).
TEST(ForwardedVariables, PicksSanitizerOptions) {
  EXPECT_EQ(forwarded_variables({"ASAN_OPTIONS=detect_leaks=1", "LSAN_OPTIONS=suppressions=x",
                                 "UBSAN_OPTIONS=halt_on_error=1", "TSAN_OPTIONS=a=1",
                                 "MSAN_OPTIONS=b=1"}),
            (Words{"ASAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS"}));
}

TEST(BuildMpirunCommand, NumGpusAloneStartsThatManyRanksHere) {
  LaunchRequest request = request_for(0, {"train"});
  request.num_gpus = 3;
  EXPECT_EQ(build_mpirun_command("mpirun", request, host_with(false, 8)),
            (Words{"mpirun", "-np", "3", "train"}));
}

const std::vector<HostSlots> kTwoHosts = {{"node-a", 4}, {"node-b", 2}};

LaunchRequest hostfile_request(int ranks, int num_gpus) {
  LaunchRequest request = request_for(ranks, {"train", "--steps", "3"});
  request.hostfile = "hosts";
  request.num_gpus = num_gpus;
  return request;
}

// The whole command for a two-host hostfile: every slot gets a rank, ranks fill the hosts in
// order, nothing is bound, and the variables travel to the other host.
TEST(BuildMpirunCommand, TwoHostHostfile) {
  const HostFacts host =
      host_with(true, 2, {"ZERO_STAGE=3", "OMP_NUM_THREADS=4", "NCCL_DEBUG=WARN", "PATH=/bin"});
  EXPECT_EQ(
      shell_join(build_mpirun_command("/usr/bin/mpirun", hostfile_request(0, 0), host, kTwoHosts)),
      "/usr/bin/mpirun -np 6 --allow-run-as-root --host node-a:4,node-b:2 --map-by slot "
      "--bind-to none -x NCCL_DEBUG -x OMP_NUM_THREADS -x ZERO_STAGE train --steps 3");
}

// With a hostfile the slots decide, not this host's cores: no oversubscription flags.
TEST(BuildMpirunCommand, NpTakesFewerRanksThanSlots) {
  EXPECT_EQ(build_mpirun_command("mpirun", hostfile_request(5, 0), host_with(false, 1), kTwoHosts),
            (Words{"mpirun", "-np", "5", "--host", "node-a:4,node-b:2", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
  EXPECT_EQ(
      build_mpirun_command("mpirun", hostfile_request(6, 0), host_with(false, 1), kTwoHosts)[2],
      "6");
}

// The OpenBLAS core type goes to ranks on this host unless the user chose one; never over a
// hostfile, whose hosts may have other CPUs.
TEST(BuildMpirunCommand, SetsTheBetterBlasCoreForRanksHere) {
  HostFacts host = host_with(false, 8);
  host.blas_core = "SkylakeX";
  EXPECT_EQ(build_mpirun_command("mpirun", request_for(2, {"train"}), host),
            (Words{"mpirun", "-np", "2", "-x", "OPENBLAS_CORETYPE=SkylakeX", "train"}));
  host.environment = {"OPENBLAS_CORETYPE=Haswell"};
  EXPECT_EQ(build_mpirun_command("mpirun", request_for(2, {"train"}), host),
            (Words{"mpirun", "-np", "2", "-x", "OPENBLAS_CORETYPE", "train"}));
  host.environment.clear();
  EXPECT_EQ(build_mpirun_command("mpirun", hostfile_request(2, 0), host, kTwoHosts),
            (Words{"mpirun", "-np", "2", "--host", "node-a:4,node-b:2", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
}

std::string hostfile_build_error(const LaunchRequest& request) {
  try {
    build_mpirun_command("mpirun", request, host_with(false, 8), kTwoHosts);
  } catch (const HostfileError& e) {
    return e.what();
  }
  return "no error";
}

TEST(BuildMpirunCommand, NpBeyondSlotsIsAnError) {
  EXPECT_EQ(hostfile_build_error(hostfile_request(7, 0)),
            "-np 7 exceeds the 6 slots of hostfile 'hosts'");
  EXPECT_EQ(hostfile_build_error(hostfile_request(5, 2)),
            "-np 5 exceeds the 4 slots of hostfile 'hosts' (at most 2 per host with --num_gpus)");
}

// --num_gpus caps every host's slots; hosts with fewer slots keep theirs.
TEST(BuildMpirunCommand, NumGpusCapsSlotsPerHost) {
  EXPECT_EQ(build_mpirun_command("mpirun", hostfile_request(0, 3), host_with(false, 8), kTwoHosts),
            (Words{"mpirun", "-np", "5", "--host", "node-a:3,node-b:2", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
  EXPECT_EQ(build_mpirun_command("mpirun", hostfile_request(2, 1), host_with(false, 8), kTwoHosts),
            (Words{"mpirun", "-np", "2", "--host", "node-a:1,node-b:1", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
  EXPECT_EQ(build_mpirun_command("mpirun", hostfile_request(0, 8), host_with(false, 8), kTwoHosts),
            (Words{"mpirun", "-np", "6", "--host", "node-a:4,node-b:2", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
}

// --tp places each tensor-parallel group on one host: every host's slots are used in whole
// groups, and a host too small for one is left out.
TEST(BuildMpirunCommand, TensorParallelGroupsStayOnOneHost) {
  const auto command = [](int ranks, int num_gpus, int tp) {
    LaunchRequest request = hostfile_request(ranks, num_gpus);
    request.tensor_parallel = tp;
    return build_mpirun_command("mpirun", request, host_with(false, 8), kTwoHosts);
  };
  EXPECT_EQ(command(0, 0, 2),
            (Words{"mpirun", "-np", "6", "--host", "node-a:4,node-b:2", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
  EXPECT_EQ(command(0, 0, 3), (Words{"mpirun", "-np", "3", "--host", "node-a:3", "--map-by", "slot",
                                     "--bind-to", "none", "train", "--steps", "3"}));
  EXPECT_EQ(command(4, 3, 2),
            (Words{"mpirun", "-np", "4", "--host", "node-a:2,node-b:2", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
  const auto error = [&](int ranks, int tp) {
    try {
      command(ranks, 0, tp);
    } catch (const HostfileError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(6, 4),
            "-np 6 exceeds the 4 slots of hostfile 'hosts' (in whole tensor-parallel groups of 4 "
            "per host with --tp)");
  EXPECT_EQ(error(0, 5),
            "no host of hostfile 'hosts' has the 5 slots of a whole tensor-parallel group (--tp)");
}

// --pp: the stages are consecutive ranks, which fill the hosts in order; the hostfile's slots must
// divide into the stages.
TEST(BuildMpirunCommand, PipelineStagesTakeConsecutiveRanks) {
  LaunchRequest request = hostfile_request(0, 0);
  request.pipeline_stages = 2;
  EXPECT_EQ(build_mpirun_command("mpirun", request, host_with(false, 8), kTwoHosts),
            (Words{"mpirun", "-np", "6", "--host", "node-a:4,node-b:2", "--map-by", "slot",
                   "--bind-to", "none", "train", "--steps", "3"}));
  request.pipeline_stages = 4;
  testing::expect_error_naming(
      [&] { build_mpirun_command("mpirun", request, host_with(false, 8), kTwoHosts); },
      "6 ranks do not divide into --pp 4 pipeline stages of tensor-parallel groups of 1");
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

TEST_F(ScratchDir, ReadHostfileReadsTheFileOrSaysWhyNot) {
  const std::string path = dir_ + "/hosts";
  std::ofstream(path) << "node-a slots=2\nnode-b slots=1\n";
  EXPECT_EQ(read_hostfile(path), (std::vector<HostSlots>{{"node-a", 2}, {"node-b", 1}}));
  std::ofstream(path) << "node-a slots=2\nnode-b\n";
  try {
    read_hostfile(path);
    ADD_FAILURE() << "no error for a bad hostfile";
  } catch (const HostfileError& e) {
    EXPECT_EQ(std::string(e.what()), path + ":2: host 'node-b' has no slots=N");
  }
  std::remove(path.c_str());
  try {
    read_hostfile(dir_ + "/missing");
    ADD_FAILURE() << "no error for a missing hostfile";
  } catch (const HostfileError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot read hostfile '" + dir_ + "/missing': No such file or directory");
  }
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
