// The engine on several ranks: every stage against every other (and against one rank, where
// nothing is sharded), the memory and communication the ZeRO paper's formulas predict, the
// joins between the streams, gradient accumulation, and the edge cases of the layout.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tests/expect_error.h"
#include "tests/runtime/train_util.h"
#include "zero/core/check.h"

namespace zero {
namespace {

using namespace zero::testing;
using models::MlpConfig;

TEST(Engine, EveryStageGivesTheSameLosses) {
  const TrainResult reference = train(RunOptions{});
  EXPECT_LT(reference.losses.back(), reference.losses.front());
  for (int stage = 1; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    const TrainResult run = train(o);
    const std::string what = "stage " + std::to_string(stage) + " vs stage 0";
    if (world_size() <= 2) {
      // Two addends sum the same in any order, so the reductions of every stage agree exactly.
      for (size_t i = 0; i < run.losses.size(); ++i) {
        EXPECT_EQ(run.losses[i], reference.losses[i]) << what << " at step " << i + 1;
      }
    } else {
      expect_close(run.losses, reference.losses, 1e-6, what);
    }
    for (size_t p = 0; p < run.final_params.size(); ++p) {
      expect_close(run.final_params[p], reference.final_params[p], 1e-5,
                   what + ", parameter " + std::to_string(p), 1e-7);
    }
  }
}

TEST(Engine, ModelStateBytesFollowTheZeroFormulas) {
  const uint64_t n = static_cast<uint64_t>(world_size());
  for (int stage = 0; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    o.steps = 1;
    const TrainResult run = train(o);
    const uint64_t psi = run.padded_params;
    // fp32 working dtype: 4 bytes of params, 4 of grads, 8 of Adam moments; no separate master.
    const uint64_t expected[4] = {16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n,
                                  16 * psi / n};
    EXPECT_EQ(run.model_state_bytes, expected[stage]) << "stage " << stage << ", psi " << psi;
  }
}

// The ZeRO paper's table: stages 1 and 2 move what stage 0's all-reduce does (a reduce-scatter
// and an all-gather of the parameters); stage 3 all-gathers the parameters once more, for
// backward, 1.5x, less the units backward finds still gathered from forward.
TEST(Engine, CommunicationVolumeMatchesTheStageTable) {
  if (world_size() < 2) GTEST_SKIP() << "one rank communicates nothing";
  std::vector<double> per_step(4);
  double backward_gathered = 0.0;
  for (int stage = 0; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    o.steps = 3;
    const TrainResult run = train(o);
    EXPECT_EQ(run.comm_bytes[1], run.comm_bytes[2]) << "stage " << stage;
    per_step[stage] = static_cast<double>(run.comm_bytes[2]);
    backward_gathered = stage3_backward_gathered_fraction(run);
  }
  EXPECT_GT(per_step[0], 0.0);
  EXPECT_GT(backward_gathered, 0.0);
  EXPECT_NEAR(per_step[1] / per_step[0], 1.0, 0.01);
  EXPECT_NEAR(per_step[2] / per_step[0], 1.0, 0.01);
  EXPECT_NEAR(per_step[3] / per_step[0], 1.0 + 0.5 * backward_gathered, 0.015);
}

// With two micro-batches per step stage 1 still reduce-scatters each unit once, after its last
// micro-batch, while stage 2 reduce-scatters during every backward: one more reduce-scatter of
// the model, half of stage 0's all-reduce.
TEST(Engine, StageOneReducesOncePerStepAndStageTwoPerMicroBatch) {
  if (world_size() < 2) GTEST_SKIP() << "one rank communicates nothing";
  const auto bytes_per_step = [](int stage, int micro_batches) {
    RunOptions o;
    o.stage = stage;
    o.steps = 3;
    o.micro_batches = micro_batches;
    return static_cast<double>(train(o).comm_bytes[2]);
  };
  const double all_reduce = bytes_per_step(0, 1);
  EXPECT_NEAR(bytes_per_step(1, 2) / all_reduce, 1.0, 0.01);
  EXPECT_NEAR(bytes_per_step(2, 2) / all_reduce, 1.5, 0.015);
}

// On one node the engine's buffers live in node-shared memory, so its reductions and gathers
// run straight on them: per step only two small all-reduces of private buffers stage, the
// engine's of the per-unit gradient norms and train()'s of the loss.
TEST(Engine, CollectivesRunStraightOnNodeSharedBuffers) {
  if (world_size() < 2) GTEST_SKIP() << "one rank communicates nothing";
  for (int stage = 0; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    o.steps = 3;
    const TrainResult run = train(o);
    EXPECT_EQ(run.staged_collectives, 2u * o.steps) << "stage " << stage;
    for (int step = 0; step < o.steps; ++step) {
      EXPECT_GT(run.collectives[step], 2) << "stage " << stage << ", step " << step + 1;
    }
  }
}

// Every stage against plain training written from the formulas (train_unsharded: its own
// forward, backward, clipping, accumulation and AdamW in double), with the run options each
// case sets honoured on both sides.
TEST(Engine, EveryStageMatchesUnshardedTraining) {
  std::vector<std::pair<std::string, RunOptions>> cases;
  RunOptions plain;
  plain.steps = 10;
  cases.emplace_back("plain", plain);
  RunOptions options = plain;
  options.micro_batches = 2;
  options.clip = 0.05f;
  options.lr = 3e-3f;
  options.weight_decay = 0.1f;
  options.seed = 11;
  options.mlp = MlpConfig{6, 16, 3, 4};
  cases.emplace_back("two micro-batches, clipping, lr 3e-3, weight decay 0.1, 4 layers", options);
  for (const auto& [name, o] : cases) {
    const TrainResult reference = train_unsharded(o);
    EXPECT_LT(reference.losses.back(), reference.losses.front()) << name;
    if (o.clip > 0.0f) {
      EXPECT_GT(reference.grad_norms.front(), o.clip) << name << ": clipping is not exercised";
    }
    for (int stage = 0; stage <= 3; ++stage) {
      RunOptions staged = o;
      staged.stage = stage;
      const TrainResult run = train(staged);
      const std::string what = name + ", stage " + std::to_string(stage);
      expect_close(run.losses, reference.losses, 1e-4, what + " losses");
      expect_close(run.grad_norms, reference.grad_norms, 1e-4, what + " gradient norms");
      ASSERT_EQ(run.final_params.size(), reference.final_params.size()) << what;
      for (size_t p = 0; p < run.final_params.size(); ++p) {
        expect_close(run.final_params[p], reference.final_params[p], 1e-5,
                     what + ", parameter " + std::to_string(p), 1e-7);
      }
    }
  }
}

// The reference itself: the options it is given change its numbers, and the ones it cannot
// model are refused rather than ignored.
TEST(Engine, UnshardedReferenceHonoursItsOptions) {
  RunOptions o;
  o.steps = 4;
  const TrainResult base = train_unsharded(o);
  const std::vector<std::pair<std::string, std::function<void(RunOptions&)>>> changes = {
      {"lr", [](RunOptions& r) { r.lr = 2e-2f; }},
      {"weight decay", [](RunOptions& r) { r.weight_decay = 0.5f; }},
      {"clipping", [](RunOptions& r) { r.clip = 0.05f; }},
      {"seed", [](RunOptions& r) { r.seed = 8; }},
      {"global batch", [](RunOptions& r) { r.global_batch = 12; }},
  };
  for (const auto& [name, change] : changes) {
    RunOptions changed = o;
    change(changed);
    EXPECT_NE(train_unsharded(changed).final_params, base.final_params) << name;
  }
  // Micro-batches of a mean loss average to the whole batch's gradient: the same training.
  o.micro_batches = 3;
  const TrainResult micro = train_unsharded(o);
  expect_close(micro.losses, base.losses, 1e-6, "three micro-batches");
  for (size_t p = 0; p < base.final_params.size(); ++p) {
    expect_close(micro.final_params[p], base.final_params[p], 1e-6, "three micro-batches", 1e-9);
  }
  RunOptions tweaked;
  tweaked.tweak = [](EngineConfig& c) { c.optimizer.beta1 = 0.5; };
  EXPECT_THROW(train_unsharded(tweaked), std::invalid_argument);
  RunOptions bf16;
  bf16.dtype = DType::kBFloat16;
  EXPECT_THROW(train_unsharded(bf16), std::invalid_argument);
}

TEST(Engine, DelayedCommunicationStreamChangesNothing) {
  // A slow communication stream: any read of a buffer before its collective finished (a missing
  // wait between the streams) gives numbers that differ from plain training's.
  RunOptions o;
  o.steps = 3;
  const TrainResult reference = train_unsharded(o);
  for (int stage : {0, 1, 2, 3}) {
    o.stage = stage;
    o.comm_delay_us = 0;
    const TrainResult fast = train(o);
    o.comm_delay_us = 2000;
    const TrainResult slow = train(o);
    const std::string what = "delayed stage " + std::to_string(stage);
    expect_close(slow.losses, reference.losses, 1e-4, what + " losses");
    expect_close(slow.grad_norms, reference.grad_norms, 1e-4, what + " gradient norms");
    for (size_t i = 0; i < fast.losses.size(); ++i) {
      EXPECT_EQ(fast.losses[i], slow.losses[i]) << "stage " << stage << " step " << i + 1;
    }
    for (size_t p = 0; p < fast.final_params.size(); ++p) {
      EXPECT_EQ(fast.final_params[p], slow.final_params[p]) << "stage " << stage;
    }
  }
  o.stage = 3;
  o.micro_batches = 2;
  const TrainResult accumulated = train(o);
  expect_close(accumulated.losses, train_unsharded(o).losses, 1e-4,
               "delayed stage 3, two micro-batches");
}

TEST(Engine, GradientAccumulationMatchesOneLargeBatch) {
  for (int stage = 0; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    o.steps = 10;
    const TrainResult whole = train(o);
    o.micro_batches = 2;
    const TrainResult accumulated = train(o);
    expect_close(accumulated.losses, whole.losses, 1e-5, "stage " + std::to_string(stage));
  }
}

TEST(Engine, ClippingIsComputedOverShards) {
  RunOptions o;
  o.clip = 0.05f;
  o.steps = 5;
  const TrainResult reference = train(o);
  for (int stage = 1; stage <= 3; ++stage) {
    o.stage = stage;
    expect_close(train(o).losses, reference.losses, 1e-6, "stage " + std::to_string(stage));
  }
  o.stage = 0;
  o.clip = 0.0f;
  const TrainResult unclipped = train(o);
  EXPECT_NE(unclipped.losses.back(), reference.losses.back());
}

// A module with the awkward shapes: an empty parameter, a one-element gain, and a weight larger
// than the merge threshold. y = gain * (x * scale) + shift, element-wise.
class Awkward : public Module {
 public:
  explicit Awkward(int width) : width_(width) {}
  std::vector<ParamDecl> parameters() const override {
    return {ParamDecl{ParamSpec{"empty", {0, 3}, 0}, ParamInit{}},
            ParamDecl{ParamSpec{"gain", {1}, 0}, ParamInit{InitKind::kOnes, 0}},
            ParamDecl{ParamSpec{"scale", {width_}, 0}, ParamInit{InitKind::kUniform, 1.0f}},
            ParamDecl{ParamSpec{"shift", {width_}, 0}, ParamInit{InitKind::kUniform, 0.1f}}};
  }
  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& p) override {
    input_ = in;
    out = Tensor(in.shape());
    Tensor s1, s2, s3;
    const float* gain = p[1].as_f32(s1);
    const float* scale = p[2].as_f32(s2);
    const float* shift = p[3].as_f32(s3);
    for (size_t i = 0; i < in.numel(); ++i) {
      const size_t j = i % width_;
      out.data()[i] = gain[0] * in.data()[i] * scale[j] + shift[j];
    }
  }
  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& p,
                const std::vector<ParamRef>& g) override {
    grad_in = Tensor(grad_out.shape());
    Tensor s1, s2;
    const float* gain = p[1].as_f32(s1);
    const float* scale = p[2].as_f32(s2);
    std::vector<float> d_gain(1, 0.0f), d_scale(width_, 0.0f), d_shift(width_, 0.0f);
    for (size_t i = 0; i < grad_out.numel(); ++i) {
      const size_t j = i % width_;
      const float go = grad_out.data()[i];
      d_gain[0] += go * input_.data()[i] * scale[j];
      d_scale[j] += go * gain[0] * input_.data()[i];
      d_shift[j] += go;
      grad_in.data()[i] = go * gain[0] * scale[j];
    }
    g[1].add_f32(d_gain.data());
    g[2].add_f32(d_scale.data());
    g[3].add_f32(d_shift.data());
  }

