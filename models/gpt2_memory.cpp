#include "models/gpt2_memory.h"

#include <algorithm>
#include <map>
#include <utility>

#include "models/gpt2.h"
#include "zero/core/check.h"
#include "zero/core/checked_size.h"
#include "zero/runtime/nvme_file.h"

namespace zero::models {

namespace {

// The NVMe spill of `checkpointed` blocks' checkpoints of `region` bytes each (gpt2_spill.h): the
// buffer they pass through, two regions (one where one block is checkpointed) and slack, and the
// file, `generations` regions per block.
void spill_sizes(uint64_t checkpointed, uint64_t region, int generations, uint64_t* buffer,
                 uint64_t* file) {
  *buffer = std::min<uint64_t>(2, checkpointed) * region + kNvmeBufferSlack;
  *file = size_product(checkpointed * region, static_cast<uint64_t>(generations),
                       "the checkpoint spill's file");
}

}  // namespace

const char* recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

bool parse_recompute(const std::string& name, Recompute* recompute) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    if (name == recompute_name(r)) {
      *recompute = r;
      return true;
    }
  }
  return false;
}

bool gpt2_block_checkpointed(const Gpt2Checkpointing& checkpointing, int layer, int n_layer) {
  if (checkpointing.recompute == Recompute::kNone) return false;
  const int64_t n =
      checkpointing.number_checkpoints == 0 ? n_layer : checkpointing.number_checkpoints;
  // Blocks floor(j * L / n), j < n: layer is one when some j lands on it, i.e. when the
  // smallest j with j * L >= layer * n gives exactly layer.
  const int64_t j = (static_cast<int64_t>(layer) * n + n_layer - 1) / n_layer;
  return j < n && j * n_layer / n == layer;
}

void check_gpt2_checkpointing(const Gpt2Checkpointing& checkpointing, int n_layer) {
  ZERO_CHECK(checkpointing.number_checkpoints >= 0 && checkpointing.number_checkpoints <= n_layer,
             "number_checkpoints " << checkpointing.number_checkpoints
                                   << " must be between 1 and the model's " << n_layer
                                   << " layers (each checkpoint is one block)");
  ZERO_CHECK(!(checkpointing.cpu_checkpointing && checkpointing.contiguous_memory),
             "cpu_checkpointing with contiguous_memory_optimization is not built yet: choose one");
  // The pinned copies of a checkpoint's pieces are not built (and on the CPU path, where the
  // split GPT-2 is tested, cpu_checkpointing saves nothing).
  ZERO_CHECK(!(checkpointing.cpu_checkpointing && checkpointing.partition_activations),
             "cpu_checkpointing with partition_activations is not built yet: choose one");
  if (checkpointing.nvme_path.empty()) return;
  ZERO_CHECK(checkpointing.recompute != Recompute::kNone,
             "the checkpoint spill to " << checkpointing.nvme_path
                                        << " needs activation checkpointing (selective or full): "
                                           "without it there are no checkpoints to spill");
  // Each is another place for the checkpoints; the spill's buffer is one allocation already.
  ZERO_CHECK(!checkpointing.cpu_checkpointing,
             "the checkpoint spill to NVMe with cpu_checkpointing is not built: choose one");
  ZERO_CHECK(!checkpointing.contiguous_memory,
             "the checkpoint spill to NVMe with contiguous_memory_optimization is not built "
             "(the spill's buffer is one allocation already): choose one");
  ZERO_CHECK(!checkpointing.partition_activations,
             "the checkpoint spill to NVMe with partition_activations is not built yet: choose "
             "one");
}

bool gpt2_partitions_checkpoints(const Gpt2Config& config, const Gpt2Checkpointing& checkpointing) {
  return checkpointing.partition_activations && config.tensor_parallel_size > 1;
}

bool gpt2_checkpoints_in_slots(const Gpt2Checkpointing& checkpointing) {
  return checkpointing.recompute != Recompute::kNone && checkpointing.contiguous_memory;
}

