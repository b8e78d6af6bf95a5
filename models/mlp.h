// The example model: a multi-layer perceptron learning a synthetic regression task. Each layer
// (linear + ReLU, the last one linear only) is one wrapped module, so one ZeRO unit. GEMMs go
// through OpenBLAS on the CPU and cuBLAS on a GPU (the device of the engine's tensors). The targets
// come from a fixed random "teacher" network drawn from the seed, and every sample's input is a
// function of (seed, step, sample index): the global batch is the same whatever the world size, so
// runs at different N see the same data.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "zero/runtime/model.h"

namespace zero::models {

namespace gpu {
class Blas;
}

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
  void forward_on_cpu(const Tensor& in, Tensor& out, const float* w, const float* b);
  void backward_on_cpu(Tensor& g, Tensor& grad_in, const float* w);
  void forward_on_gpu(const Tensor& in, Tensor& out, const float* w, const float* b);
  void backward_on_gpu(Tensor& g, Tensor& grad_in, const float* w);

  int in_features_;
  int out_features_;
  bool relu_;
  Tensor input_;   // saved for the weight gradient
  Tensor output_;  // saved for the ReLU mask
  // With bf16/fp16 storage the layer converts its parameters to fp32 and computes in fp32 (the
  // CPU has no fast 16-bit GEMM); with fp32 storage the weights are used in place.
  Tensor weight_f32_;
  Tensor bias_f32_;
  Tensor weight_grad_;
  Tensor bias_grad_;
  std::shared_ptr<gpu::Blas> blas_;  // made at the first GEMM on a GPU
};

std::vector<NamedModule> make_mlp(const MlpConfig& config);

// The parameters of make_mlp(config) as the engine names and groups them ("layers.0.weight",
// module 0, ...): what Layout::build takes, for planning memory without building a model.
std::vector<ParamSpec> mlp_param_specs(const MlpConfig& config);

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

// Mean squared error over all elements; writes d(loss)/d(prediction) into grad, on the device of
// the prediction (the target must be on the same one).
float mse_loss(const Tensor& prediction, const Tensor& target, Tensor& grad);

}  // namespace zero::models
