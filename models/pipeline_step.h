// One pipeline stage of a model wrapped by ZeroModel, as the pipeline executor's work: each
// micro-batch's slice of the global batch (train_step.h's batch_slice over the stage's
// data-parallel ranks), its forward on this stage, and later its backward. The first stage reads
// the input from the source; the last one the targets and, from the model's output, the loss and
// its gradient. Between a micro-batch's forward and its backward the modules' kept activations
// wait here (ZeroModel::take_activations), so several micro-batches can be in flight. With model
// chunks (an interleaved schedule; ZeroModel::chunks) each call runs one chunk's modules and
// the activations wait per (micro-batch, chunk): the first stage's chunk 0 reads the input, the
// last stage's last chunk computes the loss, and the other chunks receive and send the hidden
// state.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "models/train_step.h"
#include "zero/runtime/model.h"
#include "zero/runtime/pipeline_executor.h"

namespace zero::models {

class ZeroModelStage : public PipelineStageWork {
 public:
  // stage of stages; the global batch of each step is cut into micro_batches x data_parallel_size
  // equal slices (a zero::Error when it does not divide: the activations passed between stages
  // have one shape, agreed at start).
  ZeroModelStage(ZeroModel& model, MicroBatchSource& source, int stage, int stages,
                 int64_t global_batch, int micro_batches, int data_parallel_rank,
                 int data_parallel_size);

  // The step whose batch the next micro-batches read; resets the loss sum. `before_backward`,
  // when given, sees each micro-batch's gradient before its (last chunk's) backward here (the
  // loss gradient on the last stage; zero-train's fault injection).
  void begin_step(long step, std::function<void(int, Tensor&)> before_backward = {});
  // The last stage: this rank's sum of the step's micro-batch losses (0 on other stages).
  float loss_sum() const { return loss_sum_; }
  // The samples of one micro-batch on one rank.
  int64_t micro_batch_samples() const { return samples_; }
  // Host time spent making the batches, in forward and in backward.
  const MicroBatchTimes& times() const { return times_; }

  void forward(int micro_batch, int chunk, const Tensor& input, Tensor& output) override;
  void backward(int micro_batch, int chunk, const Tensor& grad_output, Tensor& grad_input) override;
  // ZB-H1: when every module of the model splits its backward (ZeroModel::splits_backward);
  // between the two halves the micro-batch's modules wait here as between forward and backward.
  bool splits_backward() const override { return model_.splits_backward(); }
  void backward_input(int micro_batch, int chunk, const Tensor& grad_output,
                      Tensor& grad_input) override;
  void backward_weight(int micro_batch, int chunk) override;

 private:
  Tensor backward_start(int micro_batch, int chunk, const Tensor& grad_output);
  bool reads_input(int chunk) const { return first_ && chunk == 0; }
  bool computes_loss(int chunk) const { return last_ && chunk == model_.chunks() - 1; }

  ZeroModel& model_;
  MicroBatchSource& source_;
  bool first_, last_;
  int64_t global_batch_;
  int micro_batches_;
  int rank_, ranks_;
  int64_t samples_;
  long step_ = 0;
  std::function<void(int, Tensor&)> before_backward_;
  float loss_sum_ = 0.0f;
  MicroBatchTimes times_;
  // Per (micro-batch, chunk) in flight: what the modules kept; per micro-batch on the last
  // stage the loss gradient.
  std::map<std::pair<int, int>, std::vector<KeptActivations>> kept_;
  std::map<int, Tensor> loss_grads_;
};

}  // namespace zero::models
