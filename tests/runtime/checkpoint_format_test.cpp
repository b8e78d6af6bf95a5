// Checkpoint formats in one process: CRC32C against published vectors, a checkpoint written
// by hand from proto/checkpoint.proto's description (so the reader's element mapping is checked
// against the documented byte layout, not against our own writer), manifests that are
// truncated, corrupt or inconsistent, path resolution, and the safetensors writer read back with
// a reader written from the format's specification.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/runtime/checkpoint_util.h"
#include "zero/runtime/checkpoint.h"

namespace zero::testing {
namespace {

namespace fs = std::filesystem;

// RFC 3720 (iSCSI) appendix B.4 and the common "123456789" check value.
TEST(Crc32c, KnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  std::vector<unsigned char> bytes(32, 0);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x8A9136AAu);
  std::fill(bytes.begin(), bytes.end(), 0xFF);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, ContinuesAcrossBuffersAtAnySplit) {
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7 + 3);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    EXPECT_EQ(crc32c(data.data() + split, data.size() - split, crc32c(data.data(), split)), whole)
        << "split at " << split;
  }
}

// World size 2, AdamW (2 state arrays), two units:
//   unit 0: numel 32, shard 16: a [3, 5] at offset 0, b [4] at offset 16 (all in rank 1's half)
//   unit 1: numel 16, shard 8:  c [2, 2, 2] at offset 4 (elements 4-7 in rank 0's file, 8-11 in
//                               rank 1's), empty [0] at offset 12
// Every float in the files is 1000 * unit + 100 * array + the unit element it stands for.
class HandWrittenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/zero_checkpoint_format_test_XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    dir_ = name;
    step_dir_ = dir_ + "/step_00000005";
    fs::create_directories(step_dir_);
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<float> values;
      const size_t shards[2] = {16, 8};
      for (int unit = 0; unit < 2; ++unit) {
        for (int array = 0; array < 3; ++array) {
          for (size_t i = 0; i < shards[unit]; ++i) {
            values.push_back(
                static_cast<float>(1000 * unit + 100 * array + rank * shards[unit] + i));
          }
        }
      }
      const std::string path = step_dir_ + "/rank_0000" + std::to_string(rank) + ".bin";
      std::ofstream(path, std::ios::binary)
          .write(reinterpret_cast<const char*>(values.data()),
                 static_cast<std::streamsize>(values.size() * sizeof(float)));
      crcs_[rank] = crc32c(values.data(), values.size() * sizeof(float));
    }
    write_manifest(body());
    std::ofstream(dir_ + "/latest") << "step_00000005\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string body() const {
    char files[256];
    std::snprintf(files, sizeof(files),
                  "files { rank: 0 name: \"rank_00000.bin\" size: 288 crc32c: %" PRIu32
                  " }\n"
                  "files { rank: 1 name: \"rank_00001.bin\" size: 288 crc32c: %" PRIu32 " }\n",
                  crcs_[0], crcs_[1]);
    return std::string(
               "format_version: 1\nworld_size: 2\nstage: 3\ndtype: \"bf16\"\n"
               "alignment_bytes: 64\n"
               "params { name: \"a\" shape: 3 shape: 5 dtype: \"bf16\" unit: 0 offset: 0 "
               "numel: 15 }\n"
               "params { name: \"b\" shape: 4 dtype: \"bf16\" unit: 0 offset: 16 numel: 4 }\n"
               "params { name: \"c\" shape: 2 shape: 2 shape: 2 dtype: \"bf16\" unit: 1 "
               "offset: 4 numel: 8 module: 1 }\n"
               "params { name: \"empty\" shape: 0 dtype: \"bf16\" unit: 1 offset: 12 numel: 0 "
               "module: 1 }\n"
               "units { numel: 32 shard: 16 }\nunits { numel: 16 shard: 8 }\n"
               "optimizer { type: \"adamw\" lr: 0.001 beta1: 0.9 beta2: 0.999 eps: 1e-08 "
               "weight_decay: 0.01 state_count: 2 step: 5 }\n"
               "lr_schedule { type: \"constant\" max_lr: 0.001 }\n"
               "loss_scaler { scale: 1 hysteresis_left: 2 }\n"
               "trainer { step: 5 seed: 3 }\n") +
           files;
  }

  // The manifest with a correct checksum line, so only the content is at fault.
  void write_manifest(const std::string& text) {
    char trailer[32];
    std::snprintf(trailer, sizeof(trailer), "# crc32c %08" PRIx32 "\n",
                  crc32c(text.data(), text.size()));
    write_raw(text + trailer);
  }
  void write_raw(const std::string& bytes) {
    std::ofstream(step_dir_ + "/manifest.pbtxt", std::ios::binary) << bytes;
  }
  std::string manifest_error() {
    try {
      read_checkpoint_info(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }
  std::string with(const std::string& from, const std::string& to) const {
    std::string text = body();
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  }

  std::string dir_;
  std::string step_dir_;
  uint32_t crcs_[2] = {0, 0};
};

TEST_F(HandWrittenCheckpoint, ReadsTheDocumentedLayout) {
  const CheckpointInfo info = read_checkpoint_info(dir_);
  EXPECT_EQ(info.step_dir, step_dir_);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.stage, 3);
  EXPECT_EQ(info.dtype, DType::kBFloat16);
  EXPECT_EQ(info.trainer.step, 5);
  EXPECT_EQ(info.trainer.seed, 3u);
  EXPECT_EQ(info.optimizer_step, 5);
  EXPECT_EQ(info.state_count, 2);
  EXPECT_EQ(info.loss_scaler.hysteresis_left, 2);
  ASSERT_EQ(info.params.size(), 4u);
  EXPECT_EQ(info.params[2].shape, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_TRUE(verify_checkpoint_files(info).empty());

  const std::vector<std::vector<float>> master = read_full_master({info});
  std::vector<float> a, b, c;
  for (int i = 0; i < 15; ++i) a.push_back(static_cast<float>(i));
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<float>(16 + i));
  for (int i = 0; i < 8; ++i) c.push_back(static_cast<float>(1000 + 4 + i));
  EXPECT_EQ(master[0], a);
  EXPECT_EQ(master[1], b);
  EXPECT_EQ(master[2], c);
  EXPECT_TRUE(master[3].empty());
  // The same through a step directory and through the `latest` file itself.
  EXPECT_EQ(read_checkpoint_info(step_dir_).trainer.step, 5);
  EXPECT_EQ(read_checkpoint_info(dir_ + "/latest").step_dir, step_dir_);
}

