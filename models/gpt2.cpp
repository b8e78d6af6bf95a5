#include "models/gpt2.h"

#include <cmath>
#include <utility>

#include "models/gpt2_ops.h"
#include "zero/core/check.h"
#include "zero/runtime/device.h"

namespace zero::models {

namespace {

using kernels::WeightLayout;

// GPT-2 initializes its weights from N(0, 0.02); the engine draws uniform values, so the bound
// gives the same standard deviation (a uniform in [-a, a) has std a / sqrt(3)).
float uniform_bound(float std) {
  return std * std::sqrt(3.0f);
}

// A parameter of the model. With decay_matrices_only, 1-D tensors (LayerNorm gains, biases) are
// in the group without weight decay, as GPT-2 recipes (and the PyTorch reference) put them.
ParamDecl param(const Gpt2Config& config, const char* name, std::vector<int64_t> shape,
                ParamInit init) {
  ParamDecl decl{ParamSpec{name, std::move(shape), 0}, init};
  if (config.decay_matrices_only && decl.spec.shape.size() < 2) decl.weight_decay = 0.0f;
  return decl;
}

// The device of tensors in a parameter's memory: null (host memory) on the CPU.
std::shared_ptr<DeviceContext> device_memory(const std::shared_ptr<DeviceContext>& device) {
  return device && device->device().is_cuda() ? device : nullptr;
}

// `tensor` holding `shape`, reallocated (zero-filled) only when its size changes: activations
// keep their memory from one micro-batch to the next.
void ensure(Tensor& tensor, std::vector<int64_t> shape, const std::shared_ptr<DeviceContext>& on) {
  size_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<size_t>(d);
  if (tensor.numel() != numel || tensor.device() != on) tensor = Tensor(std::move(shape), on);
}

// Where a kernel adds a parameter's gradient: the gradient storage itself when it is fp32;
// otherwise a zeroed fp32 scratch, added into the 16-bit storage by flush_grad (rounding once).
float* grad_target(const ParamRef& grad, Tensor& scratch) {
  if (grad.dtype == DType::kFloat32) return static_cast<float*>(grad.data);
  ensure(scratch, {static_cast<int64_t>(grad.numel)}, device_memory(grad.device));
  grad.device->zero(scratch.data(), grad.numel * sizeof(float));
  return scratch.data();
}

void flush_grad(const ParamRef& grad, const Tensor& scratch) {
  if (grad.dtype != DType::kFloat32) grad.add_f32(scratch.data());
}

// A parameter's values in fp32 and the target of its gradient, one per parameter of a module.
struct ParamSlots {
  std::vector<Tensor> values;  // fp32 copies of 16-bit parameters
  std::vector<Tensor> grads;   // fp32 gradients of 16-bit parameters

  explicit ParamSlots(size_t count) : values(count), grads(count) {}
  const float* value(const std::vector<ParamRef>& params, size_t i) {
    return params[i].as_f32(values[i]);
  }
  float* grad(const std::vector<ParamRef>& grads_in, size_t i) {
    return grad_target(grads_in[i], grads[i]);
  }
  void flush(const std::vector<ParamRef>& grads_in) {
    for (size_t i = 0; i < grads_in.size(); ++i) flush_grad(grads_in[i], grads[i]);
  }
};

// The operations of the memory a module's activations live in, made at first use and shared by
// every module of the model (one cuBLAS handle, one copy of the targets).
class Gpt2Backend {
 public:
  explicit Gpt2Backend(int threads) : threads_(threads) {}
  Gpt2Ops& ops_for(const Tensor& t) {
    if (!t.device()) {
      if (!cpu_) cpu_ = make_cpu_gpt2_ops(threads_);
      return *cpu_;
    }
    if (!cuda_ || cuda_device_ != t.device()) {
      cuda_ = make_cuda_gpt2_ops(t.device());
      cuda_device_ = t.device();
    }
    return *cuda_;
  }

