// The module API's features for GPT-2 on every stage, at 1-4 ranks, against unsharded training
// in double (model_features_util.h): a parameter tied into a later module, weight-decay groups,
// and a frozen module; the scheduling options that touch the gradient buffers (micro-batches,
// overlap_comm off, reduce_bucket_size packing, sub-groups, merging, persistence) and 16-bit
// precision; checkpoints with frozen values; and the declaration errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/expect_error.h"
#include "tests/runtime/checkpoint_util.h"
#include "tests/runtime/model_features_util.h"
#include "tests/runtime/train_util.h"
#include "zero/runtime/checkpoint.h"

namespace zero {
namespace {

using namespace zero::testing::features;
using zero::testing::expect_close;
using zero::testing::expect_error_naming;

FeatureRun run_at(int stage, int steps, std::function<void(EngineConfig&)> tweak = nullptr) {
  FeatureRun run;
  run.stage = stage;
  run.steps = steps;
  run.tweak = std::move(tweak);
  return run;
}

// Scheduling options that must not change the numbers, each with the name a failure shows.
std::vector<std::pair<std::string, FeatureRun>> schedules() {
  std::vector<std::pair<std::string, FeatureRun>> cases;
  cases.emplace_back("plain", FeatureRun{});
  FeatureRun accumulated;
  accumulated.micro_batches = 2;
  accumulated.clip = 0.05f;
  cases.emplace_back("two micro-batches, clipping", accumulated);
  FeatureRun packed = accumulated;
  packed.tweak = [](EngineConfig& c) {
    c.schedule.overlap_comm = false;
    c.schedule.reduce_bucket_elements = 1 << 20;
  };
  cases.emplace_back("two micro-batches, overlap_comm off, reduce buckets packed", packed);
  FeatureRun merged;
  merged.tweak = [](EngineConfig& c) {
    c.schedule.merge_bytes = 1 << 16;
    c.schedule.optimizer_sub_group_elements = 7;
    c.schedule.persistence_threshold = 11;
  };
  cases.emplace_back("merged units, sub-groups of 7, persistent 1-D parameters", merged);
  FeatureRun prefetching = accumulated;
  prefetching.tweak = [](EngineConfig& c) {
    c.schedule.prefetch_elements = 1 << 20;
    c.schedule.max_live_elements = 1;
    c.schedule.max_reuse_distance = 1 << 20;
  };
  cases.emplace_back("two micro-batches, deep prefetch, live budget 1, reuse", prefetching);
  return cases;
}

void expect_matches(const Result& run, const Result& reference, const std::string& what,
                    double rel = 1e-4, double param_rel = 1e-5, double floor = 1e-6) {
  expect_close(run.losses, reference.losses, rel, what + " losses");
  expect_close(run.grad_norms, reference.grad_norms, rel, what + " gradient norms");
  ASSERT_EQ(run.final_params.size(), reference.final_params.size()) << what;
  for (size_t p = 0; p < run.final_params.size(); ++p) {
    expect_close(run.final_params[p], reference.final_params[p], param_rel,
                 what + ", " + declarations()[p].name, floor);
  }
}

// Every stage and schedule against the reference.
void expect_every_stage_matches(const Net& net) {
  for (const auto& [name, schedule] : schedules()) {
    const Result reference = train_reference(net, schedule);
    EXPECT_LT(reference.losses.back(), reference.losses.front()) << name;
    for (int stage = 0; stage <= 3; ++stage) {
      FeatureRun run = schedule;
      run.stage = stage;
      expect_matches(train(net, run), reference, name + ", stage " + std::to_string(stage));
    }
  }
}

TEST(ModelFeatures, UnnamedModuleRegistersWithoutPrefix) {
  const Result run = train(Net{}, run_at(0, 1));
  const std::vector<std::string> expected = {"wte.weight", "wpe.bias", "h.0.w", "h.0.b",
                                             "h.1.w",      "h.1.b",    "head.b"};
  EXPECT_EQ(run.names, expected);
}

// The head adds its gradient of wte.weight before the embedding's backward: the two must sum
// into the one parameter at every stage, however the buffers are scheduled.
TEST(ModelFeatures, TiedParameterMatchesUnshardedTraining) {
  expect_every_stage_matches(Net{});
}

TEST(ModelFeatures, WeightDecayGroupsMatchUnshardedTraining) {
  Net groups;
  groups.no_decay = 0.0f;  // PyTorch's GPT-2 groups: 1-D tensors are not decayed
  for (const auto& [name, schedule] : schedules()) {
    FeatureRun run = schedule;
    run.weight_decay = 0.5f;  // large enough that the groups differ visibly
    const Result reference = train_reference(groups, run);
    const Result decay_all = train_reference(Net{}, run);
    EXPECT_NE(reference.final_params[1], decay_all.final_params[1]) << name;
    for (int stage = 0; stage <= 3; ++stage) {
      run.stage = stage;
      expect_matches(train(groups, run), reference, name + ", stage " + std::to_string(stage));
    }
  }
}

TEST(ModelFeatures, FrozenModuleMatchesUnshardedTraining) {
  Net frozen;
  frozen.freeze_h1 = true;
  const std::vector<Decl> decls = declarations();
  for (const auto& [name, schedule] : schedules()) {
    const Result reference = train_reference(frozen, schedule);
    for (int stage = 0; stage <= 3; ++stage) {
      FeatureRun run = schedule;
      run.stage = stage;
      const std::string what = name + ", stage " + std::to_string(stage);
      const Result result = train(frozen, run);
      expect_matches(result, reference, what);
      EXPECT_TRUE(result.frozen_grads_null) << what << ": the frozen module got gradients";
      // Never updated: still exactly the initial values, weight decay included.
      for (size_t p : {4u, 5u}) {
        for (size_t e = 0; e < result.final_params[p].size(); ++e) {
          ASSERT_EQ(result.final_params[p][e],
                    init_value(5, p, e, ParamInit{InitKind::kUniform, decls[p].scale}))
              << what << ", " << decls[p].name << " element " << e;
        }
      }
      // No gradient, master or optimizer state: less model state, as the plan says. (Merged,
      // the frozen unit's own padding can outweigh that on a model this small.)
      EXPECT_EQ(result.model_state_bytes, result.plan.model_state) << what;
      if (!run.tweak) {
        EXPECT_LT(result.model_state_bytes, train(Net{}, run_at(stage, 1)).model_state_bytes)
            << what;
      }
    }
  }
}

// merge_bytes never puts a frozen module into a trainable unit: h.1 stays a unit of its own
// between the merged trainable ones.
TEST(ModelFeatures, FrozenModulesNeverMergeWithTrainableOnes) {
  Net frozen;
  frozen.freeze_h1 = true;
  const FeatureRun run = run_at(3, 1, [](EngineConfig& c) { c.schedule.merge_bytes = 1 << 16; });
  EXPECT_EQ(train(Net{}, run).units, 1u);
  EXPECT_EQ(train(frozen, run).units, 3u);
}

// All three at once in bf16 (fp32 and bf16 accumulation) and fp16, where gradients go through
// 16-bit buckets and accumulators: within 16-bit rounding of the reference.
TEST(ModelFeatures, AllFeaturesIn16BitPrecision) {
  Net net;
  net.freeze_h1 = true;
  net.no_decay = 0.0f;
  FeatureRun base;
  base.micro_batches = 2;
  base.weight_decay = 0.5f;
  const Result reference = train_reference(net, base);
  const std::vector<std::pair<std::string, std::function<void(EngineConfig&)>>> precisions = {
      {"bf16, fp32 accumulation", [](EngineConfig& c) { c.precision.dtype = DType::kBFloat16; }},
      {"bf16, bf16 accumulation",
       [](EngineConfig& c) {
         c.precision.dtype = DType::kBFloat16;
         c.precision.grad_accum_dtype = DType::kBFloat16;
       }},
      {"fp16, packed reduce buckets", [](EngineConfig& c) {
         c.precision.dtype = DType::kFloat16;
         c.precision.loss_scaler.initial_scale_power = 8;
         c.schedule.reduce_bucket_elements = 1 << 20;
       }}};
  for (const auto& [name, precision] : precisions) {
    for (int stage = 0; stage <= 3; ++stage) {
      FeatureRun run = base;
      run.stage = stage;
      run.tweak = precision;
      const std::string what = name + ", stage " + std::to_string(stage);
      const Result result = train(net, run);
      expect_matches(result, reference, what, 3e-2, 3e-2, 3e-3);
      EXPECT_TRUE(result.frozen_grads_null) << what;
      EXPECT_EQ(result.model_state_bytes, result.plan.model_state) << what;
    }
  }
}

// A checkpoint saves the frozen values and a load restores them: the resumed run starts from a
// model initialized with another seed, so a frozen value left out would show.
TEST(ModelFeatures, CheckpointsSaveAndRestoreFrozenValues) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  Net net;
  net.freeze_h1 = true;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage : {1, 3}) {
      const std::string dir = zero::testing::shared_temp_dir(*comm);
      const std::string what = std::string(dtype_name(dtype)) + ", stage " + std::to_string(stage);
      FeatureRun run = run_at(stage, 4, [dtype](EngineConfig& c) { c.precision.dtype = dtype; });
      run.after_step = [&](ZeroModel& model, int step) {
        if (step == 2) save_checkpoint(model.engine(), dir, TrainerState{step, 5});
      };
      const Result whole = train(net, run);
      FeatureRun resumed = run;
      resumed.first_step = 3;
      resumed.after_step = nullptr;
      resumed.before = [&](ZeroModel& model) { load_checkpoint(model.engine(), dir, nullptr); };
      const Result second = train(net, resumed, /*seed=*/99);
      EXPECT_EQ(second.final_params, whole.final_params) << what;
      if (comm->rank() == 0) std::filesystem::remove_all(dir);
    }
  }
}

