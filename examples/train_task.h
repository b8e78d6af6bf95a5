// What zero-train trains, behind one interface: the MLP on its synthetic teacher task, or the
// GPT-2 on token files. The loop in zero_train.cpp asks a task for its modules, then runs each
// step's micro-batches through models::forward_backward, which asks the task for each input and,
// from the model's output, the loss and its gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "driver/metrics_writer.h"
#include "examples/nvme_space.h"
#include "examples/train_flags.h"
#include "models/gpt2.h"
#include "models/train_step.h"
#include "zero/runtime/model.h"

namespace zero::examples {

class TrainTask : public models::MicroBatchSource {
 public:
  virtual ~TrainTask() = default;

  // "mlp" or "gpt2", with its sizes, for the start-up line.
  virtual std::string description() const = 0;
  // The model's config for the metrics' init record.
  virtual driver::JsonRecord model_record() const = 0;
  // The modules to wrap (once), on this rank's tensor-parallel group (the GPT-2's; a model that
  // does not split its layers is only ever given none).
  virtual std::vector<NamedModule> take_modules(
      const models::Gpt2TensorParallel& tensor_parallel) = 0;
  // Pipeline parallelism (--pp): from now on the modules, parameters and weights are those of
  // pipeline stage `stage` of `stages`, cut by `partition` (gpt2_pipeline_partition's methods);
  // with virtual_stages v > 1 (interleaved) the model is cut into v * stages virtual stages and
  // the stage holds v chunks of it. Returns the stage's lines for the start-up print (its layers
  // and parameters; one per chunk). A ConfigError for a model that is not cut into stages or a
  // cut that is impossible.
  virtual std::string set_pipeline_stage(int stage, int stages, const std::string& partition,
                                         int virtual_stages = 1) = 0;
  // The first module of each model chunk of the modules take_modules gave (ZeroModel's
  // chunk_first_modules; empty: one chunk).
  virtual std::vector<int> chunk_first_modules() const = 0;
  // The tensor one stage hands the next for a micro-batch of `samples` (the GPT-2's residual
  // stream [samples, seq, n_embd]), and its gradient back.
  virtual std::vector<int64_t> stage_boundary_shape(int64_t samples) const = 0;
  // After the engine is built and before training: weights from a file (--init-from), and the
  // seed of the data (the run's, or the resumed checkpoint's).
  virtual void start(Engine& engine, uint64_t data_seed) = 0;

  // input() and loss() per micro-batch: see models::MicroBatchSource.
  // Tokens in one sample (1 for the MLP): tokens_per_s in the metrics.
  virtual int64_t tokens_per_sample() const = 0;

  // Lines for rank 0 to print at start: what the task chose that the command line did not say
  // (fewer validation batches than the default, when the set holds fewer).
  virtual std::vector<std::string> notes() const = 0;

  // Validation (--val-data): every K steps the mean loss over the validation batches, forward
  // only. False when the run has none.
  virtual bool validates(long step) const = 0;
  // Collective over `host` (every rank calls it): this rank's slices of each validation batch.
  virtual float validation_loss(ZeroModel& model, Communicator& host) = 0;
  // For a pipeline, which moves the forwards between stages itself: the validation batches, and
  // the input of samples [first, first + count) of batch b (in host memory; the loss's targets
  // are kept, as input() keeps them).
  virtual long validation_batches() const = 0;
  virtual Tensor validation_input(long batch, int64_t first, int64_t count) = 0;

  // Host memory of one micro-batch outside the engine's allocator (activations, batch data).
  virtual uint64_t activation_bytes(int64_t samples_per_micro_batch) const = 0;
  // The part of activation_bytes the model allocates from the engine's allocator, where it is
  // counted (0 when it counts nothing there).
  virtual uint64_t counted_activation_bytes(int64_t samples_per_micro_batch) const = 0;
  // When the activations of `samples` per micro-batch do not fit in `room` bytes: the
  // activation checkpointing setting with which they would ("--activation-checkpointing full
  // would fit (1.2 MiB of activations)"), or empty when none would (or the model has none).
  virtual std::string activation_remedy(int64_t samples_per_micro_batch, uint64_t room) const = 0;
  // The activations of `samples` per micro-batch with the heaviest recomputation this model
  // offers (activation_bytes itself for a model without).
  virtual uint64_t least_activation_bytes(int64_t samples_per_micro_batch) const = 0;
  // The parameters the modules will declare (this rank's, in the engine's order): the engine's
  // memory plan before the modules are made.
  virtual std::vector<ParamSpec> param_specs() const = 0;
  // The files the model makes under an NVMe path for `samples` per micro-batch (the GPT-2's
  // activation spill); none for most.
  virtual std::vector<NvmeFileNeed> nvme_files(int64_t samples_per_micro_batch) const = 0;
  // Memory the modules keep beside the engine's for the run: their fp32 working copies of
  // parameters and gradients (what a module computes in before adding it into the engine's
  // storage), for the working dtype, on a GPU (`on_gpu`) or this CPU.
  virtual uint64_t module_bytes(DType dtype, bool on_gpu) const = 0;
  // Lines for the memory summary at start: the activations of a micro-batch of `samples`, by
  // where they are held; empty when the model does not count them.
  virtual std::string activation_summary(int64_t samples_per_micro_batch) const = 0;
  // The activation bytes the model's modules hold now (after a step), for the step records:
  // empty when the model does not count them. With the checkpoint spill also the bytes it read
  // and wrote since the last call (the step and the validation after it, whose forwards write
  // the checkpoints too) and the size of its file.
  virtual driver::JsonRecord activation_record() = 0;
  // activation_checkpointing.profile: the per-block forward, recompute and backward times since
  // the last call, for the step records; empty without it.
  virtual driver::JsonRecord profile_record() = 0;
};

// The advice of the out-of-host-memory message when the activations of `samples` per
// micro-batch and the modules' copies pass a rank's `budget`: an activation checkpointing with
// which they fit beside the engine's plan (on `data_parallel_size` ranks), or, when none does,
// what that plan needs and the estimator's plans on other stages and more ranks.
std::string out_of_memory_advice(const TrainTask& task, const EngineConfig& engine,
                                 int data_parallel_size, int64_t samples, uint64_t budget);

// Collective over MPI_COMM_WORLD, before the engine: the NVMe files of this rank (the engine's
// offloads, by its plan on `data_parallel_size` ranks, and the task's) checked one by one and
// summed over each node's ranks by file system (nvme_space_problem). The same message on every
// rank, or "" when all fit.
std::string nvme_setup_problem(const TrainTask& task, const TrainingConfig& config, bool cuda,
                               int data_parallel_size);

// The task of --model; throws zero::Error when its data cannot be read.
std::unique_ptr<TrainTask> make_train_task(const Flags& flags, const TrainingConfig& config);

}  // namespace zero::examples
