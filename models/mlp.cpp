#include "models/mlp.h"

#include <cblas.h>

#include <cmath>
#include <string>

#include "zero/core/check.h"
#include "zero/runtime/device.h"
#if ZERO_HAVE_CUDA
#include "models/mlp_cuda.h"
#endif

namespace zero::models {

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
  ZERO_CHECK(in.shape().size() == 2 && in.shape()[1] == in_features_,
             "Linear expects input [batch, " << in_features_ << "]");
  const float* w = params[0].as_f32(weight_f32_);
  const float* b = params[1].as_f32(bias_f32_);
  out = Tensor({in.shape()[0], out_features_}, in.device());
  if (in.device()) {
    forward_on_gpu(in, out, w, b);
  } else {
    forward_on_cpu(in, out, w, b);
  }
  input_ = in;
  output_ = out;
}

void Linear::backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& params,
                      const std::vector<ParamRef>& grads) {
  ZERO_CHECK(grad_out.numel() == output_.numel(),
             "Linear backward: gradient shape does not match the forward output");
  Tensor g = grad_out;
  const float* w = params[0].as_f32(weight_f32_);
  if (weight_grad_.numel() == 0) {
    weight_grad_ = Tensor({out_features_, in_features_}, g.device());
    bias_grad_ = Tensor({out_features_}, g.device());
  }
  grad_in = Tensor({input_.shape()[0], in_features_}, g.device());
  if (g.device()) {
    backward_on_gpu(g, grad_in, w);
  } else {
    backward_on_cpu(g, grad_in, w);
  }
  // Added to the stored gradients (accumulating across micro-batches, rounded once into their
  // dtype).
  grads[0].add_f32(weight_grad_.data());
  grads[1].add_f32(bias_grad_.data());
}

void Linear::forward_on_cpu(const Tensor& in, Tensor& out, const float* w, const float* b) {
  const int batch = static_cast<int>(in.shape()[0]);
  float* y = out.data();
  for (int r = 0; r < batch; ++r) {
    for (int o = 0; o < out_features_; ++o) y[r * out_features_ + o] = b[o];
  }
  // out[batch, out] += in[batch, in] · W[out, in]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out_features_, in_features_, 1.0f,
              in.data(), in_features_, w, in_features_, 1.0f, y, out_features_);
  if (relu_) {
    for (size_t i = 0; i < out.numel(); ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
  }
}

// g is the gradient of the output, masked here by the ReLU; fills weight_grad_, bias_grad_ and
// grad_in.
void Linear::backward_on_cpu(Tensor& g, Tensor& grad_in, const float* w) {
  const int batch = static_cast<int>(input_.shape()[0]);
  float* gd = g.data();
  if (relu_) {
    const float* y = output_.data();
    for (size_t i = 0; i < g.numel(); ++i) {
      if (y[i] <= 0.0f) gd[i] = 0.0f;
    }
  }
  // dW[out, in] = g[batch, out]^T · x[batch, in]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_features_, in_features_, batch, 1.0f, gd,
              out_features_, input_.data(), in_features_, 0.0f, weight_grad_.data(), in_features_);
  float* db = bias_grad_.data();
  for (int o = 0; o < out_features_; ++o) db[o] = 0.0f;
  for (int r = 0; r < batch; ++r) {
    for (int o = 0; o < out_features_; ++o) db[o] += gd[r * out_features_ + o];
  }
  // dx[batch, in] = g[batch, out] · W[out, in]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in_features_, out_features_, 1.0f,
              gd, out_features_, w, in_features_, 0.0f, grad_in.data(), in_features_);
}

#if ZERO_HAVE_CUDA
void Linear::forward_on_gpu(const Tensor& in, Tensor& out, const float* w, const float* b) {
  if (!blas_) blas_ = std::make_shared<gpu::Blas>();
  CUstream_st* stream = in.device()->cuda_stream();
  const int batch = static_cast<int>(in.shape()[0]);
  blas_->x_wt(stream, in.data(), w, out.data(), batch, in_features_, out_features_);
  gpu::add_bias(stream, out.data(), b, batch, out_features_, relu_);
}

