#include "models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "models/gpt2_block.h"
#include "models/gpt2_common.h"
#include "models/gpt2_tensor_parallel.h"
#include "zero/core/check.h"
#include "zero/kernels/transformer_kernels.h"
#include "zero/runtime/device.h"

namespace zero::models {

namespace {

using gpt2_detail::bytes_of;
using gpt2_detail::ensure;
using gpt2_detail::param;
using gpt2_detail::ParamSlots;
using gpt2_detail::uniform_bound;
using kernels::WeightLayout;

int64_t rows_of(const Tensor& t) {
  return t.numel() / t.shape().back();
}

// The modules of make_gpt2, on no tensor-parallel group yet.
Gpt2 build_gpt2(const Gpt2Config& config, int kernel_threads,
                const Gpt2Checkpointing& checkpointing, const Gpt2PipelineStage& stage);

}  // namespace

// ---------------------------------------------------------------------------------------------
// The rows of wte (the vocabulary) this rank holds: all of them without tensor parallelism.
// `rows` of them from token `first`, of which `count` are tokens (the rest padding).
struct VocabularyRows {
  int first = 0;
  int count = 0;
  int rows = 0;
};
VocabularyRows vocabulary_rows(const Gpt2Config& config, int tensor_parallel_rank) {
  const int rows = gpt2_vocabulary_rows(config.vocab_size, config.tensor_parallel_size);
  const int first = rows * tensor_parallel_rank;
  return {first, std::min(rows, config.vocab_size - first), rows};
}

// wte and wpe: out[b, t] = wte[token] + wpe[t]. With tensor parallelism wte is split by rows
// (vocabulary-parallel): each rank looks up the tokens in its rows (0 for the others), rank 0
// adds wpe, and the sum over the group is the embedding, exactly.
class Gpt2Embedding : public Module {
 public:
  Gpt2Embedding(const Gpt2Config& config, std::shared_ptr<gpt2_detail::Gpt2Backend> backend)
      : config_(config), backend_(std::move(backend)) {}

  std::vector<ParamDecl> parameters() const override {
    const ParamInit init{InitKind::kUniform, uniform_bound(0.02f)};
    // This rank's rows of the vocabulary.
    return {
        gpt2_detail::split_param(config_, "wte.weight", {config_.vocab_size, config_.n_embd}, init),
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
    backend_->keep_copy(tokens_, in);
    ensure(out, {B, T, config_.n_embd}, in.device());
    if (takes_16bit_table(ops, params[0])) {
      ops.embedding_forward_16bit(out.data(), in.data(), params[0].data, params[0].dtype,
                                  slots_.value(params, 1), B, T, config_.n_embd);
      return;
    }
    if (config_.tensor_parallel_size == 1) {
      ops.embedding_forward(out.data(), in.data(), slots_.value(params, 0), slots_.value(params, 1),
                            B, T, config_.n_embd);
      return;
    }
    const VocabularyRows rows = vocabulary_rows(config_, backend_->tensor_parallel_rank());
    ops.embedding_forward_rows(
        out.data(), in.data(), slots_.value(params, 0),
        backend_->adds_row_parallel_bias() ? slots_.value(params, 1) : nullptr, rows.first,
        rows.count, B, T, config_.n_embd);
    backend_->all_reduce_tensor_parallel(out.data(), out.numel(), out.device());
  }

  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>&,
                const std::vector<ParamRef>& grads) override {
    const int B = static_cast<int>(tokens_.shape()[0]);
    const int T = static_cast<int>(tokens_.shape()[1]);
    Gpt2Ops& ops = backend_->ops_for(grad_out);
    if (takes_16bit_table(ops, grads[0])) {
      // The table's gradient goes into its rows directly; wpe's as before.
      ops.embedding_backward_16bit(grads[0].data, grads[0].dtype, slots_.grad(grads, 1),
                                   grad_out.data(), tokens_.data(), B, T, config_.n_embd);
      gpt2_detail::flush_grad(grads[1], slots_.grads[1]);
      grad_in = Tensor();
      return;
    }
    if (config_.tensor_parallel_size == 1) {
      ops.embedding_backward(slots_.grad(grads, 0), slots_.grad(grads, 1), grad_out.data(),
                             tokens_.data(), B, T, config_.n_embd);
    } else {
      const VocabularyRows rows = vocabulary_rows(config_, backend_->tensor_parallel_rank());
      ops.embedding_backward_rows(slots_.grad(grads, 0), slots_.grad(grads, 1), grad_out.data(),
                                  tokens_.data(), rows.first, rows.count, B, T, config_.n_embd);
    }
    slots_.flush(grads);
    grad_in = Tensor();  // token ids have no gradient
  }

