// DeepSpeed's monitors: a run's scalar events (name, value, the samples seen) written as
// TensorBoard event files (tensorboard) and as one CSV file per event (csv_monitor), in the
// layouts DeepSpeed's TensorBoardMonitor and csvMonitor write, so the tools a DeepSpeed user
// reads them with read ours. Rank 0 writes; the caller decides which rank that is.
//
// An event file is TFRecord framing (a little-endian uint64 length, the masked CRC32C of those 8
// bytes, the data, the masked CRC32C of the data) around tensorboard Event messages
// (proto/tensorboard_event.proto, TensorBoard's field numbers): first the version record, then
// one Event per scalar with a Summary holding its tag and simple_value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/runtime/config.h"

namespace zero {

struct MonitorEvent {
  std::string name;  // "Train/Samples/train_loss"
  double value = 0;
  int64_t step = 0;  // DeepSpeed's x axis: samples seen
};

// CRC32C masked as TFRecord files store it (TensorFlow's crc32c::Mask).
uint32_t masked_crc32c(const void* data, size_t size);

// One TensorBoard event file in `log_dir`, which it creates with its parents:
// events.out.tfevents.<seconds>.<host>.<pid>.0, as PyTorch's SummaryWriter names it. Every
// write reaches the file at once (a killed run keeps every event it wrote). Errors throw
// zero::Error naming the file.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // A scalar as TensorBoard's add_scalar writes it: the value as a float (simple_value).
  void write_scalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  int fd_ = -1;
};

// The records of a TFRecord file, each checked against its length and data CRCs. Throws
// zero::Error naming the file, the record and its byte offset when a check fails or the file
// ends inside a record.
std::vector<std::string> read_tfrecords(const std::string& path);

// DeepSpeed's csvMonitor: for event "A/B/name", the file log_dir/A_B_name.csv gets a header
// "step,name" the first time this writer writes it (files are appended to, as DeepSpeed opens
// them "a+"), then a "step,value" line per event, the value as Python prints a float.
class CsvMonitorWriter {
 public:
  // Creates log_dir with its parents; throws zero::Error naming it.
  explicit CsvMonitorWriter(const std::string& log_dir);
  void write(const MonitorEvent& event);

 private:
  std::string log_dir_;
  std::vector<std::string> started_;  // file names this writer has written a header to
};

// `value` as Python's repr(float) writes it: the shortest text that reads back as the same
// double ("0.1", "2.0", "1e-05", "1e+16", "nan", "inf").
std::string python_float_text(double value);

// DeepSpeed's MonitorMaster: the enabled monitors of a config, each event to each.
class Monitors {
 public:
  Monitors() = default;
  // Opens what `tensorboard` and `csv_monitor` enable (creating their directories); throws
  // zero::Error naming the directory or file that cannot be made.
  Monitors(const MonitorConfig& tensorboard, const MonitorConfig& csv_monitor);
  bool enabled() const { return tensorboard_ != nullptr || csv_ != nullptr; }
  void write_events(const std::vector<MonitorEvent>& events);
  // The event file's path, or "" without one.
  std::string tensorboard_file() const;

 private:
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::unique_ptr<CsvMonitorWriter> csv_;
};

}  // namespace zero