// y = x + b: backward's gradients (db = the column sums of gy, dx = gy) need no value of b, and
// the module can say so.
// The units `engine` holds gathered (or being gathered) now, in order.
std::vector<int> gathered_units(const Engine& engine) {
  std::vector<int> units;
  for (int u = 0; u < static_cast<int>(engine.layout().units().size()); ++u) {
    if (engine.is_gathered(u)) units.push_back(u);
  }
  return units;
}

// The all-gathers the engine's communicator has run.
uint64_t all_gather_calls(Engine& engine) {
  return engine.communicator().counters().calls[static_cast<size_t>(CollectiveOp::kAllGather)];
}

class Shift : public Module {
 public:
  explicit Shift(bool reads) : reads_(reads) {}
  std::vector<ParamDecl> parameters() const override {
    return {ParamDecl{ParamSpec{"b", {kD}, 0}, ParamInit{InitKind::kUniform, 0.2f}}};
  }
  void forward(const Tensor& x, Tensor& y, const std::vector<ParamRef>& p) override {
    Tensor scratch;
    const float* b = p[0].as_f32(scratch);
    y = Tensor(x.shape());
    for (size_t i = 0; i < x.numel(); ++i) y.data()[i] = x.data()[i] + b[i % kD];
  }
  void backward(const Tensor& gy, Tensor& gx, const std::vector<ParamRef>& p,
                const std::vector<ParamRef>& g) override {
    saw_values = p[0].data != nullptr;
    std::vector<float> db(kD, 0.0f);
    for (size_t i = 0; i < gy.numel(); ++i) db[i % kD] += gy.data()[i];
    g[0].add_f32(db.data());
    gx = gy;
  }
  bool backward_reads_params() const override { return reads_; }
  bool saw_values = false;