 private:
  int width_;
  Tensor input_;
};

// One parameter of one element: a unit with fewer elements than ranks.
class Bias1 : public Module {
 public:
  std::vector<ParamDecl> parameters() const override {
    return {ParamDecl{ParamSpec{"b", {1}, 0}, ParamInit{InitKind::kZeros, 0}}};
  }
  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>& p) override {
    Tensor scratch;
    const float b = p[0].as_f32(scratch)[0];
    out = in;
    for (size_t i = 0; i < out.numel(); ++i) out.data()[i] += b;
  }
  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>&,
                const std::vector<ParamRef>& g) override {
    float sum = 0.0f;
    for (size_t i = 0; i < grad_out.numel(); ++i) sum += grad_out.data()[i];
    g[0].add_f32(&sum);
    grad_in = grad_out;
  }
};

std::vector<float> train_awkward(int stage) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<NamedModule> modules;
  modules.push_back({"bias_in", std::make_unique<Bias1>()});
  modules.push_back({"mlp0", std::make_unique<models::Linear>(4, 300, true)});
  modules.push_back({"awkward", std::make_unique<Awkward>(300)});
  modules.push_back({"mlp1", std::make_unique<models::Linear>(300, 4, false)});
  modules.push_back({"bias_out", std::make_unique<Bias1>()});
  EngineConfig config;
  config.stage = stage;
  config.schedule.merge_bytes = 1024;  // the 300-wide weights are each larger than this
  config.optimizer.lr = 1e-2f;
  ZeroModel model(*comm, std::move(modules), config);
  const Layout& layout = model.engine().layout();
  EXPECT_EQ(layout.units().size(), 5u);
  for (const Unit& u : layout.units()) EXPECT_EQ(u.numel % (16 * comm->world_size()), 0u);

  MlpConfig task_shape{4, 8, 4, 2};
  models::TeacherTask task(task_shape, 3);
  std::vector<float> losses;
  const int world = comm->world_size();
  const long per_rank = 12 / world;
  for (int step = 1; step <= 8; ++step) {
    models::Batch batch = task.batch(step, comm->rank() * per_rank, per_rank);
    Tensor grad;
    float loss = models::mse_loss(model.forward(batch.inputs), batch.targets, grad);
    model.backward(grad);
    model.step();
    float total = 0.0f;
    comm->all_reduce_sync(&loss, &total, 1, DType::kFloat32);
    losses.push_back(total / static_cast<float>(world));
  }
  return losses;
}

