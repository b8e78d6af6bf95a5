// One GPT-2 block, with activation checkpointing (gpt2_memory.h: what each setting keeps and
// recomputes). Private to models/.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "models/gpt2_common.h"
#include "models/gpt2_spill.h"

namespace zero::models {

// The tensors a block's forward makes for its backward, in the order forward makes them.
enum BlockActivation {
  kInput,  // the block's input, also ln_1's
  kLn1,
  kLn1Mean,
  kLn1Rstd,
  kQkv,
  kAtt,  // the attention's output
  kLse,  // its log-sum-exp per row and head
  kX2,   // the residual stream after the attention, ln_2's input
  kLn2,
  kLn2Mean,
  kLn2Rstd,
  kFc,    // the GELU's input
  kGelu,  // its output, c_proj's input
  kBlockActivations
};

// How one block checkpoints (make_gpt2 derives it from Gpt2Checkpointing).
struct Gpt2BlockCheckpointing {
  Recompute recompute = Recompute::kNone;
  // With contiguous_memory, this block's checkpoint is slot `slot` of `slots` in
  // each of the `generations` sets of Gpt2BlockShared::checkpoints: one set per micro-batch a
  // pipeline stage holds in flight, its forward k in set k mod generations (as the spill's
  // regions, gpt2_spill.h).
  bool contiguous_memory = false;
  int slot = 0;
  int slots = 0;
  int generations = 1;
  bool profile = false;
  bool synchronize = false;  // synchronize_checkpoint_boundary
  bool cpu_checkpointing = false;
  // partition_activations over more than one tensor-parallel rank: this block keeps its rank's
  // piece of its checkpoint and computes on the whole input in Gpt2BlockShared::recomputed.
  bool partition = false;
  // nvme_path: this block's checkpoint goes to Gpt2BlockShared::spill's file, regions `slot`.
  bool spill = false;
};

// Milliseconds a block spent since the profile was last taken (gpt2.h's Gpt2Profile).
struct Gpt2BlockTimes {
  double forward_ms = 0.0;
  double recompute_ms = 0.0;
  double backward_ms = 0.0;  // without the recomputation
  int synchronizations = 0;  // synchronize_checkpoint_boundary's waits (also without profile)
};

// A block's parameter indices, in Hugging Face's order.
enum BlockParam {
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
  kBlockParams
};

// Buffers every block uses in turn: backward runs one block at a time.
struct Gpt2BlockShared {
  // With contiguous_memory: every checkpointed block's input, [generations x slots, N, C], or
  // partitioned its piece of it, [generations x slots, P] (gpt2_memory.h); a partitioned block
  // without contiguous_memory keeps its piece itself.
  Tensor checkpoints;
  // The recomputed tensors of the checkpointed block being processed (only those its setting
  // recomputes are allocated); with partition, [kInput] is its whole input (t pieces).
  Tensor recomputed[kBlockActivations];
  // With 16-bit parameters, the fp32 copies of a block's parameters and gradients: a block
  // converts its parameters when it computes and flushes its gradients at the end of its
  // backward, so the blocks take turns with one set (gpt2_module_copy_bytes counts one).
  gpt2_detail::ParamSlots params{kBlockParams};
  // nvme_path: the file the checkpoints are spilled to, and the buffer they pass through (the
  // allocator's kCheckpoint; gpt2_spill.h).
  std::unique_ptr<Gpt2CheckpointSpill> spill;
  Tensor spill_buffer;

  uint64_t recompute_bytes() const;
};

// One pre-LN block: x2 = x + proj(attention(ln_1(x))); out = x2 + mlp(ln_2(x2)). With
// `recompute` other than kNone, forward keeps only what that setting keeps and backward first
// reruns the operations that make the rest, with the same kernels on the same inputs (the
// parameters backward is given: at stage 3 the engine gathers them for backward), so the results
// are bitwise those without checkpointing.
class Gpt2Block : public Module {
 public:
  Gpt2Block(const Gpt2Config& config, const Gpt2BlockCheckpointing& checkpointing,
            std::shared_ptr<gpt2_detail::Gpt2Backend> backend,
            std::shared_ptr<Gpt2BlockShared> shared);

