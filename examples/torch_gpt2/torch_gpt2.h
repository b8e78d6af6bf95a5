// The reference GPT-2 written with torch::nn, as a LibTorch user writes it, and trained through
// zero::TorchModel: token and position embeddings, pre-LN blocks (causal self-attention with one
// fused QKV projection, GELU with the tanh approximation, a 4x MLP), a final LayerNorm and an LM
// head tied to the token embedding; the loss is the mean cross-entropy over every position.
//
// Parameter names and layouts are Hugging Face GPT-2's ("h.0.attn.c_attn.weight" stored
// [in, out], as its Conv1D does), which are the native GPT-2's (models/gpt2.h) too: the same
// safetensors file initializes both, and their checkpoints export alike.
//
// Units: "wte" (token ids to embeddings), "wpe" (adds the positions), each block "h.i", and
// "ln_f" (the final LayerNorm and the LM head), which ties to "wte.weight".
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/token_data.h"
#include "zero/torch/torch_model.h"

namespace zero::examples {

struct TorchGpt2Config {
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_embd = 64;
  int64_t vocab_size = 256;
  int64_t block_size = 64;  // rows of the position embedding: the longest sequence
  double layer_norm_eps = 1e-5;
};

// Hugging Face's Conv1D: a linear map whose weight is stored [in, out].
class Conv1DImpl : public torch::nn::Module {
 public:
  Conv1DImpl(int64_t in, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  torch::Tensor bias;
};
TORCH_MODULE(Conv1D);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const TorchGpt2Config& config);
  torch::Tensor forward(const torch::Tensor& x);
  Conv1D c_attn;  // q, k and v in one projection
  Conv1D c_proj;
  int64_t n_head;
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const TorchGpt2Config& config);
  torch::Tensor forward(const torch::Tensor& x);
  Conv1D c_fc;
  Conv1D c_proj;
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const TorchGpt2Config& config);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln_1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln_2;
  Mlp mlp;
};
TORCH_MODULE(Block);

class Gpt2Impl : public torch::nn::Module {
 public:
  // GPT-2's initialization: weights normal with std 0.02, biases zero, LayerNorms the identity.
  explicit Gpt2Impl(const TorchGpt2Config& config);
  // Logits [B, T, vocab] of token ids [B, T] (int64), by the units in order.
  torch::Tensor forward(const torch::Tensor& ids);
  // The units as TorchModel takes them; the head's ties to the token embedding.
  std::vector<TorchUnit> units() const;

  TorchGpt2Config config;
  torch::nn::Embedding wte;
  torch::nn::Embedding wpe;
  torch::nn::ModuleList h;
  torch::nn::LayerNorm ln_f;
};
TORCH_MODULE(Gpt2);

// Mean cross-entropy of logits [B, T, V] against targets [B, T].
torch::Tensor gpt2_loss(const torch::Tensor& logits, const torch::Tensor& targets);

// Weight decay on tensors of two or more dimensions only, as GPT-2 recipes (and the native
// GPT-2) do: the per-parameter decay TorchModel takes.
std::optional<float> gpt2_weight_decay(const std::string& name, const torch::Tensor& param);

// Wraps `model` with its blocks as units and GPT-2's weight decay. With `init_from` (a
// safetensors file of Hugging Face GPT-2's names) its weights are loaded, as the native GPT-2's
// --init-from does; a missing, extra or misshaped tensor is a zero::Error naming it.
std::unique_ptr<TorchModel> wrap_gpt2(Communicator& comm, const Gpt2& model,
                                      const EngineConfig& config, const std::string& init_from);

// A global batch: B sequences of T input token ids and their targets, the inputs shifted by one
// (int64 [B, T] each).
struct Gpt2Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};
// Step `step`'s batch of a token file, by llm.c's rule (models::TokenData).
Gpt2Batch read_gpt2_batch(const models::TokenData& data, long step, int64_t batch, int64_t seq_len);
// Uniform random tokens below vocab_size, the same on every rank for the same seed.
Gpt2Batch random_gpt2_batch(uint64_t seed, int64_t batch, int64_t seq_len, int64_t vocab_size);

// One optimizer step's forward and backward on this rank: the global batch is cut into a slice
// per micro-batch and rank (models::batch_slice), each slice's loss weighted by its size so
// that the engine's average is the global mean. Returns the global batch's mean loss
// (collective). The caller then calls model.step(). With `first_logits`, the logits of this
// rank's first micro-batch go there (detached).
float gpt2_forward_backward(TorchModel& model, const Gpt2Batch& batch,
                            torch::Tensor* first_logits = nullptr);

}  // namespace zero::examples