TEST(Engine, EmptyTinyAndOversizedParametersTrainAlike) {
  if (12 % world_size() != 0) GTEST_SKIP() << "batch of 12 does not split over these ranks";
  const std::vector<float> reference = train_awkward(0);
  for (float l : reference) EXPECT_TRUE(std::isfinite(l));
  for (int stage = 1; stage <= 3; ++stage) {
    expect_close(train_awkward(stage), reference, 1e-6, "stage " + std::to_string(stage));
  }
}

TEST(Engine, DifferentModelOnOneRankIsANamedErrorNotAHang) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks";
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<ParamDecl> params = {
      ParamDecl{ParamSpec{"embed", {10, 4}, 0}, ParamInit{}},
      ParamDecl{ParamSpec{"head", {4, comm->rank() == 1 ? 3 : 2}, 1}, ParamInit{}},
  };
  EngineConfig config;
  try {
    Engine engine(*comm, params, config);
    FAIL() << "no error for a model that differs on rank 1";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("parameter #1"), std::string::npos) << message;
    EXPECT_NE(message.find("rank(s) 1"), std::string::npos) << message;
    EXPECT_NE(message.find("'head'"), std::string::npos) << message;
  }
  // The communicator is still in step on every rank: a collective after the error completes.
  comm->barrier_sync();
}