  std::vector<ParamDecl> parameters() const override;
  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) override;
  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& params,
                const std::vector<ParamRef>& grads) override;
  // Several micro-batches in flight: the kept tensors, the batch's shape and which forward's
  // checkpoint the block holds (its regions of the spill's file, its slots of the checkpoint
  // buffer). Not with cpu_checkpointing (one host copy per block).
  void take_activations(KeptActivations& kept) override;
  void restore_activations(KeptActivations& kept) override;
  // Split (ZB-H1): backward_input writes each input gradient into memory of its own instead of
  // over an activation (the weight half reads the activations), and keeps the output gradients
  // of the four products and two LayerNorms for backward_weight; a recomputing block recomputes
  // in backward_input and keeps the recomputed tensors backward_weight reads (all but qkv and the
  // log-sum-exp) until then, in memory of its own, and a copy of its input where its checkpoint
  // is not a whole tensor of its own (kInputCopy). Not with cpu_checkpointing.
  bool splits_backward() const override { return true; }
  void backward_input(const Tensor& grad_out, Tensor& grad_in,
                      const std::vector<ParamRef>& params) override;
  void backward_weight(const std::vector<ParamRef>& grads) override;

  // Bytes of the activations this block keeps from forward to backward (and from
  // backward_input to backward_weight), and of those its checkpoint (its input, when it
  // recomputes).
  uint64_t kept_bytes() const;
  uint64_t checkpoint_bytes() const;
  bool recomputes() const { return recompute_ != Recompute::kNone; }
  // cpu_checkpointing: bytes of this block's checkpoint in pinned host memory.
  uint64_t host_checkpoint_bytes() const { return host_checkpoint_.bytes(); }
  // cpu_checkpointing and nvme_path: the checkpointed block before this one, whose checkpoint
  // this block's backward brings back (to the device, from the file) ahead of that block's
  // backward.
  void set_previous_checkpointed(Gpt2Block* block) { previous_checkpointed_ = block; }
  // The times since the last call (zeros unless profiling), and a restart.
  Gpt2BlockTimes take_times();

 private:
  Tensor& at(int a);
  // Whether this block's checkpoint is a slot of Gpt2BlockShared::checkpoints.
  bool in_shared_buffer() const;
  // Whether this block keeps a piece of its checkpoint (partition_activations).
  bool partitioned() const;
  // The tensor whose memory holds this block's checkpoint.
  const Tensor& input_holder() const;
  // Where this block's checkpoint is: kept_[kInput], or with contiguous_memory its slot of the
  // current forward's set.
  float* checkpoint_data();
  // With contiguous_memory: the slots of Gpt2BlockShared::checkpoints (every set's), and the
  // index of this block's in the current forward's set.
  size_t shared_slots() const;
  size_t checkpoint_slot() const;
  // Where tensor `a` is: at(a)'s memory, or for a contiguous checkpoint this block's slot.
  float* data_of(int a);
  // partition_activations in forward: `in` whole in the shared buffer, this rank's piece of it
  // kept as the checkpoint.
  void keep_piece(const Tensor& in);
  // cpu_checkpointing: whether this block moves its checkpoint to the host, and the start of its
  // copy back to the memory of `on`.
  bool moves_checkpoint() const;
  void fetch_checkpoint(const std::shared_ptr<DeviceContext>& on);
  // nvme_path: whether this block spills its checkpoint, and the start of its read back.
  bool spills() const;
  void fetch_spilled();
  // synchronize_checkpoint_boundary: a checkpointed block waits for all of the device's work so
  // far, as its forward and its backward begin and end.
  void synchronize_at_boundary(const Tensor& on);
  // Milliseconds since `start`, after the device ran the work issued (when profiling).
  double elapsed_ms(std::chrono::steady_clock::time_point start, const Tensor& on) const;
  // In backward: this block's checkpoint brought back (cpu_checkpointing, the spill) and, when
  // it recomputes, the tensors it does not keep rebuilt; the time the backward proper starts.
  std::chrono::steady_clock::time_point prepare_backward(const Tensor& grad_out,
                                                         const std::vector<ParamRef>& params);
  // The forward's operations: all of them (and the output) when out is given; otherwise, in
  // backward, only those making tensors this block does not keep.
  void run_forward(const std::vector<ParamRef>& params, Tensor* out);

  Gpt2Config config_;
  Recompute recompute_;
  Gpt2BlockCheckpointing checkpointing_;
  Gpt2BlockTimes times_;
  std::shared_ptr<gpt2_detail::Gpt2Backend> backend_;
  std::shared_ptr<Gpt2BlockShared> shared_;
  int B_ = 0, T_ = 0;
  // Those this block keeps (the others stay empty), and from backward_input to backward_weight
  // the recomputed ones the weight half reads (and a spilled checkpoint's copy).
  Tensor kept_[kBlockActivations];
  // Between backward_input and backward_weight: the output gradients the weight half reads (of
  // the MLP's projection, fc, ln_2, the attention's projection, ln_1; qkv's is over kFc) and,
  // where the block's checkpoint is not a whole tensor of its own (spilled: the spill's buffer
  // holds others' by then; partitioned: the whole input is rebuilt in a shared buffer; in the
  // contiguous buffer: a later forward may take its slot), a copy of its input for ln_1's
  // weight gradient.
  enum WeightInput { kFcProjOut, kFcOut, kLn2Out, kProjOut, kLn1Out, kInputCopy, kWeightInputs };
  Tensor weight_inputs_[kWeightInputs];
  // cpu_checkpointing: the checkpoint in pinned host memory, its last copy to or from there,
  // whether it is on its way back, and the block whose checkpoint is fetched next.
  Buffer host_checkpoint_;
  Event checkpoint_copy_;
  bool fetched_ = false;
  Gpt2Block* previous_checkpointed_ = nullptr;
  // nvme_path: the checkpoint's last transfer to or from the file (fetched_ as above).
  NvmeFile::Ticket spill_transfer_;
  // The forwards this block ran, and the one whose checkpoint it holds (which regions of the
  // spill's file, which set of the checkpoint buffer); per set of the buffer, the forward that
  // wrote this block's slot last, so that a checkpoint overwritten before its backward is an
  // error, never a wrong gradient.
  uint64_t forwards_ = 0;
  uint64_t forward_ = 0;
  std::vector<uint64_t> slot_writers_;
};

}  // namespace zero::models
