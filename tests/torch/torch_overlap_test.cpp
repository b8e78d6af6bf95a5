// The adapter's reductions overlap backward: a unit's reduce-scatter runs on the communication
// stream while autograd is still working on the units before it, because the adapter calls
// grads_ready for each unit as soon as autograd has accumulated that unit's gradients (the
// issue's "reduce-scatters overlap backward"). The first unit's backward is made slow (an
// autograd function that sleeps), and the engine's trace must show reduce-scatters of the later
// units starting before that slow backward ends. Were grads_ready fired only once backward is
// over, every reduce-scatter would start after it.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/trace.h"
#include "zero/torch/torch_model.h"

namespace zero {
namespace {

// Long enough for the communication threads of every rank to start the collectives already
// issued, even on a loaded machine with ranks sharing cores.
constexpr auto kSlowBackward = std::chrono::milliseconds(300);

// When the slow backward ran, on the trace's clock.
struct SlowBackwardTimes {
  double begin_us = 0;
  double end_us = 0;
};

// An identity whose backward sleeps, recording when it ran.
struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               int64_t times) {
    ctx->saved_data["times"] = times;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* times = reinterpret_cast<SlowBackwardTimes*>(ctx->saved_data["times"].toInt());
    times->begin_us = Trace::now_us();
    std::this_thread::sleep_for(kSlowBackward);
    times->end_us = Trace::now_us();
    return {grads[0], torch::Tensor()};
  }
};

// The first unit: a linear layer whose backward starts with the slow function, so the unit's
// own gradients arrive only after the sleep.
class SlowFirstImpl : public torch::nn::Module {
 public:
  explicit SlowFirstImpl(SlowBackwardTimes* times)
      : linear(register_module("linear", torch::nn::Linear(8, 32))), times_(times) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return SlowBackward::apply(linear->forward(x), reinterpret_cast<int64_t>(times_));
  }
  torch::nn::Linear linear;

 private:
  SlowBackwardTimes* times_;
};
TORCH_MODULE(SlowFirst);

void expect_reductions_during_backward(int stage) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  SlowBackwardTimes times;
  torch::manual_seed(1);
  torch::nn::Sequential net(SlowFirst(&times), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                            torch::nn::Tanh(), torch::nn::Linear(32, 4));
  EngineConfig config;
  config.stage = stage;
  config.trace = true;
  TorchModel model(*comm, net, config);
  const int units = static_cast<int>(model.engine().layout().units().size());
  ASSERT_EQ(units, 3) << "one unit per child with parameters";

  for (int step = 0; step < 2; ++step) {  // the first step warms up
    model.engine().trace().clear();
    torch::manual_seed(100 + step + comm->rank());
    const torch::Tensor x = torch::randn({16, 8});
    torch::mse_loss(model.forward(x), torch::randn({16, 4})).backward();
    model.step();  // waits for every reduction, so their spans are in the trace
  }
  std::vector<double> reduce_begins;
  for (const TraceSpan& span : model.engine().trace().spans()) {
    if (span.comm && span.name == "reduce_scatter") reduce_begins.push_back(span.begin_us);
  }
  ASSERT_EQ(static_cast<int>(reduce_begins.size()), units) << "one reduce-scatter per unit";
  ASSERT_GT(times.end_us, times.begin_us);
  const auto during = std::count_if(reduce_begins.begin(), reduce_begins.end(),
                                    [&](double begin) { return begin < times.end_us; });
  // Every unit but the first (whose gradients come after the sleep) is reduced while the first
  // unit's backward is still running.
  EXPECT_EQ(during, units - 1) << "stage " << stage << ": " << during << " of " << units
                               << " reduce-scatters started before the first unit's backward "
                                  "ended; the earliest started "
                               << (*std::min_element(reduce_begins.begin(), reduce_begins.end()) -
                                   times.end_us) /
                                      1000.0
                               << " ms after it";
}

TEST(TorchOverlap, Stage3ReducesEachUnitWhileBackwardRuns) {
  expect_reductions_during_backward(3);
}

TEST(TorchOverlap, Stage2ReducesEachUnitWhileBackwardRuns) {
  expect_reductions_during_backward(2);
}

}  // namespace
}  // namespace zero