TEST(Engine, OutOfMemorySaysWhatWouldFit) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<ParamDecl> params = {ParamDecl{ParamSpec{"w", {64, 64}, 0}, ParamInit{}},
                                   ParamDecl{ParamSpec{"v", {64, 64}, 1}, ParamInit{}}};
  EngineConfig config;
  config.stage = 0;
  // The model needs 16 x 8192 x 4 B = 128 KiB at stage 0; stage 3 on 4 ranks 32 KiB of model
  // state and 64 KiB of buffers (two gathered units, two gradient buckets of 16 KiB each).
  config.memory_limit_bytes = 100 * 1024;
  try {
    Engine engine(*comm, params, config);
    FAIL() << "no error past the memory limit";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("would pass the limit of 100.00 KiB"), std::string::npos) << message;
    EXPECT_NE(message.find("what the estimator says for this model (8192 parameters, fp32) "
                           "against the limit of 100.00 KiB:"),
              std::string::npos)
        << message;
    // Padding makes the figure depend on N: at 1, 2 and 4 ranks it is exactly 16 x 8192 x 4 B.
    const std::string this_run = "stage 0 on " + std::to_string(comm->world_size()) + " rank(s): ";
    EXPECT_NE(message.find(this_run), std::string::npos) << message;
    EXPECT_NE(message.find(" per rank <- this run"), std::string::npos) << message;
    if (comm->world_size() != 3) {
      EXPECT_NE(message.find(this_run + "128.00 KiB per rank <- this run"), std::string::npos)
          << message;
    }
    EXPECT_NE(message.find("(fits)"), std::string::npos)
        << "more ranks at stage 3 fit, buffers included: " << message;
  }
}

