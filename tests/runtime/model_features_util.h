// The model features GPT-2 needs (tied parameters, weight-decay groups, frozen modules) on a
// small network written here twice: as modules the engine trains, and as unsharded training in
// double from the formulas, which every stage must reproduce.
//
// The network, on rows of D inputs (H hidden units):
//   ""      wte.weight W [H, D], wpe.bias c [H]      y = x W^T + c
//   "h.0"   h.0.w A0 [H, H], h.0.b b0 [H]            y = tanh(x A0^T + b0)
//   "h.1"   h.1.w A1 [H, H], h.1.b b1 [H]            y = tanh(x A1^T + b1)   (may be frozen)
//   "head"  head.b e [D], and W tied                 y = x W + e
// The loss is the mean squared error over a micro-batch's elements.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/model.h"

namespace zero::testing::features {

constexpr int kD = 6;
constexpr int kH = 10;

struct Net {
  bool freeze_h1 = false;         // h.1 is frozen
  std::optional<float> no_decay;  // the decay of every 1-D parameter (GPT-2 sets 0)
};

// A layer's parameters as declared: name, shape, init scale, 1-D or not.
struct Decl {
  std::string name;
  std::vector<int64_t> shape;
  float scale;
};

// Registration order, as the modules below declare them.
inline std::vector<Decl> declarations() {
  return {{"wte.weight", {kH, kD}, 0.4f}, {"wpe.bias", {kH}, 0.1f},  {"h.0.w", {kH, kH}, 0.3f},
          {"h.0.b", {kH}, 0.1f},          {"h.1.w", {kH, kH}, 0.3f}, {"h.1.b", {kH}, 0.1f},
          {"head.b", {kD}, 0.1f}};
}

inline ParamDecl declare(const Decl& d, const std::string& local, const Net& net, bool trainable) {
  ParamDecl decl{ParamSpec{local, d.shape, 0}, ParamInit{InitKind::kUniform, d.scale}};
  if (d.shape.size() < 2) decl.weight_decay = net.no_decay;
  decl.trainable = trainable;
  return decl;
}

// The input rows and targets of the global batch of `step`, rows [first, first + count).
inline std::vector<float> inputs(long step, int64_t first, int64_t count) {
  std::vector<float> x;
  for (int64_t r = first; r < first + count; ++r) {
    for (int i = 0; i < kD; ++i) x.push_back(std::sin(0.37f * r + 1.3f * i + 0.11f * step));
  }
  return x;
}

inline std::vector<float> targets(long step, int64_t first, int64_t count) {
  std::vector<float> t;
  for (int64_t r = first; r < first + count; ++r) {
    for (int d = 0; d < kD; ++d) t.push_back(0.5f * std::cos(0.21f * r - 0.7f * d + 0.05f * step));
  }
  return t;
}

// y = act(x M^T + b) for M [out, in] (the embedding and the blocks), in fp32 on the host.
class Dense : public Module {
 public:
  Dense(std::vector<ParamDecl> params, int in, int out, bool tanh_act)
      : params_(std::move(params)), in_(in), out_(out), tanh_(tanh_act) {}
  std::vector<ParamDecl> parameters() const override { return params_; }
  void forward(const Tensor& x, Tensor& y, const std::vector<ParamRef>& p) override {
    const int64_t rows = x.shape()[0];
    Tensor s0, s1;
    const float* m = p[0].as_f32(s0);
    const float* b = p[1].as_f32(s1);
    input_ = x;
    y = Tensor({rows, out_});
    for (int64_t r = 0; r < rows; ++r) {
      for (int o = 0; o < out_; ++o) {
        float sum = b[o];
        for (int i = 0; i < in_; ++i) sum += x.data()[r * in_ + i] * m[o * in_ + i];
        y.data()[r * out_ + o] = tanh_ ? std::tanh(sum) : sum;
      }
    }
    output_ = y;
  }
  void backward(const Tensor& gy, Tensor& gx, const std::vector<ParamRef>& p,
                const std::vector<ParamRef>& g) override {
    const int64_t rows = gy.shape()[0];
    Tensor s0;
    const float* m = p[0].as_f32(s0);
    std::vector<float> dm(static_cast<size_t>(out_) * in_, 0.0f), db(out_, 0.0f);
    gx = Tensor({rows, in_});
    for (int64_t r = 0; r < rows; ++r) {
      for (int o = 0; o < out_; ++o) {
        const float y = output_.data()[r * out_ + o];
        const float go = gy.data()[r * out_ + o] * (tanh_ ? 1.0f - y * y : 1.0f);
        db[o] += go;
        for (int i = 0; i < in_; ++i) {
          dm[o * in_ + i] += go * input_.data()[r * in_ + i];
          gx.data()[r * in_ + i] += go * m[o * in_ + i];
        }
      }
    }
    saw_null_grads = g[0].data == nullptr && g[1].data == nullptr;
    if (g[0].data != nullptr) g[0].add_f32(dm.data());
    if (g[1].data != nullptr) g[1].add_f32(db.data());
  }
  bool saw_null_grads = false;

