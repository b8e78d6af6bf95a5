// Optimizer state offloaded to NVMe (files under a directory of the build tree): training is
// bitwise the in-memory engine's at stages 1-3 in fp32 and bf16, with and without pipelining
// and under every aio setting; the memory of each tier is what the plan says; a bad path and an
// I/O error each stop with the file, the offset and errno named. The files themselves:
// nvme_file_test.cpp; checkpoints of offloaded state: offload_checkpoint_test.cpp; stage 3's
// parameter shards on NVMe: param_offload_test.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "tests/runtime/offload_test_util.h"
#include "tests/runtime/train_util.h"
#include "zero/runtime/nvme_file.h"

namespace zero {
namespace {

using namespace zero::testing;

TEST(Offload, NvmeTrainingIsBitwiseInMemoryTraining) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      RunOptions o;
      o.stage = stage;
      o.dtype = dtype;
      o.steps = 6;
      o.weight_decay = 0.05f;
      // 100 elements per sub-group: several records, cut inside units.
      o.tweak = [](EngineConfig& c) { c.schedule.optimizer_sub_group_elements = 100; };
      const TrainResult reference = train(o);
      EXPECT_LT(reference.losses.back(), reference.losses.front());
      for (bool pipeline : {false, true}) {
        o.tweak = nvme(100, pipeline);
        const std::string what = std::string(dtype_name(dtype)) + " stage " +
                                 std::to_string(stage) + (pipeline ? " pipelined" : "");
        expect_bitwise(train(o), reference, what);
      }
    }
  }
}

// The aio settings change how the bytes move, never which: small blocks over several threads,
// one request at a time, batches, and one sub-group for the whole shard.
TEST(Offload, EveryAioSettingGivesTheSameTraining) {
  RunOptions o;
  o.stage = 3;
  o.dtype = DType::kBFloat16;
  o.steps = 4;
  o.tweak = [](EngineConfig& c) { c.schedule.optimizer_sub_group_elements = 300; };
  const TrainResult reference = train(o);
  AioConfig small;
  small.block_size = 4096;
  small.queue_depth = 2;
  small.intra_op_parallelism = 3;
  small.single_submit = true;
  small.overlap_events = false;
  o.tweak = nvme(300, true, small);
  expect_bitwise(train(o), reference, "4 KiB blocks, depth 2, 3 threads, single submit");
  o.tweak = [](EngineConfig& c) { c.schedule.optimizer_sub_group_elements = 0; };
  const TrainResult whole = train(o);
  o.tweak = nvme(0, false);
  expect_bitwise(train(o), whole, "one sub-group");
}

// Each step reads every record once and writes it back once, whatever the pipelining, and says
// so in its StepStats; the time blocked on the disk is part of the optimizer's time, and without
// pipelining the update waits for every transfer it starts, so most of the disk's busy time is
// time blocked on it. In memory there is no NVMe traffic.
TEST(Offload, StepStatsCountEveryRecordOnceEachWay) {
  for (bool pipeline : {false, true}) {
    RunOptions o;
    o.stage = 2;
    o.dtype = DType::kBFloat16;
    o.steps = 3;
    o.tweak = nvme(200, pipeline);
    const TrainResult run = train(o);
    ASSERT_EQ(run.stats.size(), 3u);
    double wait_ms = 0.0;
    double busy_ms = 0.0;
    for (const StepStats& stats : run.stats) {
      EXPECT_EQ(stats.nvme_read_bytes, run.nvme_bytes) << "pipeline " << pipeline;
      EXPECT_EQ(stats.nvme_write_bytes, run.nvme_bytes) << "pipeline " << pipeline;
      EXPECT_GT(stats.optimizer_ms, 0.0);
      EXPECT_LE(stats.nvme_wait_ms, stats.optimizer_ms);
      // The disk worked for the update within its span.
      EXPECT_GT(stats.nvme_busy_ms, 0.0);
      EXPECT_LE(stats.nvme_busy_ms, stats.optimizer_ms);
      wait_ms += stats.nvme_wait_ms;
      busy_ms += stats.nvme_busy_ms;
    }
    // Summed over the steps: a preempted thread that finds one transfer done adds nothing.
    if (!pipeline) {
      EXPECT_GE(wait_ms, busy_ms / 2) << "the update's waits for unpipelined transfers";
    }
  }
  RunOptions o;
  o.stage = 2;
  o.steps = 1;
  const TrainResult in_memory = train(o);
  EXPECT_GT(in_memory.stats[0].optimizer_ms, 0.0);
  EXPECT_EQ(in_memory.stats[0].nvme_read_bytes + in_memory.stats[0].nvme_write_bytes, 0u);
  EXPECT_EQ(in_memory.stats[0].nvme_wait_ms, 0.0);
  EXPECT_EQ(in_memory.stats[0].nvme_busy_ms, 0.0);
}

// Host memory drops by the master and the moments (12 bytes per owned element in bf16, 8 in
// fp32), the NVMe file holds them (each record's arrays padded to 4 KiB), the staging buffers
// are buffers; measured equals planned in each tier.
TEST(Offload, MemoryOfEachTierIsThePlan) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    RunOptions o;
    o.stage = 2;
    o.dtype = dtype;
    o.steps = 1;
    const TrainResult in_memory = train(o);
    o.tweak = nvme(0, false);
    const TrainResult run = train(o);
    const std::string what = dtype_name(dtype);
    EXPECT_EQ(run.model_state_bytes, run.plan.model_state) << what;
    EXPECT_EQ(run.buffer_bytes, run.plan.buffers) << what;
    EXPECT_EQ(run.nvme_bytes, run.plan.nvme) << what;
    const uint64_t owned = run.padded_params / static_cast<uint64_t>(world_size());
    const uint64_t moved = (dtype == DType::kFloat32 ? 8 : 12) * owned;
    EXPECT_EQ(in_memory.model_state_bytes - run.model_state_bytes, moved) << what;
    EXPECT_GE(run.nvme_bytes, moved) << what;
    EXPECT_LT(run.nvme_bytes, moved + 3 * kNvmeAlignment) << what;
    EXPECT_EQ(in_memory.plan.nvme, 0u) << what;
  }
}

TEST(Offload, BadPathNamesTheFileAndErrno) {
  const auto missing_dir = [](EngineConfig& c) {
    c.offload.optimizer.device = OffloadDevice::kNvme;
    c.offload.optimizer.nvme_path = kMissingDir;
  };
  expect_missing_dir_named(1, missing_dir, "zero_optimizer_rank");
}

// The third write of every rank fails as a failing disk would: in fp32 nothing is written at
// start (the moments start as zeros), so it is step 1's third record, at 2 x 8 KiB (100
// elements of two moments, each padded to 4 KiB). The step throws on every rank, naming the
// file, the offset and errno.
TEST(Offload, IoErrorNamesFileOffsetAndErrno) {
  const std::string fault = "write@" + std::to_string(make_mpi_communicator()->rank()) + "#3";
  const std::string message =
      expect_injected_io_error(3, 3, nvme(100, true), fault, "write", "zero_optimizer_rank",
                               " at offset 16384 (8192 bytes)");
  expect_naming(message, "nvme_store.cpp:");
}

}  // namespace
}  // namespace zero