 private:
  bool reads_;
};

struct ShiftRun {
  std::vector<std::vector<float>> final_params;
  uint64_t all_gathers = 0;  // on the engine's communicator, over the steps after the first
  bool backward_saw_values = false;
};

ShiftRun train_shifted(int stage, bool shift_reads) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<NamedModule> modules;
  auto shift = std::make_unique<Shift>(shift_reads);
  const Shift* shift_module = shift.get();
  modules.push_back({"shift", std::move(shift)});
  const Net net;
  const std::vector<ParamDecl> dense = {declare(Decl{"w", {kD, kD}, 0.3f}, "w", net, true),
                                        declare(Decl{"b", {kD}, 0.1f}, "b", net, true)};
  // Two units after the shift: backward keeps the last two gathered from forward.
  modules.push_back({"h", std::make_unique<Dense>(dense, kD, kD, true)});
  modules.push_back({"g", std::make_unique<Dense>(dense, kD, kD, true)});
  EngineConfig config;
  config.stage = stage;
  ZeroModel model(*comm, std::move(modules), config);
  const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
  const auto all_gathers = [&model] { return all_gather_calls(model.engine()); };
  ShiftRun run;
  uint64_t after_first = 0;
  for (int step = 1; step <= 3; ++step) {
    const int64_t first = comm->rank() * 4;
    const Tensor out = model.forward(Tensor({4, kD}, inputs(step, first, 4), device)).to(nullptr);
    const std::vector<float> t = targets(step, first, 4);
    std::vector<float> grad(t.size());
    for (size_t i = 0; i < t.size(); ++i) grad[i] = out.data()[i] - t[i];
    model.backward(Tensor({4, kD}, grad, device));
    model.step();
    if (step == 1) after_first = all_gathers();
  }
  run.all_gathers = all_gathers() - after_first;
  run.backward_saw_values = shift_module->saw_values;
  run.final_params = model.engine().gather_full_params();
  return run;
}

