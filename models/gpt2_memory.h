// The GPT-2's activation memory: which tensors each block keeps from its forward to its
// backward under each activation-checkpointing setting, and the formula for their bytes, written
// once here. gpt2_activation_formula computes it from the sizes alone; gpt2_held_activations
// (gpt2.h) adds up the tensors a running model actually holds, and the tests hold the two equal.
//
// Per block, N = B * T positions, C = n_embd, H = n_head, fp32 (4 bytes; activations are fp32
// whatever the working dtype), in floats:
//
//   tensor                     floats   none  selective  full
//   block input (ln_1's input)  N C      kept  kept       kept
//   ln_1 output, mean, rstd     N C+2N   kept  recomp.    recomp.
//   qkv (ln_1 @ c_attn)         3 N C    kept  kept       recomp.
//   attention output, lse       N C+N H  kept  kept       recomp.
//   x2 (ln_2's input)           N C      kept  recomp.    recomp.
//   ln_2 output, mean, rstd     N C+2N   kept  recomp.    recomp.
//   fc (GELU's input)           4 N C    kept  recomp.    recomp.
//   GELU output                 4 N C    kept  recomp.    recomp.
//
//   none:      N (16 C + 4 + H)        selective: N (5 C + H)        full: N C
//
// Korthikanti et al. (2022) count sbh (34 + 5 a s / h) bytes per layer for 16-bit activations:
// 16 tensors of s b h elements (the 16 C above: 2 bytes each, 32 bytes) plus two 1-byte dropout
// masks (we have no dropout), and 5 a s^2 b for the attention scores, softmax output and its
// dropout mask. Their selective recomputation drops that last term only. Our attention kernels
// never store scores or probabilities: they keep the log-sum-exp of each row (the N H floats),
// and backward recomputes the probabilities from it, so "none" here is already their selective
// layout. Our selective therefore keeps what the attention reads and makes (qkv, its output
// and log-sum-exp) and recomputes the rest of the block from those and the block input: both
// LayerNorms and the GELU (linear time), x2 (the attention's projection, all-reduced under
// tensor parallelism, and the residual) and fc (the MLP's first matrix). Each GEMM output costs
// about 2 C FLOPs per float rebuilt, the causal attention's output about 2 T, so at T >= C the
// attention is the last thing worth rebuilding. qkv costs what fc does per float; rebuilding x2
// and fc measured 1.05-1.09x the step at issue 15's T 1024 x C 384, and qkv would add about
// three fifths of that again, so selective keeps it. Full keeps only the block input and reruns
// the whole block forward before its backward.
//
// The recomputed tensors of a checkpointed block live in buffers every block shares (backward
// runs one block at a time), sized for one block: full N (15 C + 4 + H), selective N (11 C + 4).
// Outside the blocks: the embedding keeps the token ids (N), the head its input, ln_f's output,
// mean and rstd, the logits (their gradient is written in place) and per-position losses and
// log-sum-exps: N (2 C + V + 4). Backward allocates nothing of its own: each gradient inside a
// block is written over an activation of that block nothing reads any more (gpt2_block.cpp),
// and the head's ln_f gradient over ln_f's output. The residual-stream tensors in flight between
// modules are the caller's, not counted.
//
// Split over t tensor-parallel ranks (Gpt2Config::tensor_parallel_size), a rank holds Cl = C / t
// of qkv, the attention's output and the two MLP tensors, and Hl = H / t log-sum-exps; the rest
// is whole: none N (4 C + 12 Cl + 4 + Hl), selective N (C + 4 Cl + Hl) kept and
// N (3 C + 8 Cl + 4) rebuilt, full rebuilds N (3 C + 12 Cl + 4 + Hl); the head holds its
// ceil(V / t) columns of the logits: N (2 C + ceil(V / t) + 4).
//
// DeepSpeed's partition_activations (Gpt2Checkpointing::partition_activations, t > 1): the
// block input a checkpointed block keeps (its checkpoint, identical on every rank of the group)
// is kept as one rank's piece of it, P = ceil(N C / t) floats of the flattened tensor (rank r's
// from r P; the last rank's piece is padded with zeros where t does not divide N C, as
// DeepSpeed pads; here t divides H, which divides C, so it always divides and the padding is
// empty). Backward rebuilds the whole input with an all-gather of the pieces over the group
// into one more shared buffer of t P floats, which the block also computes on in forward:
//
//   tensor                     floats   none  selective  full     (partitioned)
//   block input (checkpoint)   P        -     kept       kept     1/t of it per rank
//   whole input (shared)       t P      -     rebuilt    rebuilt  all-gathered in backward
//
// so a checkpointed block keeps N C - P floats fewer (selective N (4 Cl + Hl) + P, full P)
// and the shared buffers hold t P more (selective N (3 C + 8 Cl + 4) + t P, full
// N (3 C + 12 Cl + 4 + Hl) + t P). Without tensor parallelism it changes nothing (a partition
// over a group of one).
//
// Ours, the NVMe spill (Gpt2Checkpointing::nvme_path): each checkpoint (N C floats) leaves its
// block for a region of R = N C f rounded up to kNvmeAlignment (4096) bytes of this rank's file,
// written while the block computes and read back one checkpointed block ahead of its backward.
// O_DIRECT transfers whole aligned regions from aligned memory, so the checkpoints pass through
// one buffer of b R + kNvmeBufferSlack bytes (b = 2 regions, or 1 with one checkpointed block;
// the slack aligns them, zero/runtime/nvme_file.h) instead of being kept: a checkpointed block
// keeps N C floats fewer, and the file holds L R G bytes for L checkpointed blocks and G
// generations (Gpt2Checkpointing::checkpoint_generations: 1, or on a pipeline stage the
// micro-batches one of its chunks holds in flight, each with regions of its own).
//
// A pipeline stage (Gpt2PipelineStage, gpt2.h) holds, per micro-batch, its own part of that:
// the embedding's on the first stage, its blocks', the head's on the last (the logits among
// them: the last stage keeps one micro-batch's logits per micro-batch in flight). Each module
// moves a micro-batch's tensors out after its forward and back before its backward, so a stage
// holding k micro-batches in flight (pipeline_micro_batches_in_flight) keeps k times that. The
// recomputation buffers are the stage's, shared by its blocks and its micro-batches (one
// backward runs at a time), and allocated only when one of its blocks is checkpointed; so is the
// spill's buffer (nothing is in flight between one block's forward or one chunk's backward and
// the next), while its file holds a region per checkpointed block of the stage and micro-batch in
// flight; so is contiguous_memory's buffer, G sets of the stage's checkpoints (G as the spill's
// regions), allocated with the first. Its peak comes at the first backward after its k-th
// forward: k micro-batches kept, plus those buffers.
// A finished backward leaves its micro-batch's tensors in the modules, where the next forward
// reuses them (Gpt2Backend::activation), so nothing else adds up.
//
// A stage of model chunks (interleaved) holds, per (micro-batch, chunk) in flight, that chunk's
// part (the embedding's with chunk 0 of the first stage, the head's with the last chunk of the
// last stage); each chunk's modules keep the tensors of their last backward until the chunk's
// next forward reuses them, so a chunk holds one set more from a backward to its next forward.
// Its peak is the largest sum over the points of the stage's list, plus the recompute buffers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zero/runtime/engine.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero::models {