  // The gradient is a scatter of grad_out by token id: stage 3 need not gather wte and wpe again.
  bool backward_reads_params() const override { return false; }

  // Split: the token ids have no gradient, so all of the work waits for the weight half.
  bool splits_backward() const override { return true; }
  void backward_input(const Tensor& grad_out, Tensor& grad_in,
                      const std::vector<ParamRef>&) override {
    backend_->keep_copy(grad_out_, grad_out);
    grad_in = Tensor();
  }
  void backward_weight(const std::vector<ParamRef>& grads) override {
    Tensor no_input_gradient;
    backward(grad_out_, no_input_gradient, {}, grads);
    grad_out_ = Tensor();
  }

  // The token ids, and after backward_input the gradient its weight half reads.
  void take_activations(KeptActivations& kept) override {
    kept.clear();
    kept.push_back(std::move(tokens_));
    tokens_ = Tensor();
    if (grad_out_.numel() == 0) return;
    kept.push_back(std::move(grad_out_));
    grad_out_ = Tensor();
  }
  void restore_activations(KeptActivations& kept) override {
    ZERO_CHECK(kept.size() == 1 || kept.size() == 2,
               "the GPT-2 embedding got " << kept.size()
                                          << " activations back; it gave out 1 (2 after "
                                             "backward_input)");
    tokens_ = std::move(kept[0]);
    if (kept.size() == 2) grad_out_ = std::move(kept[1]);
    kept.clear();
  }

  uint64_t activation_bytes() const { return bytes_of(tokens_); }
  uint64_t copy_bytes() const { return slots_.bytes(); }

 private:
  // Whether the whole vocabulary's 16-bit table (and its gradient) goes to the ops as it is:
  // widening all of it, or zeroing and adding a whole fp32 copy of its gradient, costs a pass
  // over every row for the few thousand a batch names.
  bool takes_16bit_table(const Gpt2Ops& ops, const ParamRef& table) const {
    return config_.tensor_parallel_size == 1 && table.dtype != DType::kFloat32 &&
           ops.embeds_16bit_tables();
  }
  Gpt2Config config_;
  std::shared_ptr<gpt2_detail::Gpt2Backend> backend_;
  ParamSlots slots_{2};
  Tensor tokens_;
  Tensor grad_out_;  // between backward_input and backward_weight
};

// ---------------------------------------------------------------------------------------------
// The last pipeline stage's own wte, which its head reads: the stage's input passes through
// unchanged. Its gradient comes from the head alone; the engine adds the first stage's
// (EngineConfig::pipeline).
class Gpt2StageWte : public Module {
 public:
  explicit Gpt2StageWte(const Gpt2Config& config) : config_(config) {}

  std::vector<ParamDecl> parameters() const override {
    const ParamInit init{InitKind::kUniform, uniform_bound(0.02f)};
    return {gpt2_detail::split_param(config_, "wte.weight", {config_.vocab_size, config_.n_embd},
                                     init)};
  }
  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>&) override { out = in; }
  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>&,
                const std::vector<ParamRef>&) override {
    grad_in = grad_out;
  }
  bool backward_reads_params() const override { return false; }
  bool splits_backward() const override { return true; }
  void backward_input(const Tensor& grad_out, Tensor& grad_in,
                      const std::vector<ParamRef>&) override {
    grad_in = grad_out;
  }
  void backward_weight(const std::vector<ParamRef>&) override {}
  void take_activations(KeptActivations& kept) override { kept.clear(); }
  void restore_activations(KeptActivations& kept) override { kept.clear(); }

 private:
  Gpt2Config config_;
};