void Linear::backward_on_gpu(Tensor& g, Tensor& grad_in, const float* w) {
  CUstream_st* stream = g.device()->cuda_stream();
  const int batch = static_cast<int>(input_.shape()[0]);
  if (relu_) gpu::relu_backward(stream, g.data(), output_.data(), g.numel());
  blas_->gt_x(stream, g.data(), input_.data(), weight_grad_.data(), batch, in_features_,
              out_features_);
  gpu::column_sums(stream, g.data(), batch, out_features_, bias_grad_.data());
  blas_->g_w(stream, g.data(), w, grad_in.data(), batch, in_features_, out_features_);
}
#else
void Linear::forward_on_gpu(const Tensor&, Tensor&, const float*, const float*) {
  ZERO_FAIL("Linear: a GPU tensor in a build without CUDA");
}
void Linear::backward_on_gpu(Tensor&, Tensor&, const float*) {
  ZERO_FAIL("Linear: a GPU tensor in a build without CUDA");
}
#endif

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

std::vector<ParamSpec> mlp_param_specs(const MlpConfig& config) {
  std::vector<ParamSpec> specs;
  const std::vector<NamedModule> modules = make_mlp(config);
  for (size_t m = 0; m < modules.size(); ++m) {
    for (ParamDecl decl : modules[m].module->parameters()) {
      decl.spec.name = modules[m].name + "." + decl.spec.name;
      decl.spec.module = static_cast<int>(m);
      specs.push_back(decl.spec);
    }
  }
  return specs;
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
  std::vector<float> inputs(static_cast<size_t>(count) * in);
  std::vector<float> targets(static_cast<size_t>(count) * out);
  const ParamInit input_init{InitKind::kUniform, 1.7320508f};  // unit variance
  for (int64_t r = 0; r < count; ++r) {
    const uint64_t sample = static_cast<uint64_t>(first_sample + r);
    const uint64_t key = kInputKey + static_cast<uint64_t>(step) * (1ull << 20) + sample;
    for (int j = 0; j < in; ++j) inputs[r * in + j] = init_value(seed_, key, j, input_init);
  }
  // targets = tanh(x W1^T) W2^T
  std::vector<float> h(static_cast<size_t>(count) * hidden);
  const int rows = static_cast<int>(count);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, hidden, in, 1.0f, inputs.data(), in,
              w1_.data(), in, 0.0f, h.data(), hidden);
  for (float& v : h) v = std::tanh(v);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, hidden, 1.0f, h.data(), hidden,
              w2_.data(), hidden, 0.0f, targets.data(), out);
  return Batch{Tensor({count, in}, inputs), Tensor({count, out}, targets)};
}

float mse_loss(const Tensor& prediction, const Tensor& target, Tensor& grad) {
  ZERO_CHECK(prediction.shape() == target.shape(), "mse_loss: prediction and target shapes differ");
  ZERO_CHECK(prediction.device() == target.device(),
             "mse_loss: prediction and target are on different devices");
  grad = Tensor(prediction.shape(), prediction.device());
  const size_t n = prediction.numel();
  if (prediction.device()) {
#if ZERO_HAVE_CUDA
    DeviceContext& device = *prediction.device();
    Tensor diff(prediction.shape(), prediction.device());
    gpu::mse_diff(device.cuda_stream(), prediction.data(), target.data(), diff.data(), grad.data(),
                  n);
    Tensor sum({1}, prediction.device());
    device.sum_squares(diff.data(), DType::kFloat32, n, sum.data());
    return sum.to_host()[0] / static_cast<float>(n);
#else
    ZERO_FAIL("mse_loss: a GPU tensor in a build without CUDA");
#endif
  }
  const float* p = prediction.data();
  const float* t = target.data();
  float* g = grad.data();
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const float diff = p[i] - t[i];
    sum += static_cast<double>(diff) * diff;
    g[i] = 2.0f * diff / static_cast<float>(n);
  }
  return static_cast<float>(sum / static_cast<double>(n));
}

}  // namespace zero::models
