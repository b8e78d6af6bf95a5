// Stage 3's parameter shards offloaded to NVMe (offload_param, files under a directory of the
// build tree), beside the optimizer's state on NVMe, in memory or in host memory: training is
// bitwise the in-memory engine's, the memory of each tier is what the plan says, and a buffer
// too small, a bad path and an I/O error each stop naming what is wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "tests/runtime/offload_test_util.h"
#include "tests/runtime/train_util.h"
#include "zero/runtime/nvme_file.h"

namespace zero {
namespace {

using namespace zero::testing;

// Stage 3 with the parameter shards on NVMe, alone, beside the optimizer's state there, and
// beside the optimizer in host memory (stepped by the host, which updates each shard in its
// buffer), is bitwise the in-memory run in fp32 and bf16, with one buffer (no read-ahead), two,
// and a prefetch that gathers ahead; sub-groups cut inside units.
TEST(ParamOffload, NvmeTrainingIsBitwiseInMemoryTraining) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    RunOptions o;
    o.stage = 3;
    o.dtype = dtype;
    o.steps = 5;
    o.weight_decay = 0.05f;
    const auto sub_groups = [](EngineConfig& c) { c.schedule.optimizer_sub_group_elements = 100; };
    o.tweak = sub_groups;
    const TrainResult reference = train(o);
    EXPECT_LT(reference.losses.back(), reference.losses.front());
    for (int buffers : {1, 2, 5}) {
      const std::string what =
          std::string(dtype_name(dtype)) + " " + std::to_string(buffers) + " buffer(s)";
      o.tweak = both(sub_groups, params_on_nvme(buffers));
      expect_bitwise(train(o), reference, what + ", params on nvme");
      o.tweak = both(nvme(100, true), params_on_nvme(buffers));
      expect_bitwise(train(o), reference, what + ", params and optimizer on nvme");
      o.tweak = both(both(sub_groups, optimizer_on_host), params_on_nvme(buffers));
      expect_bitwise(train(o), reference, what + ", params on nvme, optimizer on the host");
    }
    o.tweak = both(sub_groups, [](EngineConfig& c) { c.schedule.prefetch_elements = 1000; });
    const TrainResult prefetched = train(o);
    o.tweak = both(both(sub_groups, [](EngineConfig& c) { c.schedule.prefetch_elements = 1000; }),
                   params_on_nvme(3));
    expect_bitwise(train(o), prefetched, std::string(dtype_name(dtype)) + " prefetching");
    // The persistent unit (the biases and the last layer's weight) stays in memory.
    const auto persistent = [](EngineConfig& c) { c.schedule.persistence_threshold = 100; };
    o.tweak = both(sub_groups, persistent);
    const TrainResult with_persistent = train(o);
    o.tweak = both(both(sub_groups, persistent), params_on_nvme(2));
    expect_bitwise(train(o), with_persistent, std::string(dtype_name(dtype)) + " persistent");
  }
}

