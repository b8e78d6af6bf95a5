#include "tests/models/gpt2_harness.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <utility>

#include "models/gpt2_tensor_parallel.h"
#include "models/token_data.h"
#include "zero/runtime/safetensors.h"

namespace zero::models::gpt2_test {
namespace {

Gpt2Config with_layers(Gpt2Config config, int n_layer) {
  config.n_layer = n_layer;
  return config;
}

}  // namespace

const std::string kData = std::string(ZERO_SOURCE_DIR) + "/tests/data/gpt2/";
const std::string kSpillDir = ZERO_GPT2_SPILL_DIR;

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

Gpt2Checkpointing spilled(Gpt2Checkpointing c) {
  c.nvme_path = kSpillDir;
  return c;
}

Harness::Harness(const Gpt2Checkpointing& checkpointing, Communicator* group, int n_layer)
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

std::vector<ParamRef> Harness::refs(size_t module,
                                    std::map<std::string, std::vector<float>>& store) {
  std::vector<ParamRef> out;
  for (const std::string& name : names[module]) {
    std::vector<float>& v = store.at(name);
    out.push_back(ParamRef{v.data(), DType::kFloat32, &shapes.at(name), v.size(), cpu});
  }
  return out;
}

float Harness::forward(const Tensor& tokens) {
  Tensor current = tokens;
  for (size_t m = 0; m < model.modules.size(); ++m) {
    Tensor out;
    model.modules[m].module->forward(current, out, refs(m, values));
    current = std::move(out);
  }
  return current.to_host()[0];
}

void Harness::backward() {
  Tensor current({1}, {1.0f});
  for (size_t m = model.modules.size(); m-- > 0;) {
    Tensor grad_in;
    model.modules[m].module->backward(current, grad_in, refs(m, values), refs(m, grads));
    current = std::move(grad_in);
  }
}

Bf16Params::Bf16Params(const Harness& h) {
  for (const auto& [name, v] : h.values) {
    for (float x : v) values[name].push_back(float_to_bf16(x));
    grads[name].assign(v.size(), 0);
  }
}

std::vector<ParamRef> Bf16Params::refs(Harness& h, size_t module,
                                       std::map<std::string, std::vector<uint16_t>>& store) {
  std::vector<ParamRef> out;
  for (const std::string& name : h.names[module]) {
    std::vector<uint16_t>& v = store.at(name);
    out.push_back(ParamRef{v.data(), DType::kBFloat16, &h.shapes.at(name), v.size(), h.cpu});
  }
  return out;
}

float Bf16Params::forward(Harness& h, const Tensor& tokens) {
  Tensor current = tokens;
  for (size_t m = 0; m < h.model.modules.size(); ++m) {
    Tensor out;
    h.model.modules[m].module->forward(current, out, refs(h, m, values));
    current = std::move(out);
  }
  return current.to_host()[0];
}

Tensor reference_batch(Harness& h, int B, int T) {
  const TokenData data(kData + "tokens.bin");
  Tensor tokens({B, T});
  h.model.targets->ids.resize(static_cast<size_t>(B * T));
  data.read_sequences(0, B, T, 0, B, tokens.data(), h.model.targets->ids.data());
  return tokens;
}

StepResult run_step(const Gpt2Checkpointing& checkpointing, int B, int T, int n_layer) {
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

const std::vector<Gpt2Checkpointing> kSettings = {
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

}  // namespace zero::models::gpt2_test
