// The optimizer offloaded to host memory (offload_optimizer device cpu), on the CPU path, where
// the same schedule runs as on a GPU with the copies inside host memory: training is bitwise
// the in-memory engine's at stages 1-3 in fp32 and bf16, with sub-groups, packed reductions and
// gradient accumulation, and under every setting around the update (fp16's skipped steps,
// clipping, fp32 and all-reduce reductions, the pre-divide, the persistent unit); the engine's
// memory loses the master and optimizer state and the host
// tier holds them, as the plan says; each gradient shard goes to the host during backward, not
// at the step; checkpoints resume bitwise, into an offloaded engine or an in-memory one; and
// what is not supported is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tests/expect_error.h"
#include "tests/runtime/train_util.h"
#include "zero/runtime/checkpoint.h"

namespace zero {
namespace {

using namespace zero::testing;

void to_host(EngineConfig& c) {
  c.offload.optimizer.device = OffloadDevice::kCpu;
}

TEST(HostOffload, TrainingIsBitwiseInMemoryTraining) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    // fp32 with a pageable master uploads through its pinned copy, bf16 with a pinned master
    // through its working copy: both kinds of memory and both upload paths.
    const bool pin_memory = dtype == DType::kBFloat16;
    for (int stage = 1; stage <= 3; ++stage) {
      for (int micro_batches : {1, 2}) {
        RunOptions o;
        o.stage = stage;
        o.dtype = dtype;
        o.steps = 5;
        o.micro_batches = micro_batches;
        o.weight_decay = 0.05f;
        // 100 elements per sub-group cut units into several pieces; the bucket packs units
        // into one reduction.
        const auto settings = [](EngineConfig& c) {
          c.schedule.optimizer_sub_group_elements = 100;
          c.schedule.reduce_bucket_elements = 2000;
        };
        o.tweak = settings;
        const TrainResult reference = train(o);
        EXPECT_LT(reference.losses.back(), reference.losses.front());
        o.tweak = [&](EngineConfig& c) {
          settings(c);
          to_host(c);
          c.offload.optimizer.pin_memory = pin_memory;
        };
        const std::string what = std::string(dtype_name(dtype)) + " stage " +
                                 std::to_string(stage) + " micro-batches " +
                                 std::to_string(micro_batches);
        expect_bitwise(train(o), reference, what);
      }
    }
  }
}

// What changes the numbers around the update, each against the in-memory engine with the same
// setting: fp16's loss scaler skipping overflowed steps (the update does not run, the state
// stays), clipping, reductions in fp32 and by all-reduce, the pre-divide, a non-finite step
// skipped, and the persistent unit (stage 3's small parameters, reduced at the step, whose
// gradient goes to the host from there).
TEST(HostOffload, EverySettingAroundTheUpdateGivesTheInMemoryTraining) {
  struct Case {
    const char* name;
    int stage;
    DType dtype;
    int micro_batches;
    std::function<void(EngineConfig&)> setting;
    std::function<void(RunOptions&)> options;
  };
  const auto none = [](RunOptions&) {};
  const std::vector<Case> cases = {
      {"fp16 stage 1, loss scaler", 1, DType::kFloat16, 2,
       [](EngineConfig& c) { c.precision.loss_scaler.initial_scale_power = 24; }, none},
      {"fp16 stage 3, loss scaler", 3, DType::kFloat16, 1,
       [](EngineConfig& c) {
         c.precision.loss_scaler.initial_scale_power = 24;
         c.schedule.persistence_threshold = 100;
       },
       none},
      {"bf16 stage 2, clipping", 2, DType::kBFloat16, 1, [](EngineConfig&) {},
       [](RunOptions& o) { o.clip = 0.05f; }},
      {"bf16 stage 3, fp32 reductions packed", 3, DType::kBFloat16, 2,
       [](EngineConfig& c) {
         c.precision.reduce_in_fp32 = true;
         c.schedule.reduce_bucket_elements = 2000;
       },
       none},
      {"fp32 stage 2, all-reduce", 2, DType::kFloat32, 1,
       [](EngineConfig& c) { c.schedule.reduce_scatter = false; }, none},
      {"bf16 stage 2, pre-divide", 2, DType::kBFloat16, 1,
       [](EngineConfig& c) { c.precision.gradient_predivide_factor = 2.0f; }, none},
      {"fp32 stage 1, a non-finite step skipped", 1, DType::kFloat32, 1,
       [](EngineConfig& c) { c.precision.skip_nonfinite_steps = true; },
       [](RunOptions& o) { o.inf_grad_step = 2; }},
      {"bf16 stage 3, persistent unit", 3, DType::kBFloat16, 1,
       [](EngineConfig& c) { c.schedule.persistence_threshold = 100; }, none},
  };
  for (const Case& k : cases) {
    RunOptions o;
    o.stage = k.stage;
    o.dtype = k.dtype;
    o.micro_batches = k.micro_batches;
    o.steps = 5;
    k.options(o);
    o.tweak = k.setting;
    const TrainResult reference = train(o);
    o.tweak = [&](EngineConfig& c) {
      k.setting(c);
      to_host(c);
    };
    const TrainResult run = train(o);
    expect_bitwise(run, reference, k.name);
    EXPECT_EQ(run.skipped, reference.skipped) << k.name;
    // Bit for bit: a skipped step's norm is NaN on both.
    ASSERT_EQ(run.grad_norms.size(), reference.grad_norms.size()) << k.name;
    EXPECT_EQ(std::memcmp(run.grad_norms.data(), reference.grad_norms.data(),
                          run.grad_norms.size() * sizeof(float)),
              0)
        << k.name;
  }
}

