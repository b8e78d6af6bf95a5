// The forward and backward passes of one optimizer step, as every training loop of the project
// runs them (zero-train, zero-bench-step, zero-bench-gpt2): the global batch cut into a slice per
// micro-batch and rank, each slice's input, forward, loss, backward. The caller then calls
// ZeroModel::step().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "zero/runtime/model.h"

namespace zero::models {

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

// What a step needs from the data and the loss of a model.
class MicroBatchSource {
 public:
  virtual ~MicroBatchSource() = default;
  // The input of samples [first, first + count) of step's global batch, in host memory; the
  // source keeps what the loss needs (the targets).
  virtual Tensor input(long step, int64_t first, int64_t count) = 0;
  // The loss of the micro-batch from the model's output, and d(loss)/d(output) into grad (on
  // the output's device).
  virtual float loss(const Tensor& output, Tensor& grad) = 0;
};

// Host time spent making the batches, in forward and in backward (on CUDA, the time to queue
// the work), summed over the micro-batches.
struct MicroBatchTimes {
  std::chrono::steady_clock::duration data{};
  std::chrono::steady_clock::duration forward{};
  std::chrono::steady_clock::duration backward{};
};

// Runs every micro-batch of `step` on this rank: its slice's input (moved to the engine's
// device), forward, the loss and its gradient (times the slice's weight), backward. Returns this
// rank's sum of the micro-batches' weighted losses: over all ranks, divided by world_size *
// micro_batches, the mean loss of the global batch. `before_backward(k, grad)`, when given, sees
// each micro-batch's loss gradient before its backward (zero-train's fault injection).
float forward_backward(ZeroModel& model, MicroBatchSource& source, long step, int64_t global_batch,
                       int micro_batches, int rank, int world_size,
                       MicroBatchTimes* times = nullptr,
                       const std::function<void(int, Tensor&)>& before_backward = {});

}  // namespace zero::models