struct Gpt2Config;
struct Gpt2PipelineStage;

// What a checkpointed block recomputes in backward (the table above).
enum class Recompute { kNone, kSelective, kFull };

// "none", "selective", "full".
const char* recompute_name(Recompute recompute);
// False for another name.
bool parse_recompute(const std::string& name, Recompute* recompute);

struct Gpt2Checkpointing {
  Recompute recompute = Recompute::kNone;
  // DeepSpeed's number_checkpoints: how many blocks are checkpointed, spread evenly over the
  // layers (block floor(j * n_layer / n) for j < n: every k-th block when n divides n_layer
  // into k); the others keep everything. 0: every block.
  int number_checkpoints = 0;
  // DeepSpeed's contiguous_memory_optimization: the checkpoints (the inputs checkpointed blocks
  // keep) in one buffer for all of them, allocated when the micro-batch's size changes, instead
  // of one allocation per block. The same bytes, one allocation.
  bool contiguous_memory = false;
  // DeepSpeed's profile: each block times its forward, its recomputation and its backward
  // (take_gpt2_profile, gpt2.h).
  bool profile = false;
  // DeepSpeed's cpu_checkpointing: each checkpoint moves to pinned host memory on the device's
  // copy stream during its block's forward (its device copy is freed once the copy is done) and
  // comes back one checkpointed block ahead of its backward, so at most two are on the device.
  // On the CPU that is a copy from host memory to host memory, which saves nothing (zero-train
  // does not turn it on there). Not with contiguous_memory.
  bool cpu_checkpointing = false;
  // DeepSpeed's partition_activations: with tensor parallelism (Gpt2Config::tensor_parallel_size
  // t > 1), each checkpoint is kept as this rank's 1/t piece and rebuilt by an all-gather over
  // the tensor-parallel group before its block recomputes (the table above); nothing at t = 1.
  // Not with cpu_checkpointing.
  bool partition_activations = false;
  // Ours (DeepSpeed has no such key): a directory on NVMe the checkpoints are spilled to
  // (gpt2_spill.h), one file per rank (activations_rank_<spill_rank>.bin, removed once open, so
  // nothing stays behind), with the engine's aio settings; empty: off. On the CPU path only,
  // and not with cpu_checkpointing, contiguous_memory or partition_activations.
  std::string nvme_path{};
  AioConfig spill_aio{};
  int spill_rank = 0;
  // The micro-batches whose checkpoints a stage holds at once where they have places of their
  // own (the spill's file, G regions per checkpointed block; contiguous_memory's buffer, G slots
  // per checkpointed block): on a pipeline stage the most one of its chunks holds in flight
  // (gpt2_checkpoint_generations), 1 without a pipeline.
  int checkpoint_generations = 1;
  // DeepSpeed's synchronize_checkpoint_boundary: each checkpointed block's forward and backward
  // begin and end with the host waiting until the device has run all the work issued so far, on
  // every stream (DeviceContext::synchronize_device, torch.cuda.synchronize()'s meaning; on the
  // CPU each kernel has returned when done). Counted in take_gpt2_profile's synchronizations.
  bool synchronize_boundary = false;
};

