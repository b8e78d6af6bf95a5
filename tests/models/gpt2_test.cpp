// The GPT-2's forward and backward against PyTorch (tests/data/gpt2: the reference model, batch
// and what PyTorch computed for them, made by gen_gpt2_golden.py). The modules run here without
// the engine, on parameters held by the test, so the model's math is checked on its own: the
// loss, the listed logits and every parameter's gradient (the tied wte's being the sum of the
// embedding's and the head's) at step 0. tests/models/gpt2_golden.sh checks the same model
// trained through zero-train at every stage and world size.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_tensor_parallel.h"
#include "models/token_data.h"
#include "zero/runtime/device.h"
#include "zero/runtime/memory.h"
#include "zero/runtime/nvme_file.h"
#include "zero/runtime/safetensors.h"

namespace zero::models {
namespace {

const std::string kData = std::string(ZERO_SOURCE_DIR) + "/tests/data/gpt2/";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return nlohmann::json::parse(in);
}

Gpt2Config reference_config() {
  const nlohmann::json c = read_json(kData + "config.json");
  Gpt2Config config;
  config.n_layer = c["n_layer"];
  config.n_head = c["n_head"];
  config.n_embd = c["n_embd"];
  config.vocab_size = c["vocab_size"];
  config.block_size = c["block_size"];
  return config;
}

double l2(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

Gpt2Config split_config(int tensor_parallel_size) {
  Gpt2Config config = reference_config();
  config.tensor_parallel_size = tensor_parallel_size;
  return config;
}

Gpt2Config with_layers(Gpt2Config config, int n_layer) {
  config.n_layer = n_layer;
  return config;
}

// Where the checkpoint spill's tests put their files (a directory of the build tree, on disk).
const std::string kSpillDir = ZERO_GPT2_SPILL_DIR;

// `c` with its checkpoints spilled to kSpillDir.
Gpt2Checkpointing spilled(Gpt2Checkpointing c) {
  c.nvme_path = kSpillDir;
  return c;
}

// A tensor-parallel group of `size` ranks as threads of this process, for the GPT-2's two
// collectives: all_gather and all_reduce (fp32, summed in rank order, so every rank gets the
// same bits) return once every rank has made the same call. Counts the calls per op.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), sends_(static_cast<size_t>(size)) {}
  int size() const { return size_; }

  // Each rank's `send` to `combine` (which reads them all into this rank's own memory), then
  // `finish` once no rank reads any send any more: in-place calls are safe.
  template <typename Combine, typename Finish>
  void exchange(int rank, const void* send, Combine combine, Finish finish) {
    sends_[static_cast<size_t>(rank)] = send;
    arrive();
    combine(sends_);
    arrive();
    finish();
  }

 private:
  void arrive() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.notify_all();
    } else {
      all_arrived_.wait(lock, [&] { return generation_ != generation; });
    }
  }

  int size_;
  std::vector<const void*> sends_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

class ThreadGroupCommunicator : public Communicator {
 public:
  ThreadGroupCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return group_.size(); }
  std::string transport() const override { return "threads"; }
  Event all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    return all_gather_bytes(send, recv, count * dtype_size(dtype));
  }
  Event all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    ++counters_.calls[static_cast<size_t>(CollectiveOp::kAllGather)];
    std::vector<char> all(bytes * static_cast<size_t>(group_.size()));
    group_.exchange(
        rank_, send,
        [&](const std::vector<const void*>& sends) {
          for (size_t r = 0; r < sends.size(); ++r) std::memcpy(&all[r * bytes], sends[r], bytes);
        },
        [&] { std::memcpy(recv, all.data(), all.size()); });
    return Event();
  }
  Event all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    ZERO_CHECK(dtype == DType::kFloat32, "the test's group sums fp32 only");
    ++counters_.calls[static_cast<size_t>(CollectiveOp::kAllReduce)];
    std::vector<float> sum(count, 0.0f);
    group_.exchange(
        rank_, send,
        [&](const std::vector<const void*>& sends) {
          for (const void* from : sends) {
            const float* values = static_cast<const float*>(from);
            for (size_t i = 0; i < count; ++i) sum[i] += values[i];
          }
        },
        [&] { std::memcpy(recv, sum.data(), count * sizeof(float)); });
    return Event();
  }
  // Not called by the GPT-2's modules.
  Event reduce_scatter(const void*, void*, size_t, DType) override { return unused(); }
  Event broadcast(void*, size_t, DType, int) override { return unused(); }
  Event barrier() override { return unused(); }
  Stream& stream() override { return stream_; }
  const CommCounters& counters() const override { return counters_; }
  void set_timeout(std::chrono::milliseconds) override {}
  void set_desync_check(bool) override {}
  bool desync_check() const override { return false; }
  std::string flight_record() const override { return ""; }
  size_t staging_bytes(CollectiveOp, size_t, DType) const override { return 0; }
  void set_staging_buffer(void*, size_t) override {}
  void clear_staging_buffer() override {}

 private:
  static Event unused() { throw Error("the test's thread group has no such collective"); }

  ThreadGroup& group_;
  int rank_;
  CommCounters counters_;
  Stream stream_{"thread-group"};
};