// Stage 3 does not gather a unit again for a backward that says it reads none of its
// parameters (the GPT-2's embedding): one all-gather fewer per step, the same numbers.
TEST(ModelFeatures, BackwardThatReadsNoParametersIsNotGatheredAtStageThree) {
  const ShiftRun reads = train_shifted(3, true);
  const ShiftRun skips = train_shifted(3, false);
  EXPECT_EQ(skips.final_params, reads.final_params);
  EXPECT_TRUE(reads.backward_saw_values);
  EXPECT_FALSE(skips.backward_saw_values);
  if (zero::testing::world_size() > 1) {
    EXPECT_EQ(skips.all_gathers + 2, reads.all_gathers) << "two steps, one gather fewer in each";
  }
  // Other stages keep every parameter whole: backward sees the values either way.
  EXPECT_TRUE(train_shifted(2, false).backward_saw_values);
}

// y = x + c + the tied b of an earlier Shift: a head that ties to the embedding, as the
// GPT-2's does.
class TiedHead : public Module {
 public:
  std::vector<ParamDecl> parameters() const override {
    return {ParamDecl{ParamSpec{"c", {kD}, 0}, ParamInit{InitKind::kUniform, 0.2f}}};
  }
  std::vector<std::string> tied_parameters() const override { return {"shift.b"}; }
  void forward(const Tensor& x, Tensor& y, const std::vector<ParamRef>& p) override {
    Tensor s0, s1;
    const float* c = p[0].as_f32(s0);
    const float* b = p[1].as_f32(s1);
    y = Tensor(x.shape());
    for (size_t i = 0; i < x.numel(); ++i) y.data()[i] = x.data()[i] + c[i % kD] + b[i % kD];
  }
  void backward(const Tensor& gy, Tensor& gx, const std::vector<ParamRef>&,
                const std::vector<ParamRef>& g) override {
    std::vector<float> sums(kD, 0.0f);
    for (size_t i = 0; i < gy.numel(); ++i) sums[i % kD] += gy.data()[i];
    g[0].add_f32(sums.data());
    g[1].add_f32(sums.data());
    gx = gy;
  }
};

// Records whether a unit is gathered (or being gathered) when its forward runs.
class GatherProbe : public Shift {
 public:
  GatherProbe() : Shift(true) {}
  void forward(const Tensor& x, Tensor& y, const std::vector<ParamRef>& p) override {
    if (model != nullptr) watched_was_gathered = model->engine().is_gathered(watched);
    Shift::forward(x, y, p);
  }
  ZeroModel* model = nullptr;
  int watched = -1;
  bool watched_was_gathered = false;
};

// Stage 3 starts gathering a tied unit together with the unit that ties to it: during the
// forward before the head (its prefetch), and at the end of forward for the head's backward,
// not when the head is reached. The one tying unit gives it back afterwards.
TEST(ModelFeatures, StageThreePrefetchesTiedUnitsWithTheUnitThatTiesThem) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<NamedModule> modules;
  modules.push_back({"shift", std::make_unique<Shift>(true)});
  auto probe = std::make_unique<GatherProbe>();
  GatherProbe* probe_module = probe.get();
  modules.push_back({"probe", std::move(probe)});
  modules.push_back({"head", std::make_unique<TiedHead>()});
  EngineConfig config;
  config.stage = 3;
  ZeroModel model(*comm, std::move(modules), config);
  const int tied = model.engine().layout().params()[0].unit;  // shift.b's
  probe_module->model = &model;
  probe_module->watched = tied;
  const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
  const Tensor out = model.forward(Tensor({4, kD}, inputs(1, 0, 4), device));
  EXPECT_TRUE(probe_module->watched_was_gathered) << "the head's tied unit was not prefetched";
  EXPECT_TRUE(model.engine().is_gathered(tied)) << "not prefetched for the head's backward";
  model.backward(Tensor({4, kD}, std::vector<float>(4 * kD, 0.1f), device));
  EXPECT_FALSE(model.engine().is_gathered(tied)) << "the tied unit was never given back";
  model.step();
}

