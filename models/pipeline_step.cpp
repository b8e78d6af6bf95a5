#include "models/pipeline_step.h"

#include <utility>

#include "zero/core/check.h"
#include "zero/runtime/device.h"
#include "zero/runtime/trace.h"

namespace zero::models {

ZeroModelStage::ZeroModelStage(ZeroModel& model, MicroBatchSource& source, int stage, int stages,
                               int64_t global_batch, int micro_batches, int data_parallel_rank,
                               int data_parallel_size)
    : model_(model),
      source_(source),
      first_(stage == 0),
      last_(stage == stages - 1),
      global_batch_(global_batch),
      micro_batches_(micro_batches),
      rank_(data_parallel_rank),
      ranks_(data_parallel_size) {
  const int64_t slices = static_cast<int64_t>(micro_batches) * data_parallel_size;
  ZERO_CHECK(micro_batches >= 1 && global_batch % slices == 0,
             "a pipeline cuts the global batch of " << global_batch << " into " << micro_batches
                                                    << " micro-batches x " << data_parallel_size
                                                    << " data-parallel ranks of equal size; "
                                                       "choose a batch that divides");
  samples_ = global_batch / slices;
}

void ZeroModelStage::begin_step(long step, std::function<void(int, Tensor&)> before_backward) {
  ZERO_CHECK(kept_.empty(),
             "a pipeline step began with " << kept_.size() << " micro-batch(es) still in flight");
  step_ = step;
  before_backward_ = std::move(before_backward);
  loss_sum_ = 0.0f;
  times_ = MicroBatchTimes{};
}

void ZeroModelStage::forward(int micro_batch, int chunk, const Tensor& input, Tensor& output) {
  using Clock = std::chrono::steady_clock;
  const std::shared_ptr<DeviceContext>& device = model_.engine().device_context();
  const BatchSlice slice = batch_slice(global_batch_, micro_batches_, ranks_, micro_batch, rank_);
  Tensor x;
  if (reads_input(chunk) || computes_loss(chunk)) {
    // The first chunk's input; the loss chunk's read sets the micro-batch's targets.
    ScopedSpan span(model_.engine().trace(), "data");
    const auto start = Clock::now();
    Tensor tokens = source_.input(step_, slice.first, slice.count);
    if (reads_input(chunk)) x = tokens.to(device);
    times_.data += Clock::now() - start;
  }
  if (!reads_input(chunk)) x = input.to(device);
  const auto start = Clock::now();
  Tensor out = model_.forward(x, chunk);
  times_.forward += Clock::now() - start;
  if (computes_loss(chunk)) {
    ScopedSpan span(model_.engine().trace(), "loss");
    Tensor grad;
    loss_sum_ += source_.loss(out, grad);
    loss_grads_[micro_batch] = std::move(grad);
  } else {
    // The executor sends from host memory.
    output = out.device() ? out.to(nullptr) : std::move(out);
  }
  kept_[{micro_batch, chunk}] = model_.take_activations(chunk);
}

void ZeroModelStage::backward(int micro_batch, int chunk, const Tensor& grad_output,
                              Tensor& grad_input) {
  Tensor grad = backward_start(micro_batch, chunk, grad_output);
  const auto start = std::chrono::steady_clock::now();
  Tensor grad_in = model_.backward(grad, chunk);
  times_.backward += std::chrono::steady_clock::now() - start;
  if (!reads_input(chunk)) grad_input = grad_in.device() ? grad_in.to(nullptr) : std::move(grad_in);
}

void ZeroModelStage::backward_input(int micro_batch, int chunk, const Tensor& grad_output,
                                    Tensor& grad_input) {
  Tensor grad = backward_start(micro_batch, chunk, grad_output);
  const auto start = std::chrono::steady_clock::now();
  Tensor grad_in = model_.backward_input(grad, chunk);
  times_.backward += std::chrono::steady_clock::now() - start;
  // What the weight half reads waits with the micro-batch's activations.
  kept_[{micro_batch, chunk}] = model_.take_activations(chunk);
  if (!reads_input(chunk)) grad_input = grad_in.device() ? grad_in.to(nullptr) : std::move(grad_in);
}

void ZeroModelStage::backward_weight(int micro_batch, int chunk) {
  const auto kept = kept_.find({micro_batch, chunk});
  ZERO_CHECK(kept != kept_.end(), "backward_weight of micro-batch "
                                      << micro_batch << " (chunk " << chunk
                                      << ") before its backward_input on this stage");
  model_.restore_activations(std::move(kept->second), chunk);
  kept_.erase(kept);
  const auto start = std::chrono::steady_clock::now();
  model_.backward_weight(chunk);
  times_.backward += std::chrono::steady_clock::now() - start;
}

// The activations of the micro-batch's chunk back into its modules, and the gradient its
// backward starts from: the loss's on the loss chunk, the one received otherwise.
Tensor ZeroModelStage::backward_start(int micro_batch, int chunk, const Tensor& grad_output) {
  const auto kept = kept_.find({micro_batch, chunk});
  ZERO_CHECK(kept != kept_.end(), "backward of micro-batch " << micro_batch << " (chunk " << chunk
                                                             << ") before its forward on this "
                                                                "stage");
  model_.restore_activations(std::move(kept->second), chunk);
  kept_.erase(kept);
  Tensor grad;
  if (computes_loss(chunk)) {
    grad = std::move(loss_grads_.at(micro_batch));
    loss_grads_.erase(micro_batch);
  } else {
    grad = grad_output.to(model_.engine().device_context());
  }
  // Once per micro-batch: at its first backward on this stage (the last chunk's).
  if (before_backward_ && chunk == model_.chunks() - 1) before_backward_(micro_batch, grad);
  // The loss scale goes on once, here; what the next chunk or stage sends carries it already.
  if (computes_loss(chunk)) grad = model_.scaled_loss_gradient(grad);
  return grad;
}

}  // namespace zero::models