uint64_t gpt2_checkpoint_piece(const Gpt2Config& config, int64_t B, int64_t T) {
  const uint64_t whole =
      size_product(size_product(static_cast<uint64_t>(B), static_cast<uint64_t>(T), "the tokens"),
                   static_cast<uint64_t>(config.n_embd), "a checkpoint's elements");
  const uint64_t t = static_cast<uint64_t>(config.tensor_parallel_size);
  return (whole + t - 1) / t;
}

uint64_t Gpt2ActivationBytes::kept() const {
  uint64_t sum = 0;
  for (uint64_t b : blocks) sum += b;
  return sum;
}

uint64_t Gpt2ActivationBytes::total() const {
  return embedding + kept() + moving_checkpoints + spill_buffer + checkpoint_buffer + recompute +
         head;
}

Gpt2ActivationBytes gpt2_activation_formula(const Gpt2Config& config,
                                            const Gpt2Checkpointing& checkpointing, int64_t B,
                                            int64_t T) {
  const uint64_t N = size_product(static_cast<uint64_t>(B), static_cast<uint64_t>(T),
                                  "the tokens of a micro-batch");
  const uint64_t C = static_cast<uint64_t>(config.n_embd);
  const uint64_t V = static_cast<uint64_t>(config.vocab_size);
  const uint64_t f = sizeof(float);
  // Each figure below sums at most n_layer + 4 terms of N tokens x at most 20 C + H + V + 8 + t
  // elements (plus a page of alignment each) x 4 bytes: once that bound counts, none overflows.
  const uint64_t widest = 20 * C + static_cast<uint64_t>(config.n_head) + V + 8 +
                          static_cast<uint64_t>(config.tensor_parallel_size);
  const char* what = "the activations of a micro-batch";
  const uint64_t terms = static_cast<uint64_t>(config.n_layer) + 4;
  size_sum(size_product(size_product(size_product(N, widest, what), f, what), terms, what),
           size_product(terms, 2 * kNvmeAlignment, what), what);
  // With tensor parallelism over t ranks, a rank holds Cl = C / t of qkv (3 Cl), the attention's
  // output (Cl), its log-sum-exp (Hl = H / t heads) and the MLP's hidden tensors (4 Cl each);
  // the residual stream and the LayerNorms stay C wide. t = 1 gives the table's figures.
  const uint64_t t = static_cast<uint64_t>(config.tensor_parallel_size);
  const uint64_t Cl = C / t;
  const uint64_t Hl = static_cast<uint64_t>(config.n_head) / t;
  const uint64_t whole = N * (4 * C + 12 * Cl + 4 + Hl);  // a block that is not checkpointed
  uint64_t kept = whole;
  uint64_t recomputed = 0;  // what a checkpointed one rebuilds
  if (checkpointing.recompute == Recompute::kSelective) {
    kept = N * (C + 4 * Cl + Hl);
    recomputed = N * (3 * C + 8 * Cl + 4);
  } else if (checkpointing.recompute == Recompute::kFull) {
    kept = N * C;
    recomputed = N * (3 * C + 12 * Cl + 4 + Hl);
  }
  // What a checkpointed block keeps of its input: the whole of it, or with partition_activations
  // this rank's piece, the whole input then rebuilt in one more shared buffer (t pieces).
  uint64_t checkpoint = N * C;
  if (gpt2_partitions_checkpoints(config, checkpointing) &&
      checkpointing.recompute != Recompute::kNone) {
    checkpoint = gpt2_checkpoint_piece(config, B, T);
    kept = kept - N * C + checkpoint;
    recomputed += t * checkpoint;
  }
  Gpt2ActivationBytes bytes;
  bytes.embedding = N * f;
  for (int layer = 0; layer < config.n_layer; ++layer) {
    const bool checkpointed = gpt2_block_checkpointed(checkpointing, layer, config.n_layer);
    bytes.blocks.push_back((checkpointed ? kept : whole) * f);
    if (checkpointed) bytes.checkpoints += checkpoint * f;
  }
  if (checkpointing.cpu_checkpointing && bytes.checkpoints > 0) {
    // The inputs leave the blocks for the host; two are on the device at once in backward (the
    // block's own and the next one's, prefetched), one in forward.
    const uint64_t one = N * C * f;
    for (int layer = 0; layer < config.n_layer; ++layer) {
      if (gpt2_block_checkpointed(checkpointing, layer, config.n_layer)) bytes.blocks[layer] -= one;
    }
    bytes.host_checkpoints = bytes.checkpoints;
    bytes.moving_checkpoints = std::min<uint64_t>(2 * one, bytes.checkpoints);
    bytes.checkpoints = bytes.moving_checkpoints;
  }
  if (!checkpointing.nvme_path.empty() && bytes.checkpoints > 0) {
    // The inputs leave the blocks for the file, through a buffer of two regions (the block's own
    // and the next one's, read ahead in backward), one where one block is checkpointed.
    const uint64_t one = N * C * f;
    const uint64_t region = nvme_align_up(one);
    uint64_t checkpointed = 0;
    for (int layer = 0; layer < config.n_layer; ++layer) {
      if (!gpt2_block_checkpointed(checkpointing, layer, config.n_layer)) continue;
      bytes.blocks[layer] -= one;
      ++checkpointed;
    }
    spill_sizes(checkpointed, region, checkpointing.checkpoint_generations, &bytes.spill_buffer,
                &bytes.nvme_checkpoints);
    bytes.checkpoints = bytes.spill_buffer;
  }
  bytes.recompute = recomputed * f;
  // A rank's logits: its columns, padded as its rows of wte (gpt2_tensor_parallel.h).
  const uint64_t Vl = (V + t - 1) / t;
  bytes.head = N * (2 * C + Vl + 4) * f;
  return bytes;
}