// The cases above hold what they name: fp16 skipped a step, and stage 3 made a persistent unit.
TEST(HostOffload, TheCasesExerciseWhatTheyName) {
  RunOptions o;
  o.stage = 1;
  o.dtype = DType::kFloat16;
  o.micro_batches = 2;
  o.steps = 5;
  o.tweak = [](EngineConfig& c) {
    c.precision.loss_scaler.initial_scale_power = 24;
    to_host(c);
  };
  const TrainResult fp16 = train(o);
  EXPECT_NE(std::find(fp16.skipped.begin(), fp16.skipped.end(), true), fp16.skipped.end());
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config;
  config.stage = 3;
  config.schedule.persistence_threshold = 100;
  to_host(config);
  ZeroModel model(*comm, models::make_mlp(models::MlpConfig{8, 24, 4, 3}), config);
  const std::vector<Unit>& units = model.engine().layout().units();
  EXPECT_NE(std::find_if(units.begin(), units.end(), [](const Unit& u) { return u.persistent; }),
            units.end());
}

TEST(HostOffload, MemoryOfEachTierIsThePlan) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      for (bool pin_memory : {false, true}) {
        RunOptions o;
        o.stage = stage;
        o.dtype = dtype;
        o.steps = 1;
        const TrainResult in_memory = train(o);
        o.tweak = [&](EngineConfig& c) {
          to_host(c);
          c.offload.optimizer.pin_memory = pin_memory;
        };
        const TrainResult run = train(o);
        const std::string what = std::string(dtype_name(dtype)) + " stage " +
                                 std::to_string(stage) + (pin_memory ? " pinned" : " pageable");
        EXPECT_EQ(run.model_state_bytes, run.plan.model_state) << what;
        EXPECT_EQ(run.pinned_host_bytes, run.plan.host_pinned) << what;
        EXPECT_EQ(run.pageable_host_bytes, run.plan.host_pageable) << what;
        EXPECT_EQ(run.buffer_bytes, run.plan.buffers) << what;
        EXPECT_EQ(in_memory.pinned_host_bytes + in_memory.pageable_host_bytes, 0u) << what;
        EXPECT_EQ(in_memory.plan.host_pinned + in_memory.plan.host_pageable, 0u) << what;
        // What leaves the engine's memory: the master (16-bit) and the two moments, 4 bytes
        // each per owned element.
        const uint64_t owned = run.padded_params / static_cast<uint64_t>(world_size());
        const bool fp32 = dtype == DType::kFloat32;
        EXPECT_EQ(in_memory.model_state_bytes - run.model_state_bytes, (fp32 ? 8u : 12u) * owned)
            << what;
        // What the host holds: an fp32 master (of fp32 parameters too) and the two moments,
        // pinned as asked; and always pinned, the copies that cross the bus: the gradient
        // shard's (fp32: bf16 accumulates in fp32) and the updated parameters'.
        // The parameters' copy is bf16's working copy, or a pageable fp32 master's pinned copy.
        const uint64_t optimizer = 12u * owned;
        const uint64_t copies = (fp32 ? (pin_memory ? 4u : 8u) : 6u) * owned;
        EXPECT_EQ(run.pageable_host_bytes, pin_memory ? 0u : optimizer) << what;
        EXPECT_EQ(run.pinned_host_bytes, copies + (pin_memory ? optimizer : 0u)) << what;
      }
    }
  }
}

