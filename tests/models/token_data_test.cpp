// TokenData: llm.c's token files checked header by header, file lists and globs in their order,
// llm.c's batch positions (wrap included, and the same batch for a resumed run), micro-batch
// slices that add up to the batch, the first out-of-vocabulary token, and the PyTorch
// reference's tokens.bin (129 tokens: the same 4 x 32 batch at every step).
#include "models/token_data.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "zero/core/check.h"

namespace {

namespace fs = std::filesystem;
using zero::models::TokenData;

// A scratch directory per test, removed afterwards.
class TokenDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zero_token_data_test_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A file of `header` (padded with zeros to 256 int32) and `tokens`, byte for byte, so that
  // bad files can be made; returns its path.
  std::string write_raw(const std::string& name, std::vector<int32_t> header,
                        const std::vector<uint16_t>& tokens) const {
    header.resize(256, 0);
    std::ofstream out(path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()),
              static_cast<std::streamsize>(header.size() * sizeof(int32_t)));
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
    EXPECT_TRUE(out.good());
    return path(name);
  }

  // A valid token file through the library's writer; returns its path.
  std::string write(const std::string& name, const std::vector<uint16_t>& tokens) const {
    zero::models::write_token_file(path(name), tokens);
    return path(name);
  }

  std::string dir_;
};

std::vector<uint16_t> iota_tokens(size_t count, uint16_t first = 0) {
  std::vector<uint16_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<uint16_t>(first + i);
  return tokens;
}

struct Sequences {
  std::vector<float> inputs;
  std::vector<int32_t> targets;
};

// Sequences first..first + count - 1 of the B x T batch at `step`.
Sequences read_slice(const TokenData& data, long step, int B, int T, int first, int count) {
  const size_t size = static_cast<size_t>(count) * static_cast<size_t>(T);
  Sequences s{std::vector<float>(size), std::vector<int32_t>(size)};
  data.read_sequences(step, B, T, first, count, s.inputs.data(), s.targets.data());
  return s;
}

// The whole B x T batch at `step`.
Sequences read_batch(const TokenData& data, long step, int B, int T) {
  return read_slice(data, step, B, T, 0, B);
}

std::vector<uint16_t> all_tokens(const TokenData& data) {
  std::vector<uint16_t> tokens(data.size());
  data.read_tokens(0, data.size(), tokens.data());
  return tokens;
}

// Expects fn to throw zero::Error whose message contains every one of `needles`.
template <typename Fn>
void expect_error_with(Fn fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const zero::Error& e) {
    const std::string message = e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos)
          << "message '" << message << "' does not contain '" << needle << "'";
    }
  }
}

void open_fails(const std::string& spec, std::initializer_list<std::string> needles) {
  expect_error_with([&] { TokenData data(spec); }, needles);
}

TEST_F(TokenDataTest, FileShorterThanTheHeader) {
  std::ofstream(path("short.bin")) << "tiny";
  open_fails(path("short.bin"), {path("short.bin"), "4 bytes, shorter than the 1024-byte header"});
}

TEST_F(TokenDataTest, WrongMagicIsNotATokenFile) {
  const std::string file = write_raw("magic.bin", {20240521, 1, 3}, {1, 2, 3});
  open_fails(file, {file, "not an llm.c token file", "magic 20240521"});
}

TEST_F(TokenDataTest, UnsupportedVersion) {
  const std::string file = write_raw("v2.bin", {20240520, 2, 3}, {1, 2, 3});
  open_fails(file, {file, "version 2", "only version 1"});
}

TEST_F(TokenDataTest, CountZero) {
  const std::string file = write_raw("empty.bin", {20240520, 1, 0}, {});
  open_fails(file, {file, "holds no tokens"});
}

TEST_F(TokenDataTest, TruncatedFile) {
  const std::string file = write_raw("cut.bin", {20240520, 1, 10}, iota_tokens(9));
  open_fails(file, {file, "is truncated", "10 tokens (1044 bytes)", "1042 bytes"});
}

