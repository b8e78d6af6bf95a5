#include "models/gpt2_block.h"

#include <algorithm>
#include <utility>

#include "zero/core/check.h"

namespace zero::models {

using gpt2_detail::bytes_of;
using gpt2_detail::ensure;
using kernels::WeightLayout;

namespace {

// Floats hold integers below 2^24 exactly: take_activations keeps the forward number in
// two such halves.
constexpr uint64_t kFloatExact = uint64_t{1} << 24;

// Whether a block with `recompute` keeps tensor `a` from forward to backward (gpt2_memory.h's
// table). The outputs of one operation (a LayerNorm's output, mean and rstd; the attention's
// output and lse) are kept or recomputed together.
bool keeps(Recompute recompute, int a) {
  switch (recompute) {
    case Recompute::kNone:
      return true;
    case Recompute::kSelective:
      return a == kInput || a == kQkv || a == kAtt || a == kLse;
    case Recompute::kFull:
      return a == kInput;
  }
  return true;
}

// Whether backward_weight reads tensor `a` (or, for fc, backward_input's qkv output gradient
// written over it): all but qkv and the log-sum-exp, which only the input half reads.
bool weight_half_reads(int a) {
  return a != kQkv && a != kLse;
}

// Shapes on one tensor-parallel rank: C wide, its slice Cl = C / t of the heads' width and NHl of
// the heads (Cl = C and NHl = NH without tensor parallelism).
std::vector<int64_t> shape_of(int a, int B, int T, int C, int Cl, int NHl) {
  const int64_t N = static_cast<int64_t>(B) * T;
  switch (a) {
    case kInput:
    case kX2:
      return {B, T, C};
    case kLn1:
    case kLn2:
      return {N, C};
    case kAtt:
      return {N, Cl};
    case kLn1Mean:
    case kLn1Rstd:
    case kLn2Mean:
    case kLn2Rstd:
      return {N};
    case kQkv:
      return {N, 3 * static_cast<int64_t>(Cl)};
    case kLse:
      return {B, NHl, T};
    default:  // kFc, kGelu
      return {N, 4 * static_cast<int64_t>(Cl)};
  }
}

}  // namespace

uint64_t Gpt2BlockShared::recompute_bytes() const {
  uint64_t sum = 0;
  for (const Tensor& t : recomputed) sum += bytes_of(t);
  return sum;
}

Gpt2Block::Gpt2Block(const Gpt2Config& config, const Gpt2BlockCheckpointing& checkpointing,
                     std::shared_ptr<gpt2_detail::Gpt2Backend> backend,
                     std::shared_ptr<Gpt2BlockShared> shared)
    : config_(config),
      recompute_(checkpointing.recompute),
      checkpointing_(checkpointing),
      backend_(std::move(backend)),
      shared_(std::move(shared)) {}

std::vector<ParamDecl> Gpt2Block::parameters() const {
  using gpt2_detail::uniform_bound;
  const int64_t C = config_.n_embd;
  const ParamInit ones{InitKind::kOnes, 0.0f};
  const ParamInit zeros{InitKind::kZeros, 0.0f};
  const ParamInit weight{InitKind::kUniform, uniform_bound(0.02f)};
  // GPT-2 scales the residual projections by 1 / sqrt(2 * n_layer): each block adds two.
  const ParamInit residual{InitKind::kUniform,
                           uniform_bound(0.02f / std::sqrt(2.0f * config_.n_layer))};
  auto decl = [this](const char* name, std::vector<int64_t> shape, ParamInit init) {
    return gpt2_detail::param(config_, name, std::move(shape), init);
  };
  // The split matrices and biases are this rank's slices of the whole tensors' shapes given
  // here.
  auto slice = [this](const char* name, const std::vector<int64_t>& whole, ParamInit init) {
    return gpt2_detail::split_param(config_, name, whole, init);
  };
  return {decl("ln_1.weight", {C}, ones),
          decl("ln_1.bias", {C}, zeros),
          slice("attn.c_attn.weight", {C, 3 * C}, weight),
          slice("attn.c_attn.bias", {3 * C}, zeros),
          slice("attn.c_proj.weight", {C, C}, residual),
          decl("attn.c_proj.bias", {C}, zeros),
          decl("ln_2.weight", {C}, ones),
          decl("ln_2.bias", {C}, zeros),
          slice("mlp.c_fc.weight", {C, 4 * C}, weight),
          slice("mlp.c_fc.bias", {4 * C}, zeros),
          slice("mlp.c_proj.weight", {4 * C, C}, residual),
          decl("mlp.c_proj.bias", {C}, zeros)};
}

Tensor& Gpt2Block::at(int a) {
  if (a == kInput && partitioned()) return shared_->recomputed[kInput];
  // From backward_input to backward_weight a recomputed tensor the weight half reads is the
  // block's own.
  return keeps(recompute_, a) || kept_[a].numel() > 0 ? kept_[a] : shared_->recomputed[a];
}

bool Gpt2Block::partitioned() const {
  return checkpointing_.partition && recompute_ != Recompute::kNone;
}

bool Gpt2Block::in_shared_buffer() const {
  return checkpointing_.contiguous_memory && recompute_ != Recompute::kNone;
}

const Tensor& Gpt2Block::input_holder() const {
  if (spills()) return shared_->spill_buffer;
  return in_shared_buffer() ? shared_->checkpoints : kept_[kInput];
}

size_t Gpt2Block::shared_slots() const {
  return static_cast<size_t>(checkpointing_.slots) *
         static_cast<size_t>(checkpointing_.generations);
}

size_t Gpt2Block::checkpoint_slot() const {
  const uint64_t set = forward_ % static_cast<uint64_t>(checkpointing_.generations);
  return static_cast<size_t>(set) * static_cast<size_t>(checkpointing_.slots) +
         static_cast<size_t>(checkpointing_.slot);
}

float* Gpt2Block::checkpoint_data() {
  if (spills()) return shared_->spill->in_buffer(shared_->spill_buffer, checkpointing_.slot);
  if (!in_shared_buffer()) return kept_[kInput].data();
  Tensor& all = shared_->checkpoints;
  return all.data() + all.numel() / shared_slots() * checkpoint_slot();
}

float* Gpt2Block::data_of(int a) {
  // From backward_input to backward_weight a checkpoint not kept whole by the block itself
  // (spilled, partitioned, in the contiguous buffer) is the block's own copy of its input.
  if (a == kInput && weight_inputs_[kInputCopy].numel() > 0) {
    return weight_inputs_[kInputCopy].data();
  }
  return a == kInput && !partitioned() ? checkpoint_data() : at(a).data();
}

void Gpt2Block::keep_piece(const Tensor& in) {
  const int t = config_.tensor_parallel_size;
  const uint64_t piece = gpt2_checkpoint_piece(config_, B_, T_);
  backend_->activation(shared_->recomputed[kInput], {static_cast<int64_t>(t * piece)}, in.device());
  gpt2_detail::Gpt2Backend::copy_into(shared_->recomputed[kInput].data(), in);
  if (in_shared_buffer()) {
    backend_->activation(shared_->checkpoints,
                         {static_cast<int64_t>(shared_slots()), static_cast<int64_t>(piece)},
                         in.device(), MemoryCategory::kCheckpoint);
  } else {
    backend_->activation(kept_[kInput], {static_cast<int64_t>(piece)}, in.device(),
                         MemoryCategory::kCheckpoint);
  }
  // Rank r's piece is the flattened input's floats from r P; the last one's tail past the input
  // stays the zeros it was allocated with (empty here: gpt2_memory.h).
  const uint64_t numel = in.numel();
  const uint64_t first = std::min<uint64_t>(numel, backend_->tensor_parallel_rank() * piece);
  gpt2_detail::Gpt2Backend::copy_floats(checkpoint_data(), in.data() + first,
                                        std::min<uint64_t>(piece, numel - first), in.device());
}

uint64_t Gpt2Block::kept_bytes() const {
  uint64_t sum = 0;
  for (const Tensor& t : kept_) sum += bytes_of(t);
  for (const Tensor& t : weight_inputs_) sum += bytes_of(t);
  return sum + (in_shared_buffer() ? checkpoint_bytes() : 0);
}

uint64_t Gpt2Block::checkpoint_bytes() const {
  if (recompute_ == Recompute::kNone) return 0;
  if (!in_shared_buffer()) return bytes_of(kept_[kInput]);
  return bytes_of(shared_->checkpoints) / shared_slots();
}

bool Gpt2Block::moves_checkpoint() const {
  return checkpointing_.cpu_checkpointing && recompute_ != Recompute::kNone;
}

void Gpt2Block::fetch_checkpoint(const std::shared_ptr<DeviceContext>& on) {
  backend_->activation(kept_[kInput], {B_, T_, config_.n_embd}, on, MemoryCategory::kCheckpoint);
  checkpoint_copy_ = backend_->context_of(on).copy_from_host_async(
      kept_[kInput].data(), host_checkpoint_.data(), host_checkpoint_.bytes());
  fetched_ = true;
}

bool Gpt2Block::spills() const {
  return checkpointing_.spill && recompute_ != Recompute::kNone;
}

void Gpt2Block::fetch_spilled() {
  spill_transfer_ = shared_->spill->read(checkpoint_data(), checkpointing_.slot, forward_);
  fetched_ = true;
}

Gpt2BlockTimes Gpt2Block::take_times() {
  return std::exchange(times_, Gpt2BlockTimes{});
}

void Gpt2Block::synchronize_at_boundary(const Tensor& on) {
  if (recompute_ == Recompute::kNone || !checkpointing_.synchronize) return;
  if (on.device()) on.device()->synchronize_device();
  ++times_.synchronizations;
}

double Gpt2Block::elapsed_ms(std::chrono::steady_clock::time_point start, const Tensor& on) const {
  if (on.device()) on.device()->synchronize();  // device work runs after its launch returns
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

void Gpt2Block::forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& params) {
  const int C = config_.n_embd;
  ZERO_CHECK(in.shape().size() == 3 && in.shape()[2] == C,
             "a GPT-2 block takes activations [batch, seq, " << C << "]");
  synchronize_at_boundary(in);
  const auto start = std::chrono::steady_clock::now();
  B_ = static_cast<int>(in.shape()[0]);
  T_ = static_cast<int>(in.shape()[1]);
  forward_ = forwards_++;
  // A checkpointed block's input is its checkpoint: what its recomputation starts from.
  if (partitioned()) {
    keep_piece(in);
  } else if (spills()) {
    // O_DIRECT reads and writes host memory: a device's checkpoint would need a staging copy.
    ZERO_CHECK(!in.device(), "the checkpoint spill to NVMe is built on the CPU path only");
    Gpt2CheckpointSpill& spill = *shared_->spill;
    // The first checkpointed block of a micro-batch of another size remakes the file and buffer.
    spill.prepare(in.numel() * sizeof(float));
    backend_->activation(shared_->spill_buffer, {static_cast<int64_t>(spill.buffer_floats())},
                         in.device(), MemoryCategory::kCheckpoint);
    gpt2_detail::Gpt2Backend::copy_into(checkpoint_data(), in);
    // Written while the block computes on it, to this forward's generation of the block's
    // regions (gpt2_spill.h); a forward that no backward follows (validation) leaves nothing to
    // hand back.
    spill_transfer_ = spill.write(checkpoint_data(), checkpointing_.slot, forward_);
    fetched_ = false;
  } else if (in_shared_buffer()) {
    // The first checkpointed block of a micro-batch of another size reallocates the buffer.
    backend_->activation(shared_->checkpoints, {static_cast<int64_t>(shared_slots()), B_, T_, C},
                         in.device(), MemoryCategory::kCheckpoint);
    gpt2_detail::Gpt2Backend::copy_into(data_of(kInput), in);
  } else {
    backend_->keep_copy(
        kept_[kInput], in,
        recompute_ == Recompute::kNone ? MemoryCategory::kActivation : MemoryCategory::kCheckpoint);
  }
  if (in_shared_buffer()) {
    slot_writers_.resize(static_cast<size_t>(checkpointing_.generations));
    slot_writers_[forward_ % slot_writers_.size()] = forward_;
  }
  DeviceContext& context = backend_->context_of(in.device());
  if (moves_checkpoint()) {
    // To the host while the block computes; a forward without backward (validation) replaces
    // the copy a fetch would have brought back.
    const size_t bytes = in.numel() * sizeof(float);
    if (host_checkpoint_.bytes() != bytes) {
      host_checkpoint_.reset();
      host_checkpoint_ =
          backend_->pinned_allocator(context).allocate(bytes, MemoryCategory::kCheckpoint);
    }
    checkpoint_copy_ =
        context.copy_to_host_async(host_checkpoint_.data(), kept_[kInput].data(), bytes);
    fetched_ = false;
  }
  for (int a = kInput + 1; a < kBlockActivations; ++a) {
    backend_->activation(at(a),
                         shape_of(a, B_, T_, C, C / config_.tensor_parallel_size,
                                  config_.n_head / config_.tensor_parallel_size),
                         in.device());
  }
  ensure(out, {B_, T_, C}, in.device());
  run_forward(params, &out);
  if (moves_checkpoint()) {
    // The device copy goes once the host one is complete (compute waits for the copy there).
    context.wait(checkpoint_copy_);
    kept_[kInput] = Tensor();
  }
  // The buffer's half is the next checkpointed block's but one once the write is done.
  if (spills()) shared_->spill->wait(spill_transfer_);
  if (checkpointing_.profile) times_.forward_ms += elapsed_ms(start, in);
  synchronize_at_boundary(in);
}

void Gpt2Block::run_forward(const std::vector<ParamRef>& params, Tensor* out) {
  const int C = config_.n_embd;
  const int Cl = C / config_.tensor_parallel_size;
  const int NHl = config_.n_head / config_.tensor_parallel_size;
  const int N = B_ * T_;
  // The row-parallel biases go in once, on the rank that adds them, before the all-reduce.
  const bool bias = backend_->adds_row_parallel_bias();
  const float eps = config_.layer_norm_eps;
  auto w = [&](int i) { return shared_->params.value(params, i); };
  auto p = [&](int a) { return data_of(a); };
  // In backward, an operation runs again when this block did not keep what it makes.
  auto makes = [&](int a) { return out != nullptr || !keeps(recompute_, a); };
  Gpt2Ops& ops = backend_->ops_for(input_holder());
  ops.set_bf16_products(gpt2_detail::bf16_products(params));
  // The products' weight matrices: a bf16 run's working copy as it is where the products take it.
  auto m = [&](int i) { return shared_->params.matrix(params, i, ops); };
  const std::shared_ptr<DeviceContext>& on = input_holder().device();
  if (makes(kLn1)) {
    ops.layernorm_forward(p(kLn1), p(kLn1Mean), p(kLn1Rstd), p(kInput), w(kLn1W), w(kLn1B), N, C,
                          eps);
  }
  if (makes(kQkv)) {
    ops.matmul_forward(p(kQkv), p(kLn1), m(kQkvW), w(kQkvB), N, C, 3 * Cl, WeightLayout::kInOut);
  }
  if (makes(kAtt)) ops.attention_forward(p(kAtt), p(kLse), p(kQkv), B_, T_, Cl, NHl);
  if (makes(kX2)) {
    ops.matmul_forward(p(kX2), p(kAtt), m(kProjW), bias ? w(kProjB) : nullptr, N, Cl, C,
                       WeightLayout::kInOut);
    backend_->all_reduce_tensor_parallel(p(kX2), static_cast<size_t>(N) * C, on);
    ops.add(p(kX2), p(kInput), static_cast<size_t>(N) * C);  // the residual
  }
  if (makes(kLn2)) {
    ops.layernorm_forward(p(kLn2), p(kLn2Mean), p(kLn2Rstd), p(kX2), w(kLn2W), w(kLn2B), N, C, eps);
  }
  if (makes(kFc)) {
    ops.matmul_forward(p(kFc), p(kLn2), m(kFcW), w(kFcB), N, C, 4 * Cl, WeightLayout::kInOut);
  }
  if (makes(kGelu)) ops.gelu_forward(p(kGelu), p(kFc), static_cast<size_t>(N) * 4 * Cl);
  if (out == nullptr) return;
  ops.matmul_forward(out->data(), p(kGelu), m(kFcProjW), bias ? w(kFcProjB) : nullptr, N, 4 * Cl, C,
                     WeightLayout::kInOut);
  backend_->all_reduce_tensor_parallel(out->data(), out->numel(), on);
  ops.add(out->data(), p(kX2), out->numel());
}

void Gpt2Block::take_activations(KeptActivations& kept) {
  ZERO_CHECK(!moves_checkpoint(),
             "a GPT-2 block keeps one host copy of its checkpoint with cpu_checkpointing, so it "
             "cannot have several micro-batches in flight (a pipeline); turn it off");
  kept.clear();
  // The batch's shape, and which forward's checkpoint the block holds (the spill's regions and
  // the contiguous buffer's slots of that forward have it).
  kept.emplace_back(std::vector<int64_t>{4},
                    std::vector<float>{static_cast<float>(B_), static_cast<float>(T_),
                                       static_cast<float>(forward_ / kFloatExact),
                                       static_cast<float>(forward_ % kFloatExact)});
  for (Tensor& tensor : kept_) kept.push_back(std::move(tensor));
  for (Tensor& tensor : kept_) tensor = Tensor();
  for (Tensor& tensor : weight_inputs_) kept.push_back(std::move(tensor));
  for (Tensor& tensor : weight_inputs_) tensor = Tensor();
}

void Gpt2Block::restore_activations(KeptActivations& kept) {
  ZERO_CHECK(kept.size() == 1 + kBlockActivations + kWeightInputs,
             "a GPT-2 block got " << kept.size() << " activations back; it gave out "
                                  << 1 + kBlockActivations + kWeightInputs);
  const std::vector<float> header = kept[0].to_host();
  B_ = static_cast<int>(header[0]);
  T_ = static_cast<int>(header[1]);
  forward_ = static_cast<uint64_t>(header[2]) * kFloatExact + static_cast<uint64_t>(header[3]);
  for (int a = 0; a < kBlockActivations; ++a) kept_[a] = std::move(kept[1 + a]);
  for (int i = 0; i < kWeightInputs; ++i) {
    weight_inputs_[i] = std::move(kept[1 + kBlockActivations + i]);
  }
  kept.clear();
}

std::chrono::steady_clock::time_point Gpt2Block::prepare_backward(
    const Tensor& grad_out, const std::vector<ParamRef>& params) {
  if (moves_checkpoint()) {
    // This block's checkpoint back (fetched one block ahead, except for the first), then the
    // next one's on its way while this block computes.
    if (!fetched_) fetch_checkpoint(grad_out.device());
    backend_->context_of(grad_out.device()).wait(checkpoint_copy_);
    if (previous_checkpointed_ != nullptr)
      previous_checkpointed_->fetch_checkpoint(grad_out.device());
  }
  if (spills()) {
    // The same from the file: this block's checkpoint (read ahead, except for the first), then
    // the next one's into the buffer's other half while this block computes.
    if (!fetched_) fetch_spilled();
    shared_->spill->wait(spill_transfer_);
    if (previous_checkpointed_ != nullptr) previous_checkpointed_->fetch_spilled();
  }
  if (in_shared_buffer()) {
    ZERO_CHECK(!slot_writers_.empty(), "a GPT-2 block's backward ran before any forward");
    const uint64_t writer = slot_writers_[forward_ % slot_writers_.size()];
    ZERO_CHECK(writer == forward_,
               "a GPT-2 block's checkpoint of its forward "
                   << forward_ << " was overwritten by its forward " << writer
                   << " before its backward: more micro-batches in flight than the "
                   << checkpointing_.generations << " set(s) of the contiguous checkpoint buffer");
  }
  const auto start = std::chrono::steady_clock::now();
  if (recompute_ == Recompute::kNone) return start;
  // The recomputed tensors of this block: the shared buffers hold another block's by now.
  if (partitioned()) {
    // The whole input from every rank's piece, in rank order: a copy, so the recomputation
    // starts from exactly the input forward had.
    backend_->all_gather_tensor_parallel(checkpoint_data(), data_of(kInput),
                                         gpt2_checkpoint_piece(config_, B_, T_), grad_out.device());
  }
  run_forward(params, nullptr);
  if (!checkpointing_.profile) return start;
  times_.recompute_ms += elapsed_ms(start, grad_out);
  return std::chrono::steady_clock::now();
}

void Gpt2Block::backward(const Tensor& grad_out, Tensor& grad_in,
                         const std::vector<ParamRef>& params, const std::vector<ParamRef>& grads) {
  const int C = config_.n_embd;
  const int Cl = C / config_.tensor_parallel_size;
  const int NHl = config_.n_head / config_.tensor_parallel_size;
  const int N = B_ * T_;
  synchronize_at_boundary(grad_out);
  const auto start = prepare_backward(grad_out, params);
  auto w = [&](int i) { return shared_->params.value(params, i); };
  auto g = [&](int i) { return shared_->params.grad(grads, i); };
  auto p = [&](int a) { return data_of(a); };
  Gpt2Ops& ops = backend_->ops_for(grad_out);
  ops.set_bf16_products(gpt2_detail::bf16_products(params));
  // The products' weight matrices: a bf16 run's working copy as it is where the products take it.
  auto m = [&](int i) { return shared_->params.matrix(params, i, ops); };
  // Their gradients: a bf16 run's bf16 gradient as it is, added to inside the products.
  auto gm = [&](int i) { return shared_->params.matrix_grad(grads, i, ops); };
  const std::shared_ptr<DeviceContext>& dev = grad_out.device();

  // Each gradient is written into the memory of an activation nothing reads any more, so
  // backward allocates nothing: the GELU output's gradient over the GELU output (matmul_backward
  // takes dinp = inp), then the GELU input's over it in place; each LayerNorm output's over that
  // output; the attention output's over x2 (its LayerNorm's backward is done) and qkv's over
  // the GELU input (read last by the GELU's backward). Same kernels, same order: same bits.
  float* const d_hidden = p(kGelu);
  float* const d_ln2 = p(kLn2);
  float* const d_att = p(kX2);
  float* const d_qkv = p(kFc);
  float* const d_ln1 = p(kLn1);
  // The skip connection carries grad_out to x2 unchanged; the MLP's gradient is added to it.
  Tensor d_x2 = grad_out;
  // Row-parallel: the output gradient is whole on every rank, so is the bias's gradient.
  ops.matmul_backward(d_hidden, gm(kFcProjW), g(kFcProjB), grad_out.data(), p(kGelu), m(kFcProjW),
                      N, 4 * Cl, C, WeightLayout::kInOut);
  ops.gelu_backward(d_hidden, p(kFc), d_hidden, static_cast<size_t>(N) * 4 * Cl);
  // Column-parallel: each rank has its columns' share of the input gradient; the sum is whole.
  ops.matmul_backward(d_ln2, gm(kFcW), g(kFcB), d_hidden, p(kLn2), m(kFcW), N, C, 4 * Cl,
                      WeightLayout::kInOut);
  backend_->all_reduce_tensor_parallel(d_ln2, static_cast<size_t>(N) * C, dev);
  ops.layernorm_backward(d_x2.data(), g(kLn2W), g(kLn2B), d_ln2, p(kX2), w(kLn2W), p(kLn2Mean),
                         p(kLn2Rstd), N, C);
  // The same for the attention half: x's gradient is x2's plus the attention path's.
  ops.matmul_backward(d_att, gm(kProjW), g(kProjB), d_x2.data(), p(kAtt), m(kProjW), N, Cl, C,
                      WeightLayout::kInOut);
  ops.attention_backward(d_qkv, d_att, p(kQkv), p(kAtt), p(kLse), B_, T_, Cl, NHl);
  ops.matmul_backward(d_ln1, gm(kQkvW), g(kQkvB), d_qkv, p(kLn1), m(kQkvW), N, C, 3 * Cl,
                      WeightLayout::kInOut);
  backend_->all_reduce_tensor_parallel(d_ln1, static_cast<size_t>(N) * C, dev);
  grad_in = std::move(d_x2);
  ops.layernorm_backward(grad_in.data(), g(kLn1W), g(kLn1B), d_ln1, p(kInput), w(kLn1W),
                         p(kLn1Mean), p(kLn1Rstd), N, C);
  shared_->params.flush(grads);
  if (moves_checkpoint()) {
    kept_[kInput] = Tensor();  // freed in stream order, after the work that read it
    fetched_ = false;
  }
  if (spills()) fetched_ = false;
  if (checkpointing_.profile) times_.backward_ms += elapsed_ms(start, grad_out);
  synchronize_at_boundary(grad_out);
}

// backward's operations in its order, each input gradient into a tensor of its own (backward
// writes them over activations the weight half still reads), the weight gradients left out. A
// recomputing block recomputes here, once, the tensors backward_weight reads into memory of its
// own (they travel with the micro-batch until backward_weight frees them); qkv and the
// log-sum-exp, which only this half reads, stay in the shared buffers. A spilled checkpoint is
// read back as for backward and copied out of the spill's buffer, which holds other blocks' by
// the weight half.
void Gpt2Block::backward_input(const Tensor& grad_out, Tensor& grad_in,
                               const std::vector<ParamRef>& params) {
  ZERO_CHECK(!moves_checkpoint(),
             "a GPT-2 block splits its backward (ZB-H1) only with its checkpoint on the device "
             "(kept, spilled, partitioned or in the contiguous buffer), not with "
             "cpu_checkpointing");
  const int C = config_.n_embd;
  const int Cl = C / config_.tensor_parallel_size;
  const int NHl = config_.n_head / config_.tensor_parallel_size;
  const int N = B_ * T_;
  const size_t rows = static_cast<size_t>(N);
  const std::shared_ptr<DeviceContext>& dev = grad_out.device();
  synchronize_at_boundary(grad_out);
  for (int a = kInput + 1; a < kBlockActivations; ++a) {
    if (keeps(recompute_, a) || !weight_half_reads(a)) continue;
    backend_->activation(kept_[a], shape_of(a, B_, T_, C, Cl, NHl), dev);
  }
  const auto start = prepare_backward(grad_out, params);
  if (spills() || partitioned() || in_shared_buffer()) {
    // Read back, rebuilt or in a slot into which others write next: the weight half gets a copy.
    Tensor& copy = weight_inputs_[kInputCopy];
    const float* input = data_of(kInput);
    backend_->activation(copy, {B_, T_, C}, dev);
    gpt2_detail::Gpt2Backend::copy_floats(copy.data(), input, copy.numel(), dev);
    fetched_ = false;
  }
  auto w = [&](int i) { return shared_->params.value(params, i); };
  auto p = [&](int a) { return data_of(a); };
  Gpt2Ops& ops = backend_->ops_for(grad_out);
  ops.set_bf16_products(gpt2_detail::bf16_products(params));
  // The products' weight matrices: a bf16 run's working copy as it is where the products take it.
  auto m = [&](int i) { return shared_->params.matrix(params, i, ops); };
  auto kept = [&](WeightInput i, int64_t cols) -> float* {
    backend_->activation(weight_inputs_[i], {N, cols}, dev);
    return weight_inputs_[i].data();
  };
  backend_->keep_copy(weight_inputs_[kFcProjOut], grad_out);
  float* const d_hidden = kept(kFcOut, 4 * Cl);
  ops.matmul_backward(d_hidden, nullptr, nullptr, grad_out.data(), nullptr, m(kFcProjW), N, 4 * Cl,
                      C, WeightLayout::kInOut);
  ops.gelu_backward(d_hidden, p(kFc), d_hidden, rows * 4 * Cl);
  float* const d_ln2 = kept(kLn2Out, C);
  ops.matmul_backward(d_ln2, nullptr, nullptr, d_hidden, nullptr, m(kFcW), N, C, 4 * Cl,
                      WeightLayout::kInOut);
  backend_->all_reduce_tensor_parallel(d_ln2, rows * C, dev);
  // The skip connection carries grad_out to x2; ln_2's input gradient is added to it.
  backend_->keep_copy(weight_inputs_[kProjOut], grad_out);
  float* const d_x2 = weight_inputs_[kProjOut].data();
  ops.layernorm_backward(d_x2, nullptr, nullptr, d_ln2, p(kX2), w(kLn2W), p(kLn2Mean), p(kLn2Rstd),
                         N, C);
  Tensor d_att;
  backend_->activation(d_att, {N, Cl}, dev);
  ops.matmul_backward(d_att.data(), nullptr, nullptr, d_x2, nullptr, m(kProjW), N, Cl, C,
                      WeightLayout::kInOut);
  // qkv's output gradient over the GELU's input, which nothing reads any more.
  float* const d_qkv = p(kFc);
  ops.attention_backward(d_qkv, d_att.data(), p(kQkv), p(kAtt), p(kLse), B_, T_, Cl, NHl);
  float* const d_ln1 = kept(kLn1Out, C);
  ops.matmul_backward(d_ln1, nullptr, nullptr, d_qkv, nullptr, m(kQkvW), N, C, 3 * Cl,
                      WeightLayout::kInOut);
  backend_->all_reduce_tensor_parallel(d_ln1, rows * C, dev);
  // A tensor of the caller's kind (grad_out's copy), not one counted among this block's.
  grad_in = grad_out;
  gpt2_detail::Gpt2Backend::copy_into(grad_in.data(), weight_inputs_[kProjOut]);
  ops.layernorm_backward(grad_in.data(), nullptr, nullptr, d_ln1, p(kInput), w(kLn1W), p(kLn1Mean),
                         p(kLn1Rstd), N, C);
  if (checkpointing_.profile) times_.backward_ms += elapsed_ms(start, grad_out);
  synchronize_at_boundary(grad_out);
}

// The weight gradients of backward, from the activations and the output gradients
// backward_input kept; no parameter values.
void Gpt2Block::backward_weight(const std::vector<ParamRef>& grads) {
  const int C = config_.n_embd;
  const int Cl = C / config_.tensor_parallel_size;
  const int N = B_ * T_;
  auto g = [&](int i) { return shared_->params.grad(grads, i); };
  auto p = [&](int a) { return data_of(a); };
  auto d = [&](WeightInput i) { return weight_inputs_[i].data(); };
  const Tensor& on = weight_inputs_[kFcProjOut];
  const auto start = std::chrono::steady_clock::now();
  Gpt2Ops& ops = backend_->ops_for(on);
  ops.set_bf16_products(gpt2_detail::bf16_products(grads));
  auto gm = [&](int i) { return shared_->params.matrix_grad(grads, i, ops); };
  ops.matmul_backward(nullptr, gm(kFcProjW), g(kFcProjB), d(kFcProjOut), p(kGelu), nullptr, N,
                      4 * Cl, C, WeightLayout::kInOut);
  ops.matmul_backward(nullptr, gm(kFcW), g(kFcB), d(kFcOut), p(kLn2), nullptr, N, C, 4 * Cl,
                      WeightLayout::kInOut);
  ops.layernorm_backward(nullptr, g(kLn2W), g(kLn2B), d(kLn2Out), p(kX2), nullptr, p(kLn2Mean),
                         p(kLn2Rstd), N, C);
  ops.matmul_backward(nullptr, gm(kProjW), g(kProjB), d(kProjOut), p(kAtt), nullptr, N, Cl, C,
                      WeightLayout::kInOut);
  ops.matmul_backward(nullptr, gm(kQkvW), g(kQkvB), p(kFc), p(kLn1), nullptr, N, C, 3 * Cl,
                      WeightLayout::kInOut);
  ops.layernorm_backward(nullptr, g(kLn1W), g(kLn1B), d(kLn1Out), p(kInput), nullptr, p(kLn1Mean),
                         p(kLn1Rstd), N, C);
  shared_->params.flush(grads);
  // The weight half is backward's too (take_gpt2_profile's backward_ms).
  if (checkpointing_.profile) times_.backward_ms += elapsed_ms(start, on);
  for (Tensor& tensor : weight_inputs_) tensor = Tensor();
  // The recomputed tensors go back to the shared buffers for the next forward.
  for (int a = kInput; a < kBlockActivations; ++a) {
    if (!keeps(recompute_, a)) kept_[a] = Tensor();
  }
}

}  // namespace zero::models