uint64_t gpt2_uncounted_activation_bytes(const Gpt2Config& config, int64_t B, int64_t T) {
  const char* what = "the tensors between modules";
  const uint64_t N = size_product(static_cast<uint64_t>(B), static_cast<uint64_t>(T), what);
  return size_product(size_product(N, 3 * static_cast<uint64_t>(config.n_embd) + 3, what),
                      sizeof(float), what);
}

namespace {

// Bytes of one checkpoint, a block's whole input: B T C floats.
uint64_t checkpoint_bytes(const Gpt2Config& config, int64_t B, int64_t T) {
  return static_cast<uint64_t>(B) * static_cast<uint64_t>(T) *
         static_cast<uint64_t>(config.n_embd) * sizeof(float);
}

// Each chunk's sets held (Gpt2StageActivationBytes::chunk_sets) times its bytes of one set,
// added onto `base`.
uint64_t chunk_sets_bytes(const std::vector<int>& sets, const std::vector<uint64_t>& bytes,
                          uint64_t base, const char* what) {
  uint64_t held = base;
  for (size_t c = 0; c < sets.size(); ++c) {
    held = size_sum(held, size_product(static_cast<uint64_t>(sets[c]), bytes[c], what), what);
  }
  return held;
}

}  // namespace

uint64_t Gpt2StageActivationBytes::per_micro_batch() const {
  return micro_batch.total() - shared();
}

uint64_t Gpt2StageActivationBytes::shared() const {
  return micro_batch.recompute + micro_batch.spill_buffer + micro_batch.checkpoint_buffer;
}

uint64_t Gpt2StageActivationBytes::peak() const {
  const char* what = "a pipeline stage's activations";
  if (!chunk_sets.empty()) return chunk_sets_bytes(chunk_sets, chunk_bytes, shared(), what);
  const uint64_t forwarded =
      size_product(static_cast<uint64_t>(in_flight), per_micro_batch(), what);
  const uint64_t awaiting = size_product(static_cast<uint64_t>(awaiting_weight),
                                         size_sum(per_micro_batch(), weight_inputs, what), what);
  return size_sum(size_sum(forwarded, awaiting, what),
                  size_sum(in_backward_input ? split_scratch : 0, shared(), what), what);
}