// Backward starts with what forward ended with: stage 3 keeps the last unit and what the last
// module ties to gathered from forward into backward, and the unit backward prefetches first
// when it is gathered at that point anyway, instead of releasing them and gathering them again.
// A forward that no backward follows (a validation batch) gives them back at the next forward.
// All-gathers per step, with the previous step's prefetch of the first unit: a chain of four
// units gathers units 1-3 in forward, 1 and 0 in backward, and 0 after the step; with the
// last module tied to the first unit and two buffers planned, forward gathers units 1, 2, the
// tie and the head, backward 2, 1 and 0 (the tie, given back after the head's backward).
TEST(ModelFeatures, StageThreeKeepsWhatBackwardStartsWithGatheredFromForward) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "the last module ties to the first unit" : "a chain of four units");
    std::unique_ptr<Communicator> comm = make_mpi_communicator();
    std::vector<NamedModule> modules;
    for (const char* name : {"shift", "a", "b", "c"}) {
      if (tied && std::string(name) == "c") {
        modules.push_back({"head", std::make_unique<TiedHead>()});
      } else {
        modules.push_back({name, std::make_unique<Shift>(true)});
      }
    }
    EngineConfig config;
    config.stage = 3;
    ZeroModel model(*comm, std::move(modules), config);
    Engine& engine = model.engine();
    const auto gathered = [&] { return gathered_units(engine); };
    const auto all_gathers = [&] { return all_gather_calls(engine); };
    const std::shared_ptr<DeviceContext>& device = engine.device_context();
    const Tensor input({4, kD}, inputs(1, 0, 4), device);
    model.forward(input);  // no backward follows
    for (int step = 1; step <= 2; ++step) {
      const uint64_t before = all_gathers();
      model.forward(input);
      EXPECT_EQ(gathered(), tied ? std::vector<int>({0, 3}) : std::vector<int>({2, 3}))
          << "after forward, step " << step;
      model.backward(Tensor({4, kD}, std::vector<float>(4 * kD, 0.1f), device));
      EXPECT_EQ(gathered(), std::vector<int>{}) << "after backward, step " << step;
      model.step();
      EXPECT_EQ(gathered(), std::vector<int>{0}) << "after step " << step;
      if (step == 2 && zero::testing::world_size() > 1) {
        EXPECT_EQ(all_gathers() - before, tied ? 8u : 6u);
      }
    }
  }
}

// Model chunks at stage 3, regathering (an interleaved pipeline stage with --pp-regather): a
// chunk's forward gathers its own units only, prefetching none of the next chunk's (their
// forward comes after other micro-batches' work), and gives all of them back at its end,
// keeping none for its backward and starting none of its gathers; so does its backward. Holding
// through the step keeps what was gathered.
TEST(ModelFeatures, StageThreeGathersEachChunkWithinItsOwnForwardAndBackward) {
  for (bool hold : {false, true}) {
    SCOPED_TRACE(hold ? "held through the step" : "regathered");
    std::unique_ptr<Communicator> comm = make_mpi_communicator();
    std::vector<NamedModule> modules;
    for (const char* name : {"a", "b", "c", "d"}) {
      modules.push_back({name, std::make_unique<Shift>(true)});
    }
    EngineConfig config;
    config.stage = 3;
    config.schedule.prefetch_elements = 1 << 20;  // every unit fits: only the edge stops it
    config.schedule.max_reuse_distance = 1 << 20;
    config.grid.pipeline.hold_gathered = hold;
    ZeroModel model(*comm, std::move(modules), config, {0, 2});
    const Engine& engine = model.engine();
    const auto gathered = [&] { return gathered_units(engine); };
    const std::shared_ptr<DeviceContext>& device = engine.device_context();
    const Tensor out = model.forward(Tensor({4, kD}, inputs(1, 0, 4), device), 0);
    EXPECT_EQ(gathered(), hold ? std::vector<int>({0, 1}) : std::vector<int>{});
    model.forward(out, 1);
    EXPECT_EQ(gathered(), hold ? std::vector<int>({0, 1, 2, 3}) : std::vector<int>{});
    const std::vector<float> ones(4 * kD, 0.1f);
    const Tensor grad = model.backward(Tensor({4, kD}, ones, device), 1);
    EXPECT_EQ(gathered(), hold ? std::vector<int>({0, 1, 2, 3}) : std::vector<int>{});
    model.backward(grad, 0);
    model.step();
  }
}