// The model's modules on fp32 parameters and gradients owned here, by full name; their
// activations are counted in an allocator of the harness. With tensor parallelism (a
// communicator of tensor_parallel_size ranks) the parameters are this rank's slices.
struct Harness {
  Gpt2Config config;
  Allocator allocator;  // before the model: it outlives the model's tensors
  Gpt2 model;
  std::shared_ptr<DeviceContext> cpu = DeviceContext::create(Device::cpu());
  std::map<std::string, std::vector<float>> values, grads;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::vector<std::vector<std::string>> names;  // per module: its own, then its tied ones

  // n_layer: the reference's 2 layers, or more, block k taking block k % 2's weights.
  explicit Harness(const Gpt2Checkpointing& checkpointing = {}, Communicator* group = nullptr,
                   int n_layer = 2)
      : config(with_layers(split_config(group != nullptr ? group->world_size() : 1), n_layer)),
        // One kernel thread per rank of a group: its ranks share the cores.
        model(make_gpt2(config, group != nullptr ? 1 : 2, checkpointing,
                        {group != nullptr ? group->rank() : 0, group})) {
    count_gpt2_activations(model, allocator);
    for (const LoadedTensor& full : load_safetensors(kData + "model.safetensors").tensors) {
      const LoadedTensor t = gpt2_tensor_parallel_slice(full, config.tensor_parallel_size,
                                                        group != nullptr ? group->rank() : 0);
      values[t.name] = t.values;
      grads[t.name].assign(t.values.size(), 0.0f);
      shapes[t.name] = t.shape;
    }
    for (const NamedModule& m : model.modules) {
      std::vector<std::string> list;
      for (const ParamDecl& d : m.module->parameters()) {
        list.push_back(m.name.empty() ? d.spec.name : m.name + "." + d.spec.name);
        if (values.count(list.back()) == 0 && m.name.rfind("h.", 0) == 0) {
          const std::string from =
              "h." + std::to_string(std::stoi(m.name.substr(2)) % 2) + "." + d.spec.name;
          values[list.back()] = values.at(from);
          grads[list.back()].assign(values[list.back()].size(), 0.0f);
          shapes[list.back()] = shapes.at(from);
        }
        EXPECT_EQ(shapes[list.back()], d.spec.shape) << list.back();
      }
      for (const std::string& tied : m.module->tied_parameters()) list.push_back(tied);
      names.push_back(list);
    }
  }

  std::vector<ParamRef> refs(size_t module, std::map<std::string, std::vector<float>>& store) {
    std::vector<ParamRef> out;
    for (const std::string& name : names[module]) {
      std::vector<float>& v = store.at(name);
      out.push_back(ParamRef{v.data(), DType::kFloat32, &shapes.at(name), v.size(), cpu});
    }
    return out;
  }

  // Forward over the reference batch: the mean loss.
  float forward(const Tensor& tokens) {
    Tensor current = tokens;
    for (size_t m = 0; m < model.modules.size(); ++m) {
      Tensor out;
      model.modules[m].module->forward(current, out, refs(m, values));
      current = std::move(out);
    }
    return current.to_host()[0];
  }

  void backward() {
    Tensor current({1}, {1.0f});
    for (size_t m = model.modules.size(); m-- > 0;) {
      Tensor grad_in;
      model.modules[m].module->backward(current, grad_in, refs(m, values), refs(m, grads));
      current = std::move(grad_in);
    }
  }
};

Tensor reference_batch(Harness& h, int B, int T) {
  const TokenData data(kData + "tokens.bin");
  Tensor tokens({B, T});
  h.model.targets->ids.resize(static_cast<size_t>(B * T));
  data.read_sequences(0, B, T, 0, B, tokens.data(), h.model.targets->ids.data());
  return tokens;
}