TEST_F(TokenDataTest, TrailingBytes) {
  const std::string file = write_raw("long.bin", {20240520, 1, 10}, iota_tokens(11));
  open_fails(file, {file, "2 trailing bytes after its 10 tokens"});
}

TEST_F(TokenDataTest, ABadFileAmongGoodOnesIsNamed) {
  write("a.bin", iota_tokens(5));
  const std::string bad = write_raw("b.bin", {7, 1, 1}, {1});
  open_fails(path("*.bin"), {bad, "not an llm.c token file"});
}

TEST_F(TokenDataTest, MissingFileOrPatternIsNamed) {
  open_fails(path("none.bin"), {path("none.bin"), "matches no file"});
  write("a.bin", iota_tokens(5));
  open_fails(path("a.bin") + "," + path("train_*.bin"), {path("train_*.bin"), "matches no file"});
  open_fails(path("a.bin") + ",," + path("a.bin"), {"empty item"});
}

TEST_F(TokenDataTest, WrittenFileHasLlmcHeaderAndTokens) {
  const std::vector<uint16_t> tokens = {0, 1, 255, 50256, 65535};
  const std::string file = write("out.bin", tokens);
  EXPECT_EQ(fs::file_size(file), 1024u + 2 * tokens.size());
  std::ifstream in(file, std::ios::binary);
  std::vector<int32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 5);
  for (size_t i = 3; i < header.size(); ++i) EXPECT_EQ(header[i], 0) << "header int " << i;
  const TokenData data(file);
  EXPECT_EQ(data.size(), tokens.size());
  EXPECT_EQ(all_tokens(data), tokens);
  EXPECT_EQ(data.token(3), 50256);
  // Written through a temporary file that is renamed: nothing else is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  expect_error_with([&] { zero::models::write_token_file(path("none.bin"), {}); },
                    {path("none.bin"), "at least one token"});
}

TEST_F(TokenDataTest, GlobMatchesAreSortedByNameAndListsKeepTheirOrder) {
  write("shard_b.bin", iota_tokens(3, 10));
  write("shard_a.bin", iota_tokens(2, 0));
  write("shard_c.bin", iota_tokens(4, 20));
  write("extra.bin", iota_tokens(1, 99));

  const TokenData globbed(path("shard_*.bin"));
  EXPECT_EQ(globbed.files(), (std::vector<std::string>{path("shard_a.bin"), path("shard_b.bin"),
                                                       path("shard_c.bin")}));
  EXPECT_EQ(globbed.size(), 9u);
  EXPECT_EQ(all_tokens(globbed), (std::vector<uint16_t>{0, 1, 10, 11, 12, 20, 21, 22, 23}));

  const TokenData listed(path("extra.bin") + "," + path("shard_c.bin") + "," + path("shard_?.bin"));
  EXPECT_EQ(listed.files(),
            (std::vector<std::string>{path("extra.bin"), path("shard_c.bin"), path("shard_a.bin"),
                                      path("shard_b.bin"), path("shard_c.bin")}));
  EXPECT_EQ(all_tokens(listed),
            (std::vector<uint16_t>{99, 20, 21, 22, 23, 0, 1, 10, 11, 12, 20, 21, 22, 23}));
  // Ranges across file boundaries, and single tokens anywhere.
  std::vector<uint16_t> middle(6);
  listed.read_tokens(4, 6, middle.data());
  EXPECT_EQ(middle, (std::vector<uint16_t>{23, 0, 1, 10, 11, 12}));
  EXPECT_EQ(listed.token(0), 99);
  EXPECT_EQ(listed.token(13), 23);
  expect_error_with([&] { listed.token(14); }, {"past the end", "14 tokens"});
}

