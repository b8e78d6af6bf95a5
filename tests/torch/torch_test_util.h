// What the LibTorch adapter's tests share: a small LibTorch MLP, its batches, and the same MLP
// trained by plain LibTorch with torch::optim::AdamW on the whole global batch.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <utility>
#include <vector>

#include "zero/runtime/engine.h"

namespace zero::testing {

constexpr int kSteps = 5;
constexpr int64_t kGlobalRows = 8;
constexpr float kLr = 1e-2f;
constexpr float kWeightDecay = 0.1f;

inline torch::nn::Sequential make_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(6, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 3));
}

// The global batch of a step: inputs and regression targets.
inline std::pair<torch::Tensor, torch::Tensor> batch(int step) {
  torch::manual_seed(1000 + step);
  return {torch::randn({kGlobalRows, 6}), torch::randn({kGlobalRows, 3})};
}

inline std::vector<torch::Tensor> snapshot(const torch::nn::Module& net) {
  std::vector<torch::Tensor> values;
  for (const torch::Tensor& p : net.parameters()) values.push_back(p.detach().clone());
  return values;
}

// Values in registration order (Engine::gather_full_params or gather_full_master) as tensors.
inline std::vector<torch::Tensor> tensors_of(const std::vector<std::vector<float>>& values,
                                             const Layout& layout) {
  std::vector<torch::Tensor> tensors;
  for (size_t p = 0; p < values.size(); ++p) {
    tensors.push_back(torch::tensor(values[p]).reshape(layout.params()[p].shape));
  }
  return tensors;
}

// Plain LibTorch through the module's own forward(): the parameters after each step of the
// model make() returns (make_mlp(1) unless said otherwise; any module holder), its loss
// multiplied by loss_factor (fp16 tests make small gradients).
template <typename Make = std::function<torch::nn::Sequential()>>
std::vector<std::vector<torch::Tensor>> train_plain(
    const Make& make = [] { return make_mlp(1); }, float loss_factor = 1.0f) {
  auto net = make();
  torch::optim::AdamW adamw(net->parameters(),
                            torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));
  std::vector<std::vector<torch::Tensor>> after;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch(step);
    adamw.zero_grad();
    (loss_factor * torch::mse_loss(net->forward(x), y)).backward();
    adamw.step();
    after.push_back(snapshot(*net));
  }
  return after;
}

inline EngineConfig config_at(int stage, int micro_batches = 1) {
  EngineConfig config;
  config.stage = stage;
  config.micro_batches = micro_batches;
  config.optimizer.lr = kLr;
  config.optimizer.weight_decay = kWeightDecay;
  return config;
}

}  // namespace zero::testing
