// The optimizer offloaded to host memory (offload_optimizer device cpu), on the CPU path, where
// the same schedule runs as on a GPU with the copies inside host memory: training is bitwise
// the in-memory engine's at stages 1-3 in fp32 and bf16, with sub-groups, packed reductions and
// gradient accumulation; the engine's memory loses the master and optimizer state and the host
// tier holds them, as the plan says; each gradient shard goes to the host during backward, not
// at the step; checkpoints resume bitwise, into an offloaded engine or an in-memory one; and
// what is not supported is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/runtime/train_util.h"
#include "zero/runtime/checkpoint.h"

namespace zero {
namespace {

using namespace zero::testing;

void to_host(EngineConfig& c) {
  c.offload_optimizer.device = OffloadDevice::kCpu;
}

void expect_bitwise(const TrainResult& run, const TrainResult& reference, const std::string& what) {
  ASSERT_EQ(run.losses.size(), reference.losses.size()) << what;
  for (size_t i = 0; i < run.losses.size(); ++i) {
    EXPECT_EQ(run.losses[i], reference.losses[i]) << what << " step " << i + 1;
  }
  ASSERT_EQ(run.final_params.size(), reference.final_params.size()) << what;
  for (size_t p = 0; p < run.final_params.size(); ++p) {
    EXPECT_EQ(run.final_params[p], reference.final_params[p]) << what << " parameter " << p;
  }
}

TEST(HostOffload, TrainingIsBitwiseInMemoryTraining) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
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
          c.optimizer_sub_group_elements = 100;
          c.reduce_bucket_elements = 2000;
        };
        o.tweak = settings;
        const TrainResult reference = train(o);
        EXPECT_LT(reference.losses.back(), reference.losses.front());
        o.tweak = [&](EngineConfig& c) {
          settings(c);
          to_host(c);
        };
        const std::string what = std::string(dtype_name(dtype)) + " stage " +
                                 std::to_string(stage) + " micro-batches " +
                                 std::to_string(micro_batches);
        expect_bitwise(train(o), reference, what);
      }
    }
  }
}

// The persistent unit (stage 3's small parameters) is reduced at the step, and its gradient
// goes to the host from there.
TEST(HostOffload, PersistentUnitIsSteppedOnTheHost) {
  RunOptions o;
  o.stage = 3;
  o.dtype = DType::kBFloat16;
  o.steps = 4;
  const auto persistent = [](EngineConfig& c) { c.persistence_threshold = 100; };
  o.tweak = persistent;
  const TrainResult reference = train(o);
  o.tweak = [&](EngineConfig& c) {
    persistent(c);
    to_host(c);
  };
  expect_bitwise(train(o), reference, "bf16 stage 3 with a persistent unit");
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
          c.offload_optimizer.pin_memory = pin_memory;
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
        // pinned as asked; and always pinned, the gradient shard's copy (fp32: bf16 accumulates
        // in fp32) and bf16's working copy.
        const uint64_t optimizer = 12u * owned;
        const uint64_t copies = (fp32 ? 4u : 6u) * owned;
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
  const models::MlpConfig mlp{8, 24, 4, 3};
  const auto run = [&](bool offloaded, int stage, int from, int to, bool save, bool load) {
    EngineConfig config;
    config.stage = stage;
    config.dtype = DType::kBFloat16;
    config.optimizer.lr = 1e-2f;
    if (offloaded) to_host(config);
    ZeroModel model(*comm, models::make_mlp(mlp), config);
    if (load) load_checkpoint(model.engine(), dir + "/latest", nullptr);
    models::TeacherTask task(mlp, 7);
    std::vector<float> losses;
    for (int step = from; step <= to; ++step) {
      models::Batch batch = task.batch(step, comm->rank() * 6, 6);
      Tensor grad;
      losses.push_back(models::mse_loss(model.forward(batch.inputs), batch.targets, grad));
      model.backward(grad);
      model.step();
      if (save && step == 3) save_checkpoint(model.engine(), dir, TrainerState{step, 7});
    }
    return std::make_pair(losses, model.engine().gather_full_master());
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
}

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HostOffload, UnsupportedSettingsAreRefusedByName) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const auto build = [&](const std::function<void(EngineConfig&)>& tweak) {
    EngineConfig config;
    to_host(config);
    tweak(config);
    ZeroModel model(*comm, models::make_mlp(models::MlpConfig{8, 24, 4, 3}), config);
  };
  EXPECT_NE(error_of([&] {
              build([](EngineConfig& c) { c.stage = 0; });
            }).find("optimizer offload to cpu needs ZeRO stage 1, 2 or 3, not stage 0"),
            std::string::npos);
  const std::string with_params = error_of([&] {
    build([](EngineConfig& c) {
      c.stage = 3;
      c.offload_param.device = OffloadDevice::kNvme;
      c.offload_param.nvme_path = "/tmp";
    });
  });
  EXPECT_NE(with_params.find("optimizer offload to cpu with parameter offload to nvme"),
            std::string::npos)
      << with_params;
}

}  // namespace
}  // namespace zero
