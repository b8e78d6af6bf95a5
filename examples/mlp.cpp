#include "examples/mlp.h"

#include <cblas.h>

#include <cmath>
#include <string>

#include "zero/kernels/check.h"

namespace zero::examples {

Linear::Linear(int in_features, int out_features, bool relu)
    : in_features_(in_features), out_features_(out_features), relu_(relu) {}

std::vector<ParamDecl> Linear::parameters() const {
  // PyTorch's default for nn.Linear: uniform in ±1/sqrt(fan_in) for weight and bias.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features_));
  return {
      ParamDecl{ParamSpec{"weight", {out_features_, in_features_}, 0},
                ParamInit{InitKind::kUniform, bound}},
      ParamDecl{ParamSpec{"bias", {out_features_}, 0}, ParamInit{InitKind::kUniform, bound}},
  };
}

void Linear::forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) {
  ZERO_CHECK(in.shape.size() == 2 && in.shape[1] == in_features_,
             "Linear expects input [batch, " << in_features_ << "]");
  const int batch = static_cast<int>(in.shape[0]);
  const float* w = params[0].as_f32(weight_f32_);
  const float* b = params[1].as_f32(bias_f32_);
  out = Tensor({batch, out_features_});
  for (int r = 0; r < batch; ++r) {
    for (int o = 0; o < out_features_; ++o) out.data[r * out_features_ + o] = b[o];
  }
  // out[batch, out] += in[batch, in] · W[out, in]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out_features_, in_features_, 1.0f,
              in.data.data(), in_features_, w, in_features_, 1.0f, out.data.data(), out_features_);
  if (relu_) {
    for (float& v : out.data) v = v > 0.0f ? v : 0.0f;
  }
  input_ = in;
  output_ = out;
}

void Linear::backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& params,
                      const std::vector<ParamRef>& grads) {
  const int batch = static_cast<int>(input_.shape[0]);
  ZERO_CHECK(grad_out.numel() == static_cast<size_t>(batch) * out_features_,
             "Linear backward: gradient shape does not match the forward output");
  Tensor g = grad_out;
  if (relu_) {
    for (size_t i = 0; i < g.data.size(); ++i) {
      if (output_.data[i] <= 0.0f) g.data[i] = 0.0f;
    }
  }
  // dW[out, in] = g[batch, out]^T · x[batch, in], added to the stored gradient (accumulating
  // across micro-batches, rounded once into its dtype).
  weight_grad_.resize(static_cast<size_t>(out_features_) * in_features_);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_features_, in_features_, batch, 1.0f,
              g.data.data(), out_features_, input_.data.data(), in_features_, 0.0f,
              weight_grad_.data(), in_features_);
  grads[0].add_f32(weight_grad_.data());
  bias_grad_.assign(out_features_, 0.0f);
  for (int r = 0; r < batch; ++r) {
    for (int o = 0; o < out_features_; ++o) bias_grad_[o] += g.data[r * out_features_ + o];
  }
  grads[1].add_f32(bias_grad_.data());
  // dx[batch, in] = g[batch, out] · W[out, in]
  grad_in = Tensor({batch, in_features_});
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in_features_, out_features_, 1.0f,
              g.data.data(), out_features_, params[0].as_f32(weight_f32_), in_features_, 0.0f,
              grad_in.data.data(), in_features_);
}

std::vector<NamedModule> make_mlp(const MlpConfig& config) {
  ZERO_CHECK(config.layers >= 1 && config.input_dim >= 1 && config.hidden_dim >= 1 &&
                 config.output_dim >= 1,
             "MLP dimensions and layer count must be positive");
  std::vector<NamedModule> modules;
  for (int l = 0; l < config.layers; ++l) {
    const int in = l == 0 ? config.input_dim : config.hidden_dim;
    const bool last = l == config.layers - 1;
    const int out = last ? config.output_dim : config.hidden_dim;
    modules.push_back({"layers." + std::to_string(l), std::make_unique<Linear>(in, out, !last)});
  }
  return modules;
}

namespace {
// Keys of the teacher's weights and of the inputs live in separate ranges of the counter
// space from the student's parameters (which use small parameter indices).
constexpr uint64_t kTeacherKey = 1ull << 40;
constexpr uint64_t kInputKey = 1ull << 41;
}  // namespace

TeacherTask::TeacherTask(const MlpConfig& config, uint64_t seed) : config_(config), seed_(seed) {
  const int hidden = config.hidden_dim;
  w1_.resize(static_cast<size_t>(hidden) * config.input_dim);
  w2_.resize(static_cast<size_t>(config.output_dim) * hidden);
  const ParamInit init1{InitKind::kUniform, 1.0f / std::sqrt(static_cast<float>(config.input_dim))};
  const ParamInit init2{InitKind::kUniform, 1.0f / std::sqrt(static_cast<float>(hidden))};
  for (size_t i = 0; i < w1_.size(); ++i) w1_[i] = init_value(seed, kTeacherKey, i, init1);
  for (size_t i = 0; i < w2_.size(); ++i) w2_[i] = init_value(seed, kTeacherKey + 1, i, init2);
}

Batch TeacherTask::batch(long step, int64_t first_sample, int64_t count) const {
  const int in = config_.input_dim;
  const int hidden = config_.hidden_dim;
  const int out = config_.output_dim;
  Batch b{Tensor({count, in}), Tensor({count, out})};
  const ParamInit input_init{InitKind::kUniform, 1.7320508f};  // unit variance
  for (int64_t r = 0; r < count; ++r) {
    const uint64_t sample = static_cast<uint64_t>(first_sample + r);
    const uint64_t key = kInputKey + static_cast<uint64_t>(step) * (1ull << 20) + sample;
    for (int j = 0; j < in; ++j) b.inputs.data[r * in + j] = init_value(seed_, key, j, input_init);
  }
  // targets = tanh(x W1^T) W2^T
  std::vector<float> h(static_cast<size_t>(count) * hidden);
  const int rows = static_cast<int>(count);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, hidden, in, 1.0f, b.inputs.data.data(),
              in, w1_.data(), in, 0.0f, h.data(), hidden);
  for (float& v : h) v = std::tanh(v);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, hidden, 1.0f, h.data(), hidden,
              w2_.data(), hidden, 0.0f, b.targets.data.data(), out);
  return b;
}

float mse_loss(const Tensor& prediction, const Tensor& target, Tensor& grad) {
  ZERO_CHECK(prediction.shape == target.shape, "mse_loss: prediction and target shapes differ");
  grad = Tensor(prediction.shape);
  const size_t n = prediction.numel();
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float diff = prediction.data[i] - target.data[i];
    sum += static_cast<double>(diff) * diff;
    grad.data[i] = 2.0f * diff / static_cast<float>(n);
  }
  return static_cast<float>(sum / static_cast<double>(n));
}

}  // namespace zero::examples