// Two units of one 8-element parameter each, "w" and "v".
std::vector<ParamDecl> two_units() {
  return {ParamDecl{ParamSpec{"w", {8}, 0}, ParamInit{}},
          ParamDecl{ParamSpec{"v", {8}, 1}, ParamInit{}}};
}

EngineConfig stage3() {
  EngineConfig config;
  config.stage = 3;
  return config;
}

TEST(Engine, PrimitivesRejectMisuse) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  Engine engine(*comm, two_units(), stage3());
  EXPECT_THROW(engine.param(0), Error);   // not gathered
  EXPECT_THROW(engine.gather(2), Error);  // no such unit
  EXPECT_THROW(engine.step(), Error);     // no backward yet
  engine.gather(0);
  EXPECT_NE(engine.param(0), nullptr);
  engine.grads_ready(0);
  EXPECT_THROW(engine.grads_ready(0), Error);  // once per micro-batch
  engine.release(0);
  engine.grads_ready(1);
  engine.gather(1);
  EXPECT_THROW(engine.step(), Error);  // unit 1 still gathered
  engine.release(1);
  StepStats stats = engine.step();
  EXPECT_EQ(stats.step, 1);
  EXPECT_EQ(stats.grad_norm, 0.0f);
}

// In bf16 with fp32 accumulation at stages 0-1, a unit's first micro-batch is copied into its
// fp32 accumulator rather than added to a zeroed one; a unit whose backward asked for no
// gradient (grads_ready without grad) still reduces 0, not the last step's sum.
TEST(Engine, AUnitWithoutGradientAfterAStepWithOneReducesZero) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (int stage : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage);
    EngineConfig config;
    config.stage = stage;
    config.precision.dtype = DType::kBFloat16;
    Engine engine(*comm, two_units(), config);
    for (int p : {0, 1}) {
      uint16_t* g = static_cast<uint16_t*>(engine.grad(p));
      for (int i = 0; i < 8; ++i) g[i] = float_to_bf16(1.0f);
      engine.grads_ready(p);
    }
    EXPECT_GT(engine.step().grad_norm, 0.0f);
    engine.grads_ready(0);
    engine.grads_ready(1);
    EXPECT_EQ(engine.step().grad_norm, 0.0f);
  }
  // With two micro-batches: a step with a gradient of 1 in each, then one whose first
  // micro-batch has none: the second step's sum is half the first's.
  for (int stage : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "stage " << stage << ", 2 micro-batches");
    EngineConfig config;
    config.stage = stage;
    config.precision.dtype = DType::kBFloat16;
    config.micro_batches = 2;
    Engine engine(*comm, two_units(), config);
    const auto micro_batch = [&](bool with_gradient) {
      for (int p : {0, 1}) {
        if (with_gradient) {
          uint16_t* g = static_cast<uint16_t*>(engine.grad(p));
          for (int i = 0; i < 8; ++i) g[i] = float_to_bf16(1.0f);
        }
        engine.grads_ready(p);
      }
    };
    micro_batch(true);
    micro_batch(true);
    const float full = engine.step().grad_norm;
    micro_batch(false);
    micro_batch(true);
    EXPECT_EQ(engine.step().grad_norm, 0.5f * full);
  }
}

// A stage-3 unit prefetched when a state load comes (a model wrapped, then its weights loaded)
// stays gathered with the loaded values; its release gives the buffer back.
TEST(Engine, StateLoadedRefreshesAPrefetchedStage3Unit) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  Engine engine(*comm, two_units(), stage3());
  engine.prefetch(0);
  const Engine::StateView view = engine.state_view(0);
  for (size_t i = view.begin; i < view.end; ++i) view.master[i - view.begin] = float(i);
  engine.state_loaded();
  EXPECT_TRUE(engine.is_gathered(0));
  EXPECT_EQ(engine.live_elements(), engine.layout().units()[0].numel);
  engine.gather(0);
  const float* w = static_cast<const float*>(engine.param(0));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(w[i], float(i)) << "element " << i;
  engine.release(0);
  EXPECT_EQ(engine.live_elements(), 0u);
}

}  // namespace
// The communicator reads and writes the engine's buffers: it must work on the memory they are in.
TEST(Engine, ACudaEngineOnAHostCommunicatorIsAnError) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config;
  config.device = Device::cuda(0);
  testing::expect_error_naming(
      [&] {
        Engine engine(*comm, {ParamDecl{ParamSpec{"w", {8}, 0}, ParamInit{}}}, config);
      },
      "the engine runs on cuda:0 but its communicator works on host memory (MPI); use "
      "make_nccl_communicator() for a CUDA device");
}

}  // namespace zero
