#include "models/train_step.h"

#include "zero/runtime/device.h"
#include "zero/runtime/trace.h"

namespace zero::models {

BatchSlice batch_slice(int64_t global_batch, int micro_batches, int world_size, int micro_batch,
                       int rank) {
  const int64_t slices = static_cast<int64_t>(micro_batches) * world_size;
  const int64_t index = static_cast<int64_t>(micro_batch) * world_size + rank;
  const int64_t base = global_batch / slices;
  const int64_t extra = global_batch % slices;  // the first `extra` slices take one more
  BatchSlice slice;
  slice.first = index * base + (index < extra ? index : extra);
  slice.count = base + (index < extra ? 1 : 0);
  if (extra != 0) {
    slice.weight = static_cast<float>(static_cast<double>(slice.count * slices) /
                                      static_cast<double>(global_batch));
  }
  return slice;
}

float forward_backward(ZeroModel& model, MicroBatchSource& source, long step, int64_t global_batch,
                       int micro_batches, int rank, int world_size, MicroBatchTimes* times,
                       const std::function<void(int, Tensor&)>& before_backward) {
  using Clock = std::chrono::steady_clock;
  Trace& trace = model.engine().trace();
  const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
  MicroBatchTimes local;
  MicroBatchTimes& t = times != nullptr ? *times : local;
  float loss_sum = 0.0f;
  for (int k = 0; k < micro_batches; ++k) {
    const BatchSlice slice = batch_slice(global_batch, micro_batches, world_size, k, rank);
    Tensor input;
    {
      ScopedSpan span(trace, "data");
      const auto start = Clock::now();
      input = source.input(step, slice.first, slice.count).to(device);
      t.data += Clock::now() - start;
    }
    auto start = Clock::now();
    const Tensor output = model.forward(input);
    t.forward += Clock::now() - start;
    Tensor grad;
    {
      ScopedSpan span(trace, "loss");
      loss_sum += source.loss(output, grad) * slice.weight;
      if (slice.weight != 1.0f) {
        device->scale(grad.data(), DType::kFloat32, slice.weight, grad.numel());
      }
    }
    if (before_backward) before_backward(k, grad);
    start = Clock::now();
    model.backward(grad);
    t.backward += Clock::now() - start;
  }
  return loss_sum;
}

}  // namespace zero::models
