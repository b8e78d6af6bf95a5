// Unsharded training of the tests' MLP, written here from the formulas in plain scalar code: what
// every stage of the engine must reproduce. It includes only the standard library: none of the
// engine, the optimizer under test or the example model's modules. The caller supplies the data
// (the same generator the engine's run uses) and the initial value of each parameter element.
//
// The model: `layers` linear layers y = x W^T + b (W [out, in], b [out]), ReLU after all but
// the last; the loss is the mean squared error over all elements of a micro-batch. A step
// averages the gradients of its micro-batches (each the mean over its own rows), reports the
// global gradient norm, clips it as torch.nn.utils.clip_grad_norm_ does, and applies AdamW with
// PyTorch's formulas (decoupled weight decay, bias-corrected moments). Values are kept and
// computed in double: this is the exact answer the engine's fp32 arithmetic approximates.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace zero::testing::reference {

struct Mlp {
  int input_dim = 0;
  int hidden_dim = 0;
  int output_dim = 0;
  int layers = 0;
};

struct Run {
  int steps = 0;
  long global_batch = 0;  // rows per step, split into micro_batches equal micro-batches
  int micro_batches = 1;
  double lr = 0.0;     // constant
  double beta1 = 0.9;  // PyTorch's AdamW defaults
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  double clip = 0.0;  // max global gradient norm; 0: no clipping
};

// Rows [first, first + count) of the global batch of `step`, row-major.
struct Rows {
  std::vector<float> inputs;   // [count, input_dim]
  std::vector<float> targets;  // [count, output_dim]
};
using DataFn = std::function<Rows(long step, int64_t first, int64_t count)>;
// The initial value of element `element` of parameter `index` (registration order: layer l's
// weight is 2l, its bias 2l + 1), drawn uniform in +-bound.
using InitFn = std::function<float(uint64_t index, uint64_t element, float bound)>;

struct Result {
  std::vector<float> losses;      // per step: mean of the micro-batches' losses
  std::vector<float> grad_norms;  // per step: norm of the averaged gradient, before clipping
  std::vector<std::vector<std::vector<float>>> params_after_step;  // [step][param][element]
};