TEST(Gpt2, ForwardAndBackwardMatchPyTorch) {
  const nlohmann::json config = read_json(kData + "config.json");
  const nlohmann::json step0 = read_json(kData + "expected.json")["steps"][0];
  Harness h;
  const int B = config["batch"], T = config["seq_len"];
  const Tensor tokens = reference_batch(h, B, T);

  // PyTorch's float32 run is within 1e-7 of float64 on these; ours sums in other orders.
  const float loss = h.forward(tokens);
  EXPECT_NEAR(loss, step0["loss"].get<double>(), 1e-5 * step0["loss"].get<double>());
  const std::vector<float> logits = gpt2_logits(h.model).to_host();
  const int V = h.config.vocab_size;
  const std::vector<double> first = step0["logits_first8"]["b0_t0"];
  const std::vector<double> last = step0["logits_first8"]["blast_tlast"];
  for (int v = 0; v < 8; ++v) {
    EXPECT_NEAR(logits[v], first[v], 1e-5) << "b0_t0 logit " << v;
    EXPECT_NEAR(logits[static_cast<size_t>(B * T - 1) * V + v], last[v], 1e-5)
        << "blast_tlast logit " << v;
  }

  h.backward();
  // wte.weight's gradient is the embedding's share plus the head's: without the tie it would
  // miss the larger part of PyTorch's.
  double sum_squares = 0.0;
  for (const auto& [name, expected] : step0["grad_l2"].items()) {
    const double norm = l2(h.grads.at(name));
    EXPECT_NEAR(norm, expected.get<double>(), 1e-5 * expected.get<double>()) << name;
    sum_squares += norm * norm;
  }
  EXPECT_EQ(step0["grad_l2"].size(), h.grads.size());
  const double grad_norm = step0["grad_norm"];
  EXPECT_NEAR(std::sqrt(sum_squares), grad_norm, 1e-5 * grad_norm);
}

TEST(Gpt2, PresetsAndConfigChecks) {
  Gpt2Config c;
  ASSERT_TRUE(gpt2_preset("gpt2-124M", &c));
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.n_embd, 768);
  EXPECT_EQ(c.vocab_size, 50257);
  size_t params = 0;
  for (const ParamSpec& s : gpt2_param_specs(c)) {
    size_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<size_t>(d);
    params += n;
  }
  EXPECT_EQ(params, 124439808u);  // GPT-2 small, as Hugging Face counts it (tied head)
  EXPECT_FALSE(gpt2_preset("gpt2-7B", &c));
  c.n_head = 5;
  try {
    check_gpt2_config(c);
    FAIL() << "n_embd 768 with 5 heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of n_head"), std::string::npos) << e.what();
  }
}

// One step (two micro-batches, so gradients accumulate) of a model with `checkpointing`: the
// losses, the logits of the last forward and every gradient.
struct StepResult {
  std::vector<float> losses, logits;
  std::map<std::string, std::vector<float>> grads;
};

StepResult run_step(const Gpt2Checkpointing& checkpointing, int B, int T, int n_layer = 2) {
  Harness h(checkpointing, nullptr, n_layer);
  const Tensor tokens = reference_batch(h, B, T);
  StepResult r;
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    r.losses.push_back(h.forward(tokens));
    r.logits = gpt2_logits(h.model).to_host();
    h.backward();
  }
  r.grads = h.grads;
  return r;
}

const Gpt2Checkpointing kSettings[] = {
    {Recompute::kSelective, 0},
    {Recompute::kFull, 0},
    {Recompute::kSelective, 1},  // block 0 of 2 recomputes, block 1 keeps everything
    {Recompute::kFull, 1},
    // contiguous_memory_optimization: the checkpoints in one buffer
    {Recompute::kFull, 0, true},
    {Recompute::kSelective, 1, true},
    // cpu_checkpointing: the checkpoints moved to (here: host) memory and back
    {Recompute::kFull, 0, false, false, true},
    {Recompute::kSelective, 1, false, false, true},
    // nvme_path: the checkpoints spilled to a file and read back (two blocks, then one)
    spilled({Recompute::kFull, 0}),
    spilled({Recompute::kSelective, 1}),
};

std::string label(const Gpt2Checkpointing& c) {
  return std::string(recompute_name(c.recompute)) + " number_checkpoints " +
         std::to_string(c.number_checkpoints) + (c.contiguous_memory ? " contiguous" : "") +
         (c.cpu_checkpointing ? " cpu_checkpointing" : "") +
         (c.nvme_path.empty() ? "" : " nvme_path");
}