// ---------------------------------------------------------------------------------------------
// ln_f, then logits = ln_f(x) @ wte^T and the mean cross-entropy against the targets. With
// tensor parallelism each rank computes the logits of its rows of wte only (no rank holds them
// all): the cross-entropy combines the ranks' log-sum-exps (an all-gather of N values) and the
// target's logit (an all-reduce of N), and backward all-reduces the input's gradient.
class Gpt2Head : public Module {
 public:
  Gpt2Head(const Gpt2Config& config, std::shared_ptr<gpt2_detail::Gpt2Backend> backend,
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
    // This rank's columns of the logits: its rows of wte, padding included.
    const int V = gpt2_vocabulary_rows(config_.vocab_size, config_.tensor_parallel_size);
    const int N = static_cast<int>(rows_of(in));
    const std::vector<int32_t>& ids = targets_->ids;
    ZERO_CHECK(ids.size() == static_cast<size_t>(N),
               "the GPT-2 head has " << ids.size() << " targets for " << N << " positions");
    for (size_t i = 0; i < ids.size(); ++i) {
      ZERO_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size,
                 "target " << ids[i] << " at position " << i << " is not below the vocabulary size "
                           << config_.vocab_size);
    }
    Gpt2Ops& ops = backend_->ops_for(in);
    ops.set_bf16_products(gpt2_detail::bf16_products(params));
    const std::shared_ptr<DeviceContext>& dev = in.device();
    backend_->keep_copy(input_, in);
    backend_->activation(norm_, {N, C}, dev);
    backend_->activation(mean_, {N}, dev);
    backend_->activation(rstd_, {N}, dev);
    backend_->activation(logits_, {N, V}, dev);
    backend_->activation(losses_, {N}, dev);
    backend_->activation(lse_, {N}, dev);
    ops.layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), in.data(),
                          slots_.value(params, 0), slots_.value(params, 1), N, C,
                          config_.layer_norm_eps);
    ops.matmul_forward(logits_.data(), norm_.data(), slots_.matrix(params, 2, ops), nullptr, N, C,
                       V, WeightLayout::kOutIn);
    logits_hold_gradient_ = fuses_loss_gradient(ops);
    if (logits_hold_gradient_) {
      ops.cross_entropy_forward_bf16_gradient(losses_.data(), lse_.data(), logits_.data(),
                                              ops.targets(ids), N, V);
    } else if (config_.tensor_parallel_size == 1) {
      ops.cross_entropy_forward(losses_.data(), lse_.data(), logits_.data(), ops.targets(ids), N,
                                V);
    } else {
      parallel_cross_entropy(ops, N, V, dev);
    }
    // The mean over the positions, summed in double on the host (N values).
    double sum = 0.0;
    for (float loss : losses_.to_host()) sum += loss;
    out = Tensor({1}, {static_cast<float>(sum / N)}, dev);
  }

  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& params,
                const std::vector<ParamRef>& grads) override {
    const int C = config_.n_embd;
    // This rank's columns of the logits: its rows of wte, padding included.
    const int V = gpt2_vocabulary_rows(config_.vocab_size, config_.tensor_parallel_size);
    const int N = static_cast<int>(rows_of(input_));
    Gpt2Ops& ops = backend_->ops_for(grad_out);
    ops.set_bf16_products(gpt2_detail::bf16_products(params));
    const std::shared_ptr<DeviceContext>& dev = grad_out.device();
    // ln_f's output gradient over ln_f's output, its last reader (as the blocks do).
    float* const d_norm = norm_.data();
    if (fuses_loss_gradient(ops)) {
      ops.matmul_backward_scaled_bf16(d_norm, slots_.matrix_grad(grads, 2, ops), logits_.data(),
                                      loss_gradient_scale(grad_out, N), norm_.data(),
                                      slots_.matrix(params, 2, ops), N, C, V, WeightLayout::kOutIn);
    } else {
      logits_gradient(ops, grad_out, N, V);
      ops.matmul_backward(d_norm, slots_.matrix_grad(grads, 2, ops), nullptr, logits_.data(),
                          norm_.data(), slots_.matrix(params, 2, ops), N, C, V,
                          WeightLayout::kOutIn);
    }
    // Each rank's columns give a share of ln_f's output gradient: the sum is whole.
    backend_->all_reduce_tensor_parallel(d_norm, norm_.numel(), dev);
    grad_in = Tensor(input_.shape(), dev);
    ops.layernorm_backward(grad_in.data(), slots_.grad(grads, 0), slots_.grad(grads, 1), d_norm,
                           input_.data(), slots_.value(params, 0), mean_.data(), rstd_.data(), N,
                           C);
    slots_.flush(grads);
  }

  // Split: the input half keeps the logits' gradient and ln_f's input and output gradient for
  // the weight half (ln_f's output stays: it is the head's input).
  bool splits_backward() const override { return true; }
  void backward_input(const Tensor& grad_out, Tensor& grad_in,
                      const std::vector<ParamRef>& params) override {
    const int C = config_.n_embd;
    const int V = gpt2_vocabulary_rows(config_.vocab_size, config_.tensor_parallel_size);
    const int N = static_cast<int>(rows_of(input_));
    Gpt2Ops& ops = backend_->ops_for(grad_out);
    ops.set_bf16_products(gpt2_detail::bf16_products(params));
    const std::shared_ptr<DeviceContext>& dev = grad_out.device();
    backend_->activation(d_norm_, {N, C}, dev);
    if (fuses_loss_gradient(ops)) {
      weight_gradient_scale_ = loss_gradient_scale(grad_out, N);
      ops.matmul_backward_scaled_bf16(d_norm_.data(), nullptr, logits_.data(),
                                      weight_gradient_scale_, nullptr,
                                      slots_.matrix(params, 2, ops), N, C, V, WeightLayout::kOutIn);
    } else {
      logits_gradient(ops, grad_out, N, V);
      ops.matmul_backward(d_norm_.data(), nullptr, nullptr, logits_.data(), nullptr,
                          slots_.matrix(params, 2, ops), N, C, V, WeightLayout::kOutIn);
    }
    backend_->all_reduce_tensor_parallel(d_norm_.data(), d_norm_.numel(), dev);
    grad_in = Tensor(input_.shape(), dev);
    ops.layernorm_backward(grad_in.data(), nullptr, nullptr, d_norm_.data(), input_.data(),
                           slots_.value(params, 0), mean_.data(), rstd_.data(), N, C);
  }
  void backward_weight(const std::vector<ParamRef>& grads) override {
    const int C = config_.n_embd;
    const int V = gpt2_vocabulary_rows(config_.vocab_size, config_.tensor_parallel_size);
    const int N = static_cast<int>(rows_of(input_));
    Gpt2Ops& ops = backend_->ops_for(input_);
    ops.set_bf16_products(gpt2_detail::bf16_products(grads));
    if (fuses_loss_gradient(ops)) {
      ops.matmul_backward_scaled_bf16(nullptr, slots_.matrix_grad(grads, 2, ops), logits_.data(),
                                      weight_gradient_scale_, norm_.data(), nullptr, N, C, V,
                                      WeightLayout::kOutIn);
    } else {
      ops.matmul_backward(nullptr, slots_.matrix_grad(grads, 2, ops), nullptr, logits_.data(),
                          norm_.data(), nullptr, N, C, V, WeightLayout::kOutIn);
    }
    ops.layernorm_backward(nullptr, slots_.grad(grads, 0), slots_.grad(grads, 1), d_norm_.data(),
                           input_.data(), nullptr, mean_.data(), rstd_.data(), N, C);
    slots_.flush(grads);
    d_norm_ = Tensor();
  }

  // The kept tensors, then the micro-batch's targets (ids below 2^24 are exact as floats) and
  // the scale of the gradient the logits hold between backward_input and backward_weight.
  void take_activations(KeptActivations& kept) override {
    kept.clear();
    for (Tensor* tensor : kept_tensors()) {
      kept.push_back(std::move(*tensor));
      *tensor = Tensor();
    }
    const std::vector<int32_t>& ids = targets_->ids;
    kept.emplace_back(std::vector<int64_t>{static_cast<int64_t>(ids.size())},
                      std::vector<float>(ids.begin(), ids.end()));
    kept.emplace_back(std::vector<int64_t>{1}, std::vector<float>{weight_gradient_scale_});
  }
  void restore_activations(KeptActivations& kept) override {
    const std::vector<Tensor*> tensors = kept_tensors();
    ZERO_CHECK(kept.size() == tensors.size() + 2,
               "the GPT-2 head got " << kept.size() << " activations back; it gave out "
                                     << tensors.size() + 2);
    for (size_t i = 0; i < tensors.size(); ++i) *tensors[i] = std::move(kept[i]);
    const std::vector<float> ids = kept[tensors.size()].to_host();
    targets_->ids.assign(ids.begin(), ids.end());
    weight_gradient_scale_ = kept.back().to_host()[0];
    kept.clear();
  }

  const Tensor& logits() const {
    ZERO_CHECK(!logits_hold_gradient_,
               "the GPT-2 head's bf16 products made the loss's gradient in the logits' memory "
               "during forward: the logits are not kept (run with fp32 products to read them)");
    return logits_;
  }
  uint64_t copy_bytes() const { return slots_.bytes(); }
  // What forward keeps for backward (and backward_input for backward_weight).
  uint64_t kept_bytes() const {
    return bytes_of(input_) + bytes_of(norm_) + bytes_of(mean_) + bytes_of(rstd_) +
           bytes_of(logits_) + bytes_of(losses_) + bytes_of(lse_) + bytes_of(d_norm_);
  }

 private:
  // Whether forward makes the loss's gradient with the loss (bf16 products, the whole
  // vocabulary on this rank): set by the ops and the configuration alone, so forward and
  // backward agree.
  bool fuses_loss_gradient(const Gpt2Ops& ops) const {
    return config_.tensor_parallel_size == 1 && ops.fuses_loss_gradient();
  }
  // d(mean loss)/d(loss of one position) = 1 / N, times the gradient of the mean.
  static float loss_gradient_scale(const Tensor& grad_out, int N) {
    ZERO_CHECK(grad_out.numel() == 1, "the GPT-2's output is its loss: its gradient is one value");
    return grad_out.to_host()[0] / static_cast<float>(N);
  }
  // The logits' gradient over the logits. The targets forward put in the device's memory are
  // still there.
  void logits_gradient(Gpt2Ops& ops, const Tensor& grad_out, int N, int V) {
    const float dloss = loss_gradient_scale(grad_out, N);
    if (config_.tensor_parallel_size == 1) {
      ops.cross_entropy_backward(logits_.data(), logits_.data(), lse_.data(),
                                 ops.targets(targets_->ids), dloss, N, V);
    } else {
      const VocabularyRows rows = vocabulary_rows(config_, backend_->tensor_parallel_rank());
      ops.cross_entropy_backward_partial(logits_.data(), logits_.data(), lse_.data(),
                                         ops.targets(targets_->ids), rows.first, dloss, N,
                                         rows.count, V);
    }
  }

  Gpt2Config config_;
  std::shared_ptr<gpt2_detail::Gpt2Backend> backend_;
  // The cross-entropy over the whole vocabulary from this rank's columns of the logits: each
  // row's log-sum-exp combined from every rank's (into lse_, which backward uses), minus the
  // target's logit (summed over the ranks: only its owner's is not 0). The ranks' partials are
  // gathered in the activations' memory and combined on the host in double (N rows), so both
  // devices combine them alike.
  void parallel_cross_entropy(Gpt2Ops& ops, int N, int V,
                              const std::shared_ptr<DeviceContext>& dev) {
    const int t = config_.tensor_parallel_size;
    const VocabularyRows rows = vocabulary_rows(config_, backend_->tensor_parallel_rank());
    Tensor mine({N}, dev), all({t, N}, dev), target_logits({N}, dev);
    ops.cross_entropy_partials(mine.data(), target_logits.data(), logits_.data(),
                               ops.targets(targets_->ids), rows.first, N, rows.count, V);
    backend_->all_gather_tensor_parallel(mine.data(), all.data(), static_cast<size_t>(N), dev);
    backend_->all_reduce_tensor_parallel(target_logits.data(), static_cast<size_t>(N), dev);
    const std::vector<float> lses = all.to_host();
    const std::vector<float> targets = target_logits.to_host();
    std::vector<float> lse(static_cast<size_t>(N)), losses(static_cast<size_t>(N));
    for (size_t n = 0; n < static_cast<size_t>(N); ++n) {
      float max = lses[n];
      for (int r = 1; r < t; ++r) max = std::max(max, lses[static_cast<size_t>(r) * N + n]);
      double sum = 0.0;
      for (int r = 0; r < t; ++r)
        sum += std::exp(static_cast<double>(lses[static_cast<size_t>(r) * N + n]) - max);
      lse[n] = static_cast<float>(max + std::log(sum));
      losses[n] = lse[n] - targets[n];
    }
    DeviceContext& context = backend_->context_of(dev);
    context.copy_from_host(lse_.data(), lse.data(), lse.size() * sizeof(float));
    context.copy_from_host(losses_.data(), losses.data(), losses.size() * sizeof(float));
  }

  std::vector<Tensor*> kept_tensors() {
    return {&input_, &norm_, &mean_, &rstd_, &logits_, &losses_, &lse_, &d_norm_};
  }

  std::shared_ptr<Gpt2Targets> targets_;
  ParamSlots slots_{3};
  Tensor input_, norm_, mean_, rstd_, logits_, losses_, lse_;
  Tensor d_norm_;  // ln_f's output gradient, between backward_input and backward_weight
  // With the gradient made in forward: its scale, from backward_input to backward_weight.
  float weight_gradient_scale_ = 0.0f;
  bool logits_hold_gradient_ = false;  // the last forward's logits were replaced by it
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
  ZERO_CHECK(c.tensor_parallel_size >= 1,
             "GPT-2 tensor_parallel_size must be at least 1, got " << c.tensor_parallel_size);
  ZERO_CHECK(
      c.tensor_parallel_size == 1 || gpt2_vocabulary_rows(c.vocab_size, c.tensor_parallel_size) *
                                             (c.tensor_parallel_size - 1) <
                                         c.vocab_size,
      "GPT-2 vocab_size (" << c.vocab_size << ") leaves the last of " << c.tensor_parallel_size
                           << " tensor-parallel ranks no row of wte: use fewer ranks");
  ZERO_CHECK(c.n_head % c.tensor_parallel_size == 0,
             "GPT-2 n_head (" << c.n_head << ") must be a multiple of the tensor-parallel size ("
                              << c.tensor_parallel_size
                              << "): each tensor-parallel rank computes whole heads");
}

