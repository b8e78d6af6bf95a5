// The zero-tokenize executable: every byte one token, read back through TokenData (the loader
// the trainer uses) byte for byte; the validation split at the end; a fortunes file when the
// Debian package is installed; and bad arguments (a message naming the problem, exit code 2,
// no file written).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "models/token_data.h"
#include "tests/run_program.h"
#include "tests/whole_file.h"

namespace {

namespace fs = std::filesystem;
using Words = std::vector<std::string>;
using zero::testing::ProgramOutcome;

ProgramOutcome run_tokenize(const Words& args) {
  return zero::testing::run_program(ZERO_TOKENIZE_PATH, args);
}

// The bytes a token file holds, each token checked to be a byte.
std::string token_bytes(const std::string& path) {
  const zero::models::TokenData data(path);
  std::vector<uint16_t> tokens(data.size());
  data.read_tokens(0, tokens.size(), tokens.data());
  EXPECT_LT(data.max_token(), 256) << path;
  return std::string(tokens.begin(), tokens.end());
}

class ZeroTokenizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zero_tokenize_test_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string write_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  // Runs with `args`, expects exit code 2 with `message` and the usage on stderr, and that
  // neither output file was made.
  void expect_usage_error(const Words& args, const std::string& message) const {
    const ProgramOutcome outcome = run_tokenize(args);
    EXPECT_EQ(outcome.exit_code, 2) << outcome.err;
    EXPECT_NE(outcome.err.find("zero-tokenize: " + message), std::string::npos) << outcome.err;
    EXPECT_NE(outcome.err.find("usage: zero-tokenize"), std::string::npos) << outcome.err;
    EXPECT_FALSE(fs::exists(path("out.bin")));
    EXPECT_FALSE(fs::exists(path("val.bin")));
  }

  std::string dir_;
};

TEST_F(ZeroTokenizeTest, EveryByteIsOneTokenInInputOrder) {
  const std::string text = "Hello, world!\n";
  const std::string binary("\x00\xff\xc3\xa9 end", 8);
  const std::string a = write_text("a.txt", text);
  const std::string b = write_text("b.txt", binary);
  const ProgramOutcome outcome = run_tokenize({a, b, "--out", path("out.bin")});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.out,
            "wrote " + path("out.bin") + ": 22 tokens (vocabulary 256) from 2 input file(s)\n");
  EXPECT_EQ(token_bytes(path("out.bin")), text + binary);
  EXPECT_EQ(fs::file_size(path("out.bin")), 1024u + 2 * 22);
  // Only the output is left: the temporary file was renamed, not copied.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 3);
}

TEST_F(ZeroTokenizeTest, ValidationFileGetsTheLastFraction) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
  const std::string input = write_text("in.txt", text);

  ProgramOutcome outcome =
      run_tokenize({input, "--out", path("out.bin"), "--val-out", path("val.bin")});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_NE(outcome.out.find(path("out.bin") + ": 90 tokens"), std::string::npos) << outcome.out;
  EXPECT_NE(outcome.out.find(path("val.bin") + ": 10 validation tokens"), std::string::npos)
      << outcome.out;
  EXPECT_EQ(token_bytes(path("out.bin")), text.substr(0, 90));
  EXPECT_EQ(token_bytes(path("val.bin")), text.substr(90));

  outcome = run_tokenize(
      {input, "--val-fraction", "0.25", "--val-out", path("val.bin"), "--out", path("out.bin")});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_NE(outcome.out.find("(the last 0.25 of the input)"), std::string::npos) << outcome.out;
  EXPECT_EQ(token_bytes(path("out.bin")), text.substr(0, 75));
  EXPECT_EQ(token_bytes(path("val.bin")), text.substr(75));
}

// English text from the Debian `fortunes` package (scripts/setup.sh installs it).
TEST_F(ZeroTokenizeTest, FortunesRoundTrip) {
  const std::string fortunes = "/usr/share/games/fortunes/fortunes";
  if (!fs::exists(fortunes)) GTEST_SKIP() << fortunes << " is missing (package fortunes)";
  const std::string text = zero::read_whole_file(fortunes);
  ASSERT_GT(text.size(), 1000u);
  const ProgramOutcome outcome =
      run_tokenize({fortunes, "--out", path("out.bin"), "--val-out", path("val.bin")});
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  const size_t val = text.size() / 10;
  EXPECT_NE(outcome.out.find(": " + std::to_string(text.size() - val) + " tokens"),
            std::string::npos)
      << outcome.out;
  EXPECT_EQ(token_bytes(path("out.bin")) + token_bytes(path("val.bin")), text);
  EXPECT_EQ(zero::models::TokenData(path("val.bin")).size(), val);
}

