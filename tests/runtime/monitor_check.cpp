// monitor_check METRICS TENSORBOARD_DIR CSV_DIR BATCH: a zero-train run's monitors hold the
// values its metrics file holds, at DeepSpeed's x axis. The event file (the one in
// TENSORBOARD_DIR) is read through its TFRecord framing, every CRC checked; each step's
// train_loss is the metrics file's loss as a float, bit for bit, at (step - 1) * BATCH, and lr
// at step * BATCH; the CSV files hold the same values as doubles, exactly. Exit 0 when all
// agree, 1 with a message naming the first difference.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "zero/proto/tensorboard_event.pb.h"
#include "zero/runtime/monitor.h"

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "monitor_check: %s\n", message.c_str());
  std::exit(1);
}

// tag -> (step, value) in file order.
using Series = std::map<std::string, std::vector<std::pair<int64_t, double>>>;

Series tensorboard_series(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      files.push_back(entry.path());
    }
  }
  if (files.size() != 1) fail(dir + " holds " + std::to_string(files.size()) + " event files");
  Series series;
  const std::vector<std::string> records = zero::read_tfrecords(files[0].string());
  zero::tensorboard::Event first;
  if (records.empty() || !first.ParseFromString(records[0]) ||
      first.file_version() != "brain.Event:2") {
    fail(files[0].string() + " does not start with the version record");
  }
  for (size_t i = 1; i < records.size(); ++i) {
    zero::tensorboard::Event event;
    if (!event.ParseFromString(records[i])) fail("record " + std::to_string(i) + " is no Event");
    for (const auto& value : event.summary().value()) {
      series[value.tag()].emplace_back(event.step(), value.simple_value());
    }
  }
  return series;
}

std::vector<std::pair<int64_t, double>> csv_series(const fs::path& file,
                                                   const std::string& header) {
  std::ifstream in(file);
  if (!in) fail("cannot read " + file.string());
  std::string line;
  std::getline(in, line);
  if (line != "step," + header + "\r") fail(file.string() + " starts with " + line);
  std::vector<std::pair<int64_t, double>> out;
  while (std::getline(in, line)) {
    const size_t comma = line.find(',');
    out.emplace_back(std::stoll(line.substr(0, comma)),
                     std::strtod(line.c_str() + comma + 1, nullptr));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) fail("usage: monitor_check METRICS TENSORBOARD_DIR CSV_DIR BATCH");
  const long batch = std::atol(argv[4]);
  std::vector<nlohmann::json> steps;
  std::ifstream metrics(argv[1]);
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.value("event", "") == "step") steps.push_back(record);
  }
  if (steps.empty()) fail(std::string(argv[1]) + " holds no step record");

  const Series events = tensorboard_series(argv[2]);
  const auto csv_loss =
      csv_series(fs::path(argv[3]) / "Train_Samples_train_loss.csv", "train_loss");
  const auto csv_lr = csv_series(fs::path(argv[3]) / "Train_Samples_lr.csv", "lr");
  const auto& tb_loss = events.at("Train/Samples/train_loss");
  const auto& tb_lr = events.at("Train/Samples/lr");
  if (tb_loss.size() != steps.size() || csv_loss.size() != steps.size() ||
      tb_lr.size() != steps.size() || csv_lr.size() != steps.size()) {
    fail("the monitors hold another number of steps than the metrics file's " +
         std::to_string(steps.size()));
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const long step = steps[i].at("step").get<long>();
    const double loss = steps[i].at("loss").get<double>();
    const double lr = steps[i].at("lr").get<double>();
    std::ostringstream where;
    where << "step " << step << ": ";
    if (tb_loss[i].first != (step - 1) * batch || tb_lr[i].first != step * batch ||
        csv_loss[i].first != (step - 1) * batch || csv_lr[i].first != step * batch) {
      fail(where.str() + "an event is not at DeepSpeed's samples seen");
    }
    if (static_cast<float>(tb_loss[i].second) != static_cast<float>(loss) ||
        static_cast<float>(tb_lr[i].second) != static_cast<float>(lr)) {
      where << "TensorBoard holds loss " << tb_loss[i].second << ", lr " << tb_lr[i].second
            << "; the metrics " << loss << ", " << lr;
      fail(where.str());
    }
    if (csv_loss[i].second != loss || csv_lr[i].second != lr) {
      where << "the CSV files hold loss " << csv_loss[i].second << ", lr " << csv_lr[i].second
            << "; the metrics " << loss << ", " << lr;
      fail(where.str());
    }
  }
  std::printf("monitor_check: %zu steps agree in %zu TensorBoard series and the CSV files\n",
              steps.size(), events.size());
  return 0;
}