// llm.c's loader, step by step: read at p, advance by B*T, start over when the next batch
// would run past the end.
std::vector<size_t> llmc_positions(size_t size, int B, int T, int steps) {
  const size_t bt = static_cast<size_t>(B) * static_cast<size_t>(T);
  std::vector<size_t> positions;
  size_t p = 0;
  for (int s = 0; s < steps; ++s) {
    positions.push_back(p);
    p += bt;
    if (p + bt + 1 > size) p = 0;
  }
  return positions;
}

TEST_F(TokenDataTest, BatchPositionsFollowLlmcAndWrap) {
  for (const size_t size : {17u, 97u, 100u, 112u, 113u}) {
    const TokenData data(write("data.bin", iota_tokens(size)));
    const long batches = static_cast<long>((size - 1) / 16);
    EXPECT_EQ(data.batches_per_pass(2, 8), batches) << size << " tokens";
    const std::vector<size_t> expected = llmc_positions(size, 2, 8, 30);
    for (long s = 0; s < 30; ++s) {
      EXPECT_EQ(data.batch_start(s, 2, 8), expected[static_cast<size_t>(s)])
          << "step " << s << ", " << size << " tokens";
    }
  }
}

TEST_F(TokenDataTest, SequencesAreTheTokensAfterTheBatchStart) {
  // 97 tokens, B*T = 16: 6 batches; the last one (at 80) ends with the file's last token.
  const TokenData data(write("data.bin", iota_tokens(97, 1000)));
  const int B = 2;
  const int T = 8;
  for (const long step : {0L, 3L, 5L, 6L, 11L}) {
    const auto [inputs, targets] = read_batch(data, step, B, T);
    const size_t p = static_cast<size_t>(step % 6) * 16;
    for (int i = 0; i < B; ++i) {
      for (int j = 0; j < T; ++j) {
        const size_t k = static_cast<size_t>(i * T + j);
        EXPECT_EQ(inputs[k], static_cast<float>(1000 + p + k)) << "step " << step << " at " << k;
        EXPECT_EQ(targets[k], static_cast<int32_t>(1000 + p + k + 1))
            << "step " << step << " at " << k;
      }
    }
    if (step % 6 == 5) {
      EXPECT_EQ(targets.back(), 1096);
    }
  }
}

TEST_F(TokenDataTest, ResumedRunReadsTheBatchOfItsStep) {
  const std::string file = write("data.bin", iota_tokens(300));
  const int B = 3;
  const int T = 7;
  // An uninterrupted run keeps one reader for steps 0..39 ...
  std::vector<std::vector<float>> run;
  {
    const TokenData data(file);
    for (long s = 0; s < 40; ++s) run.push_back(read_batch(data, s, B, T).inputs);
  }
  // ... and a run resumed at step 27 opens the files anew and reads the same batches.
  const TokenData resumed(file);
  for (long s = 27; s < 40; ++s) {
    EXPECT_EQ(read_batch(resumed, s, B, T).inputs, run[static_cast<size_t>(s)]) << "step " << s;
  }
  // 299 / 21 = 14 batches per pass: step 14 is step 0 again, step 27 is step 13.
  EXPECT_EQ(run[14], run[0]);
  EXPECT_EQ(run[27], run[13]);
  EXPECT_NE(run[13], run[0]);
}