TEST_F(HandWrittenCheckpoint, CorruptOrMissingShardFilesNameTheFile) {
  flip_byte(step_dir_ + "/rank_00001.bin", 100);
  const CheckpointInfo info = read_checkpoint_info(dir_);
  const std::vector<std::string> problems = verify_checkpoint_files(info);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("rank_00001.bin: checksum mismatch"), std::string::npos)
      << problems[0];
  try {
    read_full_master({info});
    ADD_FAILURE() << "read a corrupt file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank_00001.bin"), std::string::npos) << e.what();
  }
  fs::remove(step_dir_ + "/rank_00000.bin");
  const std::vector<std::string> both = verify_checkpoint_files(info);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_NE(both[0].find("rank_00000.bin: cannot open"), std::string::npos) << both[0];
  fs::resize_file(step_dir_ + "/rank_00001.bin", 100);
  EXPECT_NE(verify_checkpoint_files(info)[1].find("size is 100 bytes, the manifest says 288"),
            std::string::npos);
}

TEST_F(HandWrittenCheckpoint, BadManifestsAreRefusedWithTheReason) {
  const std::string text = read_whole_file(step_dir_ + "/manifest.pbtxt");
  write_raw(text.substr(0, text.size() - 20));
  EXPECT_NE(manifest_error().find("is truncated"), std::string::npos) << manifest_error();
  std::string changed = text;
  changed[changed.find("stage: 3")] = 'S';
  write_raw(changed);
  EXPECT_NE(manifest_error().find("is corrupt"), std::string::npos) << manifest_error();

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hello\n", "does not parse: line 2 column 1: Message type"},
      {body() + "bogus_field: 1\n", "does not parse"},
      {with("format_version: 1", "format_version: 2"), "format_version 2 is not supported"},
      {with("world_size: 2", "world_size: 4"), "unit 0 has numel 32, not world_size * shard"},
      {with("offset: 4 numel: 8", "offset: 12 numel: 8"), "'c' (offset 12, numel 8) runs past"},
      {with("shape: 3 shape: 5", "shape: 3 shape: 4"), "'a' has shape [3, 4] but numel 15"},
      {with("name: \"b\"", "name: \"a\""), "parameter 'a' appears twice"},
      {with("state_count: 2", "state_count: 1"), "keeps 2 state arrays, the manifest says 1"},
      {with("type: \"adamw\"", "type: \"lion\""), "unknown optimizer type 'lion'"},
      {with("dtype: \"bf16\"\n", "dtype: \"fp8\"\n"), "unknown dtype 'fp8'"},
      {with("size: 288", "size: 280"), "rank_00000.bin is listed with 280 bytes"},
      {with("rank: 1 name: \"rank_00001.bin\"", "rank: 1 name: \"rank_00009.bin\""),
       "expected rank_00001.bin"},
      {with("scale: 1", "scale: -1"), "scale must be positive"},
      {with("shape: 3 shape: 5", "shape: 3 shape: 5 split { dim: 2 parts: 1 full_extent: 5 }"),
       "parameter 'a' [3, 5] has a split dimension outside the shape over tensor_parallel_size 1"},
      {with("shape: 3 shape: 5", "shape: 3 shape: 5 split { dim: 1 parts: 1 full_extent: 10 }"),
       "'a' [3, 5] has a slice whose extent is not its share of the full extent"},
  };
  for (const auto& c : cases) {
    write_manifest(c.first);
    const std::string error = manifest_error();
    EXPECT_NE(error.find(c.second), std::string::npos)
        << "expected '" << c.second << "', got " << error;
    EXPECT_NE(error.find("manifest.pbtxt"), std::string::npos) << error;
  }
}

