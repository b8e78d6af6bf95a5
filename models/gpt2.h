// GPT-2 on the engine: what llm.c trains. Token and position embeddings, pre-LN blocks (causal
// self-attention with one fused QKV matrix, GELU with the tanh approximation, a 4x MLP), a final
// LayerNorm and an LM head tied to the token embedding; the loss is the mean cross-entropy over
// every position. Parameters carry Hugging Face GPT-2's names and layouts (`wte.weight`,
// `h.0.attn.c_attn.weight` stored [in, out], ...), so weights import and export unchanged.
//
// ZeRO units: the embeddings, each block, and the head (the final LayerNorm; it reads `wte`
// through a tied parameter, so the embedding's gradient is the sum of both uses). The model's
// input is a micro-batch of token ids as floats [B, T] (exact below 2^24); its output is the
// micro-batch's mean loss [1]. The targets of a micro-batch are handed over before its forward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/gpt2_memory.h"
#include "zero/collectives/communicator.h"
#include "zero/runtime/layout.h"
#include "zero/runtime/model.h"

namespace zero::models {

struct Gpt2Config {
  int n_layer = 2;
  int n_head = 4;
  int n_embd = 64;
  int vocab_size = 256;
  int block_size = 64;  // the longest sequence (rows of the position embedding)
  float layer_norm_eps = 1e-5f;
  // Weight decay only on tensors with two or more dimensions (the embeddings and the four
  // matrices of each block), as GPT-2 training recipes do; false decays every tensor.
  bool decay_matrices_only = true;
  // Megatron-style tensor parallelism over this many ranks (1: none; models/gpt2_tensor_parallel.h
  // says what is split). The parameters and activations a rank holds are its slices: the shapes
  // below (gpt2_param_specs, gpt2_activation_formula) are one rank's.
  int tensor_parallel_size = 1;
};

// Where this rank sits in its tensor-parallel group of Gpt2Config::tensor_parallel_size ranks,
// and the group's communicator (host memory; null without tensor parallelism). The communicator
// must outlive the modules.
struct Gpt2TensorParallel {
  int rank = 0;
  Communicator* comm = nullptr;
};

// "tiny", "gpt2-124M", "gpt2-350M", "gpt2-774M", "gpt2-1.5B"; false for another name.
bool gpt2_preset(const std::string& name, Gpt2Config* config);
const char* gpt2_preset_names();  // "tiny, gpt2-124M, ..." for messages
// Throws zero::Error naming the first bad field (sizes < 1, n_embd not divisible by n_head,
// n_head not divisible by tensor_parallel_size).
void check_gpt2_config(const Gpt2Config& config);

// The targets of the micro-batch the next forward computes the loss of: token ids, one per
// input position, each below the vocabulary size.
struct Gpt2Targets {
  std::vector<int32_t> ids;
};

class Gpt2Embedding;
class Gpt2Block;
class Gpt2Head;
struct Gpt2BlockShared;
namespace gpt2_detail {
class Gpt2Backend;
}

struct Gpt2 {
  std::vector<NamedModule> modules;
  std::shared_ptr<Gpt2Targets> targets;
  // Owned by modules (which may move into a ZeroModel): for gpt2_held_activations.
  Gpt2Embedding* embedding = nullptr;
  std::vector<Gpt2Block*> blocks;
  Gpt2Head* head = nullptr;
  Gpt2BlockShared* shared = nullptr;                  // the buffers the blocks use in turn
  std::shared_ptr<gpt2_detail::Gpt2Backend> backend;  // the modules' operations and allocator
  // The index in modules of each model chunk's first module (one chunk: {0}), for ZeroModel.
  std::vector<int> chunk_first_modules;
};

// One stage of a GPT-2 cut into a pipeline: blocks [first_layer, end_layer); the first stage
// also has the embeddings, the last the final LayerNorm, the head and the loss. The last stage
// (when it is not also the first) holds its own wte, which the head reads and whose gradient
// EngineConfig::pipeline's tie sums with the first stage's. The whole model: the default.
// Interleaved (Megatron's layout): the stage holds several model chunks, chunk c being virtual
// stage c * stages + stage with blocks [chunks[c].first, chunks[c].second); the embeddings go
// with chunk 0 of the first stage, ln_f, the head (and the last stage's wte) with the last
// chunk of the last stage. first_layer and end_layer are then chunk 0's first and the last
// chunk's end.
struct Gpt2PipelineStage {
  int stage = 0;
  int stages = 1;
  int first_layer = 0;
  int end_layer = -1;                       // -1: n_layer
  std::vector<std::pair<int, int>> chunks;  // empty: one chunk, [first_layer, end_layer)
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  int chunk_count() const { return chunks.empty() ? 1 : static_cast<int>(chunks.size()); }
  // Chunk c's blocks, [first, end), with end_layer's -1 resolved against n_layer; a zero::Error
  // naming the stage when they are not layers of a model of n_layer.
  std::pair<int, int> chunk_layers(int chunk, int n_layer) const;
  // Whether chunk c holds the embeddings, or ln_f and the head.
  bool embeds(int chunk) const { return first() && chunk == 0; }
  bool heads(int chunk) const { return last() && chunk == chunk_count() - 1; }
  // "3-5" or, interleaved, "1-1, 3-3" (each chunk's first and last block), for messages.
  std::string describe_layers(int n_layer) const;
};

// The block boundaries of a GPT-2 cut into `stages` pipeline stages of at least one block each
// (stages + 1 values from 0 to n_layer), by DeepSpeed's partition methods: "uniform", the same
// number of blocks per stage (n_layer must be a multiple of stages); "parameters", the
// contiguous cut whose largest stage holds the fewest parameters, counting the embeddings on the
// first stage and the final LayerNorm and a copy of wte on the last; "type:REGEX", the same
// balance counting each layer whose type name (Gpt2Embedding, Gpt2Block, Gpt2Head) the regular
// expression matches, ignoring case; and ours, "flops", the same balance counting each layer's
// training FLOPs per token as llm.c does (a block's 6 per weight of its products and its
// attention's 12 n_embd T, T being seq_len or, when 0, the block size; the head's product with
// wte, 6 vocab n_embd, on the last stage; the embeddings' lookups nothing), for a head over a
// large vocabulary that outweighs blocks. Among cuts with the same largest stage, the most
// even. Throws zero::Error naming the values when it cannot.
std::vector<int> gpt2_pipeline_partition(const Gpt2Config& config, int stages,
                                         const std::string& method, int seq_len = 0);

// The stage of `stages` that holds layer range `partition[stage]`..`partition[stage + 1]`, the
// blocks cut at the given boundaries (stages + 1 values from 0 to n_layer, non-decreasing).
// Interleaved, with virtual_stages v > 1: `partition` cuts v * stages virtual stages (as
// gpt2_pipeline_partition(config, v * stages, method)) and the stage holds v chunks, chunk c
// being virtual stage c * stages + stage. Throws zero::Error naming the values when they are
// not.
Gpt2PipelineStage gpt2_pipeline_stage(const Gpt2Config& config, const std::vector<int>& partition,
                                      int stage, int virtual_stages = 1);

// The modules of a GPT-2; kernel_threads: threads of every CPU kernel and GEMM; checkpointing:
// which blocks recompute what in backward (gpt2_memory.h). Throws zero::Error for a bad config
// or a number_checkpoints outside 0..n_layer; tensor_parallel: this rank's place in its group
// (a communicator of tensor_parallel_size ranks is needed when that is above 1).
Gpt2 make_gpt2(const Gpt2Config& config, int kernel_threads,
               const Gpt2Checkpointing& checkpointing = {},
               const Gpt2TensorParallel& tensor_parallel = {},
               const Gpt2PipelineStage& pipeline_stage = {});

// Counts the model's activations in `allocator` from now on (the engine's, Engine::allocator(),
// whose limit then covers them): the kept inputs of checkpointed blocks as
// MemoryCategory::kCheckpoint, the rest of what gpt2_held_activations adds up as kActivation.
// Tensors held already move there at their next use. The allocator must outlive the modules (a
// ZeroModel's engine does).
void count_gpt2_activations(Gpt2& model, Allocator& allocator);

// Per block, the milliseconds its forward, its recomputation and the rest of its backward took
// since the last call, summed over micro-batches (DeepSpeed's activation_checkpointing.profile;
// zeros unless Gpt2Checkpointing::profile), and whether it recomputes. On a GPU each block waits
// for its work to finish before reading the clock. Valid while the modules live.
struct Gpt2Profile {
  std::vector<double> forward_ms, recompute_ms, backward_ms;
  std::vector<bool> recomputes;
  // synchronize_checkpoint_boundary: each block's waits for the device, as a checkpointed
  // block's forward and its backward begin and end: four per forward and backward (counted also
  // without profile).
  std::vector<int> synchronizations;
};
Gpt2Profile take_gpt2_profile(Gpt2& model);

// nvme_path: the bytes the checkpoint spill read from and wrote to its file since the last call
// (zeros without it): per micro-batch, each checkpointed block's region once each way, and one
// write per region for a forward without backward. Valid while the modules live.
Gpt2SpillTraffic take_gpt2_spill_traffic(Gpt2& model);

// The activation bytes the model's modules hold now, counted from their tensors: after a
// forward and backward of B sequences of T tokens, gpt2_activation_formula(config, checkpointing,
// B, T). Valid while the modules live.
Gpt2ActivationBytes gpt2_held_activations(const Gpt2& model);

// The parameters make_gpt2(config) registers, for planning memory without building a model.
// pipeline_stage: those of one stage (with their chunks, as ZeroModel marks them).
std::vector<ParamSpec> gpt2_param_specs(const Gpt2Config& config,
                                        const Gpt2PipelineStage& pipeline_stage = {});

// Bytes the modules keep beside the engine's storage for a working dtype, on a GPU (`on_gpu`)
// or this CPU: none for fp32 (the kernels add into fp32 storage); else fp32 copies of
// parameters and their gradients, the embedding's and the head's (each of wte) and one block's,
// which the blocks share, but for what the kernels take as it is: on the CPU the embedding's
// 16-bit table, and where this CPU runs bf16 products in bf16 the weight matrices.
uint64_t gpt2_module_copy_bytes(const Gpt2Config& config, DType dtype, bool on_gpu);

// The copies the model's modules hold now, counted from their tensors: after a forward and
// backward, gpt2_module_copy_bytes(config, dtype, on_gpu) of a whole model. Valid while the
// modules live.
uint64_t gpt2_held_module_copies(const Gpt2& model);

// The logits of the last forward [B * T, vocab], in the device's memory (valid until backward
// consumes them). A zero::Error where the head's bf16 products made the loss's gradient in their
// place (Gpt2Ops::fuses_loss_gradient: bf16 products without tensor parallelism).
const Tensor& gpt2_logits(const Gpt2& model);

// FLOPs of one training step (forward and backward) per token, as llm.c and PaLM count them:
// 6 per parameter of the matrices plus the attention's 12 * n_layer * n_embd * T.
double gpt2_flops_per_token(const Gpt2Config& config, int seq_len);

// Overwrites the model's weights with those of a Hugging Face GPT-2 safetensors file (names and
// layouts as GPT2Model saves them; a "transformer." prefix is accepted, the attention's `bias`
// and `masked_bias` buffers and a tied `lm_head.weight` are ignored). A missing, extra or
// misshaped tensor is a zero::Error naming it. Collective: every rank reads the file and keeps
// its shard; with tensor parallelism (tensor_parallel_size > 1) each tensor the blocks split is
// first cut to the slice of tensor-parallel rank `tensor_parallel_rank`.
// held_elsewhere: the names of tensors another pipeline stage holds, which this one skips.
void load_gpt2_weights(Engine& engine, const std::string& path, int tensor_parallel_size = 1,
                       int tensor_parallel_rank = 0,
                       const std::vector<std::string>& held_elsewhere = {});

}  // namespace zero::models