// Whether block `layer` of `n_layer` recomputes (false everywhere with Recompute::kNone).
bool gpt2_block_checkpointed(const Gpt2Checkpointing& checkpointing, int layer, int n_layer);

// Whether the checkpointed blocks of a model of `config` keep their checkpoints partitioned:
// partition_activations over more than one tensor-parallel rank.
bool gpt2_partitions_checkpoints(const Gpt2Config& config, const Gpt2Checkpointing& checkpointing);

// Whether the checkpointed blocks keep their checkpoints in slots of the blocks' shared buffer
// (contiguous_memory): checkpoint_generations slots each.
bool gpt2_checkpoints_in_slots(const Gpt2Checkpointing& checkpointing);

// Floats of one rank's piece of a partitioned checkpoint of B T positions: ceil(B T C / t).
uint64_t gpt2_checkpoint_piece(const Gpt2Config& config, int64_t B, int64_t T);

// Throws zero::Error for a number_checkpoints below 0 or above n_layer, for cpu_checkpointing
// with contiguous_memory or with partition_activations, and for an nvme_path without
// recomputation or with any of those three.
void check_gpt2_checkpointing(const Gpt2Checkpointing& checkpointing, int n_layer);

// nvme_path: the bytes the spill moved to and from its file (take_gpt2_spill_traffic, gpt2.h).
struct Gpt2SpillTraffic {
  uint64_t read_bytes = 0;
  uint64_t write_bytes = 0;
};