TEST_F(HandWrittenCheckpoint, UnfinishedSavesAndDanglingPointersAreNeverTakenForWhole) {
  fs::rename(step_dir_, dir_ + "/.tmp_step_00000005");
  EXPECT_NE(manifest_error().find("names step_00000005, but"), std::string::npos)
      << manifest_error();
  try {
    read_checkpoint_info(dir_ + "/.tmp_step_00000005");
    ADD_FAILURE() << "an unfinished save was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unfinished save"), std::string::npos) << e.what();
  }
  fs::remove(dir_ + "/latest");
  EXPECT_NE(manifest_error().find("holds no checkpoint"), std::string::npos) << manifest_error();
  EXPECT_THROW(read_checkpoint_info(dir_ + "/nothing_here"), Error);
}

TEST(Safetensors, WriterOutputParsesFromTheSpec) {
  char name[] = "/tmp/zero_safetensors_test_XXXXXX";
  ASSERT_NE(mkdtemp(name), nullptr);
  const std::string path = std::string(name) + "/m.safetensors";
  const std::vector<float> w = {1.0f, -2.5f, 3.25f, 1e-3f, 65504.0f, 0.1f};
  const std::vector<float> scalar = {42.0f};
  const std::vector<float> empty;
  const std::vector<NamedTensor> tensors = {
      {"layer.weight", {2, 3}, &w}, {"scale", {}, &scalar}, {"nothing", {0, 4}, &empty}};
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    write_safetensors(path, tensors, dtype, {{"format", "pt"}, {"step", "12"}});
    const std::string bytes = read_whole_file(path);
    uint64_t header_size = 0;
    std::memcpy(&header_size, bytes.data(), 8);
    EXPECT_EQ((8 + header_size) % 8, 0u) << "data starts 8-byte aligned";
    const SafetensorsFile file = read_safetensors(path);
    ASSERT_EQ(file.tensors.size(), 3u);
    EXPECT_EQ(file.tensors[0].first, "layer.weight");
    EXPECT_EQ(file.tensors[0].second.shape, (std::vector<int64_t>{2, 3}));
    std::vector<float> expected = w;
    for (float& v : expected) {
      if (dtype == DType::kBFloat16) v = bf16_to_float(float_to_bf16(v));
      if (dtype == DType::kFloat16) v = fp16_to_float(float_to_fp16(v));
    }
    EXPECT_EQ(file.tensors[0].second.values, expected);
    EXPECT_EQ(file.tensors[0].second.dtype, dtype == DType::kFloat32    ? "F32"
                                            : dtype == DType::kBFloat16 ? "BF16"
                                                                        : "F16");
    EXPECT_EQ(file.tensors[1].second.shape, std::vector<int64_t>{});
    EXPECT_EQ(file.tensors[1].second.values, scalar);
    EXPECT_TRUE(file.tensors[2].second.values.empty());
    ASSERT_EQ(file.metadata.size(), 2u);
    // The library's reader gives what the specification's does.
    const LoadedSafetensors loaded = load_safetensors(path);
    ASSERT_EQ(loaded.tensors.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(loaded.tensors[i].name, file.tensors[i].first);
      EXPECT_EQ(loaded.tensors[i].dtype, dtype);
      EXPECT_EQ(loaded.tensors[i].shape, file.tensors[i].second.shape);
      EXPECT_EQ(loaded.tensors[i].values, file.tensors[i].second.values);
    }
    EXPECT_EQ(loaded.metadata, file.metadata);
  }
  const std::vector<float> wrong = {1.0f};
  EXPECT_THROW(write_safetensors(path, {{"x", {2}, &wrong}}, DType::kFloat32, {}), Error);
  EXPECT_THROW(
      write_safetensors(path, {{"x", {1}, &wrong}, {"x", {1}, &wrong}}, DType::kFloat32, {}),
      Error);
  fs::remove_all(name);
}