 private:
  int threads_;
  std::unique_ptr<Gpt2Ops> cpu_;
  std::unique_ptr<Gpt2Ops> cuda_;
  std::shared_ptr<DeviceContext> cuda_device_;
};

// Input gradients of a block's inner operations, shared by every block: backward runs one block
// at a time, so one set serves them all.
struct BlockScratch {
  Tensor d_hidden4;  // [N, 4C] gradient of the GELU output, then of the MLP's first matrix
  Tensor d_fc;       // [N, 4C]
  Tensor d_norm;     // [N, C] gradient of a LayerNorm's output
  Tensor d_att;      // [N, C]
  Tensor d_qkv;      // [N, 3C]
};

int64_t rows_of(const Tensor& t) {
  return t.numel() / t.shape().back();
}

// ---------------------------------------------------------------------------------------------
// wte and wpe: out[b, t] = wte[token] + wpe[t].
class Embedding : public Module {
 public:
  Embedding(const Gpt2Config& config, std::shared_ptr<Gpt2Backend> backend)
      : config_(config), backend_(std::move(backend)) {}

  std::vector<ParamDecl> parameters() const override {
    const ParamInit init{InitKind::kUniform, uniform_bound(0.02f)};
    return {param(config_, "wte.weight", {config_.vocab_size, config_.n_embd}, init),
            param(config_, "wpe.weight", {config_.block_size, config_.n_embd}, init)};
  }

  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) override {
    ZERO_CHECK(in.shape().size() == 2, "the GPT-2 takes token ids [batch, seq], got a tensor of "
                                           << in.shape().size() << " dimensions");
    const int B = static_cast<int>(in.shape()[0]);
    const int T = static_cast<int>(in.shape()[1]);
    ZERO_CHECK(T <= config_.block_size, "sequences of " << T << " tokens are longer than the "
                                                        << "model's block size "
                                                        << config_.block_size);
    // Checked on the host: an id outside the table would read past it.
    const std::vector<float> ids = in.to_host();
    for (size_t i = 0; i < ids.size(); ++i) {
      ZERO_CHECK(ids[i] >= 0.0f && ids[i] < static_cast<float>(config_.vocab_size) &&
                     ids[i] == std::floor(ids[i]),
                 "token " << ids[i] << " at position " << i << " is not an id below the "
                          << "vocabulary size " << config_.vocab_size);
    }
    Gpt2Ops& ops = backend_->ops_for(in);
    tokens_ = in;
    ensure(out, {B, T, config_.n_embd}, in.device());
    ops.embedding_forward(out.data(), in.data(), slots_.value(params, 0), slots_.value(params, 1),
                          B, T, config_.n_embd);
  }

  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>&,
                const std::vector<ParamRef>& grads) override {
    const int B = static_cast<int>(tokens_.shape()[0]);
    const int T = static_cast<int>(tokens_.shape()[1]);
    Gpt2Ops& ops = backend_->ops_for(grad_out);
    ops.embedding_backward(slots_.grad(grads, 0), slots_.grad(grads, 1), grad_out.data(),
                           tokens_.data(), B, T, config_.n_embd);
    slots_.flush(grads);
    grad_in = Tensor();  // token ids have no gradient
  }

 private:
  Gpt2Config config_;
  std::shared_ptr<Gpt2Backend> backend_;
  ParamSlots slots_{2};
  Tensor tokens_;
};

// ---------------------------------------------------------------------------------------------
// One pre-LN block: x2 = x + proj(attention(ln_1(x))); out = x2 + mlp(ln_2(x2)).
class Block : public Module {
 public:
  // Parameter indices, in Hugging Face's order.
  enum {
    kLn1W,
    kLn1B,
    kQkvW,
    kQkvB,
    kProjW,
    kProjB,
    kLn2W,
    kLn2B,
    kFcW,
    kFcB,
    kFcProjW,
    kFcProjB,
    kParams
  };

