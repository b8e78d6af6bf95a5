// What zero-train trains, behind one interface: the MLP on its synthetic teacher task, or the
// GPT-2 on token files. The loop in zero_train.cpp asks a task for its modules, then for each
// micro-batch its input and, from the model's output, its loss and the loss's gradient.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "driver/metrics_writer.h"
#include "examples/train_flags.h"
#include "zero/runtime/model.h"

namespace zero::examples {

// The samples one rank takes in one micro-batch: the global batch of B samples is cut into
// K * N contiguous slices (micro-batch k, rank r: slice k * N + r) whose sizes differ by at most
// one when B is not a multiple of K * N. Each slice's loss gradient is multiplied by `weight`,
// its size over the mean slice size, so that the engine's average over ranks and micro-batches
// is the mean over the B samples.
struct BatchSlice {
  int64_t first = 0;
  int64_t count = 0;
  float weight = 1.0f;
};
BatchSlice batch_slice(int64_t global_batch, int micro_batches, int world_size, int micro_batch,
                       int rank);

class TrainTask {
 public:
  virtual ~TrainTask() = default;

  // "mlp" or "gpt2", with its sizes, for the start-up line.
  virtual std::string description() const = 0;
  // The model's config for the metrics' init record.
  virtual driver::JsonRecord model_record() const = 0;
  // The modules to wrap (once).
  virtual std::vector<NamedModule> take_modules() = 0;
  // After the engine is built and before training: weights from a file (--init-from), and the
  // seed of the data (the run's, or the resumed checkpoint's).
  virtual void start(Engine& engine, uint64_t data_seed) = 0;

  // The input of samples [first, first + count) of step's global batch, in host memory; the
  // task keeps what the loss needs (the targets).
  virtual Tensor input(long step, int64_t first, int64_t count) = 0;
  // The loss of the micro-batch from the model's output, and d(loss)/d(output) into grad (on the
  // output's device).
  virtual float loss(const Tensor& output, Tensor& grad) = 0;
  // Tokens in one sample (1 for the MLP): tokens_per_s in the metrics.
  virtual int64_t tokens_per_sample() const = 0;

  // Validation (--val-data): every K steps the mean loss over the validation batches, forward
  // only. False when the run has none.
  virtual bool validates(long step) const = 0;
  // Collective over `host` (every rank calls it): this rank's slices of each validation batch.
  virtual float validation_loss(ZeroModel& model, Communicator& host) = 0;

  // Host memory of one micro-batch outside the engine's allocator (activations, batch data).
  virtual uint64_t activation_bytes(int64_t samples_per_micro_batch) const = 0;
  // Host memory the modules keep beside the engine's for the run: their fp32 working copies of
  // parameters and gradients (what a module computes in before adding it into the engine's
  // storage), for the working dtype.
  virtual uint64_t module_bytes(DType dtype) const = 0;
  // Lines for the memory summary at start: the activations of a micro-batch of `samples`, by
  // where they are held; empty when the model does not count them.
  virtual std::string activation_summary(int64_t samples_per_micro_batch) const = 0;
  // The activation bytes the model's modules hold now (after a step), for the step records:
  // empty when the model does not count them.
  virtual driver::JsonRecord activation_record() const = 0;
};

// The task of --model; throws zero::Error when its data cannot be read.
std::unique_ptr<TrainTask> make_train_task(const Flags& flags, const TrainingConfig& config);

}  // namespace zero::examples