int checkpointed_blocks(const Gpt2Checkpointing& c, int n_layer) {
  int n = 0;
  for (int i = 0; i < n_layer; ++i) n += gpt2_block_checkpointed(c, i, n_layer) ? 1 : 0;
  return n;
}

// Recomputation runs the same kernels on the same inputs: the losses, the logits and every
// gradient are bit for bit those without checkpointing.
TEST(Gpt2Checkpointing, BitwiseEqualToNoCheckpointing) {
  const StepResult none = run_step({}, 4, 32);
  for (const Gpt2Checkpointing& c : kSettings) {
    const StepResult r = run_step(c, 4, 32);
    EXPECT_EQ(r.losses, none.losses) << label(c);
    EXPECT_EQ(r.logits, none.logits) << label(c);
    for (const auto& [name, grad] : none.grads) {
      EXPECT_EQ(r.grads.at(name), grad) << label(c) << ": " << name;
    }
  }
}

// The bytes the modules hold, counted from their tensors, are the formula of gpt2_memory.h, at
// two micro-batch sizes and two sequence lengths, for every setting; so is the peak the
// allocator measured over the step, activations and checkpoints each.
TEST(Gpt2Checkpointing, HeldActivationsEqualTheFormula) {
  std::vector<Gpt2Checkpointing> settings = {{Recompute::kNone, 0}};
  settings.insert(settings.end(), std::begin(kSettings), std::end(kSettings));
  for (const auto& [B, T] : {std::pair{4, 32}, std::pair{2, 64}, std::pair{1, 16}}) {
    std::vector<uint64_t> kept;
    for (const Gpt2Checkpointing& c : settings) {
      Harness h(c);
      const Tensor tokens = reference_batch(h, B, T);
      h.forward(tokens);
      h.backward();
      const Gpt2ActivationBytes held = gpt2_held_activations(h.model);
      const Gpt2ActivationBytes formula = gpt2_activation_formula(h.config, c, B, T);
      const std::string what = label(c) + " B " + std::to_string(B) + " T " + std::to_string(T);
      EXPECT_EQ(held.embedding, formula.embedding) << what;
      EXPECT_EQ(held.blocks, formula.blocks) << what;
      EXPECT_EQ(held.recompute, formula.recompute) << what;
      EXPECT_EQ(held.head, formula.head) << what;
      // With cpu_checkpointing the checkpoints are on the device only while they move: none
      // after backward; every one in the host's memory.
      const uint64_t moving = formula.moving_checkpoints;
      EXPECT_EQ(held.checkpoints + moving, formula.checkpoints) << what;
      EXPECT_EQ(held.host_checkpoints, formula.host_checkpoints) << what;
      EXPECT_EQ(held.spill_buffer, formula.spill_buffer) << what;
      EXPECT_EQ(held.nvme_checkpoints, formula.nvme_checkpoints) << what;
      EXPECT_EQ(held.total() + moving, formula.total()) << what;
      const MemoryStats& measured = h.allocator.stats();
      EXPECT_EQ(measured.window_peak_activations, formula.total()) << what;
      EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                formula.checkpoints)
          << what;
      EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kActivation)],
                formula.total() - formula.checkpoints)
          << what;
      // One allocation per checkpoint, or one for all of them with contiguous_memory (and the
      // spill's buffer); with cpu_checkpointing one in forward and one to bring it back.
      const int blocks = checkpointed_blocks(c, h.config.n_layer);
      const bool one_buffer = c.contiguous_memory || !c.nvme_path.empty();
      const int expected_allocations = one_buffer && blocks > 0 ? 1
                                       : c.cpu_checkpointing    ? 2 * blocks
                                                                : blocks;
      EXPECT_EQ(measured.allocations[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                static_cast<uint64_t>(expected_allocations))
          << what;
      // A second step reuses every buffer: its window peaks at the same bytes.
      h.allocator.start_window();
      h.forward(tokens);
      h.backward();
      EXPECT_EQ(measured.window_peak_activations, formula.total()) << what << ", second step";
      kept.push_back(held.kept());
    }
    // none > selective > full, and a block in full keeps its input alone: B T C floats.
    EXPECT_GT(kept[0], kept[1]);
    EXPECT_GT(kept[1], kept[2]);
    EXPECT_EQ(kept[2], 2u * B * T * 64 * sizeof(float));
  }
  // Without checkpointing nothing is a checkpoint; with full recomputation of both blocks the
  // checkpoints are their inputs.
  EXPECT_EQ(gpt2_activation_formula(reference_config(), {}, 2, 16).checkpoints, 0u);
  EXPECT_EQ(gpt2_activation_formula(reference_config(), {Recompute::kFull, 0}, 2, 16).checkpoints,
            2u * 2 * 16 * 64 * sizeof(float));
  // cpu_checkpointing on a model of 3 full blocks: two of the three inputs on the device at once.
  Gpt2Config three = reference_config();
  three.n_layer = 3;
  const uint64_t one = 2u * 16 * 64 * sizeof(float);
  const Gpt2ActivationBytes kept = gpt2_activation_formula(three, {Recompute::kFull, 0}, 2, 16);
  const Gpt2ActivationBytes moved =
      gpt2_activation_formula(three, {Recompute::kFull, 0, false, false, true}, 2, 16);
  EXPECT_EQ(moved.host_checkpoints, 3 * one);
  EXPECT_EQ(moved.moving_checkpoints, 2 * one);
  EXPECT_EQ(moved.total(), kept.total() - one);
}