  Block(const Gpt2Config& config, std::shared_ptr<Gpt2Backend> backend,
        std::shared_ptr<BlockScratch> scratch)
      : config_(config), backend_(std::move(backend)), scratch_(std::move(scratch)) {}

  std::vector<ParamDecl> parameters() const override {
    const int64_t C = config_.n_embd;
    const ParamInit ones{InitKind::kOnes, 0.0f};
    const ParamInit zeros{InitKind::kZeros, 0.0f};
    const ParamInit weight{InitKind::kUniform, uniform_bound(0.02f)};
    // GPT-2 scales the residual projections by 1 / sqrt(2 * n_layer): each block adds two.
    const ParamInit residual{InitKind::kUniform,
                             uniform_bound(0.02f / std::sqrt(2.0f * config_.n_layer))};
    auto decl = [this](const char* name, std::vector<int64_t> shape, ParamInit init) {
      return param(config_, name, std::move(shape), init);
    };
    return {decl("ln_1.weight", {C}, ones),
            decl("ln_1.bias", {C}, zeros),
            decl("attn.c_attn.weight", {C, 3 * C}, weight),
            decl("attn.c_attn.bias", {3 * C}, zeros),
            decl("attn.c_proj.weight", {C, C}, residual),
            decl("attn.c_proj.bias", {C}, zeros),
            decl("ln_2.weight", {C}, ones),
            decl("ln_2.bias", {C}, zeros),
            decl("mlp.c_fc.weight", {C, 4 * C}, weight),
            decl("mlp.c_fc.bias", {4 * C}, zeros),
            decl("mlp.c_proj.weight", {4 * C, C}, residual),
            decl("mlp.c_proj.bias", {C}, zeros)};
  }

  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) override {
    const int C = config_.n_embd;
    ZERO_CHECK(in.shape().size() == 3 && in.shape()[2] == C,
               "a GPT-2 block takes activations [batch, seq, " << C << "]");
    const int B = static_cast<int>(in.shape()[0]);
    const int T = static_cast<int>(in.shape()[1]);
    const int N = B * T;
    const int NH = config_.n_head;
    auto w = [&](int i) { return slots_.value(params, i); };
    Gpt2Ops& ops = backend_->ops_for(in);
    const std::shared_ptr<DeviceContext>& dev = in.device();
    input_ = in;
    ensure(ln1_, {N, C}, dev);
    ensure(ln1_mean_, {N}, dev);
    ensure(ln1_rstd_, {N}, dev);
    ensure(qkv_, {N, 3 * C}, dev);
    ensure(att_, {N, C}, dev);
    ensure(lse_, {B, NH, T}, dev);
    ensure(x2_, {B, T, C}, dev);
    ensure(ln2_, {N, C}, dev);
    ensure(ln2_mean_, {N}, dev);
    ensure(ln2_rstd_, {N}, dev);
    ensure(fc_, {N, 4 * C}, dev);
    ensure(gelu_, {N, 4 * C}, dev);
    ensure(out, {B, T, C}, dev);

    ops.layernorm_forward(ln1_.data(), ln1_mean_.data(), ln1_rstd_.data(), in.data(), w(kLn1W),
                          w(kLn1B), N, C, config_.layer_norm_eps);
    ops.matmul_forward(qkv_.data(), ln1_.data(), w(kQkvW), w(kQkvB), N, C, 3 * C,
                       WeightLayout::kInOut);
    ops.attention_forward(att_.data(), lse_.data(), qkv_.data(), B, T, C, NH);
    ops.matmul_forward(x2_.data(), att_.data(), w(kProjW), w(kProjB), N, C, C,
                       WeightLayout::kInOut);
    ops.add(x2_.data(), in.data(), x2_.numel());  // the residual
    ops.layernorm_forward(ln2_.data(), ln2_mean_.data(), ln2_rstd_.data(), x2_.data(), w(kLn2W),
                          w(kLn2B), N, C, config_.layer_norm_eps);
    ops.matmul_forward(fc_.data(), ln2_.data(), w(kFcW), w(kFcB), N, C, 4 * C,
                       WeightLayout::kInOut);
    ops.gelu_forward(gelu_.data(), fc_.data(), fc_.numel());
    ops.matmul_forward(out.data(), gelu_.data(), w(kFcProjW), w(kFcProjB), N, 4 * C, C,
                       WeightLayout::kInOut);
    ops.add(out.data(), x2_.data(), out.numel());
  }

  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& params,
                const std::vector<ParamRef>& grads) override {
    const int C = config_.n_embd;
    const int B = static_cast<int>(input_.shape()[0]);
    const int T = static_cast<int>(input_.shape()[1]);
    const int N = B * T;
    auto w = [&](int i) { return slots_.value(params, i); };
    auto g = [&](int i) { return slots_.grad(grads, i); };
    Gpt2Ops& ops = backend_->ops_for(grad_out);
    const std::shared_ptr<DeviceContext>& dev = grad_out.device();
    BlockScratch& s = *scratch_;
    ensure(s.d_hidden4, {N, 4 * C}, dev);
    ensure(s.d_fc, {N, 4 * C}, dev);
    ensure(s.d_norm, {N, C}, dev);
    ensure(s.d_att, {N, C}, dev);
    ensure(s.d_qkv, {N, 3 * C}, dev);

    // The skip connection carries grad_out to x2 unchanged; the MLP's gradient is added to it.
    Tensor d_x2 = grad_out;
    ops.matmul_backward(s.d_hidden4.data(), g(kFcProjW), g(kFcProjB), grad_out.data(), gelu_.data(),
                        w(kFcProjW), N, 4 * C, C, WeightLayout::kInOut);
    ops.gelu_backward(s.d_fc.data(), fc_.data(), s.d_hidden4.data(), fc_.numel());
    ops.matmul_backward(s.d_norm.data(), g(kFcW), g(kFcB), s.d_fc.data(), ln2_.data(), w(kFcW), N,
                        C, 4 * C, WeightLayout::kInOut);
    ops.layernorm_backward(d_x2.data(), g(kLn2W), g(kLn2B), s.d_norm.data(), x2_.data(), w(kLn2W),
                           ln2_mean_.data(), ln2_rstd_.data(), N, C);
    // The same for the attention half: x's gradient is x2's plus the attention path's.
    ops.matmul_backward(s.d_att.data(), g(kProjW), g(kProjB), d_x2.data(), att_.data(), w(kProjW),
                        N, C, C, WeightLayout::kInOut);
    ops.attention_backward(s.d_qkv.data(), s.d_att.data(), qkv_.data(), att_.data(), lse_.data(), B,
                           T, C, config_.n_head);
    ops.matmul_backward(s.d_norm.data(), g(kQkvW), g(kQkvB), s.d_qkv.data(), ln1_.data(), w(kQkvW),
                        N, C, 3 * C, WeightLayout::kInOut);
    grad_in = std::move(d_x2);
    ops.layernorm_backward(grad_in.data(), g(kLn1W), g(kLn1B), s.d_norm.data(), input_.data(),
                           w(kLn1W), ln1_mean_.data(), ln1_rstd_.data(), N, C);
    slots_.flush(grads);
  }

 private:
  Gpt2Config config_;
  std::shared_ptr<Gpt2Backend> backend_;
  std::shared_ptr<BlockScratch> scratch_;
  ParamSlots slots_{kParams};
  // What backward needs from forward.
  Tensor input_, ln1_, ln1_mean_, ln1_rstd_, qkv_, att_, lse_, x2_, ln2_, ln2_mean_, ln2_rstd_, fc_,
      gelu_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// ln_f, then logits = ln_f(x) @ wte^T and the mean cross-entropy against the targets.
