// The engine on several ranks: every stage against every other (and against one rank, where
// nothing is sharded), the memory and communication the ZeRO paper's formulas predict, the
// joins between the streams, gradient accumulation, and the edge cases of the layout.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "examples/mlp.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/kernels/check.h"
#include "zero/runtime/model.h"

namespace zero {
namespace {

using examples::MlpConfig;

struct TrainResult {
  std::vector<float> losses;
  std::vector<float> grad_norms;
  std::vector<uint64_t> comm_bytes;  // per step, this rank
  uint64_t model_state_bytes = 0;
  size_t padded_params = 0;
  std::vector<std::vector<float>> final_params;
};

struct RunOptions {
  int stage = 0;
  int micro_batches = 1;
  int steps = 20;
  long global_batch = 24;
  long comm_delay_us = 0;
  MlpConfig mlp{8, 24, 4, 3};
  size_t merge_bytes = 0;
  float clip = 0.0f;
};

// Trains the example MLP and records what the tests compare. The loss of a step is the mean
// over the global batch (all ranks, all micro-batches), like zero-train's.
TrainResult train(const RunOptions& o) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int world = comm->world_size();
  const long per_micro = o.global_batch / (world * o.micro_batches);
  EngineConfig config;
  config.stage = o.stage;
  config.micro_batches = o.micro_batches;
  config.optimizer.lr = 1e-2f;
  config.merge_bytes = o.merge_bytes;
  config.gradient_clipping = o.clip;
  config.seed = 7;
  if (o.comm_delay_us > 0) {
    comm->stream().set_delay_for_testing(std::chrono::microseconds(o.comm_delay_us));
  }
  TrainResult run;
  {
    ZeroModel model(*comm, examples::make_mlp(o.mlp), config);
    examples::TeacherTask task(o.mlp, 7);
    run.model_state_bytes = model.engine().model_state_bytes();
    run.padded_params = model.engine().layout().padded_numel();
    for (int step = 1; step <= o.steps; ++step) {
      const uint64_t before = comm->counters().total_bytes();
      float loss_sum = 0.0f;
      for (int k = 0; k < o.micro_batches; ++k) {
        const int64_t first = (static_cast<int64_t>(k) * world + comm->rank()) * per_micro;
        examples::Batch batch = task.batch(step, first, per_micro);
        Tensor grad;
        loss_sum += examples::mse_loss(model.forward(batch.inputs), batch.targets, grad);
        model.backward(grad);
      }
      run.grad_norms.push_back(model.step().grad_norm);
      run.comm_bytes.push_back(comm->counters().total_bytes() - before);
      float total = 0.0f;
      comm->all_reduce_sync(&loss_sum, &total, 1, DType::kFloat32);
      run.losses.push_back(total / static_cast<float>(world * o.micro_batches));
    }
    run.final_params = model.engine().gather_full_params();
  }
  return run;
}

int world_size() {
  return make_mpi_communicator()->world_size();
}

// |a - b| <= rel * max(|a|, |b|) + floor: the floor covers values near zero, where a reduction
// summed in another order moves the last bits of a tiny number by a large relative amount.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel,
                  const std::string& what, double floor = 1e-12) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tolerance = rel * std::max(std::fabs(a[i]), std::fabs(b[i])) + floor;
    EXPECT_NEAR(a[i], b[i], tolerance) << what << " at index " << i;
  }
}

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

TEST(Engine, CommunicationVolumeMatchesTheStageTable) {
  if (world_size() < 2) GTEST_SKIP() << "one rank communicates nothing";
  std::vector<double> per_step(4);
  for (int stage = 0; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    o.steps = 3;
    const TrainResult run = train(o);
    EXPECT_EQ(run.comm_bytes[1], run.comm_bytes[2]) << "stage " << stage;
    per_step[stage] = static_cast<double>(run.comm_bytes[2]);
  }
  EXPECT_GT(per_step[0], 0.0);
  EXPECT_NEAR(per_step[1] / per_step[0], 1.0, 0.01);
  EXPECT_NEAR(per_step[2] / per_step[0], 1.0, 0.01);
  EXPECT_NEAR(per_step[3] / per_step[0], 1.5, 0.015);
}