// The NVMe spill on 4 blocks with full recomputation, one micro-batch of 20 positions (a
// checkpoint of 5 KiB in a region of 8 KiB): bit for bit the run without the spill; the
// checkpoints in memory at peak (the allocator's kCheckpoint) are the spill's buffer of two
// regions, not the four checkpoints; each micro-batch writes and reads every region once, the
// last block's backward reading the next one's ahead; a forward alone writes them, reads none.
TEST(Gpt2Checkpointing, NvmeSpillHoldsTwoCheckpointsAndMovesEachOnce) {
  constexpr int kLayers = 4, B = 1, T = 20;
  const Gpt2Checkpointing full{Recompute::kFull, 0};
  const StepResult kept = run_step(full, B, T, kLayers);
  const StepResult spill = run_step(spilled(full), B, T, kLayers);
  EXPECT_EQ(spill.losses, kept.losses);
  EXPECT_EQ(spill.logits, kept.logits);
  for (const auto& [name, grad] : kept.grads) EXPECT_EQ(spill.grads.at(name), grad) << name;

  Harness h(spilled(full), nullptr, kLayers);
  const Tensor tokens = reference_batch(h, B, T);
  const uint64_t checkpoint = B * T * 64 * sizeof(float), region = 8192;
  const Gpt2ActivationBytes formula = gpt2_activation_formula(h.config, spilled(full), B, T);
  EXPECT_EQ(formula.spill_buffer, 2 * region + kNvmeBufferSlack);
  EXPECT_EQ(formula.checkpoints, formula.spill_buffer);
  EXPECT_EQ(formula.nvme_checkpoints, kLayers * region);
  EXPECT_EQ(formula.total(), gpt2_activation_formula(h.config, full, B, T).total() -
                                 kLayers * checkpoint + formula.spill_buffer);
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    h.allocator.start_window();
    h.forward(tokens);
    h.backward();
    const MemoryStats& measured = h.allocator.stats();
    EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kCheckpoint)],
              formula.checkpoints);
    EXPECT_LT(formula.checkpoints, kLayers * checkpoint);
    EXPECT_EQ(measured.window_peak_activations, formula.total());
    const Gpt2SpillTraffic traffic = take_gpt2_spill_traffic(h.model);
    EXPECT_EQ(traffic.write_bytes, kLayers * region) << "micro-batch " << micro_batch;
    EXPECT_EQ(traffic.read_bytes, kLayers * region) << "micro-batch " << micro_batch;
  }
  EXPECT_EQ(gpt2_held_activations(h.model).nvme_checkpoints, kLayers * region);
  // Read ahead: the last block's backward reads its own checkpoint and starts the next one's
  // (modules: the embedding, the blocks, the head).
  h.forward(tokens);
  take_gpt2_spill_traffic(h.model);
  Tensor grad({1}, {1.0f});
  size_t next = h.model.modules.size();  // the module whose backward runs next, plus one
  auto backward_to = [&](size_t first) {
    for (; next > first; --next) {
      const size_t m = next - 1;
      Tensor grad_in;
      h.model.modules[m].module->backward(grad, grad_in, h.refs(m, h.values), h.refs(m, h.grads));
      grad = std::move(grad_in);
    }
  };
  backward_to(kLayers);
  EXPECT_EQ(take_gpt2_spill_traffic(h.model).read_bytes, 2 * region);
  backward_to(0);
  EXPECT_EQ(take_gpt2_spill_traffic(h.model).read_bytes, 2 * region);
  h.forward(tokens);
  const Gpt2SpillTraffic forward_only = take_gpt2_spill_traffic(h.model);
  EXPECT_EQ(forward_only.write_bytes, kLayers * region);
  EXPECT_EQ(forward_only.read_bytes, 0u);
}

