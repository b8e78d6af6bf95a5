// Shared by the checkpoint tests and their driver program: a trainer of the example MLP that can
// stop after any step and be rebuilt from a checkpoint, a save directory every rank agrees on,
// and a safetensors reader written from the format's specification.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/mlp.h"
#include "tests/whole_file.h"
#include "zero/core/check.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/model.h"

namespace zero::testing {

struct TrainSetup {
  int stage = 3;
  DType dtype = DType::kFloat32;
  models::MlpConfig mlp{8, 24, 4, 3};
  uint64_t seed = 7;  // data, and initialization unless init_seed is set
  uint64_t init_seed = 0;
  long global_batch = 24;  // divisible by 1, 2, 3 and 4 ranks
  float lr = 1e-2f;
  OptimizerType optimizer = OptimizerType::kAdamW;
  float weight_decay = OptimizerConfig().weight_decay;
  int mics_shard_size = -1;
};

// The example MLP on the engine; step(s) trains on the global batch of step s, as zero-train
// does, and returns the mean loss over all ranks.
class CheckpointTrainer {
 public:
  CheckpointTrainer(Communicator& comm, const TrainSetup& setup)
      : comm_(comm), setup_(setup), task_(setup.mlp, setup.seed) {
    EngineConfig config;
    config.stage = setup.stage;
    config.precision.dtype = setup.dtype;
    config.seed = setup.init_seed != 0 ? setup.init_seed : setup.seed;
    config.optimizer.lr = setup.lr;
    config.optimizer.type = setup.optimizer;
    config.optimizer.weight_decay = setup.weight_decay;
    config.grid.mics_shard_size = setup.mics_shard_size;
    model_ = std::make_unique<ZeroModel>(comm, models::make_mlp(setup.mlp), config);
  }

  float step(long step) {
    const int world = comm_.world_size();
    const long per_rank = setup_.global_batch / world;
    models::Batch batch =
        task_.batch(step, static_cast<int64_t>(comm_.rank()) * per_rank, per_rank);
    Tensor grad;
    float loss = models::mse_loss(model_->forward(batch.inputs), batch.targets, grad);
    model_->backward(grad);
    model_->step();
    float total = 0.0f;
    comm_.all_reduce_sync(&loss, &total, 1, DType::kFloat32);
    return total / static_cast<float>(world);
  }

  Engine& engine() { return model_->engine(); }

 private:
  Communicator& comm_;
  TrainSetup setup_;
  models::TeacherTask task_;
  std::unique_ptr<ZeroModel> model_;
};

// A fresh directory that every rank knows: rank 0 creates it and broadcasts its name.
inline std::string shared_temp_dir(Communicator& comm) {
  char name[64] = {};
  if (comm.rank() == 0) {
    std::snprintf(name, sizeof(name), "/tmp/zero_checkpoint_test_XXXXXX");
    ZERO_CHECK(mkdtemp(name) != nullptr, "mkdtemp failed: " << std::strerror(errno));
  }
  comm.broadcast_sync(name, sizeof(name) / 2, DType::kBFloat16, 0);
  return name;
}

// Flips every bit of one byte of a file.
inline void flip_byte(const std::string& path, long offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ZERO_CHECK(file.good(), "cannot open " << path);
  file.seekg(offset);
  char c = 0;
  file.get(c);
  file.seekp(offset);
  file.put(static_cast<char>(~c));
  ZERO_CHECK(file.good(), "cannot flip a byte of " << path);
}

// ---- safetensors, read from the specification: an 8-byte little-endian header size N, N bytes
// of JSON ({name: {dtype, shape, data_offsets: [begin, end]}, optional "__metadata__": {string:
// string}}), then the byte buffer the offsets index (relative to its start). Offsets must tile
// the buffer exactly, without gaps or overlaps.
struct SafetensorsTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;  // F32 as is, BF16 and F16 widened
};

struct SafetensorsFile {
  std::vector<std::pair<std::string, SafetensorsTensor>> tensors;  // in data order
  std::vector<std::pair<std::string, std::string>> metadata;
};

inline SafetensorsFile read_safetensors(const std::string& path) {
  const std::string bytes = read_whole_file(path);
  auto fail = [&](const std::string& why) {
    throw std::runtime_error("safetensors " + path + ": " + why);
  };
  if (bytes.size() < 8) fail("shorter than the 8-byte header size");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  }
  if (header_size > bytes.size() - 8) fail("header size runs past the end of the file");
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size));
  if (!header.is_object()) fail("header is not a JSON object");
  const std::string data = bytes.substr(8 + header_size);
  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) fail("metadata value of " + m.key() + " is not a string");
        file.metadata.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    SafetensorsTensor t;
    t.dtype = it.value().at("dtype").get<std::string>();
    t.shape = it.value().at("shape").get<std::vector<int64_t>>();
    const auto offsets = it.value().at("data_offsets").get<std::vector<uint64_t>>();
    if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data.size()) {
      fail("bad data_offsets for " + it.key());
    }
    const size_t elem = t.dtype == "F32" ? 4 : t.dtype == "BF16" || t.dtype == "F16" ? 2 : 0;
    if (elem == 0) fail("unexpected dtype " + t.dtype);
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (numel * elem != offsets[1] - offsets[0]) fail(it.key() + ": shape and offsets disagree");
    for (uint64_t i = 0; i < numel; ++i) {
      const char* p = data.data() + offsets[0] + i * elem;
      uint32_t bits = 0;
      for (size_t b = elem; b-- > 0;) bits = (bits << 8) | static_cast<unsigned char>(p[b]);
      float v;
      if (t.dtype == "F16") {
        v = fp16_to_float(static_cast<uint16_t>(bits));
      } else {
        if (elem == 2) bits <<= 16;
        std::memcpy(&v, &bits, 4);
      }
      t.values.push_back(v);
    }
    ranges.emplace_back(offsets[0], offsets[1]);
    file.tensors.emplace_back(it.key(), std::move(t));
  }
  // Order by offset and check the tiling.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t expected = 0;
  std::vector<std::pair<std::string, SafetensorsTensor>> sorted;
  for (size_t i : order) {
    if (ranges[i].first != expected) fail("tensor data has a gap or an overlap");
    expected = ranges[i].second;
    sorted.push_back(std::move(file.tensors[i]));
  }
  if (expected != data.size()) fail("the byte buffer has unused bytes at its end");
  file.tensors = std::move(sorted);
  return file;
}

}  // namespace zero::testing