Gpt2 make_gpt2(const Gpt2Config& config, int kernel_threads, const Gpt2Checkpointing& checkpointing,
               const Gpt2TensorParallel& tensor_parallel, const Gpt2PipelineStage& pipeline_stage) {
  const int t = config.tensor_parallel_size;
  ZERO_CHECK(
      t == 1 || (tensor_parallel.comm != nullptr && tensor_parallel.comm->world_size() == t &&
                 tensor_parallel.rank == tensor_parallel.comm->rank()),
      "a GPT-2 split over " << t << " tensor-parallel ranks needs the communicator of its " << t
                            << " ranks and this rank's place in it");
  Gpt2 model = build_gpt2(config, kernel_threads, checkpointing, pipeline_stage);
  if (t > 1) model.backend->set_tensor_parallel(tensor_parallel);
  return model;
}

namespace {

Gpt2 build_gpt2(const Gpt2Config& config, int kernel_threads,
                const Gpt2Checkpointing& checkpointing, const Gpt2PipelineStage& stage) {
  check_gpt2_config(config);
  check_gpt2_checkpointing(checkpointing, config.n_layer);
  const int chunks = stage.chunk_count();
  std::vector<int> layers;  // the stage's blocks, chunk after chunk
  for (int c = 0; c < chunks; ++c) {
    const std::pair<int, int> range = stage.chunk_layers(c, config.n_layer);
    for (int i = range.first; i < range.second; ++i) layers.push_back(i);
  }
  auto backend = std::make_shared<gpt2_detail::Gpt2Backend>(kernel_threads);
  Gpt2 model;
  model.targets = std::make_shared<Gpt2Targets>();
  model.backend = backend;
  auto shared = std::make_shared<Gpt2BlockShared>();
  model.shared = shared.get();
  int slots = 0;
  for (int i : layers) slots += gpt2_block_checkpointed(checkpointing, i, config.n_layer) ? 1 : 0;
  if (!checkpointing.nvme_path.empty()) {
    shared->spill = std::make_unique<Gpt2CheckpointSpill>(
        checkpointing.nvme_path, checkpointing.spill_aio, checkpointing.spill_rank, slots,
        checkpointing.checkpoint_generations);
  }
  int slot = 0;
  for (int c = 0; c < chunks; ++c) {
    model.chunk_first_modules.push_back(static_cast<int>(model.modules.size()));
    if (stage.embeds(c)) {
      auto embedding = std::make_unique<Gpt2Embedding>(config, backend);
      model.embedding = embedding.get();
      model.modules.push_back({"", std::move(embedding)});
    } else if (stage.heads(c)) {
      model.modules.push_back({"", std::make_unique<Gpt2StageWte>(config)});
    }
    // Backward fetches the checkpoint of the chunk's previous checkpointed block next.
    Gpt2Block* previous_checkpointed = nullptr;
    const std::pair<int, int> range = stage.chunk_layers(c, config.n_layer);
    for (int i = range.first; i < range.second; ++i) {
      Gpt2BlockCheckpointing block_checkpointing;
      block_checkpointing.contiguous_memory = checkpointing.contiguous_memory;
      block_checkpointing.slots = slots;
      block_checkpointing.generations = checkpointing.checkpoint_generations;
      block_checkpointing.profile = checkpointing.profile;
      block_checkpointing.synchronize = checkpointing.synchronize_boundary;
      block_checkpointing.cpu_checkpointing = checkpointing.cpu_checkpointing;
      block_checkpointing.partition = gpt2_partitions_checkpoints(config, checkpointing);
      block_checkpointing.spill = !checkpointing.nvme_path.empty();
      if (gpt2_block_checkpointed(checkpointing, i, config.n_layer)) {
        block_checkpointing.recompute = checkpointing.recompute;
        block_checkpointing.slot = slot++;
      }
      auto block = std::make_unique<Gpt2Block>(config, block_checkpointing, backend, shared);
      if (block->recomputes()) {
        block->set_previous_checkpointed(previous_checkpointed);
        previous_checkpointed = block.get();
      }
      model.blocks.push_back(block.get());
      model.modules.push_back({"h." + std::to_string(i), std::move(block)});
    }
    if (stage.heads(c)) {
      auto head = std::make_unique<Gpt2Head>(config, backend, model.targets);
      model.head = head.get();
      model.modules.push_back({"ln_f", std::move(head)});
    }
  }
  return model;
}

}  // namespace