// Each unit's copy runs on the communication stream right behind its reduction: the first unit
// to finish backward is on the host before the last unit's reduce-scatter starts.
TEST(HostOffload, GradientsGoToTheHostDuringBackward) {
  RunOptions o;
  o.stage = 2;
  o.steps = 1;
  o.mlp = MlpConfig{8, 24, 4, 4};
  o.tweak = [](EngineConfig& c) {
    to_host(c);
    c.trace = true;
  };
  const TrainResult run = train(o);
  std::vector<TraceSpan> copies;
  double last_reduction_begin_us = 0.0;
  for (const TraceSpan& span : run.trace) {
    if (span.name == "grads_to_host") copies.push_back(span);
    if (span.name == "reduce_scatter") {
      last_reduction_begin_us = std::max(last_reduction_begin_us, span.begin_us);
    }
  }
  ASSERT_EQ(copies.size(), run.units);
  const auto first_done =
      std::min_element(copies.begin(), copies.end(),
                       [](const TraceSpan& a, const TraceSpan& b) { return a.end_us < b.end_us; });
  EXPECT_LT(first_done->end_us, last_reduction_begin_us);
  // And before the step's update began.
  const auto update = std::find_if(run.trace.begin(), run.trace.end(),
                                   [](const TraceSpan& s) { return s.name == "optimizer"; });
  ASSERT_NE(update, run.trace.end());
  for (const TraceSpan& copy : copies) EXPECT_LE(copy.end_us, update->begin_us);
}

TEST(HostOffload, CheckpointResumeIsBitwise) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const std::string dir = std::string(ZERO_HOST_OFFLOAD_TEST_DIR) + "/np" +
                          std::to_string(comm->world_size()) + "/checkpoint";
  if (comm->rank() == 0) std::filesystem::remove_all(dir);
  comm->barrier_sync();
  const auto run = [&](bool offloaded, int stage, int from, int to, bool save, bool load,
                       DType dtype = DType::kBFloat16) {
    EngineConfig config;
    config.stage = stage;
    config.precision.dtype = dtype;
    config.optimizer.lr = 1e-2f;
    if (offloaded) to_host(config);
    const CheckpointedRun r = train_around_checkpoint(*comm, config, dir, from, to, save, load);
    return std::make_pair(r.losses, r.master);
  };
  const auto [whole, whole_master] = run(true, 3, 1, 6, true, false);
  const std::vector<float> tail(whole.begin() + 3, whole.end());
  // Resumed offloaded, in memory, and at another stage (whose reductions round differently, so
  // against the in-memory engine there).
  const auto [offloaded, offloaded_master] = run(true, 3, 4, 6, false, true);
  EXPECT_EQ(offloaded, tail);
  EXPECT_EQ(offloaded_master, whole_master);
  const auto [in_memory, in_memory_master] = run(false, 3, 4, 6, false, true);
  EXPECT_EQ(in_memory, tail);
  EXPECT_EQ(in_memory_master, whole_master);
  EXPECT_EQ(run(true, 1, 4, 6, false, true), run(false, 1, 4, 6, false, true));
  // fp32, whose master on the host is a copy of the parameters on the device.
  comm->barrier_sync();
  if (comm->rank() == 0) std::filesystem::remove_all(dir);
  comm->barrier_sync();
  const auto fp32_whole = run(true, 2, 1, 6, true, false, DType::kFloat32);
  const std::vector<float> fp32_tail(fp32_whole.first.begin() + 3, fp32_whole.first.end());
  EXPECT_EQ(run(true, 2, 4, 6, false, true, DType::kFloat32).first, fp32_tail);
  EXPECT_EQ(run(false, 2, 4, 6, false, true, DType::kFloat32).first, fp32_tail);
}

TEST(HostOffload, UnsupportedSettingsAreRefusedByName) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const auto build = [&](const std::function<void(EngineConfig&)>& tweak) {
    EngineConfig config;
    to_host(config);
    tweak(config);
    ZeroModel model(*comm, models::make_mlp(models::MlpConfig{8, 24, 4, 3}), config);
  };
  expect_error_naming([&] { build([](EngineConfig& c) { c.stage = 0; }); },
                      "optimizer offload to cpu needs ZeRO stage 1, 2 or 3, not stage 0");
}

}  // namespace
}  // namespace zero