class Plain : public Module {
 public:
  Plain(std::vector<ParamDecl> params, std::vector<std::string> tied)
      : params_(std::move(params)), tied_(std::move(tied)) {}
  std::vector<ParamDecl> parameters() const override { return params_; }
  std::vector<std::string> tied_parameters() const override { return tied_; }
  void forward(const Tensor& in, Tensor& out, const std::vector<ParamRef>&) override { out = in; }
  void backward(const Tensor& g, Tensor& gin, const std::vector<ParamRef>&,
                const std::vector<ParamRef>&) override {
    gin = g;
  }

 private:
  std::vector<ParamDecl> params_;
  std::vector<std::string> tied_;
};

ParamDecl param(const std::string& name, bool trainable = true) {
  ParamDecl d{ParamSpec{name, {4}, 0}, ParamInit{}};
  d.trainable = trainable;
  return d;
}

void expect_model_error(std::vector<std::pair<std::string, Plain>> specs, const std::string& needle,
                        std::vector<int> chunk_first_modules = {}) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::vector<NamedModule> modules;
  for (auto& [name, module] : specs) {
    modules.push_back({name, std::make_unique<Plain>(std::move(module))});
  }
  expect_error_naming(
      [&] { ZeroModel model(*comm, std::move(modules), EngineConfig{}, chunk_first_modules); },
      needle);
}

TEST(ModelFeatures, BadDeclarationsAreNamedErrors) {
  using Specs = std::vector<std::pair<std::string, Plain>>;
  const auto specs = [](Plain first, Plain second) {
    Specs s;
    s.emplace_back("", std::move(first));
    s.emplace_back("head", std::move(second));
    return s;
  };
  expect_model_error(specs(Plain({param("wte.weight")}, {}), Plain({}, {"wte.wieght"})),
                     "module #1 ('head') ties to 'wte.wieght', which no module declares; close "
                     "names: 'wte.weight'");
  expect_model_error(specs(Plain({param("wte.weight")}, {"head.b"}), Plain({param("b")}, {})),
                     "module #0 ('') ties to 'head.b' of module #1 ('head'); a module ties only "
                     "to parameters of earlier modules");
  expect_model_error(specs(Plain({param("w")}, {}), Plain({param("b")}, {"head.b"})),
                     "module #1 ('head') ties to 'head.b' of itself");
  expect_model_error(specs(Plain({param("w")}, {}), Plain({}, {"w", "w"})),
                     "module #1 ('head') ties to 'w' twice");
  expect_model_error(specs(Plain({param("w")}, {}), Plain({param("a"), param("b", false)}, {})),
                     "module #1 ('head') has frozen and trainable parameters: 'head.b' is frozen, "
                     "'head.a' trainable");
  expect_model_error(specs(Plain({param("head.b")}, {}), Plain({param("b")}, {})),
                     "parameter name 'head.b' is registered twice");
  // Model chunks (an interleaved pipeline stage's): each starts at a module, after the one
  // before, and a tie stays within its chunk, whose backward completes the tied gradient.
  expect_model_error(specs(Plain({param("w")}, {}), Plain({param("b")}, {})),
                     "the first model chunk starts at module 0, not 1", {1});
  expect_model_error(specs(Plain({param("w")}, {}), Plain({param("b")}, {})),
                     "model chunk 1 starts at module 2: each chunk starts after the one before, "
                     "at one of the 2 modules",
                     {0, 2});
  expect_model_error(specs(Plain({param("wte.weight")}, {}), Plain({}, {"wte.weight"})),
                     "module #1 ('head') of model chunk 1 ties to 'wte.weight' of module #0 ('') "
                     "in chunk 0; a module ties only to parameters of its own chunk",
                     {0, 1});
}

}  // namespace
}  // namespace zero