// Activation bytes of a model, by where they are held.
struct Gpt2ActivationBytes {
  uint64_t embedding = 0;
  std::vector<uint64_t> blocks;  // kept from forward to backward, per block
  uint64_t checkpoints = 0;      // of blocks: the inputs checkpointed blocks keep (the
                                 // allocator's kCheckpoint; the rest is kActivation)
  // With cpu_checkpointing, instead: the checkpoints on the device at once, outside blocks (the
  // allocator's kCheckpoint at its peak), and every checkpoint in pinned host memory (counted
  // apart, not in total()).
  uint64_t moving_checkpoints = 0;
  uint64_t host_checkpoints = 0;
  // With nvme_path, instead: the aligned buffer the checkpoints pass through (outside blocks; the
  // allocator's kCheckpoint, so also `checkpoints`), and the bytes of every checkpoint's region
  // in the file (counted apart, not in total()).
  uint64_t spill_buffer = 0;
  uint64_t nvme_checkpoints = 0;
  // With contiguous_memory on a pipeline stage, instead: the buffer of checkpoint_generations
  // sets of the stage's checkpoints (outside blocks; also `checkpoints`), which its
  // micro-batches share.
  uint64_t checkpoint_buffer = 0;
  uint64_t recompute = 0;  // the shared buffers of recomputed tensors
  uint64_t head = 0;

  uint64_t kept() const;   // the sum of blocks
  uint64_t total() const;  // everything above
};

// The formula: what a model of `config` holds after a forward and backward of B sequences of
// T tokens.
Gpt2ActivationBytes gpt2_activation_formula(const Gpt2Config& config,
                                            const Gpt2Checkpointing& checkpointing, int64_t B,
                                            int64_t T);

// One pipeline stage's activations with `in_flight` micro-batches of B sequences of T tokens
// held at once (the comment at the top).
struct Gpt2StageActivationBytes {
  // One micro-batch's, on this stage only: the embedding (first stage), the stage's blocks and
  // their checkpoints, the head (last stage), and the stage's recomputation buffers and spill
  // buffer (0 when none of its blocks is checkpointed); with the spill, its file's bytes.
  Gpt2ActivationBytes micro_batch;
  int in_flight = 1;
  // A split backward (ZB-H1), at the peak: the micro-batches whose backward_input ran and whose
  // backward_weight waits (each keeps its activations and weight_inputs more: the output
  // gradients the weight half reads and, of each checkpointed block, the tensors it recomputed
  // that the weight half reads, with the spill its checkpoint's copy), and whether the peak is
  // inside a backward_input, which holds split_scratch more (a block's attention output gradient).
  int awaiting_weight = 0;
  uint64_t weight_inputs = 0;
  uint64_t split_scratch = 0;
  bool in_backward_input = false;

  // Model chunks (interleaved): per chunk one set's bytes (its part of per_micro_batch()) and
  // checkpoints, and how many sets it holds at the peak; in_flight is then their sum. Empty for
  // a stage of one chunk.
  std::vector<uint64_t> chunk_bytes;
  std::vector<uint64_t> chunk_checkpoints;
  std::vector<int> chunk_sets;

  // What one micro-batch in flight keeps: micro_batch.total() less shared().
  uint64_t per_micro_batch() const;
  // What the stage holds once for all its micro-batches: the recompute buffers, the spill's
  // buffer and the contiguous checkpoint buffer.
  uint64_t shared() const;
  // The stage's peak: in_flight x per_micro_batch() + awaiting_weight x (per_micro_batch() +
  // weight_inputs) + split_scratch inside a backward_input + shared(); with model chunks, the
  // sum of chunk_sets x chunk_bytes + shared().
  uint64_t peak() const;
  // The peak's checkpoints: in_flight x micro_batch.checkpoints (with model chunks, the sum of
  // chunk_sets x chunk_checkpoints); with the spill, its buffer.
  uint64_t peak_checkpoints() const;
};