TEST_F(TokenDataTest, SlicesConcatenateToTheWholeBatch) {
  // Three files of odd sizes, so sequences straddle file boundaries.
  write("s0.bin", iota_tokens(37, 0));
  write("s1.bin", iota_tokens(23, 37));
  write("s2.bin", iota_tokens(51, 60));
  const TokenData data(path("s*.bin"));
  const int B = 4;
  const int T = 6;
  for (const long step : {0L, 1L, 2L, 4L, 9L}) {
    const Sequences whole = read_batch(data, step, B, T);
    // Ranks x micro-batches: 1x4, 2x2, 4x1 and an uneven 1+3.
    for (const std::vector<int>& counts : {std::vector<int>{4}, std::vector<int>{2, 2},
                                           std::vector<int>{1, 1, 1, 1}, std::vector<int>{1, 3}}) {
      std::vector<float> in;
      std::vector<int32_t> tg;
      int first = 0;
      for (const int count : counts) {
        const Sequences part = read_slice(data, step, B, T, first, count);
        in.insert(in.end(), part.inputs.begin(), part.inputs.end());
        tg.insert(tg.end(), part.targets.begin(), part.targets.end());
        first += count;
      }
      EXPECT_EQ(in, whole.inputs) << "step " << step << ", " << counts.size() << " slices";
      EXPECT_EQ(tg, whole.targets) << "step " << step << ", " << counts.size() << " slices";
    }
  }
}

TEST_F(TokenDataTest, TooFewTokensAndBadSlicesAreErrors) {
  const TokenData data(write("data.bin", iota_tokens(16)));
  expect_error_with([&] { data.batches_per_pass(2, 8); },
                    {"holds 16 tokens", "2 x 8 needs at least 17"});
  EXPECT_EQ(data.batches_per_pass(3, 5), 1);
  std::vector<float> in(15);
  std::vector<int32_t> tg(15);
  expect_error_with([&] { data.read_sequences(0, 3, 5, 2, 2, in.data(), tg.data()); },
                    {"sequences [2, 4) are not within a batch of 3"});
  expect_error_with([&] { data.read_sequences(-1, 3, 5, 0, 1, in.data(), tg.data()); },
                    {"at least 0, got -1"});
}

TEST_F(TokenDataTest, FirstTokenOutsideTheVocabularyIsLocated) {
  write("a.bin", {3, 200, 7});
  write("b.bin", {1, 2, 300, 4, 400, 5});
  const TokenData data(path("a.bin") + "," + path("b.bin"));
  EXPECT_EQ(data.max_token(), 400);

  const auto at = [&](int limit) { return data.first_token_at_least(limit); };
  ASSERT_TRUE(at(256).has_value());
  EXPECT_EQ(at(256)->file, path("b.bin"));
  EXPECT_EQ(at(256)->index, 2u);
  EXPECT_EQ(at(256)->token, 300);
  ASSERT_TRUE(at(301).has_value());
  EXPECT_EQ(at(301)->index, 4u);
  EXPECT_EQ(at(301)->token, 400);
  ASSERT_TRUE(at(200).has_value());
  EXPECT_EQ(at(200)->file, path("a.bin"));
  EXPECT_EQ(at(200)->index, 1u);
  EXPECT_FALSE(at(401).has_value());
}

// The PyTorch reference (tests/data/gpt2, copied from gen_gpt2_golden.py's output) trains three
// steps on tokens[:-1].view(4, 32) and tokens[1:].view(4, 32) of its 129 tokens: the loader
// must give exactly that batch at every step.
TEST(TokenDataReference, TokensBinIsOneBatchAtEveryStep) {
  const std::string file = std::string(ZERO_SOURCE_DIR) + "/tests/data/gpt2/tokens.bin";
  const TokenData data(file);
  ASSERT_EQ(data.size(), 129u);
  EXPECT_LT(data.max_token(), 256);
  EXPECT_FALSE(data.first_token_at_least(256).has_value());
  const int B = 4;
  const int T = 32;
  EXPECT_EQ(data.batches_per_pass(B, T), 1);
  const std::vector<uint16_t> tokens = all_tokens(data);
  for (long step = 0; step < 3; ++step) {
    const auto [inputs, targets] = read_batch(data, step, B, T);
    for (size_t k = 0; k < inputs.size(); ++k) {
      ASSERT_EQ(inputs[k], static_cast<float>(tokens[k])) << "step " << step << " at " << k;
      ASSERT_EQ(targets[k], tokens[k + 1]) << "step " << step << " at " << k;
    }
  }
}

}  // namespace
