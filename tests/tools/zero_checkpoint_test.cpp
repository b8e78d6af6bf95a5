// The zero-checkpoint executable: bad arguments (exit 2 with the usage), a missing checkpoint
// (exit 1 naming it), and info, verify and export on the checkpoint the reshard fixture saved at
// 4 ranks and stage 3 (tests/runtime/CMakeLists.txt): the exported safetensors file, read with a
// reader written from the specification, holds every parameter with the saved master's values.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tests/runtime/checkpoint_util.h"
#include "zero/runtime/checkpoint.h"

namespace zero::testing {
namespace {

struct Outcome {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs zero-checkpoint with args; its output goes to files, read once it has exited.
Outcome run_tool(const std::vector<std::string>& args) {
  char out_name[] = "/tmp/zero_checkpoint_test_out_XXXXXX";
  char err_name[] = "/tmp/zero_checkpoint_test_err_XXXXXX";
  const int out_fd = mkstemp(out_name);
  const int err_fd = mkstemp(err_name);
  if (out_fd < 0 || err_fd < 0)
    throw std::runtime_error(std::string("mkstemp: ") + strerror(errno));
  const pid_t child = fork();
  if (child < 0) throw std::runtime_error(std::string("fork: ") + strerror(errno));
  if (child == 0) {
    if (dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0) _exit(126);
    std::vector<char*> argv = {const_cast<char*>(ZERO_CHECKPOINT_PATH)};
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(ZERO_CHECKPOINT_PATH, argv.data());
    _exit(127);
  }
  close(out_fd);
  close(err_fd);
  int status = 0;
  if (waitpid(child, &status, 0) != child) throw std::runtime_error("waitpid failed");
  Outcome outcome;
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.out = read_text(out_name);
  outcome.err = read_text(err_name);
  unlink(out_name);
  unlink(err_name);
  return outcome;
}

TEST(ZeroCheckpoint, BadArgumentsExitWithCode2AndTheUsage) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "missing command"},
      {{"reshard", "x"}, "unknown command 'reshard'"},
      {{"info"}, "info needs a checkpoint directory"},
      {{"verify", "x", "extra"}, "unexpected argument 'extra'"},
      {{"export", "x"}, "export needs --to"},
      {{"export", "x", "--to"}, "--to needs a value"},
      {{"export", "x", "--to", "m.safetensors", "--dtype", "fp16"}, "--dtype must be fp32 or bf16"},
      {{"export", "x", "--out", "m"}, "unknown option '--out'"},
  };
  for (const auto& c : cases) {
    const Outcome o = run_tool(c.first);
    EXPECT_EQ(o.exit_code, 2) << c.second;
    EXPECT_NE(o.err.find(c.second), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("usage: zero-checkpoint"), std::string::npos) << o.err;
  }
}

TEST(ZeroCheckpoint, MissingCheckpointExitsWith1NamingIt) {
  const Outcome o = run_tool({"verify", "/nonexistent/checkpoints"});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("no checkpoint at /nonexistent/checkpoints"), std::string::npos) << o.err;
}

TEST(ZeroCheckpoint, InfoVerifyAndExportOfASavedCheckpoint) {
  const std::string dir = ZERO_CHECKPOINT_FIXTURE;
  const Outcome info = run_tool({"info", dir});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("saved by     4 ranks, ZeRO stage 3, dtype fp32"), std::string::npos)
      << info.out;
  EXPECT_NE(info.out.find("step 10, seed 7"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("rank_00003.bin"), std::string::npos) << info.out;
  const Outcome verify = run_tool({"verify", dir});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;

  const CheckpointInfo saved = read_checkpoint_info(dir);
  const std::vector<std::vector<float>> master = read_full_master(saved);
  char name[] = "/tmp/zero_checkpoint_export_XXXXXX";
  ASSERT_NE(mkdtemp(name), nullptr);
  for (const std::string dtype : {"fp32", "bf16"}) {
    const std::string path = std::string(name) + "/model.safetensors";
    const Outcome exported = run_tool({"export", dir, "--to", path, "--dtype", dtype});
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
    const SafetensorsFile file = read_safetensors(path);
    ASSERT_EQ(file.tensors.size(), saved.params.size());
    for (size_t p = 0; p < saved.params.size(); ++p) {
      EXPECT_EQ(file.tensors[p].first, saved.params[p].name);
      EXPECT_EQ(file.tensors[p].second.shape, saved.params[p].shape);
      std::vector<float> expected = master[p];
      if (dtype == "bf16") {
        for (float& v : expected) v = bf16_to_float(float_to_bf16(v));
      }
      EXPECT_EQ(file.tensors[p].second.values, expected) << saved.params[p].name;
    }
  }
  std::filesystem::remove_all(name);
}

}  // namespace
}  // namespace zero::testing
