// The example model: a multi-layer perceptron learning a synthetic regression task. Each layer
// (linear + ReLU, the last one linear only) is one wrapped module, so one ZeRO unit. GEMMs go
// through OpenBLAS. The targets come from a fixed random "teacher" network drawn from the
// seed, and every sample's input is a function of (seed, step, sample index): the global batch
// is the same whatever the world size, so runs at different N see the same data.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/runtime/model.h"

namespace zero::examples {

struct MlpConfig {
  int input_dim = 32;
  int hidden_dim = 128;
  int output_dim = 16;
  int layers = 4;  // linear layers; all but the last are followed by ReLU
};

// A fully connected layer y = x W^T + b, optionally followed by ReLU. Parameters and gradients
// are stored in the engine's working dtype (fp32, bf16 or fp16); the math runs in fp32.
class Linear : public Module {
 public:
  Linear(int in_features, int out_features, bool relu);
  std::vector<ParamDecl> parameters() const override;
  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) override;
  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& params,
                const std::vector<ParamRef>& grads) override;

 private:
  int in_features_;
  int out_features_;
  bool relu_;
  Tensor input_;   // saved for the weight gradient
  Tensor output_;  // saved for the ReLU mask
  // With bf16/fp16 storage the layer converts its parameters to fp32 and computes in fp32 (the
  // CPU has no fast 16-bit GEMM); with fp32 storage the weights are used in place.
  std::vector<float> weight_f32_;
  std::vector<float> bias_f32_;
  std::vector<float> weight_grad_;
  std::vector<float> bias_grad_;
};

std::vector<NamedModule> make_mlp(const MlpConfig& config);

// One micro-batch of the synthetic task: rows [first_sample, first_sample + count) of the
// global batch of `step`.
struct Batch {
  Tensor inputs;
  Tensor targets;
};

class TeacherTask {
 public:
  TeacherTask(const MlpConfig& config, uint64_t seed);
  Batch batch(long step, int64_t first_sample, int64_t count) const;

 private:
  MlpConfig config_;
  uint64_t seed_;
  std::vector<float> w1_;  // [hidden, input]
  std::vector<float> w2_;  // [output, hidden]
};

// Mean squared error over all elements; writes d(loss)/d(prediction) into grad.
float mse_loss(const Tensor& prediction, const Tensor& target, Tensor& grad);

}  // namespace zero::examples