// An export to a directory's name is refused before anything is written, and a write that
// fails leaves no temporary file beside its target (zero-checkpoint export --to DIR once left
// DIR.tmp behind).
TEST(Safetensors, ADirectoryTargetIsRefusedAndLeavesNothing) {
  const fs::path dir =
      fs::temp_directory_path() / ("zero_safetensors_dir_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "target");
  const std::vector<float> values = {1.0f, 2.0f};
  try {
    write_safetensors((dir / "target").string(), {{"x", {2}, &values}}, DType::kFloat32, {});
    FAIL() << "a directory was taken as the target file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  size_t entries = 0;
  for (const auto& entry : fs::directory_iterator(dir)) entries += entry.path() != dir / "target";
  EXPECT_EQ(entries, 0u) << "something was left beside the target";
  fs::remove_all(dir);
}

// load_safetensors refuses a file whose header and data disagree, naming the file and why.
TEST(Safetensors, ReaderRefusesInconsistentFiles) {
  char name[] = "/tmp/zero_safetensors_bad_XXXXXX";
  ASSERT_NE(mkdtemp(name), nullptr);
  const std::string path = std::string(name) + "/m.safetensors";
  const auto write = [&](const std::string& header, size_t data_bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t size = header.size();
    out.write(reinterpret_cast<const char*>(&size), 8);
    out << header << std::string(data_bytes, '\0');
  };
  const auto error_of = [&]() -> std::string {
    try {
      load_safetensors(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "(read without an error)";
  };
  const auto expect_error = [&](const std::string& header, size_t data_bytes,
                                const std::string& part) {
    write(header, data_bytes);
    const std::string message = error_of();
    EXPECT_NE(message.find("safetensors file " + path + ": " + part), std::string::npos)
        << header << " -> " << message;
  };
  expect_error(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8,
               "tensor 'a' has dtype \"I64\"; F32, BF16 and F16 are read");
  expect_error(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
               "tensor 'a' has 8 bytes for 3 elements");
  expect_error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
               "tensor 'a' has data_offsets outside the data");
  expect_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8,
               "tensor 'a' starts at data byte 4, expected 0");
  expect_error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8,
               "the tensors cover 4 of 8 data bytes");
  expect_error("[1, 2]", 0, "the header is not an object");
  write(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_EQ(load_safetensors(path).tensors.size(), 1u);
  fs::resize_file(path, 12);
  EXPECT_NE(error_of().find("header size"), std::string::npos) << error_of();
  fs::resize_file(path, 3);
  EXPECT_NE(error_of().find("shorter than its 8-byte header size"), std::string::npos);
  fs::remove_all(name);
}

// A resume compares the optimizer the checkpoint was saved with against the run's, lr aside.
TEST(OptimizerDifferences, NamesEachDifferenceAndIgnoresLr) {
  OptimizerConfig saved;
  saved.weight_decay = 0.01f;
  OptimizerConfig run = saved;
  run.lr = 0.5f;  // scheduled: never a difference
  EXPECT_TRUE(optimizer_differences(saved, run).empty());
  run.type = OptimizerType::kAdam;
  run.beta2 = 0.95;
  run.eps = 1e-6f;
  run.weight_decay = 0.0f;
  EXPECT_EQ(optimizer_differences(saved, run),
            (std::vector<std::string>{
                "type AdamW in the checkpoint, Adam (adam_w_mode false) in this run",
                "betas[1] 0.999 in the checkpoint, 0.95 in this run",
                "eps 1e-08 in the checkpoint, 1e-06 in this run",
                "weight_decay 0.01 in the checkpoint, 0 in this run"}));
  OptimizerConfig sgd;
  sgd.type = OptimizerType::kSgd;
  OptimizerConfig sgd_momentum = sgd;
  sgd_momentum.momentum = 0.9f;
  EXPECT_EQ(optimizer_differences(sgd, sgd_momentum),
            std::vector<std::string>{"momentum 0 in the checkpoint, 0.9 in this run"});
}

}  // namespace
}  // namespace zero::testing