void count_gpt2_activations(Gpt2& model, Allocator& allocator) {
  model.backend->set_allocator(&allocator);
}

Gpt2Profile take_gpt2_profile(Gpt2& model) {
  Gpt2Profile profile;
  for (Gpt2Block* block : model.blocks) {
    const Gpt2BlockTimes times = block->take_times();
    profile.forward_ms.push_back(times.forward_ms);
    profile.recompute_ms.push_back(times.recompute_ms);
    profile.backward_ms.push_back(times.backward_ms);
    profile.synchronizations.push_back(times.synchronizations);
    profile.recomputes.push_back(block->recomputes());
  }
  return profile;
}

Gpt2SpillTraffic take_gpt2_spill_traffic(Gpt2& model) {
  return model.shared->spill ? model.shared->spill->take_traffic() : Gpt2SpillTraffic{};
}

Gpt2ActivationBytes gpt2_held_activations(const Gpt2& model) {
  Gpt2ActivationBytes bytes;
  bytes.embedding = model.embedding ? model.embedding->activation_bytes() : 0;
  for (const Gpt2Block* block : model.blocks) {
    bytes.blocks.push_back(block->kept_bytes());
    bytes.checkpoints += block->checkpoint_bytes();
    bytes.host_checkpoints += block->host_checkpoint_bytes();
  }
  if (model.shared->spill) {
    bytes.spill_buffer = gpt2_detail::bytes_of(model.shared->spill_buffer);
    bytes.checkpoints += bytes.spill_buffer;
    bytes.nvme_checkpoints = model.shared->spill->file_bytes();
  }
  bytes.recompute = model.shared->recompute_bytes();
  bytes.head = model.head ? model.head->kept_bytes() : 0;
  return bytes;
}