TEST_F(ZeroTokenizeTest, BadArgumentsAreUsageErrors) {
  const std::string input = write_text("in.txt", "some text to tokenize\n");
  const std::string empty = write_text("empty.txt", "");
  const std::string out = path("out.bin");
  const std::string val = path("val.bin");
  expect_usage_error({}, "no input files");
  expect_usage_error({"--out", out}, "no input files");
  expect_usage_error({input}, "missing --out FILE");
  expect_usage_error({input, "--out"}, "--out needs a value");
  expect_usage_error({input, "--out", out, "--shuffle"}, "unknown option '--shuffle'");
  expect_usage_error({path("missing.txt"), "--out", out},
                     "cannot read '" + path("missing.txt") + "': No such file or directory");
  expect_usage_error({dir_, "--out", out}, "cannot read '" + dir_ + "': Is a directory");
  expect_usage_error({empty, "--out", out}, "the input files are empty");
  expect_usage_error({empty, empty, "--out", out}, "the input files are empty");
  for (const std::string fraction : {"0", "1", "1.5", "-0.1"}) {
    expect_usage_error({input, "--out", out, "--val-out", val, "--val-fraction", fraction},
                       "--val-fraction must be between 0 and 1 (both excluded), got " + fraction);
  }
  expect_usage_error({input, "--out", out, "--val-out", val, "--val-fraction", "half"},
                     "--val-fraction expects a number, got 'half'");
  expect_usage_error({input, "--out", out, "--val-fraction", "0.2"},
                     "--val-fraction needs --val-out");
  expect_usage_error(
      {input, "--out", out, "--val-out", val, "--val-fraction", "0.01"},
      "--val-fraction 0.01 of 22 tokens leaves the training or the validation file empty");
}

// An output that names an input or the other output, by any spelling or link, would destroy
// data (the text replaced by its tokens; the training tokens by the validation ones): refused
// before anything is written, and the input is left as it was.
TEST_F(ZeroTokenizeTest, OutputsNamingAnInputOrEachOtherAreRefused) {
  const std::string text = "some text that must survive\n";
  const std::string input = write_text("in.txt", text);
  const std::string other = write_text("other.txt", text);
  fs::create_hard_link(input, path("hard.txt"));
  fs::create_symlink(input, path("soft.txt"));
  const std::string out = path("out.bin");
  const std::string val = path("val.bin");
  expect_usage_error({input, "--out", input}, "--out " + input + " is also input " + input);
  expect_usage_error({other, input, "--out", dir_ + "/./in.txt"},
                     "--out " + dir_ + "/./in.txt is also input " + input);
  expect_usage_error({input, "--out", path("hard.txt")},
                     "--out " + path("hard.txt") + " is also input " + input);
  expect_usage_error({path("soft.txt"), "--out", input},
                     "--out " + input + " is also input " + path("soft.txt"));
  expect_usage_error({input, "--out", out, "--val-out", input},
                     "--val-out " + input + " is also input " + input);
  expect_usage_error({input, "--out", out, "--val-out", out},
                     "--out and --val-out name the same file " + out);
  expect_usage_error({input, "--out", out, "--val-out",
                      dir_ + "/../" + fs::path(dir_).filename().string() + "/out.bin"},
                     "--out and --val-out name the same file " + out);
  EXPECT_EQ(zero::read_whole_file(input), text);
  EXPECT_EQ(zero::read_whole_file(other), text);
}

TEST_F(ZeroTokenizeTest, UnwritableOutputExitsOne) {
  const std::string input = write_text("in.txt", "text\n");
  const std::string out = path("no/such/dir/out.bin");
  const ProgramOutcome outcome = run_tokenize({input, "--out", out});
  EXPECT_EQ(outcome.exit_code, 1) << outcome.err;
  EXPECT_NE(outcome.err.find("cannot create " + out), std::string::npos) << outcome.err;
}

}  // namespace