inline Result train(const Mlp& mlp, const Run& run, const DataFn& data, const InitFn& init) {
  struct Layer {
    int in, out;
    bool relu;
    std::vector<double> w, b, dw, db, mw, mb, vw, vb;
    std::vector<double> x, y;  // this micro-batch's input and output, kept for backward
  };
  std::vector<Layer> layers;
  for (int l = 0; l < mlp.layers; ++l) {
    Layer layer;
    layer.in = l == 0 ? mlp.input_dim : mlp.hidden_dim;
    layer.out = l == mlp.layers - 1 ? mlp.output_dim : mlp.hidden_dim;
    layer.relu = l != mlp.layers - 1;
    // PyTorch's nn.Linear initialization: uniform in +-1/sqrt(fan_in), weight and bias.
    const float bound = 1.0f / std::sqrt(static_cast<float>(layer.in));
    const size_t nw = static_cast<size_t>(layer.out) * layer.in;
    for (size_t e = 0; e < nw; ++e) layer.w.push_back(init(2 * l, e, bound));
    for (int e = 0; e < layer.out; ++e) layer.b.push_back(init(2 * l + 1, e, bound));
    layer.dw.assign(nw, 0.0);
    layer.mw.assign(nw, 0.0);
    layer.vw.assign(nw, 0.0);
    layer.db.assign(layer.out, 0.0);
    layer.mb.assign(layer.out, 0.0);
    layer.vb.assign(layer.out, 0.0);
    layers.push_back(std::move(layer));
  }

  Result result;
  const int64_t rows = run.global_batch / run.micro_batches;
  for (int step = 1; step <= run.steps; ++step) {
    for (Layer& layer : layers) {
      std::fill(layer.dw.begin(), layer.dw.end(), 0.0);
      std::fill(layer.db.begin(), layer.db.end(), 0.0);
    }
    double loss_sum = 0.0;
    for (int k = 0; k < run.micro_batches; ++k) {
      const Rows batch = data(step, k * rows, rows);
      // Forward.
      std::vector<double> x(batch.inputs.begin(), batch.inputs.end());
      for (Layer& layer : layers) {
        layer.x = x;
        layer.y.assign(static_cast<size_t>(rows) * layer.out, 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          for (int o = 0; o < layer.out; ++o) {
            double sum = layer.b[o];
            for (int i = 0; i < layer.in; ++i) {
              sum += layer.x[r * layer.in + i] * layer.w[static_cast<size_t>(o) * layer.in + i];
            }
            layer.y[r * layer.out + o] = layer.relu && sum < 0.0 ? 0.0 : sum;
          }
        }
        x = layer.y;
      }
      // Loss: mean over the micro-batch's elements; its gradient 2 (p - t) / count.
      const size_t count = x.size();
      std::vector<double> grad(count);
      double squares = 0.0;
      for (size_t i = 0; i < count; ++i) {
        const double diff = x[i] - batch.targets[i];
        squares += diff * diff;
        grad[i] = 2.0 * diff / static_cast<double>(count);
      }
      loss_sum += squares / static_cast<double>(count);
      // Backward: the ReLU mask (zero where the output is not positive), then
      // dW += g^T x, db += sum of g over rows, dx = g W.
      for (size_t l = layers.size(); l-- > 0;) {
        Layer& layer = layers[l];
        if (layer.relu) {
          for (size_t i = 0; i < grad.size(); ++i) {
            if (layer.y[i] <= 0.0) grad[i] = 0.0;
          }
        }
        std::vector<double> grad_in(static_cast<size_t>(rows) * layer.in, 0.0);
        for (int64_t r = 0; r < rows; ++r) {
          for (int o = 0; o < layer.out; ++o) {
            const double g = grad[r * layer.out + o];
            layer.db[o] += g;
            for (int i = 0; i < layer.in; ++i) {
              layer.dw[static_cast<size_t>(o) * layer.in + i] += g * layer.x[r * layer.in + i];
              grad_in[r * layer.in + i] += g * layer.w[static_cast<size_t>(o) * layer.in + i];
            }
          }
        }
        grad = std::move(grad_in);
      }
    }
    result.losses.push_back(static_cast<float>(loss_sum / run.micro_batches));

    // The step's gradient: the mean over micro-batches; its norm; clipping.
    double squares = 0.0;
    for (Layer& layer : layers) {
      for (double& g : layer.dw) g /= run.micro_batches;
      for (double& g : layer.db) g /= run.micro_batches;
      for (double g : layer.dw) squares += g * g;
      for (double g : layer.db) squares += g * g;
    }
    const double norm = std::sqrt(squares);
    result.grad_norms.push_back(static_cast<float>(norm));
    double clip = 1.0;
    if (run.clip > 0.0) {
      const double coefficient = run.clip / (norm + 1e-6);
      if (coefficient < 1.0) clip = coefficient;
    }

    // AdamW (torch.optim.AdamW): p -= lr * wd * p; m = b1 m + (1 - b1) g;
    // v = b2 v + (1 - b2) g^2; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
    const double correction1 = 1.0 - std::pow(run.beta1, step);
    const double correction2 = 1.0 - std::pow(run.beta2, step);
    auto adamw = [&](std::vector<double>& p, const std::vector<double>& grads,
                     std::vector<double>& m, std::vector<double>& v) {
      for (size_t i = 0; i < p.size(); ++i) {
        const double g = grads[i] * clip;
        p[i] -= run.lr * run.weight_decay * p[i];
        m[i] = run.beta1 * m[i] + (1.0 - run.beta1) * g;
        v[i] = run.beta2 * v[i] + (1.0 - run.beta2) * g * g;
        p[i] -= run.lr * (m[i] / correction1) / (std::sqrt(v[i] / correction2) + run.eps);
      }
    };
    std::vector<std::vector<float>> params;
    for (Layer& layer : layers) {
      adamw(layer.w, layer.dw, layer.mw, layer.vw);
      adamw(layer.b, layer.db, layer.mb, layer.vb);
      params.emplace_back(layer.w.begin(), layer.w.end());
      params.emplace_back(layer.b.begin(), layer.b.end());
    }
    result.params_after_step.push_back(std::move(params));
  }
  return result;
}

}  // namespace zero::testing::reference
