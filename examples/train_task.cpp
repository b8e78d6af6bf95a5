#include "examples/train_task.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "examples/run_checks.h"
#include "models/gpt2.h"
#include "models/mlp.h"
#include "models/token_data.h"
#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"
#include "zero/runtime/nvme_file.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero::examples {

namespace {

uint64_t numel(const ParamSpec& spec) {
  uint64_t n = 1;
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The MLP learning a fixed random teacher network (models/mlp.h).
class MlpTask : public TrainTask {
 public:
  explicit MlpTask(const models::MlpConfig& config) : config_(config) {}

  std::string description() const override { return "mlp"; }
  driver::JsonRecord model_record() const override {
    return {{"model", "mlp"},
            {"input_dim", config_.input_dim},
            {"hidden_dim", config_.hidden_dim},
            {"output_dim", config_.output_dim},
            {"layers", config_.layers}};
  }
  std::vector<NamedModule> take_modules(
      const models::Gpt2TensorParallel& tensor_parallel) override {
    ZERO_CHECK(tensor_parallel.comm == nullptr,
               "the MLP does not split over tensor-parallel ranks");
    return models::make_mlp(config_);
  }
  std::string set_pipeline_stage(int, int, const std::string&, int) override {
    throw ConfigError("--pp: only --model gpt2 is cut into pipeline stages");
  }
  std::vector<int> chunk_first_modules() const override { return {}; }
  std::vector<int64_t> stage_boundary_shape(int64_t) const override {
    throw ConfigError("--pp: only --model gpt2 is cut into pipeline stages");
  }
  void start(Engine&, uint64_t data_seed) override { data_.emplace(config_, data_seed); }

  Tensor input(long step, int64_t first, int64_t count) override {
    models::Batch batch = data_->batch(step, first, count);
    targets_ = std::move(batch.targets);
    return std::move(batch.inputs);
  }
  float loss(const Tensor& output, Tensor& grad) override {
    return models::mse_loss(output, targets_.to(output.device()), grad);
  }
  int64_t tokens_per_sample() const override { return 1; }
  std::vector<std::string> notes() const override { return {}; }
  bool validates(long) const override { return false; }
  float validation_loss(ZeroModel&, Communicator&) override { return 0.0f; }
  long validation_batches() const override { return 0; }
  Tensor validation_input(long, int64_t, int64_t) override {
    throw Error("the MLP has no validation data");
  }

  // The batch (inputs and targets), each layer's output kept for backward, and the gradients
  // that flow back (about as large again), in fp32.
  uint64_t activation_bytes(int64_t samples) const override {
    const uint64_t per_sample =
        static_cast<uint64_t>(config_.input_dim) +
        2ull * static_cast<uint64_t>(config_.output_dim) +
        2ull * static_cast<uint64_t>(config_.hidden_dim) * static_cast<uint64_t>(config_.layers);
    return static_cast<uint64_t>(samples) * per_sample * 2 * sizeof(float);
  }
  uint64_t counted_activation_bytes(int64_t) const override { return 0; }
  std::string activation_remedy(int64_t, uint64_t) const override { return ""; }
  uint64_t least_activation_bytes(int64_t samples) const override {
    return activation_bytes(samples);
  }
  std::vector<ParamSpec> param_specs() const override { return models::mlp_param_specs(config_); }
  std::vector<NvmeFileNeed> nvme_files(int64_t) const override { return {}; }
  // Each Linear computes its weight and bias gradients into fp32 tensors of its own, then adds
  // them into the engine's; with 16-bit storage it also converts its parameters to fp32.
  uint64_t module_bytes(DType dtype, bool) const override {
    uint64_t params = 0;
    for (const ParamSpec& spec : models::mlp_param_specs(config_)) params += numel(spec);
    return params * sizeof(float) * (dtype == DType::kFloat32 ? 1 : 2);
  }
  std::string activation_summary(int64_t) const override { return ""; }
  driver::JsonRecord activation_record() override { return driver::JsonRecord::object(); }
  driver::JsonRecord profile_record() override { return driver::JsonRecord::object(); }

 private:
  models::MlpConfig config_;
  std::optional<models::TeacherTask> data_;
  Tensor targets_;
};

// The GPT-2 on token files: samples are sequences of seq_len tokens (models/token_data.h).
class Gpt2Task : public TrainTask {
 public:
  Gpt2Task(const Flags& f, long global_batch, int micro_batches, int kernel_threads,
           const models::Gpt2Checkpointing& checkpointing, int tensor_parallel_size,
           long micro_batch_per_rank)
      : config_(with_tensor_parallel(f.gpt2, tensor_parallel_size)),
        checkpointing_(checkpointing),
        seq_len_(f.seq_len),
        global_batch_(global_batch),
        micro_batches_(micro_batches),
        pipeline_schedule_(f.pp_schedule),
        init_from_(f.init_from),
        val_every_(f.val_every),
        kernel_threads_(kernel_threads),
        train_(f.data) {
    // The modules are made on the rank's tensor-parallel group (take_modules); the sizes and
    // the checkpointing are checked now, before any rank starts.
    models::check_gpt2_config(config_);
    models::check_gpt2_checkpointing(checkpointing_, config_.n_layer);
    if (!checkpointing_.nvme_path.empty()) check_spill_directory(micro_batch_per_rank);
    check_vocabulary(train_, "--data");
    if (!f.val_data.empty()) {
      val_.emplace(f.val_data);
      check_vocabulary(*val_, "--val-data");
    }
    // A batch must fit in the data; the error says how many tokens it needs.
    train_.batches_per_pass(static_cast<int>(global_batch_), seq_len_);
    if (val_) choose_val_batches(f);
  }

  std::string description() const override {
    const std::string split =
        config_.tensor_parallel_size == 1
            ? ""
            : ", tensor-parallel over " + std::to_string(config_.tensor_parallel_size) + " ranks";
    return "gpt2 (" + std::to_string(config_.n_layer) + " layers, " +
           std::to_string(config_.n_head) + " heads, " + std::to_string(config_.n_embd) +
           " wide, vocab " + std::to_string(config_.vocab_size) + ", seq " +
           std::to_string(seq_len_) + split + ")";
  }
  driver::JsonRecord model_record() const override {
    return {{"model", "gpt2"},
            {"n_layer", config_.n_layer},
            {"n_head", config_.n_head},
            {"n_embd", config_.n_embd},
            {"vocab_size", config_.vocab_size},
            {"block_size", config_.block_size},
            {"tensor_parallel_size", config_.tensor_parallel_size},
            {"seq_len", seq_len_},
            {"train_tokens", train_.size()},
            {"flops_per_token", models::gpt2_flops_per_token(config_, seq_len_)},
            {"activation_checkpointing", models::recompute_name(checkpointing_.recompute)},
            {"number_checkpoints", checkpointed_blocks()}};
  }
  std::vector<NamedModule> take_modules(
      const models::Gpt2TensorParallel& tensor_parallel) override {
    model_ = models::make_gpt2(config_, kernel_threads_, checkpointing_, tensor_parallel, stage_);
    tensor_parallel_rank_ = tensor_parallel.rank;
    return std::move(model_.modules);
  }
  std::vector<int> chunk_first_modules() const override { return model_.chunk_first_modules; }
  std::vector<int64_t> stage_boundary_shape(int64_t samples) const override {
    return {samples, seq_len_, config_.n_embd};
  }
  std::string set_pipeline_stage(int stage, int stages, const std::string& partition,
                                 int virtual_stages) override {
    std::vector<int> bounds;
    try {
      bounds = models::gpt2_pipeline_partition(config_, stages * virtual_stages, partition,
                                               static_cast<int>(seq_len_));
    } catch (const Error& e) {
      if (virtual_stages == 1) throw ConfigError(e.what());
      throw ConfigError("--pp " + std::to_string(stages) + " x --pp-virtual-stages " +
                        std::to_string(virtual_stages) + " = " +
                        std::to_string(stages * virtual_stages) + " virtual stages: " + e.what());
    }
    stage_ = models::gpt2_pipeline_stage(config_, bounds, stage, virtual_stages);
    try {
      const PipelineScheduleKind kind = parse_pipeline_schedule(pipeline_schedule_);
      in_flight_ =
          pipeline_micro_batches_in_flight(kind, stages, stage, micro_batches_, virtual_stages);
      split_loads_.clear();
      if (kind == PipelineScheduleKind::kZeroBubbleH1) {
        split_loads_ = pipeline_stage_loads(kind, stages, stage, micro_batches_);
      }
      chunk_actions_.clear();
      if (virtual_stages > 1) {
        chunk_actions_ =
            make_pipeline_schedule(kind, stages, micro_batches_, virtual_stages)[stage];
      }
      // The spill's file and the contiguous checkpoint buffer give each micro-batch in flight
      // on a chunk places of its own.
      checkpointing_.checkpoint_generations =
          models::gpt2_checkpoint_generations(in_flight_, chunk_actions_);
    } catch (const Error& e) {
      throw ConfigError(std::string("--pp-schedule: ") + e.what());
    }
    // What the other stages hold, which this one's weights file skips.
    held_elsewhere_.clear();
    std::vector<std::string> mine;
    for (const ParamSpec& spec : models::gpt2_param_specs(config_, stage_)) {
      mine.push_back(spec.name);
    }
    for (const ParamSpec& spec : models::gpt2_param_specs(config_)) {
      if (std::find(mine.begin(), mine.end(), spec.name) == mine.end()) {
        held_elsewhere_.push_back(spec.name);
      }
    }
    // One line per virtual stage, each with its parameters.
    std::vector<uint64_t> params(static_cast<size_t>(stage_.chunk_count()), 0);
    for (const ParamSpec& spec : models::gpt2_param_specs(config_, stage_)) {
      params[static_cast<size_t>(spec.chunk)] += numel(spec);
    }
    std::ostringstream lines;
    for (int c = 0; c < stage_.chunk_count(); ++c) {
      const std::pair<int, int> layers = stage_.chunk_layers(c, config_.n_layer);
      lines << (c == 0 ? "" : "\n") << "pipeline stage " << stage;
      if (virtual_stages > 1) {
        lines << " chunk " << c << " (virtual stage " << c * stages + stage << ")";
      }
      lines << ": layers " << layers.first << "-" << layers.second - 1
            << (stage_.embeds(c) ? " + embeddings" : "")
            << (stage_.heads(c) ? " + ln_f, head (wte)" : "") << ", " << params[c] << " parameters";
    }
    return lines.str();
  }
  void start(Engine& engine, uint64_t) override {
    models::count_gpt2_activations(model_, engine.allocator());
    if (init_from_.empty()) return;
    // A bad file (missing, misshaped, not finite) is found before any rank writes its state:
    // agreed across the ranks, it stops every one as a setup error (exit 2), naming the problem.
    std::string problem;
    try {
      models::load_gpt2_weights(engine, init_from_, config_.tensor_parallel_size,
                                tensor_parallel_rank_, held_elsewhere_);
    } catch (const Error& e) {
      problem = e.what();
    }
    const std::vector<int> failed = failed_ranks(!problem.empty());
    if (failed.empty()) return;
    // zero-train prints rank 0's message; the first other rank that failed prints its own
    // when rank 0's does not say it.
    const int first = failed.front();
    int rank = 0;
    ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (first != 0 && rank == first) {
      std::fprintf(stderr, "zero-train: rank %d: %s\n", rank, problem.c_str());
    }
    throw ConfigError(!problem.empty() ? problem
                                       : "--init-from " + init_from_ + ": rank " +
                                             std::to_string(first) + " could not load it");
  }

  Tensor input(long step, int64_t first, int64_t count) override {
    return read(train_, step - 1, first, count);
  }
  float loss(const Tensor& output, Tensor& grad) override {
    // The model's output is its loss; the gradient of the loss with respect to itself is 1.
    grad = Tensor({1}, {1.0f}, output.device());
    return output.to_host()[0];
  }
  int64_t tokens_per_sample() const override { return seq_len_; }
  std::vector<std::string> notes() const override { return notes_; }

  bool validates(long step) const override {
    return val_ && val_every_ > 0 && step % val_every_ == 0;
  }
  // Each batch's loss is the mean over its sequences: every rank takes its slices of each batch
  // as training does (batch_slice, a forward per micro-batch, so the activations stay those the
  // budget planned and every rank runs as many forwards), and the slices' sums add up to the
  // batch's, whatever the world size.
  float validation_loss(ZeroModel& model, Communicator& host) override {
    double sum = 0.0;
    for (long b = 0; b < val_batches_; ++b) {
      for (int k = 0; k < micro_batches_; ++k) {
        const models::BatchSlice slice =
            models::batch_slice(global_batch_, micro_batches_, host.world_size(), k, host.rank());
        const Tensor tokens = validation_input(b, slice.first, slice.count);
        const Tensor out = model.forward(tokens.to(model.engine().device_context()));
        sum += static_cast<double>(out.to_host()[0]) * static_cast<double>(slice.count);
      }
    }
    // The blocks' times and boundary waits of these forwards are not the next step's.
    models::take_gpt2_profile(model_);
    float mine = static_cast<float>(sum), total = 0.0f;
    host.all_reduce_sync(&mine, &total, 1, DType::kFloat32);
    return total / static_cast<float>(global_batch_ * val_batches_);
  }
  long validation_batches() const override { return val_ ? val_batches_ : 0; }
  Tensor validation_input(long batch, int64_t first, int64_t count) override {
    ZERO_CHECK(val_, "validation_input without --val-data");
    return read(*val_, batch, first, count);
  }

  // The activations the model holds (gpt2_memory.h's formula), and the tensors in flight
  // between modules and the batch.
  uint64_t activation_bytes(int64_t samples) const override {
    return activation_bytes(checkpointing_, samples);
  }
  std::string activation_remedy(int64_t samples, uint64_t room) const override {
    using models::Recompute;
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      if (r <= checkpointing_.recompute) continue;
      models::Gpt2Checkpointing heavier{r, checkpointing_.number_checkpoints};
      heavier.partition_activations = checkpointing_.partition_activations;
      const uint64_t bytes = activation_bytes(heavier, samples);
      if (bytes <= room) {
        return std::string("--activation-checkpointing ") + models::recompute_name(r) +
               " would fit (" + human_bytes(bytes) + " of activations)";
      }
    }
    return "";
  }
  uint64_t least_activation_bytes(int64_t samples) const override {
    models::Gpt2Checkpointing full = checkpointing_;
    full.recompute = models::Recompute::kFull;
    return std::min(activation_bytes(checkpointing_, samples), activation_bytes(full, samples));
  }
  std::vector<ParamSpec> param_specs() const override {
    return models::gpt2_param_specs(config_, stage_);
  }
  std::vector<NvmeFileNeed> nvme_files(int64_t samples) const override {
    if (checkpointing_.nvme_path.empty()) return {};
    // The stage's file (the whole model's without a pipeline).
    return {{checkpointing_.nvme_path,
             stage_formula(checkpointing_, samples).micro_batch.nvme_checkpoints,
             "rank " + std::to_string(checkpointing_.spill_rank) + "'s activation checkpoints"}};
  }
  // What the modules hold (the formula; a pipeline stage's with its micro-batches in flight) is
  // counted in the engine's allocator; the tensors in flight and the batch are not.
  uint64_t counted_activation_bytes(int64_t samples) const override {
    return counted_bytes(checkpointing_, samples);
  }
  std::string activation_summary(int64_t samples) const override {
    const models::Gpt2StageActivationBytes stage = stage_formula(checkpointing_, samples);
    const models::Gpt2ActivationBytes& bytes = stage.micro_batch;
    std::ostringstream blocks;
    blocks << "blocks " << human_bytes(bytes.kept());
    if (!bytes.blocks.empty()) {
      blocks << " (per block " << human_bytes(bytes.blocks.front()) << " .. "
             << human_bytes(bytes.blocks.back()) << ")";
    }
    const std::string ends = "embedding and head " + human_bytes(bytes.embedding + bytes.head);
    // The stage's buffers shared by its micro-batches: the recomputed tensors, the spill's.
    std::string recompute = "recompute " + human_bytes(bytes.recompute);
    if (bytes.spill_buffer > 0) recompute += " + spill buffer " + human_bytes(bytes.spill_buffer);
    std::ostringstream out;
    out << "activations of " << samples << " x " << seq_len_ << " tokens ("
        << models::recompute_name(checkpointing_.recompute) << " recomputation, "
        << checkpointed_blocks() << " of " << config_.n_layer << " blocks checkpointed)";
    if (!stage.chunk_sets.empty()) {
      // Each (micro-batch, chunk) in flight keeps its chunk's tensors; the recompute buffers
      // are shared.
      out << " on pipeline stage " << stage_.stage << " (layers "
          << stage_.describe_layers(config_.n_layer) << "), " << stage.in_flight
          << " (micro-batch, chunk) sets at the peak: " << human_bytes(stage.peak()) << " = ";
      for (size_t c = 0; c < stage.chunk_sets.size(); ++c) {
        out << (c == 0 ? "" : " + ") << stage.chunk_sets[c] << " x "
            << human_bytes(stage.chunk_bytes[c]) << " (chunk " << c << ")";
      }
      out << " + " << recompute << "\n";
    } else if (stage_.stages > 1) {
      // Each micro-batch in flight keeps its own; the recompute buffers are shared.
      out << " on pipeline stage " << stage_.stage << " (layers "
          << stage_.describe_layers(config_.n_layer) << "), " << stage.in_flight << " micro-batch"
          << (stage.in_flight == 1 ? "" : "es") << " in flight: " << human_bytes(stage.peak())
          << " = " << stage.in_flight << " x " << human_bytes(stage.per_micro_batch()) << " ("
          << blocks.str() << " + " << ends << ") + " << recompute;
      if (!split_loads_.empty()) {
        // ZB-H1's peak: those awaiting their weight gradients keep the output gradients (and
        // a checkpointed block's recomputed tensors the weight half reads) too.
        out << " + " << stage.awaiting_weight << " awaiting weight gradients x ("
            << human_bytes(stage.per_micro_batch()) << " + " << human_bytes(stage.weight_inputs)
            << ")"
            << (stage.in_backward_input && stage.split_scratch > 0
                    ? " + scratch " + human_bytes(stage.split_scratch)
                    : "");
      }
      out << "\n";
    } else {
      out << ": " << human_bytes(bytes.total()) << " = " << blocks.str() << " + " << recompute
          << " + " << ends << "\n";
    }
    return out.str();
  }
  driver::JsonRecord profile_record() override {
    if (!checkpointing_.profile) return driver::JsonRecord::object();
    const models::Gpt2Profile profile = models::take_gpt2_profile(model_);
    driver::JsonRecord record{{"block_forward_ms", profile.forward_ms},
                              {"block_backward_ms", profile.backward_ms}};
    // Only blocks that recompute have a recomputation time; null for the others.
    bool any = false;
    driver::JsonRecord recompute = driver::JsonRecord::array();
    for (size_t b = 0; b < profile.recomputes.size(); ++b) {
      any = any || profile.recomputes[b];
      recompute.push_back(profile.recomputes[b] ? driver::JsonRecord(profile.recompute_ms[b])
                                                : driver::JsonRecord());
    }
    if (any) record["block_recompute_ms"] = recompute;
    if (checkpointing_.synchronize_boundary) {
      record["block_synchronizations"] = profile.synchronizations;
    }
    return record;
  }
  driver::JsonRecord activation_record() override {
    const models::Gpt2ActivationBytes bytes = models::gpt2_held_activations(model_);
    driver::JsonRecord record{{"activation_bytes", bytes.total()},
                              {"activation_kept_bytes", bytes.kept()},
                              {"activation_checkpoint_bytes", bytes.checkpoints},
                              {"activation_block_bytes", bytes.blocks},
                              {"activation_recompute_bytes", bytes.recompute}};
    if (!checkpointing_.nvme_path.empty()) {
      // Fields of their own: nvme_read_bytes and nvme_write_bytes are the engine's offloads'.
      const models::Gpt2SpillTraffic traffic = models::take_gpt2_spill_traffic(model_);
      record["checkpoint_nvme_read_bytes"] = traffic.read_bytes;
      record["checkpoint_nvme_write_bytes"] = traffic.write_bytes;
      record["checkpoint_nvme_file_bytes"] = bytes.nvme_checkpoints;
    }
    return record;
  }
  // fp32 kernels add gradients straight into fp32 storage; with 16-bit storage each module keeps
  // fp32 copies of its parameters and of their gradients (gpt2.cpp's ParamSlots).
  uint64_t module_bytes(DType dtype, bool on_gpu) const override {
    return models::gpt2_module_copy_bytes(config_, dtype, on_gpu);
  }

 private:
  // At start, as the offloads check theirs: the spill directory takes an O_DIRECT file and has
  // room for every checkpoint of a micro-batch (gpt2_memory.h's file bytes).
  void check_spill_directory(long samples) const {
    const models::Gpt2ActivationBytes bytes = formula(samples);
    const int blocks = checkpointed_blocks();
    check_nvme_directory(checkpointing_.nvme_path, bytes.nvme_checkpoints,
                         "rank " + std::to_string(checkpointing_.spill_rank) +
                             "'s activation checkpoints (" + std::to_string(blocks) + " blocks x " +
                             std::to_string(bytes.nvme_checkpoints / blocks) + " bytes)");
  }

  // Validation reads each batch of the set at most once: --val-batches may not ask for more than
  // it holds, and the default takes what there is when the set is smaller.
  void choose_val_batches(const Flags& f) {
    const long held = val_->batches_per_pass(static_cast<int>(global_batch_), seq_len_);
    const std::string batches = std::to_string(held) + (held == 1 ? " batch" : " batches") +
                                " of " + std::to_string(global_batch_) + " x " +
                                std::to_string(seq_len_) + " tokens";
    ZERO_CHECK(!f.val_batches || *f.val_batches <= held,
               "--val-batches " << *f.val_batches << " is more than the " << batches
                                << " that --val-data " << f.val_data
                                << " holds: validation would repeat them");
    val_batches_ = f.val_batches.value_or(std::min(kDefaultValBatches, held));
    if (!f.val_batches && held < kDefaultValBatches) {
      notes_.push_back("validation: --val-data " + f.val_data + " holds " + batches +
                       ", fewer than the default --val-batches " +
                       std::to_string(kDefaultValBatches) + ": each validation takes " +
                       (held == 1 ? "that 1" : "those " + std::to_string(held)));
    }
  }

  // Every token must index the embedding: checked once, before training, naming the first bad one.
  void check_vocabulary(const models::TokenData& data, const char* flag) const {
    const std::optional<models::TokenLocation> bad = data.first_token_at_least(config_.vocab_size);
    ZERO_CHECK(!bad, flag << ": token " << bad->token << " at index " << bad->index << " of "
                          << bad->file << " is not below the vocabulary size " << config_.vocab_size
                          << " (--vocab-size)");
  }

  Tensor read(const models::TokenData& data, long batch, int64_t first, int64_t count) {
    Tensor tokens({count, seq_len_});
    model_.targets->ids.resize(static_cast<size_t>(count * seq_len_));
    data.read_sequences(batch, static_cast<int>(global_batch_), seq_len_, static_cast<int>(first),
                        static_cast<int>(count), tokens.data(), model_.targets->ids.data());
    return tokens;
  }

  // Counted and not: in a pipeline the stage's, with its micro-batches in flight.
  uint64_t activation_bytes(const models::Gpt2Checkpointing& checkpointing, int64_t samples) const {
    const uint64_t uncounted =
        stage_.stages > 1 ? models::gpt2_stage_uncounted_activation_bytes(
                                config_, stage_, in_flight_, samples, seq_len_)
                          : models::gpt2_uncounted_activation_bytes(config_, samples, seq_len_);
    return counted_bytes(checkpointing, samples) + uncounted;
  }
  uint64_t counted_bytes(const models::Gpt2Checkpointing& checkpointing, int64_t samples) const {
    return stage_formula(checkpointing, samples).peak();
  }
  models::Gpt2StageActivationBytes stage_formula(const models::Gpt2Checkpointing& checkpointing,
                                                 int64_t samples) const {
    if (!split_loads_.empty()) {
      return models::gpt2_split_stage_activation_formula(config_, checkpointing, stage_,
                                                         split_loads_, samples, seq_len_);
    }
    if (!chunk_actions_.empty()) {
      return models::gpt2_chunked_stage_activation_formula(config_, checkpointing, stage_,
                                                           chunk_actions_, samples, seq_len_);
    }
    return models::gpt2_stage_activation_formula(config_, checkpointing, stage_, in_flight_,
                                                 samples, seq_len_);
  }
  models::Gpt2ActivationBytes formula(int64_t samples) const {
    return models::gpt2_activation_formula(config_, checkpointing_, samples, seq_len_);
  }
  int checkpointed_blocks() const {
    int n = 0;
    for (int i = 0; i < config_.n_layer; ++i) {
      n += models::gpt2_block_checkpointed(checkpointing_, i, config_.n_layer) ? 1 : 0;
    }
    return n;
  }

  static models::Gpt2Config with_tensor_parallel(models::Gpt2Config config, int size) {
    config.tensor_parallel_size = size;
    return config;
  }

  models::Gpt2Config config_;
  models::Gpt2Checkpointing checkpointing_;
  int seq_len_;
  long global_batch_;
  int micro_batches_;
  std::string pipeline_schedule_;  // --pp-schedule, for the micro-batches a stage holds
  int in_flight_ = 1;              // micro-batches this pipeline stage holds at once
  // ZB-H1: the stage's loads, over which its activations' peak is planned (else empty).
  std::vector<PipelineStageLoad> split_loads_;
  // Interleaved: the stage's actions of a step, over which its chunks' peak is planned.
  std::vector<PipelineAction> chunk_actions_;
  std::string init_from_;
  long val_every_;
  long val_batches_ = 0;
  std::vector<std::string> notes_;
  int kernel_threads_;
  int tensor_parallel_rank_ = 0;
  models::Gpt2PipelineStage stage_;          // the whole model without a pipeline
  std::vector<std::string> held_elsewhere_;  // the parameters of the other pipeline stages
  models::TokenData train_;
  std::optional<models::TokenData> val_;
  models::Gpt2 model_;
};

uint64_t saturating_sum(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

}  // namespace

std::string out_of_memory_advice(const TrainTask& task, const EngineConfig& engine,
                                 int data_parallel_size, int64_t samples, uint64_t budget) {
  const uint64_t activations = task.activation_bytes(samples);
  const uint64_t module_copies = task.module_bytes(engine.precision.dtype, engine.device.is_cuda());
  const uint64_t least_activations = task.least_activation_bytes(samples);
  // The engine's own plan comes on top: advice that leaves no room for it is no plan at all.
  const int ranks = sharding_group_size(engine, data_parallel_size);
  std::optional<Layout> layout;
  uint64_t engine_bytes = UINT64_MAX;
  std::string uncountable;
  try {
    layout.emplace(Layout::build(task.param_specs(), layout_options(engine, data_parallel_size)));
    const MemoryPlan plan = plan_memory(*layout, engine);
    engine_bytes = saturating_sum(plan.model_state, plan.buffers);
  } catch (const Error& e) {
    uncountable = e.what();
  }
  const uint64_t beside_engine = saturating_sum(engine_bytes, module_copies);
  const std::string plan_here = "the engine's plan for this model (stage " +
                                std::to_string(engine.stage) + " on " + std::to_string(ranks) +
                                " rank(s))";
  if (!uncountable.empty()) return plan_here + " cannot be counted: " + uncountable;
  const std::string lower =
      std::string("lower ") + (activations >= module_copies ? "--global-batch" : "the model size");
  if (saturating_sum(beside_engine, least_activations) < budget) {
    // Mostly activations: a checkpointing setting that would fit is the first remedy.
    const std::string remedy =
        activations >= module_copies ? task.activation_remedy(samples, budget - beside_engine) : "";
    return !remedy.empty() ? remedy + ", or lower --global-batch" : lower;
  }
  if (beside_engine < budget) {
    return plan_here + " needs " + human_bytes(engine_bytes) + " per rank, which leaves " +
           human_bytes(budget - beside_engine) +
           " for activations, and the lightest of this micro-batch need " +
           human_bytes(least_activations) + ": lower --global-batch";
  }
  if (saturating_sum(module_copies, least_activations) >= budget) {
    return lower + " (beside them " + plan_here + " needs " + human_bytes(engine_bytes) +
           " per rank)";
  }
  // Nothing fits on these ranks: the plans that would, with the lightest activations beside.
  const uint64_t room = budget - module_copies - least_activations;
  return std::string(least_activations < activations ? "no activation checkpointing fits: " : "") +
         plan_here + " alone needs " + human_bytes(engine_bytes) + " per rank, more than the " +
         human_bytes(room) +
         " a rank has beside the modules' copies and the lightest activations; " +
         what_would_fit(*layout, engine, ranks, room);
}

std::string nvme_setup_problem(const TrainTask& task, const TrainingConfig& config, bool cuda,
                               int data_parallel_size) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<NvmeFileNeed> files = task.nvme_files(config.micro_batch_per_rank);
  const bool optimizer = config.engine.offload.optimizer.device == OffloadDevice::kNvme;
  const bool params = config.engine.offload.param.device == OffloadDevice::kNvme;
  std::string problem;
  if (optimizer || params) {
    // The engine's files as its plan has them (on a GPU the optimizer's records hold the
    // master in fp32 too).
    EngineConfig engine = config.engine;
    if (cuda) engine.device = Device::cuda(0);
    try {
      const MemoryPlan plan = plan_memory(
          Layout::build(task.param_specs(), layout_options(engine, data_parallel_size)), engine);
      const std::string whose = "rank " + std::to_string(rank) + "'s ";
      if (optimizer) {
        files.push_back({engine.offload.optimizer.nvme_path, plan.nvme - plan.nvme_params,
                         whose + "offloaded optimizer state (offload_optimizer.nvme_path)"});
      }
      if (params) {
        files.push_back({engine.offload.param.nvme_path, plan.nvme_params,
                         whose + "offloaded parameters (offload_param.nvme_path)"});
      }
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  // Collective whatever this rank found, so no rank is left waiting.
  const std::string found =
      nvme_space_problem(problem.empty() ? files : std::vector<NvmeFileNeed>{});
  return !problem.empty() ? problem : found;
}

std::unique_ptr<TrainTask> make_train_task(const Flags& flags, const TrainingConfig& config) {
  if (flags.model == "mlp") return std::make_unique<MlpTask>(flags.mlp);
  models::Gpt2Checkpointing checkpointing;
  models::parse_recompute(config.activation_checkpointing.mode, &checkpointing.recompute);
  checkpointing.number_checkpoints =
      static_cast<int>(config.activation_checkpointing.number_checkpoints);
  checkpointing.contiguous_memory = config.activation_checkpointing.contiguous_memory_optimization;
  checkpointing.profile = config.activation_checkpointing.profile;
  checkpointing.synchronize_boundary =
      config.activation_checkpointing.synchronize_checkpoint_boundary;
  // On the CPU path checkpoints are in host memory already (resolve_config says so).
  checkpointing.cpu_checkpointing = config.activation_checkpointing.cpu_checkpointing && flags.cuda;
  // Without tensor parallelism it changes nothing (resolve_config says so).
  checkpointing.partition_activations =
      config.activation_checkpointing.partition_activations && config.tensor_parallel_size > 1;
  checkpointing.nvme_path = config.activation_checkpointing.nvme_path;
  checkpointing.spill_aio = config.engine.offload.aio;
  // The spill's file is named by the world rank: unique across tensor- and data-parallel groups.
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &checkpointing.spill_rank));
  return std::make_unique<Gpt2Task>(flags, config.train_batch_size,
                                    config.gradient_accumulation_steps,
                                    config.engine.kernel_threads, checkpointing,
                                    config.tensor_parallel_size, config.micro_batch_per_rank);
}

}  // namespace zero::examples