 private:
  std::vector<ParamDecl> params_;
  int in_, out_;
  bool tanh_;
  Tensor input_, output_;
};

// y = x W + e with W [H, D] the embedding's weight, tied.
class Head : public Module {
 public:
  explicit Head(ParamDecl bias) : bias_(std::move(bias)) {}
  std::vector<ParamDecl> parameters() const override { return {bias_}; }
  std::vector<std::string> tied_parameters() const override { return {"wte.weight"}; }
  void forward(const Tensor& x, Tensor& y, const std::vector<ParamRef>& p) override {
    const int64_t rows = x.shape()[0];
    Tensor s0, s1;
    const float* e = p[0].as_f32(s0);
    const float* w = p[1].as_f32(s1);
    input_ = x;
    y = Tensor({rows, kD});
    for (int64_t r = 0; r < rows; ++r) {
      for (int d = 0; d < kD; ++d) {
        float sum = e[d];
        for (int h = 0; h < kH; ++h) sum += x.data()[r * kH + h] * w[h * kD + d];
        y.data()[r * kD + d] = sum;
      }
    }
  }
  void backward(const Tensor& gy, Tensor& gx, const std::vector<ParamRef>& p,
                const std::vector<ParamRef>& g) override {
    const int64_t rows = gy.shape()[0];
    Tensor s1;
    const float* w = p[1].as_f32(s1);
    std::vector<float> de(kD, 0.0f), dw(static_cast<size_t>(kH) * kD, 0.0f);
    gx = Tensor({rows, kH});
    for (int64_t r = 0; r < rows; ++r) {
      for (int d = 0; d < kD; ++d) {
        const float go = gy.data()[r * kD + d];
        de[d] += go;
        for (int h = 0; h < kH; ++h) {
          dw[h * kD + d] += go * input_.data()[r * kH + h];
          gx.data()[r * kH + h] += go * w[h * kD + d];
        }
      }
    }
    g[0].add_f32(de.data());
    g[1].add_f32(dw.data());
  }