// A failing disk (ZERO_TEST_NVME_FAULT, as the offloads' tests inject it) ends forward or
// backward with the spill file, the offset of the failed transfer and errno.
TEST(Gpt2Checkpointing, NvmeSpillErrorsNameFileOffsetAndErrno) {
  constexpr int kLayers = 4, B = 1, T = 20;
  const Gpt2Checkpointing full = spilled({Recompute::kFull, 0});
  const std::string file = kSpillDir + "/activations_rank_0.bin";
  auto error_of = [&](const char* fault, bool backward) {
    EXPECT_EQ(setenv("ZERO_TEST_NVME_FAULT", fault, 1), 0);
    std::string message;
    try {
      Harness h(full, nullptr, kLayers);
      const Tensor tokens = reference_batch(h, B, T);
      h.forward(tokens);
      if (backward) h.backward();
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_EQ(unsetenv("ZERO_TEST_NVME_FAULT"), 0);
    return message;
  };
  // The second block's write, at its region; in backward the first read is the last block's.
  const std::string write = error_of("write@0#2", false);
  EXPECT_NE(write.find("nvme: write of " + file +
                       " at offset 8192 (8192 bytes) failed: "
                       "Input/output error (errno 5) [injected by ZERO_TEST_NVME_FAULT]"),
            std::string::npos)
      << write;
  const std::string read = error_of("read@0", true);
  EXPECT_NE(read.find("nvme: read of " + file +
                      " at offset 24576 (8192 bytes) failed: "
                      "Input/output error (errno 5)"),
            std::string::npos)
      << read;
}

// What the spill is not built with, or has nothing to do without, is refused by name.
TEST(Gpt2Checkpointing, NvmeSpillRefusesWhatItIsNotBuiltWith) {
  const std::pair<Gpt2Checkpointing, std::string> refused[] = {
      {spilled({Recompute::kNone, 0}), "needs activation checkpointing (selective or full)"},
      {spilled({Recompute::kFull, 0, false, false, true}),
       "spill to NVMe with cpu_checkpointing is not built"},
      {spilled({Recompute::kFull, 0, true}),
       "spill to NVMe with contiguous_memory_optimization is not built"},
      {spilled({Recompute::kFull, 0, false, false, false, true}),
       "spill to NVMe with partition_activations is not built yet"},
  };
  for (const auto& [c, expected] : refused) {
    try {
      check_gpt2_checkpointing(c, 2);
      ADD_FAILURE() << label(c) << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

// partition_activations at t = 2, the tensor-parallel group being two threads of this process:
// each checkpoint is kept as a rank's half and all-gathered back before its block recomputes.
// Per rank, losses, logits and every gradient are bit for bit those of the same checkpointing
// without partitioning (the all-gather rebuilds the exact input) and those without
// checkpointing; the held bytes and the allocator's peaks are the formula's, whose checkpoints
// are half the unpartitioned ones; and backward all-gathers once per checkpointed block.
TEST(Gpt2Checkpointing, PartitionedCheckpointsAreBitwiseAndHoldTheirFormula) {
  constexpr int kRanks = 2;
  struct SplitStep {
    StepResult result;
    uint64_t gathers = 0;  // all-gathers of the step
  };
  // One step of two micro-batches on each rank; `check(rank, harness)` after it.
  auto split_step = [](const Gpt2Checkpointing& c, int B, int T, auto check) {
    ThreadGroup group(kRanks);
    std::vector<SplitStep> steps(kRanks);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < kRanks; ++rank) {
      ranks.emplace_back([&, rank] {
        ThreadGroupCommunicator comm(group, rank);
        Harness h(c, &comm);
        const Tensor tokens = reference_batch(h, B, T);
        SplitStep& step = steps[static_cast<size_t>(rank)];
        for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
          step.result.losses.push_back(h.forward(tokens));
          step.result.logits = gpt2_logits(h.model).to_host();
          h.backward();
        }
        step.result.grads = h.grads;
        step.gathers = comm.counters().calls[static_cast<size_t>(CollectiveOp::kAllGather)];
        check(rank, h);
      });
    }
    for (std::thread& r : ranks) r.join();
    return steps;
  };
  const auto nothing = [](int, Harness&) {};
  const std::vector<SplitStep> none = split_step({}, 4, 32, nothing);
  const Gpt2Checkpointing settings[] = {
      {Recompute::kFull, 0},
      {Recompute::kSelective, 0},
      {Recompute::kFull, 0, true},       // the pieces in one contiguous buffer
      {Recompute::kSelective, 1, true},  // block 0 of 2 partitions, block 1 keeps everything
  };
  for (const Gpt2Checkpointing& whole : settings) {
    Gpt2Checkpointing partitioned = whole;
    partitioned.partition_activations = true;
    const std::string what = label(whole) + " partition_activations";
    const std::vector<SplitStep> kept = split_step(whole, 4, 32, nothing);
    const std::vector<SplitStep> split = split_step(partitioned, 4, 32, nothing);
    const uint64_t blocks = static_cast<uint64_t>(checkpointed_blocks(whole, 2));
    for (size_t rank = 0; rank < kRanks; ++rank) {
      const std::string on = what + ", rank " + std::to_string(rank);
      EXPECT_EQ(split[rank].result.losses, kept[rank].result.losses) << on;
      EXPECT_EQ(split[rank].result.losses, none[rank].result.losses) << on;
      EXPECT_EQ(split[rank].result.logits, kept[rank].result.logits) << on;
      for (const auto& [name, grad] : kept[rank].result.grads) {
        EXPECT_EQ(split[rank].result.grads.at(name), grad) << on << ": " << name;
        EXPECT_EQ(none[rank].result.grads.at(name), grad) << on << ": " << name;
      }
      // Per micro-batch: one all-gather per checkpointed block in backward.
      EXPECT_EQ(split[rank].gathers, kept[rank].gathers + 2 * blocks) << on;
    }
    for (const auto& [B, T] : {std::pair{4, 32}, std::pair{1, 16}}) {
      const Gpt2Config config = split_config(kRanks);
      const Gpt2ActivationBytes formula = gpt2_activation_formula(config, partitioned, B, T);
      const Gpt2ActivationBytes unpartitioned = gpt2_activation_formula(config, whole, B, T);
      const uint64_t piece = static_cast<uint64_t>(B * T * 64 / kRanks) * sizeof(float);
      EXPECT_EQ(formula.checkpoints, blocks * piece) << what;
      EXPECT_EQ(formula.checkpoints * kRanks, unpartitioned.checkpoints) << what;
      EXPECT_EQ(formula.recompute, unpartitioned.recompute + kRanks * piece) << what;
      split_step(partitioned, B, T, [&](int, Harness& h) {
        const Gpt2ActivationBytes held = gpt2_held_activations(h.model);
        EXPECT_EQ(held.blocks, formula.blocks) << what;
        EXPECT_EQ(held.checkpoints, formula.checkpoints) << what;
        EXPECT_EQ(held.recompute, formula.recompute) << what;
        EXPECT_EQ(held.total(), formula.total()) << what;
        const MemoryStats& measured = h.allocator.stats();
        EXPECT_EQ(measured.window_peak_activations, formula.total()) << what;
        EXPECT_EQ(measured.window_peak[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                  formula.checkpoints)
            << what;
        EXPECT_EQ(measured.allocations[static_cast<size_t>(MemoryCategory::kCheckpoint)],
                  whole.contiguous_memory ? 1u : blocks)
            << what;
      });
    }
  }
  // Over a group of one a partition is the whole checkpoint: the formula is the one without.
  const Gpt2Checkpointing alone{Recompute::kFull, 0, false, false, false, true};
  EXPECT_EQ(gpt2_activation_formula(reference_config(), alone, 4, 32).total(),
            gpt2_activation_formula(reference_config(), {Recompute::kFull, 0}, 4, 32).total());
  try {
    check_gpt2_checkpointing({Recompute::kFull, 0, false, false, true, true}, 2);
    FAIL() << "cpu_checkpointing with partition_activations was accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("cpu_checkpointing with partition_activations is not built yet"),
        std::string::npos)
        << e.what();
  }
}

TEST(Gpt2Checkpointing, NumberCheckpointsSpreadsBlocksEvenly) {
  auto chosen = [](Recompute r, int n, int layers) {
    std::vector<int> out;
    for (int i = 0; i < layers; ++i) {
      if (gpt2_block_checkpointed({r, n}, i, layers)) out.push_back(i);
    }
    return out;
  };
  EXPECT_EQ(chosen(Recompute::kFull, 4, 12), (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(chosen(Recompute::kFull, 5, 12), (std::vector<int>{0, 2, 4, 7, 9}));
  EXPECT_EQ(chosen(Recompute::kSelective, 0, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(chosen(Recompute::kNone, 2, 3), std::vector<int>{});
  try {
    make_gpt2(reference_config(), 1, {Recompute::kFull, 0, true, false, true});
    FAIL() << "cpu_checkpointing with contiguous_memory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_checkpointing with contiguous_memory_optimization "
                                         "is not built yet"),
              std::string::npos)
        << e.what();
  }
  try {
    make_gpt2(reference_config(), 1, {Recompute::kFull, 3});
    FAIL() << "3 checkpoints of 2 layers were accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("number_checkpoints 3 must be between 1 and the model's 2"),
        std::string::npos)
        << e.what();
  }
}

// profile: every block times its forward and backward, and those that recompute their
// recomputation; without profile nothing is timed.
TEST(Gpt2Checkpointing, ProfileTimesEachBlock) {
  for (const Gpt2Checkpointing& c : {Gpt2Checkpointing{Recompute::kNone, 0, false, true},
                                     Gpt2Checkpointing{Recompute::kFull, 1, false, true},
                                     Gpt2Checkpointing{Recompute::kSelective, 0, true, true}}) {
    Harness h(c);
    const Tensor tokens = reference_batch(h, 4, 32);
    h.forward(tokens);
    h.backward();
    const Gpt2Profile profile = take_gpt2_profile(h.model);
    ASSERT_EQ(profile.forward_ms.size(), 2u);
    for (size_t b = 0; b < 2; ++b) {
      const bool recomputes = gpt2_block_checkpointed(c, static_cast<int>(b), 2);
      EXPECT_EQ(profile.recomputes[b], recomputes) << label(c) << " block " << b;
      EXPECT_GT(profile.forward_ms[b], 0.0) << label(c) << " block " << b;
      EXPECT_GT(profile.backward_ms[b], 0.0) << label(c) << " block " << b;
      if (recomputes) {
        EXPECT_GT(profile.recompute_ms[b], 0.0) << label(c) << " block " << b;
      } else {
        EXPECT_EQ(profile.recompute_ms[b], 0.0) << label(c) << " block " << b;
      }
    }
    // Taking the profile restarts it.
    const Gpt2Profile again = take_gpt2_profile(h.model);
    EXPECT_EQ(again.forward_ms, (std::vector<double>{0.0, 0.0})) << label(c);
  }
  Harness quiet({Recompute::kFull, 0});
  const Tensor tokens = reference_batch(quiet, 4, 32);
  quiet.forward(tokens);
  quiet.backward();
  const Gpt2Profile none = take_gpt2_profile(quiet.model);
  EXPECT_EQ(none.forward_ms, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(none.recompute_ms, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(none.backward_ms, (std::vector<double>{0.0, 0.0}));
}

// synchronize_checkpoint_boundary: a checkpointed block waits for the device as its forward and
// its backward begin and end (here, with every block checkpointed, and one of two); a
// block that keeps everything never does, nor does any block without the option. The results
// are those without it, bit for bit.
TEST(Gpt2Checkpointing, SynchronizeCheckpointBoundaryWaitsAtEachCheckpointedBlock) {
  for (int checkpoints : {0, 1}) {
    Gpt2Checkpointing c{Recompute::kFull, checkpoints};
    c.synchronize_boundary = true;
    Harness h(c);
    Harness plain({Recompute::kFull, checkpoints});
    const Tensor tokens = reference_batch(h, 4, 32);
    h.forward(tokens);
    h.backward();
    plain.forward(reference_batch(plain, 4, 32));
    plain.backward();
    const std::vector<int> waits = {4, checkpoints == 0 ? 4 : 0};
    EXPECT_EQ(take_gpt2_profile(h.model).synchronizations, waits) << label(c);
    EXPECT_EQ(take_gpt2_profile(plain.model).synchronizations, (std::vector<int>{0, 0}));
    EXPECT_EQ(h.grads, plain.grads) << label(c);  // float vectors compared exactly
  }
}

}  // namespace
}  // namespace zero::models