// The formula for one pipeline stage (the whole model's, gpt2_activation_formula, when it is the
// only stage); with nvme_path, the stage's file holds checkpointing.checkpoint_generations regions
// per checkpointed block of the stage, and with contiguous_memory its checkpoint buffer
// checkpoint_generations slots per checkpointed block (shared(), the checkpoints left out of
// the blocks). Throws zero::Error for in_flight below 1, for layers outside the model and, in a
// pipeline of several stages, for cpu_checkpointing (built for one micro-batch in flight).
Gpt2StageActivationBytes gpt2_stage_activation_formula(const Gpt2Config& config,
                                                       const Gpt2Checkpointing& checkpointing,
                                                       const Gpt2PipelineStage& stage,
                                                       int in_flight, int64_t B, int64_t T);

// The generations of checkpoint places a pipeline stage needs (Gpt2Checkpointing::
// checkpoint_generations): the most micro-batches one chunk of it holds in flight, `in_flight`
// for a stage of one chunk (pipeline_micro_batches_in_flight), and for model chunks (`in_flight`
// then unused) the most forwards of one chunk whose backward, or its input half, has not run over
// `chunk_actions`, the stage's list of one step.
int gpt2_checkpoint_generations(int in_flight, const std::vector<PipelineAction>& chunk_actions);

// The same for a stage of model chunks (stage.chunks, interleaved) running `actions`, the
// stage's list of one step (make_pipeline_schedule's): the largest over its points (the comment
// at the top). Throws zero::Error as gpt2_stage_activation_formula, and for actions of a chunk
// the stage does not have.
Gpt2StageActivationBytes gpt2_chunked_stage_activation_formula(
    const Gpt2Config& config, const Gpt2Checkpointing& checkpointing,
    const Gpt2PipelineStage& stage, const std::vector<PipelineAction>& actions, int64_t B,
    int64_t T);

// The same under a schedule that splits backward (ZB-H1): the largest over `loads`, the stage's
// points (pipeline_stage_loads). A checkpointed block recomputes once, in backward_input, and
// keeps what backward_weight reads of it until then (weight_inputs), with the spill its
// checkpoint's copy too (partitioned or in the contiguous buffer, a copy of its whole input).
Gpt2StageActivationBytes gpt2_split_stage_activation_formula(
    const Gpt2Config& config, const Gpt2Checkpointing& checkpointing,
    const Gpt2PipelineStage& stage, const std::vector<PipelineStageLoad>& loads, int64_t B,
    int64_t T);

// What a training step of B sequences of T tokens holds beside the formula, outside the
// model's counted activations: the residual-stream tensors in flight between modules (a
// block's output, and in backward the gradient coming in and the one going out: 3 N C floats)
// and the batch (token ids as given and on the device, and targets: 3 N).
uint64_t gpt2_uncounted_activation_bytes(const Gpt2Config& config, int64_t B, int64_t T);

// The same for pipeline stage `stage` of a pipeline holding `in_flight` micro-batches on it,
// a bound rather than an exact figure: the tensors between its modules (3 N C), the batch where
// the stage reads it (3 N on the first and the last stage), the targets the last stage keeps
// per micro-batch in flight (N each), and the transfer buffers of a stage with neighbours
// (activation-shaped, N C each): up to two receives of each kind posted and a send per
// micro-batch in flight in each direction, 4 + 2 in_flight.
uint64_t gpt2_stage_uncounted_activation_bytes(const Gpt2Config& config,
                                               const Gpt2PipelineStage& stage, int in_flight,
                                               int64_t B, int64_t T);

}  // namespace zero::models