// Plain training without the engine: the whole global batch on one process, parameters in
// their own arrays, the same initial values and the same AdamW. What every stage must match.
TrainResult train_unsharded(const RunOptions& o) {
  std::vector<NamedModule> modules = examples::make_mlp(o.mlp);
  struct Param {
    std::vector<int64_t> shape;
    std::vector<float> value, grad, m, v;
  };
  std::vector<std::vector<Param>> params(modules.size());
  uint64_t index = 0;
  for (size_t l = 0; l < modules.size(); ++l) {
    for (const ParamDecl& d : modules[l].module->parameters()) {
      size_t n = 1;
      for (int64_t dim : d.spec.shape) n *= static_cast<size_t>(dim);
      Param p{d.spec.shape, std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
              std::vector<float>(n)};
      for (size_t e = 0; e < n; ++e) p.value[e] = init_value(7, index, e, d.init);
      params[l].push_back(std::move(p));
      ++index;
    }
  }
  auto refs = [&](size_t l, bool grads) {
    std::vector<ParamRef> out;
    for (Param& p : params[l]) {
      out.push_back(ParamRef{grads ? p.grad.data() : p.value.data(), &p.shape, p.value.size()});
    }
    return out;
  };
  OptimizerConfig opt;
  opt.lr = 1e-2f;
  Optimizer optimizer(opt);
  examples::TeacherTask task(o.mlp, 7);
  TrainResult result;
  for (int step = 1; step <= o.steps; ++step) {
    examples::Batch batch = task.batch(step, 0, o.global_batch);
    Tensor x = batch.inputs;
    for (size_t l = 0; l < modules.size(); ++l) {
      Tensor y;
      modules[l].module->forward(x, y, refs(l, false));
      x = std::move(y);
    }
    Tensor grad;
    result.losses.push_back(examples::mse_loss(x, batch.targets, grad));
    for (size_t l = modules.size(); l-- > 0;) {
      for (Param& p : params[l]) std::fill(p.grad.begin(), p.grad.end(), 0.0f);
      Tensor grad_in;
      modules[l].module->backward(grad, grad_in, refs(l, false), refs(l, true));
      grad = std::move(grad_in);
    }
    double sum_squares = 0.0;
    for (auto& layer : params) {
      for (Param& p : layer) {
        for (float g : p.grad) sum_squares += static_cast<double>(g) * g;
      }
    }
    result.grad_norms.push_back(static_cast<float>(std::sqrt(sum_squares)));
    optimizer.begin_step(opt.lr);
    for (auto& layer : params) {
      for (Param& p : layer) {
        ShardState shard{p.value.data(), {p.m.data(), p.v.data()}, p.value.size()};
        optimizer.apply(shard, p.grad.data(), DType::kFloat32, 1.0f, nullptr, DType::kFloat32);
      }
    }
  }
  return result;
}

TEST(Engine, EveryStageMatchesUnshardedTraining) {
  RunOptions o;
  o.steps = 10;
  const TrainResult reference = train_unsharded(o);
  EXPECT_LT(reference.losses.back(), reference.losses.front());
  for (int stage = 0; stage <= 3; ++stage) {
    o.stage = stage;
    const TrainResult run = train(o);
    const std::string what = "stage " + std::to_string(stage);
    expect_close(run.losses, reference.losses, 1e-4, what + " losses");
    expect_close(run.grad_norms, reference.grad_norms, 1e-4, what + " gradient norms");
  }
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
  expect_close(accumulated.losses, reference.losses, 1e-4, "delayed stage 3, two micro-batches");
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
    out = Tensor(in.shape);
    for (size_t i = 0; i < in.numel(); ++i) {
      const size_t j = i % width_;
      out.data[i] = p[1].data[0] * in.data[i] * p[2].data[j] + p[3].data[j];
    }
  }
  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>& p,
                const std::vector<ParamRef>& g) override {
    grad_in = Tensor(grad_out.shape);
    for (size_t i = 0; i < grad_out.numel(); ++i) {
      const size_t j = i % width_;
      const float go = grad_out.data[i];
      g[1].data[0] += go * input_.data[i] * p[2].data[j];
      g[2].data[j] += go * p[1].data[0] * input_.data[i];
      g[3].data[j] += go;
      grad_in.data[i] = go * p[1].data[0] * p[2].data[j];
    }
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
    out = in;
    for (float& v : out.data) v += p[0].data[0];
  }
  void backward(const Tensor& grad_out, Tensor& grad_in, const std::vector<ParamRef>&,
                const std::vector<ParamRef>& g) override {
    for (float v : grad_out.data) g[0].data[0] += v;
    grad_in = grad_out;
  }
};

std::vector<float> train_awkward(int stage) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<NamedModule> modules;
  modules.push_back({"bias_in", std::make_unique<Bias1>()});
  modules.push_back({"mlp0", std::make_unique<examples::Linear>(4, 300, true)});
  modules.push_back({"awkward", std::make_unique<Awkward>(300)});
  modules.push_back({"mlp1", std::make_unique<examples::Linear>(300, 4, false)});
  modules.push_back({"bias_out", std::make_unique<Bias1>()});
  EngineConfig config;
  config.stage = stage;
  config.merge_bytes = 1024;  // the 300-wide weights are each larger than this
  config.optimizer.lr = 1e-2f;
  ZeroModel model(*comm, std::move(modules), config);
  const Layout& layout = model.engine().layout();
  EXPECT_EQ(layout.units().size(), 5u);
  for (const Unit& u : layout.units()) EXPECT_EQ(u.numel % (16 * comm->world_size()), 0u);

  MlpConfig task_shape{4, 8, 4, 2};
  examples::TeacherTask task(task_shape, 3);
  std::vector<float> losses;
  const int world = comm->world_size();
  const long per_rank = 12 / world;
  for (int step = 1; step <= 8; ++step) {
    examples::Batch batch = task.batch(step, comm->rank() * per_rank, per_rank);
    Tensor grad;
    float loss = examples::mse_loss(model.forward(batch.inputs), batch.targets, grad);
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

TEST(Engine, PrimitivesRejectMisuse) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<ParamDecl> params = {ParamDecl{ParamSpec{"w", {8}, 0}, ParamInit{}},
                                   ParamDecl{ParamSpec{"v", {8}, 1}, ParamInit{}}};
  EngineConfig config;
  config.stage = 3;
  Engine engine(*comm, params, config);
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

}  // namespace
}  // namespace zero
