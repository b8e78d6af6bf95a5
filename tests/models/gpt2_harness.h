// What the GPT-2's tests run the model with: the reference model, batch and what PyTorch
// computed for them (tests/data/gpt2, made by gen_gpt2_golden.py), and the model's modules run
// without the engine, on parameters held by the test, so the model's math is checked on its own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "zero/runtime/device.h"
#include "zero/runtime/memory.h"

namespace zero::models::gpt2_test {

// tests/data/gpt2/, where the reference files are.
extern const std::string kData;
// Where the checkpoint spill's tests put their files (a directory of the build tree, on disk).
extern const std::string kSpillDir;

nlohmann::json read_json(const std::string& path);
// The reference model's config (config.json).
Gpt2Config reference_config();
// The reference config at `tensor_parallel_size`.
Gpt2Config split_config(int tensor_parallel_size);
// The L2 norm of `v`, summed in double.
double l2(const std::vector<float>& v);
// `c` with its checkpoints spilled to kSpillDir.
Gpt2Checkpointing spilled(Gpt2Checkpointing c);

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
                   int n_layer = 2);

  std::vector<ParamRef> refs(size_t module, std::map<std::string, std::vector<float>>& store);
  // Forward over the reference batch: the mean loss.
  float forward(const Tensor& tokens);
  void backward();
};

// A harness's parameters and gradients as a bf16 run's engine holds them (bf16 working copies of
// the values, zeroed bf16 gradients), and the modules' refs to them.
struct Bf16Params {
  std::map<std::string, std::vector<uint16_t>> values, grads;

  explicit Bf16Params(const Harness& h);
  std::vector<ParamRef> refs(Harness& h, size_t module,
                             std::map<std::string, std::vector<uint16_t>>& store);
  // Forward over `tokens` on these values: the mean loss.
  float forward(Harness& h, const Tensor& tokens);
};

// The first B sequences of T tokens of the reference batch, with their targets set in h's model.
Tensor reference_batch(Harness& h, int B, int T);

// One step (two micro-batches, so gradients accumulate) of a model with `checkpointing`: the
// losses, the logits of the last forward and every gradient.
struct StepResult {
  std::vector<float> losses, logits;
  std::map<std::string, std::vector<float>> grads;
};
StepResult run_step(const Gpt2Checkpointing& checkpointing, int B, int T, int n_layer = 2);

// The checkpointing settings every recomputation must match bit for bit.
extern const std::vector<Gpt2Checkpointing> kSettings;

// `c` in words, for failure messages.
std::string label(const Gpt2Checkpointing& c);
// How many of n_layer blocks `c` checkpoints.
int checkpointed_blocks(const Gpt2Checkpointing& c, int n_layer);

}  // namespace zero::models::gpt2_test
