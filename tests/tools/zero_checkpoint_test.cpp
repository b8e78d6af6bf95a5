// The zero-checkpoint executable: bad arguments (exit 2 with the usage), a missing checkpoint
// (exit 1 naming it), and info, verify and export on the checkpoint the reshard fixture saved at
// 4 ranks and stage 3 (tests/runtime/CMakeLists.txt): the exported safetensors file, read with a
// reader written from the specification, holds every parameter with the saved master's values.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/run_program.h"
#include "tests/runtime/checkpoint_util.h"
#include "zero/runtime/checkpoint.h"

namespace zero::testing {
namespace {

ProgramOutcome run_tool(const std::vector<std::string>& args) {
  return run_program(ZERO_CHECKPOINT_PATH, args);
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
    const ProgramOutcome o = run_tool(c.first);
    EXPECT_EQ(o.exit_code, 2) << c.second;
    EXPECT_NE(o.err.find(c.second), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("usage: zero-checkpoint"), std::string::npos) << o.err;
  }
}

TEST(ZeroCheckpoint, MissingCheckpointExitsWith1NamingIt) {
  const ProgramOutcome o = run_tool({"verify", "/nonexistent/checkpoints"});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_NE(o.err.find("no checkpoint at /nonexistent/checkpoints"), std::string::npos) << o.err;
}

// A file that is no checkpoint (here 300 KB of text given where a 'latest' file goes) is named
// with the reason and a short quote of its start, not printed whole into the error.
TEST(ZeroCheckpoint, ANonCheckpointFileIsNamedNotPrinted) {
  char name[] = "/tmp/zero_checkpoint_not_XXXXXX";
  ASSERT_NE(mkdtemp(name), nullptr);
  const std::string file = std::string(name) + "/notes.txt";
  {
    std::ofstream out(file);
    for (int i = 0; i < 10000; ++i) out << "line " << i << " of a text that is no checkpoint\n";
  }
  for (const std::string command : {"info", "verify"}) {
    const ProgramOutcome o = run_tool({command, file});
    EXPECT_EQ(o.exit_code, 1) << o.err.substr(0, 300);
    EXPECT_NE(o.err.find(file + " does not name a step directory"), std::string::npos)
        << o.err.substr(0, 300);
    EXPECT_NE(o.err.find("bytes starting 'line 0 of a text"), std::string::npos)
        << o.err.substr(0, 300);
    EXPECT_LT(o.err.size(), 400u) << o.err.substr(0, 300);
  }
  std::filesystem::remove_all(name);
}

TEST(ZeroCheckpoint, InfoVerifyAndExportOfASavedCheckpoint) {
  const std::string dir = ZERO_CHECKPOINT_FIXTURE;
  const ProgramOutcome info = run_tool({"info", dir});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("saved by     4 ranks, ZeRO stage 3, dtype fp32"), std::string::npos)
      << info.out;
  EXPECT_NE(info.out.find("step 10, seed 7"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("rank_00003.bin"), std::string::npos) << info.out;
  const ProgramOutcome verify = run_tool({"verify", dir});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;

  const CheckpointInfo saved = read_checkpoint_info(dir);
  const std::vector<std::vector<float>> master = read_full_master({saved});
  char name[] = "/tmp/zero_checkpoint_export_XXXXXX";
  ASSERT_NE(mkdtemp(name), nullptr);
  for (const std::string dtype : {"fp32", "bf16"}) {
    const std::string path = std::string(name) + "/model.safetensors";
    const ProgramOutcome exported = run_tool({"export", dir, "--to", path, "--dtype", dtype});
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

// An export aimed into the checkpoint it reads is refused before anything is written: the
// save directory's `latest`, a shard file, the manifest or a new name in the step directory
// (by any spelling of the path), and the checkpoint still verifies afterwards. A copy of the
// fixture is used, so a failing run cannot damage what the other tests read.
TEST(ZeroCheckpoint, ExportIntoTheCheckpointItReadsIsRefused) {
  namespace fs = std::filesystem;
  char name[] = "/tmp/zero_checkpoint_into_XXXXXX";
  ASSERT_NE(mkdtemp(name), nullptr);
  const std::string save_dir = name;
  const fs::path fixture = ZERO_CHECKPOINT_FIXTURE;
  const std::string step = fixture.filename().string();
  fs::copy(fixture, save_dir + "/" + step, fs::copy_options::recursive);
  { std::ofstream(save_dir + "/latest") << step << "\n"; }
  const std::string step_dir = save_dir + "/" + step;
  const std::vector<std::string> inside = {
      save_dir + "/latest",
      step_dir + "/rank_00000.bin",
      step_dir + "/manifest.pbtxt",
      step_dir + "/model.safetensors",
      save_dir + "/../" + fs::path(save_dir).filename().string() + "/" + step + "/rank_00001.bin",
  };
  for (const std::string& source : {save_dir, step_dir, save_dir + "/latest"}) {
    for (const std::string& to : inside) {
      const ProgramOutcome o = run_tool({"export", source, "--to", to});
      EXPECT_EQ(o.exit_code, 2) << source << " --to " << to << ": " << o.err;
      EXPECT_NE(o.err.find("--to " + to + " is inside the checkpoint it exports"),
                std::string::npos)
          << o.err;
    }
  }
  EXPECT_FALSE(fs::exists(step_dir + "/model.safetensors"));
  const ProgramOutcome verify = run_tool({"verify", save_dir});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  // Beside the checkpoint, in the save directory itself, is fine.
  const ProgramOutcome beside = run_tool({"export", save_dir, "--to", save_dir + "/m.safetensors"});
  EXPECT_EQ(beside.exit_code, 0) << beside.err;
  fs::remove_all(save_dir);
}

}  // namespace
}  // namespace zero::testing
