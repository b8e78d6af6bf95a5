// The monitors' files, read back as their readers read them: the TensorBoard event file through
// its TFRecord framing (parsed here with a CRC32C of the test's own, so that the writer's is not
// checked against itself) and the Event messages through protobuf; the CSV files byte for byte
// as DeepSpeed's csvMonitor writes them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/whole_file.h"
#include "zero/proto/tensorboard_event.pb.h"
#include "zero/runtime/monitor.h"

namespace zero {
namespace {

namespace fs = std::filesystem;

// Bit by bit, reflected polynomial 0x82F63B78: slow and obviously right.
uint32_t reference_crc32c(const unsigned char* data, size_t size) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t reference_masked(const unsigned char* data, size_t size) {
  const uint32_t crc = reference_crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("zero_monitor_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

// The records of an event file, framing and CRCs checked the test's own way.
std::vector<tensorboard::Event> events_of(const std::string& text) {
  std::vector<tensorboard::Event> events;
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  size_t at = 0;
  while (at < text.size()) {
    EXPECT_GE(text.size() - at, 16u);
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[at + static_cast<size_t>(i)];
    uint32_t length_crc = 0, data_crc = 0;
    std::memcpy(&length_crc, bytes + at + 8, 4);
    std::memcpy(&data_crc, bytes + at + 12 + length, 4);
    EXPECT_EQ(length_crc, reference_masked(bytes + at, 8));
    EXPECT_EQ(data_crc, reference_masked(bytes + at + 12, length));
    tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromArray(bytes + at + 12, static_cast<int>(length)));
    events.push_back(event);
    at += 12 + length + 4;
  }
  EXPECT_EQ(at, text.size());
  return events;
}

TEST(Monitor, TensorBoardEventFileReadsBack) {
  const fs::path dir = fresh_dir("tensorboard");
  std::string path;
  {
    TensorBoardWriter writer((dir / "job").string());
    path = writer.path();
    writer.write_scalar("Train/Samples/train_loss", 2.718281828, 0);
    writer.write_scalar("Train/Samples/lr", 0.001, 8);
  }
  EXPECT_EQ(fs::path(path).parent_path(), dir / "job");
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);

  const std::vector<tensorboard::Event> events = events_of(read_whole_file(path));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_GT(events[0].wall_time(), 1.6e9);
  ASSERT_EQ(events[1].summary().value_size(), 1);
  EXPECT_EQ(events[1].summary().value(0).tag(), "Train/Samples/train_loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.718281828f);
  EXPECT_EQ(events[1].step(), 0);
  EXPECT_EQ(events[2].summary().value(0).tag(), "Train/Samples/lr");
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 0.001f);
  EXPECT_EQ(events[2].step(), 8);
  EXPECT_EQ(read_tfrecords(path).size(), 3u);
  fs::remove_all(dir);
}

TEST(Monitor, CorruptedRecordIsRefusedByItsCrc) {
  const fs::path dir = fresh_dir("corrupt");
  std::string path;
  {
    TensorBoardWriter writer(dir.string());
    path = writer.path();
    writer.write_scalar("Train/Samples/train_loss", 1.5, 4);
  }
  std::string text = read_whole_file(path);
  const size_t first_record = 8 + 4 + read_tfrecords(path)[0].size() + 4;
  text[first_record + 12 + 5] ^= 0x01;  // a byte of the scalar's Event
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  try {
    read_tfrecords(path);
    FAIL() << "a flipped byte was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("record 1 at byte " + std::to_string(first_record) +
                                         ": the data's CRC does not match"),
              std::string::npos)
        << e.what();
  }
  // A file cut inside a record is refused too.
  text.resize(text.size() - 2);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  EXPECT_THROW(read_tfrecords(path), Error);
  fs::remove_all(dir);
}

TEST(Monitor, CsvFilesAreDeepSpeedsLayout) {
  const fs::path dir = fresh_dir("csv");
  {
    CsvMonitorWriter csv(dir.string());
    csv.write({"Train/Samples/train_loss", 2.5, 0});
    csv.write({"Train/Samples/lr", 0.001, 8});
    csv.write({"Train/Samples/train_loss", static_cast<double>(0.1f), 8});
  }
  EXPECT_EQ(read_whole_file(dir / "Train_Samples_train_loss.csv"),
            "step,train_loss\r\n0,2.5\r\n8,0.10000000149011612\r\n");
  EXPECT_EQ(read_whole_file(dir / "Train_Samples_lr.csv"), "step,lr\r\n8,0.001\r\n");
  // A second writer (a resumed run) appends, with a header of its own, as DeepSpeed's "a+" does.
  CsvMonitorWriter(dir.string()).write({"Train/Samples/lr", 1e-05, 16});
  EXPECT_EQ(read_whole_file(dir / "Train_Samples_lr.csv"),
            "step,lr\r\n8,0.001\r\nstep,lr\r\n16,1e-05\r\n");
  fs::remove_all(dir);
}

TEST(Monitor, FloatsAreWrittenAsPythonWritesThem) {
  EXPECT_EQ(python_float_text(2.0), "2.0");
  EXPECT_EQ(python_float_text(0.1), "0.1");
  EXPECT_EQ(python_float_text(-1.5), "-1.5");
  EXPECT_EQ(python_float_text(0.0001), "0.0001");
  EXPECT_EQ(python_float_text(0.00001), "1e-05");
  EXPECT_EQ(python_float_text(2.5e-07), "2.5e-07");
  EXPECT_EQ(python_float_text(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_text(1e16), "1e+16");
  EXPECT_EQ(python_float_text(123456.789), "123456.789");
  EXPECT_EQ(python_float_text(65536.0), "65536.0");
  EXPECT_EQ(python_float_text(1.5e300), "1.5e+300");
  EXPECT_EQ(python_float_text(0.0), "0.0");
  EXPECT_EQ(python_float_text(std::nan("")), "nan");
  EXPECT_EQ(python_float_text(-HUGE_VAL), "-inf");
}

TEST(Monitor, DirectoryThatCannotBeMadeIsNamed) {
  const fs::path dir = fresh_dir("blocked");
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "not a directory";
  MonitorConfig csv;
  csv.enabled = true;
  csv.output_path = (dir / "file").string();
  csv.job_name = "run";
  try {
    Monitors monitors(MonitorConfig{}, csv);
    FAIL() << "a directory under a file was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot create csv_monitor directory '" +
                                         (dir / "file" / "run").string() + "'"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(Monitor, LogDirJoinsAsDeepSpeedDoes) {
  MonitorConfig config;
  EXPECT_EQ(config.log_dir(), "DeepSpeedJobName");
  config.output_path = "runs/";
  config.job_name = "a";
  EXPECT_EQ(config.log_dir(), "runs/a");
  config.output_path = "runs";
  EXPECT_EQ(config.log_dir(), "runs/a");
}

}  // namespace
}  // namespace zero