std::vector<ParamSpec> gpt2_param_specs(const Gpt2Config& config,
                                        const Gpt2PipelineStage& pipeline_stage) {
  // The shapes only: the modules are never run, so no tensor-parallel group is needed.
  Gpt2 model = build_gpt2(config, 1, {}, pipeline_stage);
  std::vector<ParamSpec> specs;
  int chunk = 0;
  for (size_t m = 0; m < model.modules.size(); ++m) {
    const std::string& prefix = model.modules[m].name;
    while (chunk + 1 < static_cast<int>(model.chunk_first_modules.size()) &&
           static_cast<int>(m) >= model.chunk_first_modules[static_cast<size_t>(chunk) + 1]) {
      ++chunk;
    }
    for (ParamDecl d : model.modules[m].module->parameters()) {
      if (!prefix.empty()) d.spec.name = prefix + "." + d.spec.name;
      d.spec.module = static_cast<int>(m);
      d.spec.chunk = chunk;
      specs.push_back(std::move(d.spec));
    }
  }
  // As ZeroModel marks them: the parameters a later module ties to.
  for (const NamedModule& named : model.modules) {
    for (const std::string& name : named.module->tied_parameters()) {
      for (ParamSpec& spec : specs) spec.tied = spec.tied || spec.name == name;
    }
  }
  return specs;
}