 private:
  ParamDecl bias_;
  Tensor input_;
};

inline std::vector<NamedModule> make_net(const Net& net) {
  const std::vector<Decl> d = declarations();
  const bool h1 = !net.freeze_h1;
  std::vector<NamedModule> modules;
  modules.push_back(
      {"", std::make_unique<Dense>(std::vector<ParamDecl>{declare(d[0], "wte.weight", net, true),
                                                          declare(d[1], "wpe.bias", net, true)},
                                   kD, kH, false)});
  modules.push_back(
      {"h.0", std::make_unique<Dense>(std::vector<ParamDecl>{declare(d[2], "w", net, true),
                                                             declare(d[3], "b", net, true)},
                                      kH, kH, true)});
  modules.push_back(
      {"h.1", std::make_unique<Dense>(
                  std::vector<ParamDecl>{declare(d[4], "w", net, h1), declare(d[5], "b", net, h1)},
                  kH, kH, true)});
  modules.push_back({"head", std::make_unique<Head>(declare(d[6], "b", net, true))});
  return modules;
}

struct FeatureRun {
  int stage = 0;
  int micro_batches = 1;
  int steps = 6;
  long global_batch = 24;
  float lr = 1e-2f;
  float weight_decay = 0.1f;
  float clip = 0.0f;
  std::function<void(EngineConfig&)> tweak;  // settings that do not change the math
  int first_step = 1;                        // steps first_step..steps run
  std::function<void(ZeroModel&)> before;    // after construction (a checkpoint load)
  std::function<void(ZeroModel&, int)> after_step;
};

struct Result {
  std::vector<float> losses;
  std::vector<float> grad_norms;
  std::vector<std::vector<float>> final_params;  // registration order
  bool frozen_grads_null = false;                // h.1's backward saw null gradients
  uint64_t model_state_bytes = 0;
  MemoryPlan plan;
  std::vector<std::string> names;
  size_t units = 0;
};

// The engine's run: each rank takes its rows of every micro-batch; the loss of a step is the
// mean over the global batch.
inline Result train(const Net& net, const FeatureRun& run, uint64_t seed = 5) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int world = comm->world_size();
  const long rows = run.global_batch / (world * run.micro_batches);
  EngineConfig config;
  config.stage = run.stage;
  config.micro_batches = run.micro_batches;
  config.optimizer.lr = run.lr;
  config.optimizer.weight_decay = run.weight_decay;
  config.gradient_clipping = run.clip;
  config.seed = seed;
  if (run.tweak) run.tweak(config);
  std::vector<NamedModule> modules = make_net(net);
  const auto* h1 = static_cast<const Dense*>(modules[2].module.get());
  ZeroModel model(*comm, std::move(modules), config);
  Result result;
  result.model_state_bytes = model.engine().model_state_bytes();
  result.plan = plan_memory(model.engine().layout(), config);
  result.units = model.engine().layout().units().size();
  for (const ParamPlacement& p : model.engine().layout().params()) result.names.push_back(p.name);
  const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
  if (run.before) run.before(model);
  for (int step = run.first_step; step <= run.steps; ++step) {
    float loss = 0.0f;
    for (int k = 0; k < run.micro_batches; ++k) {
      const int64_t first = (static_cast<int64_t>(k) * world + comm->rank()) * rows;
      const Tensor out =
          model.forward(Tensor({rows, kD}, inputs(step, first, rows), device)).to(nullptr);
      const std::vector<float> t = targets(step, first, rows);
      std::vector<float> grad(t.size());
      for (size_t i = 0; i < t.size(); ++i) {
        const float diff = out.data()[i] - t[i];
        loss += diff * diff / static_cast<float>(t.size());
        grad[i] = 2.0f * diff / static_cast<float>(t.size());
      }
      model.backward(Tensor({rows, kD}, grad, device));
    }
    const StepStats stats = model.step();
    result.grad_norms.push_back(stats.grad_norm);
    float total = 0.0f;
    comm->all_reduce_sync(&loss, &total, 1, DType::kFloat32);
    result.losses.push_back(total / static_cast<float>(world * run.micro_batches));
    if (run.after_step) run.after_step(model, step);
  }
  result.frozen_grads_null = h1->saw_null_grads;
  result.final_params = model.engine().gather_full_params();
  return result;
}