class Gpt2Head : public Module {
 public:
  Gpt2Head(const Gpt2Config& config, std::shared_ptr<Gpt2Backend> backend,
           std::shared_ptr<Gpt2Targets> targets)
      : config_(config), backend_(std::move(backend)), targets_(std::move(targets)) {}

  std::vector<ParamDecl> parameters() const override {
    const int64_t C = config_.n_embd;
    return {param(config_, "weight", {C}, ParamInit{InitKind::kOnes, 0.0f}),
            param(config_, "bias", {C}, ParamInit{InitKind::kZeros, 0.0f})};
  }
  std::vector<std::string> tied_parameters() const override { return {"wte.weight"}; }

  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) override {
    const int C = config_.n_embd;
    const int V = config_.vocab_size;
    const int N = static_cast<int>(rows_of(in));
    const std::vector<int32_t>& ids = targets_->ids;
    ZERO_CHECK(ids.size() == static_cast<size_t>(N),
               "the GPT-2 head has " << ids.size() << " targets for " << N << " positions");
    for (size_t i = 0; i < ids.size(); ++i) {
      ZERO_CHECK(ids[i] >= 0 && ids[i] < V, "target " << ids[i] << " at position " << i
                                                      << " is not below the vocabulary size " << V);
    }
    Gpt2Ops& ops = backend_->ops_for(in);
    const std::shared_ptr<DeviceContext>& dev = in.device();
    input_ = in;
    ensure(norm_, {N, C}, dev);
    ensure(mean_, {N}, dev);
    ensure(rstd_, {N}, dev);
    ensure(logits_, {N, V}, dev);
    ensure(losses_, {N}, dev);
    ensure(lse_, {N}, dev);
    ops.layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), in.data(),
                          slots_.value(params, 0), slots_.value(params, 1), N, C,
                          config_.layer_norm_eps);
    ops.matmul_forward(logits_.data(), norm_.data(), slots_.value(params, 2), nullptr, N, C, V,
                       WeightLayout::kOutIn);
    ops.cross_entropy_forward(losses_.data(), lse_.data(), logits_.data(), ops.targets(ids), N, V);
    // The mean over the positions, summed in double on the host (N values).
    double sum = 0.0;
    for (float loss : losses_.to_host()) sum += loss;
    out = Tensor({1}, {static_cast<float>(sum / N)}, dev);
  }

  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& params,
                const std::vector<ParamRef>& grads) override {
    const int C = config_.n_embd;
    const int V = config_.vocab_size;
    const int N = static_cast<int>(rows_of(input_));
    ZERO_CHECK(grad_out.numel() == 1, "the GPT-2's output is its loss: its gradient is one value");
    // d(mean loss)/d(loss of one position) = 1 / N, times the gradient of the mean.
    const float dloss = grad_out.to_host()[0] / static_cast<float>(N);
    Gpt2Ops& ops = backend_->ops_for(grad_out);
    const std::shared_ptr<DeviceContext>& dev = grad_out.device();
    // The targets forward put in the device's memory are still there.
    ops.cross_entropy_backward(logits_.data(), logits_.data(), lse_.data(),
                               ops.targets(targets_->ids), dloss, N, V);
    ensure(d_norm_, {N, C}, dev);
    ops.matmul_backward(d_norm_.data(), slots_.grad(grads, 2), nullptr, logits_.data(),
                        norm_.data(), slots_.value(params, 2), N, C, V, WeightLayout::kOutIn);
    grad_in = Tensor(input_.shape(), dev);
    ops.layernorm_backward(grad_in.data(), slots_.grad(grads, 0), slots_.grad(grads, 1),
                           d_norm_.data(), input_.data(), slots_.value(params, 0), mean_.data(),
                           rstd_.data(), N, C);
    slots_.flush(grads);
  }

  const Tensor& logits() const { return logits_; }

 private:
  Gpt2Config config_;
  std::shared_ptr<Gpt2Backend> backend_;
  std::shared_ptr<Gpt2Targets> targets_;
  ParamSlots slots_{3};
  Tensor input_, norm_, mean_, rstd_, logits_, losses_, lse_, d_norm_;
};