uint64_t Gpt2StageActivationBytes::peak_checkpoints() const {
  const char* what = "a pipeline stage's checkpoints";
  // The spill's buffer is the only checkpoint memory there is with it, and the stage's one; so
  // is the contiguous buffer.
  const uint64_t buffer = micro_batch.spill_buffer + micro_batch.checkpoint_buffer;
  if (!chunk_sets.empty()) return chunk_sets_bytes(chunk_sets, chunk_checkpoints, buffer, what);
  return size_sum(
      size_product(static_cast<uint64_t>(in_flight), micro_batch.checkpoints - buffer, what),
      buffer, what);
}

int gpt2_checkpoint_generations(int in_flight, const std::vector<PipelineAction>& chunk_actions) {
  if (chunk_actions.empty()) return in_flight;
  // Per chunk, forwards whose checkpoint is still to be read: by the backward, or by the input
  // half of a split one.
  std::map<int, int> forwarded;
  int most = 1;
  for (const PipelineAction& action : chunk_actions) {
    if (action.kind == PipelineAction::kForward) most = std::max(most, ++forwarded[action.chunk]);
    if (action.kind == PipelineAction::kBackward || action.kind == PipelineAction::kBackwardInput) {
      --forwarded[action.chunk];
    }
  }
  return most;
}

Gpt2StageActivationBytes gpt2_stage_activation_formula(const Gpt2Config& config,
                                                       const Gpt2Checkpointing& checkpointing,
                                                       const Gpt2PipelineStage& stage,
                                                       int in_flight, int64_t B, int64_t T) {
  ZERO_CHECK(in_flight >= 1,
             "a pipeline stage holds at least 1 micro-batch in flight, not " << in_flight);
  const Gpt2ActivationBytes whole = gpt2_activation_formula(config, checkpointing, B, T);
  Gpt2StageActivationBytes bytes;
  bytes.in_flight = in_flight;
  if (stage.stages == 1) {
    bytes.micro_batch = whole;
    return bytes;
  }
  // cpu_checkpointing keeps one host copy per block (gpt2_block.cpp's take_activations), which
  // a second micro-batch in flight would overwrite; zero-train refuses it with --pp.
  ZERO_CHECK(!checkpointing.cpu_checkpointing,
             "cpu_checkpointing keeps one host copy per block: a pipeline stage cannot hold "
             "micro-batches in flight with it");
  Gpt2ActivationBytes& mine = bytes.micro_batch;
  const uint64_t checkpoint = checkpoint_bytes(config, B, T);
  // What a checkpointed block keeps: its whole input, or with partition_activations its piece.
  const uint64_t kept_checkpoint = gpt2_partitions_checkpoints(config, checkpointing)
                                       ? gpt2_checkpoint_piece(config, B, T) * sizeof(float)
                                       : checkpoint;
  // With the spill a checkpointed block keeps none (whole.blocks has it out already); with the
  // contiguous buffer its checkpoint is the buffer's, which has checkpoint_generations sets of
  // the stage's checkpoints, all of them allocated with the first.
  const bool spilled = whole.spill_buffer > 0;
  const bool in_buffer = gpt2_checkpoints_in_slots(checkpointing);
  uint64_t checkpointed = 0;
  for (int c = 0; c < stage.chunk_count(); ++c) {
    const std::pair<int, int> layers = stage.chunk_layers(c, config.n_layer);
    // One set of the chunk's tensors.
    uint64_t chunk = 0, checkpoints = 0;
    if (stage.embeds(c)) {
      mine.embedding = whole.embedding;
      chunk += whole.embedding;
    }
    if (stage.heads(c)) {
      mine.head = whole.head;
      chunk += whole.head;
    }
    for (int layer = layers.first; layer < layers.second; ++layer) {
      const bool checkpointed_here = gpt2_block_checkpointed(checkpointing, layer, config.n_layer);
      const uint64_t block = whole.blocks[static_cast<size_t>(layer)] -
                             (checkpointed_here && in_buffer ? kept_checkpoint : 0);
      mine.blocks.push_back(block);
      chunk += block;
      if (checkpointed_here) {
        ++checkpointed;
        mine.recompute = whole.recompute;
        if (!spilled && !in_buffer) {
          mine.checkpoints += kept_checkpoint;
          checkpoints += kept_checkpoint;
        }
      }
    }
    bytes.chunk_bytes.push_back(chunk);
    bytes.chunk_checkpoints.push_back(checkpoints);
  }
  if (spilled && checkpointed > 0) {
    // The stage's checkpointed blocks spill to a file of their own (checkpoint_generations regions
    // each) through one buffer, which its micro-batches and chunks share (gpt2_spill.h).
    spill_sizes(checkpointed, nvme_align_up(checkpoint), checkpointing.checkpoint_generations,
                &mine.spill_buffer, &mine.nvme_checkpoints);
    mine.checkpoints = mine.spill_buffer;
  }
  if (in_buffer && checkpointed > 0) {
    mine.checkpoint_buffer =
        size_product(size_product(static_cast<uint64_t>(checkpointing.checkpoint_generations),
                                  checkpointed, "the contiguous checkpoint buffer"),
                     kept_checkpoint, "the contiguous checkpoint buffer");
    mine.checkpoints = mine.checkpoint_buffer;
  }
  if (stage.chunk_count() == 1) {
    bytes.chunk_bytes.clear();
    bytes.chunk_checkpoints.clear();
  }
  return bytes;
}

