#include "examples/torch_gpt2/torch_gpt2.h"

#include <cmath>
#include <limits>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>

#include "models/gpt2.h"
#include "models/train_step.h"
#include "zero/core/check.h"

namespace zero::examples {

namespace {

torch::nn::LayerNorm layer_norm(const TorchGpt2Config& config) {
  return torch::nn::LayerNorm(
      torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_eps));
}

}  // namespace

Conv1DImpl::Conv1DImpl(int64_t in, int64_t out)
    : weight(register_parameter("weight", torch::randn({in, out}) * 0.02)),
      bias(register_parameter("bias", torch::zeros({out}))) {}

torch::Tensor Conv1DImpl::forward(const torch::Tensor& x) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(1);
  return torch::addmm(bias, x.reshape({-1, x.size(-1)}), weight).view(shape);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const TorchGpt2Config& config)
    : c_attn(register_module("c_attn", Conv1D(config.n_embd, 3 * config.n_embd))),
      c_proj(register_module("c_proj", Conv1D(config.n_embd, config.n_embd))),
      n_head(config.n_head) {}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int64_t head_size = C / n_head;
  std::vector<torch::Tensor> qkv = c_attn(x).split(C, /*dim=*/2);
  for (torch::Tensor& t : qkv) t = t.view({B, T, n_head, head_size}).transpose(1, 2);
  torch::Tensor att = qkv[0].matmul(qkv[1].transpose(-2, -1)) / std::sqrt(double(head_size));
  const torch::Tensor future = torch::ones({T, T}, torch::kBool).triu(1);
  att = att.masked_fill(future, -std::numeric_limits<double>::infinity()).softmax(-1);
  return c_proj(att.matmul(qkv[2]).transpose(1, 2).reshape({B, T, C}));
}

MlpImpl::MlpImpl(const TorchGpt2Config& config)
    : c_fc(register_module("c_fc", Conv1D(config.n_embd, 4 * config.n_embd))),
      c_proj(register_module("c_proj", Conv1D(4 * config.n_embd, config.n_embd))) {}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return c_proj(torch::gelu(c_fc(x), "tanh"));
}

BlockImpl::BlockImpl(const TorchGpt2Config& config)
    : ln_1(register_module("ln_1", layer_norm(config))),
      attn(register_module("attn", CausalSelfAttention(config))),
      ln_2(register_module("ln_2", layer_norm(config))),
      mlp(register_module("mlp", Mlp(config))) {}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  const torch::Tensor y = x + attn(ln_1(x));
  return y + mlp(ln_2(y));
}

Gpt2Impl::Gpt2Impl(const TorchGpt2Config& gpt2)
    : config(gpt2),
      wte(register_module("wte", torch::nn::Embedding(gpt2.vocab_size, gpt2.n_embd))),
      wpe(register_module("wpe", torch::nn::Embedding(gpt2.block_size, gpt2.n_embd))),
      h(register_module("h", torch::nn::ModuleList())),
      ln_f(register_module("ln_f", layer_norm(gpt2))) {
  ZERO_CHECK(gpt2.n_layer > 0 && gpt2.n_head > 0 && gpt2.n_embd % gpt2.n_head == 0,
             "GPT-2: n_embd " << gpt2.n_embd << " must be a multiple of n_head " << gpt2.n_head
                              << ", and n_layer (" << gpt2.n_layer << ") at least 1");
  for (int64_t i = 0; i < gpt2.n_layer; ++i) h->push_back(Block(gpt2));
  torch::NoGradGuard no_grad;
  wte->weight.normal_(0.0, 0.02);
  wpe->weight.normal_(0.0, 0.02);
}