uint64_t gpt2_module_copy_bytes(const Gpt2Config& config, DType dtype, bool on_gpu) {
  if (dtype == DType::kFloat32) return 0;
  // What the modules read as it is (ParamSlots): on the CPU the embedding's 16-bit table
  // (without tensor parallelism), and where bf16 products run in bf16 the weight matrices, the
  // blocks' and the head's (wte). Everything else of the embedding, the head and one block (the
  // blocks share one set, Gpt2BlockShared::params) is copied, values and gradients.
  const bool table_as_is = !on_gpu && config.tensor_parallel_size == 1;
  const bool matrices_as_is =
      !on_gpu && dtype == DType::kBFloat16 && kernels::bf16_products_in_bf16();
  uint64_t copied = 0;
  for (const ParamSpec& spec : gpt2_param_specs(config)) {
    uint64_t n = 1;
    for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
    const bool first_block = spec.name.rfind("h.0.", 0) == 0;
    if (spec.name.rfind("h.", 0) == 0 && !first_block) continue;
    if (spec.name == "wte.weight") {
      if (!table_as_is) copied += n;     // the embedding's
      if (!matrices_as_is) copied += n;  // the head's
      continue;
    }
    if (first_block && spec.shape.size() == 2 && matrices_as_is) continue;
    copied += n;
  }
  return copied * 2 * sizeof(float);
}

uint64_t gpt2_held_module_copies(const Gpt2& model) {
  uint64_t bytes = model.shared->params.bytes();
  if (model.embedding) bytes += model.embedding->copy_bytes();
  if (model.head) bytes += model.head->copy_bytes();
  return bytes;
}

const Tensor& gpt2_logits(const Gpt2& model) {
  ZERO_CHECK(model.head != nullptr, "this GPT-2 pipeline stage has no head, so no logits");
  return model.head->logits();
}

double gpt2_flops_per_token(const Gpt2Config& c, int seq_len) {
  // The whole model's, however it is split.
  Gpt2Config whole = c;
  whole.tensor_parallel_size = 1;
  double params = 0.0;
  for (const ParamSpec& s : gpt2_param_specs(whole)) {
    double n = 1.0;
    for (int64_t d : s.shape) n *= static_cast<double>(d);
    params += n;
  }
  return 6.0 * params + 12.0 * c.n_layer * c.n_embd * static_cast<double>(seq_len);
}

}  // namespace zero::models