Gpt2StageActivationBytes gpt2_chunked_stage_activation_formula(
    const Gpt2Config& config, const Gpt2Checkpointing& checkpointing,
    const Gpt2PipelineStage& stage, const std::vector<PipelineAction>& actions, int64_t B,
    int64_t T) {
  Gpt2StageActivationBytes bytes =
      gpt2_stage_activation_formula(config, checkpointing, stage, 1, B, T);
  const size_t chunks = static_cast<size_t>(stage.chunk_count());
  if (chunks == 1) return bytes;
  // Per chunk: (micro-batch, chunk) pairs forwarded and not yet backward, and whether its
  // modules keep the tensors of their last backward (one more set, until its next forward).
  std::vector<int> forwarded(chunks, 0), left(chunks, 0);
  uint64_t most = 0;
  bytes.chunk_sets.assign(chunks, 0);
  for (const PipelineAction& action : actions) {
    if (!is_pipeline_compute(action.kind)) continue;
    ZERO_CHECK(action.kind == PipelineAction::kForward || action.kind == PipelineAction::kBackward,
               "a pipeline stage of model chunks runs forward and backward, not "
                   << pipeline_action_name(action.kind));
    ZERO_CHECK(
        action.chunk >= 0 && static_cast<size_t>(action.chunk) < chunks,
        "a pipeline action of chunk " << action.chunk << " on a stage of " << chunks << " chunks");
    const size_t c = static_cast<size_t>(action.chunk);
    // The set a backward left behind is reused by the chunk's next forward, and a backward's
    // micro-batch brings its own tensors back in its place.
    left[c] = 0;
    if (action.kind == PipelineAction::kForward) ++forwarded[c];
    Gpt2StageActivationBytes at = bytes;
    for (size_t k = 0; k < chunks; ++k) at.chunk_sets[k] = forwarded[k] + left[k];
    if (at.peak() > most) {
      most = at.peak();
      bytes.chunk_sets = at.chunk_sets;
    }
    if (action.kind == PipelineAction::kBackward) {
      --forwarded[c];
      left[c] = 1;
    }
  }
  bytes.in_flight = 0;
  for (int sets : bytes.chunk_sets) bytes.in_flight += sets;
  return bytes;
}