bool gpt2_preset(const std::string& name, Gpt2Config* config) {
  struct Preset {
    const char* name;
    int n_layer, n_head, n_embd, vocab_size, block_size;
  };
  static const Preset kPresets[] = {
      {"tiny", 4, 4, 128, 256, 256},
      {"gpt2-124M", 12, 12, 768, 50257, 1024},
      {"gpt2-350M", 24, 16, 1024, 50257, 1024},
      {"gpt2-774M", 36, 20, 1280, 50257, 1024},
      {"gpt2-1.5B", 48, 25, 1600, 50257, 1024},
  };
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    config->n_layer = p.n_layer;
    config->n_head = p.n_head;
    config->n_embd = p.n_embd;
    config->vocab_size = p.vocab_size;
    config->block_size = p.block_size;
    return true;
  }
  return false;
}

const char* gpt2_preset_names() {
  return "tiny, gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1.5B";
}

void check_gpt2_config(const Gpt2Config& c) {
  ZERO_CHECK(c.n_layer >= 1, "GPT-2 n_layer must be at least 1, got " << c.n_layer);
  ZERO_CHECK(c.n_head >= 1, "GPT-2 n_head must be at least 1, got " << c.n_head);
  ZERO_CHECK(c.n_embd >= 1, "GPT-2 n_embd must be at least 1, got " << c.n_embd);
  ZERO_CHECK(c.n_embd % c.n_head == 0,
             "GPT-2 n_embd (" << c.n_embd << ") must be a multiple of n_head (" << c.n_head << ")");
  ZERO_CHECK(c.vocab_size >= 1, "GPT-2 vocab_size must be at least 1, got " << c.vocab_size);
  ZERO_CHECK(c.block_size >= 1, "GPT-2 block_size must be at least 1, got " << c.block_size);
}