// The shards leave memory for the file: params-shard bytes fall by the working shard of every
// unit but the persistent one, the file holds them (each padded to 4 KiB), the buffers are
// buffers; measured equals planned in each tier. Every step reads each shard for its
// all-gathers (and, in fp32, for the update) and writes it once.
TEST(ParamOffload, MemoryOfEachTierIsThePlan) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    RunOptions o;
    o.stage = 3;
    o.dtype = dtype;
    o.steps = 2;
    const TrainResult in_memory = train(o);
    o.tweak = nvme(0, false);
    const TrainResult optimizer_only = train(o);
    o.tweak = both(optimizer_on_host, params_on_nvme(2));
    const TrainResult host_run = train(o);
    const std::string what = dtype_name(dtype);
    // Beside the optimizer in host memory: each tier is the plan, and no swapped unit keeps a
    // host copy of its parameters (the shards' buffers are what the host updates).
    EXPECT_EQ(host_run.model_state_bytes, host_run.plan.model_state) << what;
    EXPECT_EQ(host_run.buffer_bytes, host_run.plan.buffers) << what;
    EXPECT_EQ(host_run.pinned_host_bytes, host_run.plan.host_pinned) << what;
    EXPECT_EQ(host_run.pageable_host_bytes, host_run.plan.host_pageable) << what;
    EXPECT_EQ(host_run.nvme_bytes, host_run.plan.nvme) << what;
    o.tweak = both(nvme(0, false), params_on_nvme(2));
    // Reads of this rank's files take 20 ms at least (a slow disk), so the stream's waits for
    // them are there to count whatever the machine's speed; the bytes are unchanged.
    const TrainResult run = [&] {
      const ScopedNvmeFault slow_disk("slow-read@" +
                                      std::to_string(make_mpi_communicator()->rank()) + "#20");
      return train(o);
    }();
    EXPECT_EQ(run.model_state_bytes, run.plan.model_state) << what;
    EXPECT_EQ(run.buffer_bytes, run.plan.buffers) << what;
    EXPECT_EQ(run.nvme_bytes, run.plan.nvme) << what;
    const uint64_t owned = run.padded_params / static_cast<uint64_t>(world_size());
    const uint64_t shards = dtype_size(dtype) * owned;
    const uint64_t optimizer = (dtype == DType::kFloat32 ? 8 : 12) * owned;
    EXPECT_EQ(in_memory.model_state_bytes - run.model_state_bytes, optimizer + shards) << what;
    EXPECT_GE(run.nvme_bytes, optimizer + shards) << what;
    // Padding: the optimizer's arrays and each of the MLP's 3 unit shards to 4 KiB.
    EXPECT_LT(run.nvme_bytes, optimizer + shards + 6 * kNvmeAlignment) << what;
    const uint64_t optimizer_file = optimizer_only.nvme_bytes;
    const uint64_t param_file = run.nvme_bytes - optimizer_file;
    EXPECT_GE(param_file, shards) << what;
    // Each shard is read for the forward's all-gather, for the backward's (unless the unit
    // stayed gathered from forward to backward) and, only where the update steps the shard
    // itself (fp32 here: the records hold no master), for the update; a bf16 update, like the
    // host's in both dtypes, writes the whole shard from its master unread. Each file is
    // written once.
    const uint64_t update_reads = dtype == DType::kFloat32 ? param_file : 0;
    ASSERT_EQ(run.stats.size(), host_run.stats.size()) << what;
    double read_wait_ms = 0.0;
    for (size_t step = 0; step < run.stats.size(); ++step) {
      const StepStats& stats = run.stats[step];
      EXPECT_EQ(stats.nvme_write_bytes, run.nvme_bytes) << what;
      EXPECT_GE(stats.nvme_read_bytes, optimizer_file + param_file + update_reads) << what;
      EXPECT_LE(stats.nvme_read_bytes, optimizer_file + 2 * param_file + update_reads) << what;
      // The host-stepped run has no optimizer file and the same gathers: its reads are theirs.
      EXPECT_EQ(stats.nvme_read_bytes,
                optimizer_file + host_run.stats[step].nvme_read_bytes + update_reads)
          << what;
      read_wait_ms += stats.nvme_param_read_wait_ms;
    }
    // A gather's read starts when the gather is issued, and the tiny MLP leaves the stream
    // little else to do first: it waits for the slow reads, and says how long.
    EXPECT_GT(read_wait_ms, 0.0) << what << ": the stream's waits for shard reads";
  }
}

// Too small a buffer for a unit's shard is refused before anything runs, naming both sizes;
// other stages refuse offload_param nvme, as DeepSpeed does.
TEST(ParamOffload, ShardLargerThanBufferIsRefused) {
  const std::string message = training_error(3, 1, params_on_nvme(2, 16));
  expect_naming(message, "offload_param.buffer_size is 16 elements, but unit ");
  expect_naming(message, "'s shard on each rank has ");
  expect_naming(message, "raise buffer_size to at least ");
  expect_naming(training_error(2, 1, params_on_nvme(2)),
                "parameter offload to nvme (offload_param) needs ZeRO stage 3, not stage 2");
}

TEST(ParamOffload, BadPathNamesTheFileAndErrno) {
  const auto missing_dir = [](EngineConfig& c) {
    c.offload.param.device = OffloadDevice::kNvme;
    c.offload.param.nvme_path = kMissingDir;
  };
  expect_missing_dir_named(3, missing_dir, "zero_param_rank");
}

// The first shard read of every rank fails as a failing disk would (the first all-gather's):
// the error names the parameter file, the offset and errno.
TEST(ParamOffload, IoErrorNamesFileOffsetAndErrno) {
  const std::string fault = "read@" + std::to_string(make_mpi_communicator()->rank());
  expect_injected_io_error(3, 2, params_on_nvme(2), fault, "read", "zero_param_rank",
                           " at offset 0 (4096 bytes)");
}

}  // namespace
}  // namespace zero