Gpt2StageActivationBytes gpt2_split_stage_activation_formula(
    const Gpt2Config& config, const Gpt2Checkpointing& checkpointing,
    const Gpt2PipelineStage& stage, const std::vector<PipelineStageLoad>& loads, int64_t B,
    int64_t T) {
  Gpt2StageActivationBytes bytes =
      gpt2_stage_activation_formula(config, checkpointing, stage, 1, B, T);
  const char* what = "a split backward's weight inputs";
  const uint64_t N = size_product(static_cast<uint64_t>(B), static_cast<uint64_t>(T), what);
  const uint64_t C = static_cast<uint64_t>(config.n_embd);
  const uint64_t Cl = C / static_cast<uint64_t>(config.tensor_parallel_size);
  const uint64_t f = sizeof(float);
  // Per block (gpt2_block.cpp's backward_input): the output gradients of the MLP's projection,
  // fc (4 Cl wide), ln_2, the attention's projection and ln_1; the head's of ln_f; the
  // embedding's of its output.
  const uint64_t blocks = bytes.micro_batch.blocks.size();
  uint64_t floats = size_product(blocks, size_product(N, 4 * C + 4 * Cl, what), what);
  // And per checkpointed block the tensors it recomputed that the weight half reads: all but qkv
  // and the log-sum-exp (selective keeps those), N (3 C + 8 Cl + 4) with selective and
  // N (3 C + 9 Cl + 4) with full (the attention's output too); with the spill, partitioned or in
  // the contiguous buffer also a copy of its input (N C), read back out of the spill's buffer,
  // rebuilt in the recompute buffers or out of a slot the next forward may take.
  const bool copies_input = !checkpointing.nvme_path.empty() ||
                            gpt2_partitions_checkpoints(config, checkpointing) ||
                            gpt2_checkpoints_in_slots(checkpointing);
  const uint64_t recomputed =
      (checkpointing.recompute == Recompute::kFull ? 3 * C + 9 * Cl + 4 : 3 * C + 8 * Cl + 4) +
      (copies_input ? C : 0);
  const std::pair<int, int> layers = stage.chunk_layers(0, config.n_layer);
  for (int layer = layers.first; layer < layers.second; ++layer) {
    if (!gpt2_block_checkpointed(checkpointing, layer, config.n_layer)) continue;
    floats = size_sum(floats, size_product(N, recomputed, what), what);
  }
  if (stage.last() && stage.stages > 1) floats = size_sum(floats, N * C, what);
  if (stage.first() && stage.stages > 1) floats = size_sum(floats, N * C, what);
  bytes.weight_inputs = size_product(floats, f, what);
  // Inside a block's backward_input, its attention output gradient (N x Cl) beside the rest; the
  // embedding's own weight input (N x C, made after the blocks' scratch is gone) outweighs it on
  // the first stage.
  bytes.split_scratch = blocks > 0 && !stage.first() ? N * Cl * f : 0;
  uint64_t most = 0;
  bytes.in_flight = 0;
  for (const PipelineStageLoad& load : loads) {
    Gpt2StageActivationBytes at = bytes;
    at.in_flight = load.forwarded;
    at.awaiting_weight = load.awaiting_weight;
    at.in_backward_input = load.in_backward_input;
    if (at.peak() <= most) continue;
    most = at.peak();
    bytes = at;
  }
  return bytes;
}

uint64_t gpt2_stage_uncounted_activation_bytes(const Gpt2Config& config,
                                               const Gpt2PipelineStage& stage, int in_flight,
                                               int64_t B, int64_t T) {
  const char* what = "the tensors beside a pipeline stage's activations";
  const uint64_t N = size_product(static_cast<uint64_t>(B), static_cast<uint64_t>(T), what);
  const uint64_t C = static_cast<uint64_t>(config.n_embd);
  const uint64_t k = static_cast<uint64_t>(in_flight);
  uint64_t floats = size_product(N, 3 * C, what);
  if (stage.first() || stage.last()) floats = size_sum(floats, size_product(N, 3, what), what);
  if (stage.last()) floats = size_sum(floats, size_product(N, k, what), what);
  if (stage.stages > 1) {
    floats = size_sum(floats, size_product(size_product(N, C, what), 4 + 2 * k, what), what);
  }
  return size_product(floats, sizeof(float), what);
}

}  // namespace zero::models