Gpt2 make_gpt2(const Gpt2Config& config, int kernel_threads) {
  check_gpt2_config(config);
  auto backend = std::make_shared<Gpt2Backend>(kernel_threads);
  Gpt2 model;
  model.targets = std::make_shared<Gpt2Targets>();
  model.modules.push_back({"", std::make_unique<Embedding>(config, backend)});
  auto scratch = std::make_shared<BlockScratch>();
  for (int i = 0; i < config.n_layer; ++i) {
    model.modules.push_back(
        {"h." + std::to_string(i), std::make_unique<Block>(config, backend, scratch)});
  }
  auto head = std::make_unique<Gpt2Head>(config, backend, model.targets);
  model.head = head.get();
  model.modules.push_back({"ln_f", std::move(head)});
  return model;
}

std::vector<ParamSpec> gpt2_param_specs(const Gpt2Config& config) {
  Gpt2 model = make_gpt2(config, 1);
  std::vector<ParamSpec> specs;
  for (size_t m = 0; m < model.modules.size(); ++m) {
    const std::string& prefix = model.modules[m].name;
    for (ParamDecl d : model.modules[m].module->parameters()) {
      if (!prefix.empty()) d.spec.name = prefix + "." + d.spec.name;
      d.spec.module = static_cast<int>(m);
      specs.push_back(std::move(d.spec));
    }
  }
  return specs;
}

const Tensor& gpt2_logits(const Gpt2& model) {
  return model.head->logits();
}

double gpt2_flops_per_token(const Gpt2Config& c, int seq_len) {
  double params = 0.0;
  for (const ParamSpec& s : gpt2_param_specs(c)) {
    double n = 1.0;
    for (int64_t d : s.shape) n *= static_cast<double>(d);
    params += n;
  }
  return 6.0 * params + 12.0 * c.n_layer * c.n_embd * static_cast<double>(seq_len);
}

}  // namespace zero::models