// Unsharded training in double: the whole global batch in its micro-batches, the step's
// gradient their mean, PyTorch's clip_grad_norm_ and AdamW, each parameter with its own decay
// (the 1-D ones net.no_decay when set), and h.1 left alone when frozen.
inline Result train_reference(const Net& net, const FeatureRun& run, uint64_t seed = 5) {
  using Vec = std::vector<double>;
  const std::vector<Decl> decls = declarations();
  const size_t n = decls.size();
  std::vector<Vec> p(n), m(n), v(n), g(n);
  std::vector<double> decay(n);
  std::vector<bool> trained(n, true);
  for (size_t i = 0; i < n; ++i) {
    size_t numel = 1;
    for (int64_t dim : decls[i].shape) numel *= static_cast<size_t>(dim);
    for (size_t e = 0; e < numel; ++e) {
      p[i].push_back(init_value(seed, i, e, ParamInit{InitKind::kUniform, decls[i].scale}));
    }
    m[i].assign(numel, 0.0);
    v[i].assign(numel, 0.0);
    decay[i] = decls[i].shape.size() < 2 && net.no_decay ? *net.no_decay : run.weight_decay;
  }
  trained[4] = trained[5] = !net.freeze_h1;
  // y = act(x M^T + b) over `rows` rows; backward adds into gm, gb and returns dx.
  const auto dense = [](const Vec& x, const Vec& mat, const Vec& b, int in, int out, bool act) {
    const size_t rows = x.size() / in;
    Vec y(rows * out);
    for (size_t r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double sum = b[o];
        for (int i = 0; i < in; ++i) sum += x[r * in + i] * mat[o * in + i];
        y[r * out + o] = act ? std::tanh(sum) : sum;
      }
    }
    return y;
  };
  const auto dense_back = [](const Vec& x, const Vec& y, Vec gy, const Vec& mat, Vec& gm, Vec& gb,
                             int in, int out, bool act) {
    const size_t rows = x.size() / in;
    Vec gx(rows * in, 0.0);
    for (size_t r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double go = gy[r * out + o];
        if (act) go *= 1.0 - y[r * out + o] * y[r * out + o];
        gb[o] += go;
        for (int i = 0; i < in; ++i) {
          gm[o * in + i] += go * x[r * in + i];
          gx[r * in + i] += go * mat[o * in + i];
        }
      }
    }
    return gx;
  };
  Result result;
  const long rows = run.global_batch / run.micro_batches;
  for (int step = 1; step <= run.steps; ++step) {
    for (size_t i = 0; i < n; ++i) g[i].assign(p[i].size(), 0.0);
    double loss = 0.0;
    for (int k = 0; k < run.micro_batches; ++k) {
      const std::vector<float> xf = inputs(step, k * rows, rows);
      const std::vector<float> t = targets(step, k * rows, rows);
      const Vec x(xf.begin(), xf.end());
      const Vec y0 = dense(x, p[0], p[1], kD, kH, false);
      const Vec y1 = dense(y0, p[2], p[3], kH, kH, true);
      const Vec y2 = dense(y1, p[4], p[5], kH, kH, true);
      Vec out(static_cast<size_t>(rows) * kD), gout(out.size());
      for (long r = 0; r < rows; ++r) {
        for (int d = 0; d < kD; ++d) {
          double sum = p[6][d];
          for (int h = 0; h < kH; ++h) sum += y2[r * kH + h] * p[0][h * kD + d];
          out[r * kD + d] = sum;
        }
      }
      for (size_t i = 0; i < out.size(); ++i) {
        const double diff = out[i] - t[i];
        loss += diff * diff / static_cast<double>(out.size());
        gout[i] = 2.0 * diff / static_cast<double>(out.size());
      }
      // The head: its bias, the tied use of W, and the gradient into y2.
      Vec gy2(y2.size(), 0.0);
      for (long r = 0; r < rows; ++r) {
        for (int d = 0; d < kD; ++d) {
          const double go = gout[r * kD + d];
          g[6][d] += go;
          for (int h = 0; h < kH; ++h) {
            g[0][h * kD + d] += go * y2[r * kH + h];
            gy2[r * kH + h] += go * p[0][h * kD + d];
          }
        }
      }
      const Vec gy1 = dense_back(y1, y2, gy2, p[4], g[4], g[5], kH, kH, true);
      const Vec gy0 = dense_back(y0, y1, gy1, p[2], g[2], g[3], kH, kH, true);
      dense_back(x, y0, gy0, p[0], g[0], g[1], kD, kH, false);
    }
    result.losses.push_back(static_cast<float>(loss / run.micro_batches));
    double squares = 0.0;
    for (size_t i = 0; i < n; ++i) {
      for (double& e : g[i]) e /= run.micro_batches;
      for (double e : g[i]) squares += trained[i] ? e * e : 0.0;
    }
    const double norm = std::sqrt(squares);
    result.grad_norms.push_back(static_cast<float>(norm));
    const double clip =
        run.clip > 0.0f && run.clip / (norm + 1e-6) < 1.0 ? run.clip / (norm + 1e-6) : 1.0;
    const double c1 = 1.0 - std::pow(0.9, step);
    const double c2 = 1.0 - std::pow(0.999, step);
    for (size_t i = 0; i < n; ++i) {
      if (!trained[i]) continue;
      for (size_t e = 0; e < p[i].size(); ++e) {
        const double ge = g[i][e] * clip;
        p[i][e] -= run.lr * decay[i] * p[i][e];
        m[i][e] = 0.9 * m[i][e] + 0.1 * ge;
        v[i][e] = 0.999 * v[i][e] + 0.001 * ge * ge;
        p[i][e] -= run.lr * (m[i][e] / c1) / (std::sqrt(v[i][e] / c2) + 1e-8);
      }
    }
  }
  for (const Vec& values : p) result.final_params.emplace_back(values.begin(), values.end());
  return result;
}

}  // namespace zero::testing::features