std::vector<TorchUnit> Gpt2Impl::units() const {
  std::vector<TorchUnit> units;
  // The lambdas hold the modules (not this object), as units_of does.
  const std::shared_ptr<torch::nn::EmbeddingImpl> token = wte.ptr(), position = wpe.ptr();
  units.push_back({"wte", [token](const torch::Tensor& ids) { return token->forward(ids); }});
  units.push_back({"wpe", [position](const torch::Tensor& x) {
                     return x + position->weight.narrow(0, 0, x.size(1));
                   }});
  for (TorchUnit& block : units_of<BlockImpl>("h", h)) units.push_back(std::move(block));
  const std::shared_ptr<torch::nn::LayerNormImpl> norm = ln_f.ptr();
  units.push_back(
      {"ln_f",
       [norm, token](const torch::Tensor& x) { return norm->forward(x).matmul(token->weight.t()); },
       {"wte.weight"}});
  return units;
}

torch::Tensor Gpt2Impl::forward(const torch::Tensor& ids) {
  torch::Tensor x = ids;
  for (const TorchUnit& unit : units()) x = unit.forward(x);
  return x;
}

torch::Tensor gpt2_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                              targets.reshape({-1}));
}

std::optional<float> gpt2_weight_decay(const std::string&, const torch::Tensor& param) {
  if (param.dim() >= 2) return std::nullopt;
  return 0.0f;
}

std::unique_ptr<TorchModel> wrap_gpt2(Communicator& comm, const Gpt2& model,
                                      const EngineConfig& config, const std::string& init_from) {
  auto wrapped =
      std::make_unique<TorchModel>(comm, model.ptr(), model->units(), config, gpt2_weight_decay);
  if (!init_from.empty()) models::load_gpt2_weights(wrapped->engine(), init_from);
  return wrapped;
}

Gpt2Batch read_gpt2_batch(const models::TokenData& data, long step, int64_t batch,
                          int64_t seq_len) {
  std::vector<float> inputs(static_cast<size_t>(batch * seq_len));
  torch::Tensor targets = torch::empty({batch, seq_len}, torch::kInt32);
  data.read_sequences(step, static_cast<int>(batch), static_cast<int>(seq_len), 0,
                      static_cast<int>(batch), inputs.data(), targets.data_ptr<int32_t>());
  return {torch::from_blob(inputs.data(), {batch, seq_len}).to(torch::kInt64),
          targets.to(torch::kInt64)};
}

Gpt2Batch random_gpt2_batch(uint64_t seed, int64_t batch, int64_t seq_len, int64_t vocab_size) {
  torch::Generator generator = torch::make_generator<torch::CPUGeneratorImpl>(seed);
  const torch::Tensor tokens = torch::randint(vocab_size, {batch, seq_len + 1}, generator,
                                              torch::TensorOptions().dtype(torch::kInt64));
  return {tokens.narrow(1, 0, seq_len).contiguous(), tokens.narrow(1, 1, seq_len).contiguous()};
}

float gpt2_forward_backward(TorchModel& model, const Gpt2Batch& batch,
                            torch::Tensor* first_logits) {
  Communicator& comm = model.engine().host_communicator();
  const int micro_batches = model.engine().config().micro_batches;
  const int64_t global_batch = batch.inputs.size(0);
  ZERO_CHECK(global_batch >= static_cast<int64_t>(micro_batches) * comm.world_size(),
             "a global batch of " << global_batch << " sequences is too small for " << micro_batches
                                  << " micro-batch(es) on " << comm.world_size() << " rank(s)");
  float loss_sum = 0.0f;
  for (int k = 0; k < micro_batches; ++k) {
    const models::BatchSlice slice =
        models::batch_slice(global_batch, micro_batches, comm.world_size(), k, comm.rank());
    const torch::Tensor logits = model.forward(batch.inputs.narrow(0, slice.first, slice.count));
    if (k == 0 && first_logits != nullptr) *first_logits = logits.detach();
    const torch::Tensor loss =
        gpt2_loss(logits, batch.targets.narrow(0, slice.first, slice.count)) * slice.weight;
    loss.backward();
    loss_sum += loss.item<float>();
  }
  float mean = loss_sum;
  comm.all_reduce(&mean, &mean, 1, DType::kFloat32).wait();
  return mean / static_cast<float>(comm.world_size() * micro_batches);
}

}  // namespace zero::examples
