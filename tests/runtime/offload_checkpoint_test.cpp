// Checkpoints of offloaded state (files under a directory of the build tree): saved from and
// loaded into optimizer state and parameter shards on NVMe, a resume is bitwise, a save and a
// load hold one unit's state or shard copy in memory at a time, and a refused load changes
// nothing.
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/runtime/offload_test_util.h"
#include "tests/runtime/train_util.h"
#include "zero/runtime/checkpoint.h"

namespace zero {
namespace {

using namespace zero::testing;

// Saved at step 3 from NVMe-resident state, loaded into a fresh NVMe-offloaded engine (bf16:
// master, moments and working copy all come back), steps 4-6 are those of the run that never
// stopped; the checkpoint also loads into an in-memory engine with the same result.
TEST(Offload, CheckpointResumeIsBitwise) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const std::string dir = empty_job_dir(*comm, "checkpoint");
  const auto run = [&](bool offloaded, int from, int to, bool save, bool load) {
    EngineConfig config;
    config.stage = 3;
    config.precision.dtype = DType::kBFloat16;
    config.optimizer.lr = 1e-2f;
    if (offloaded) nvme(100, true)(config);
    return train_around_checkpoint(*comm, config, dir, from, to, save, load).losses;
  };
  const std::vector<float> whole = run(true, 1, 6, true, false);
  const std::vector<float> tail(whole.begin() + 3, whole.end());
  EXPECT_EQ(run(true, 4, 6, false, true), tail);
  EXPECT_EQ(run(false, 4, 6, false, true), tail);
}

// /proc/self/status's field (kB) in bytes.
uint64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  ADD_FAILURE() << "no " << field << " in /proc/self/status";
  return 0;
}

// A load into NVMe-resident state holds one unit's state at a time, not the rank's shard: the
// peak resident memory the load adds (VmHWM, reset through /proc/self/clear_refs before it)
// stays under half of the shard's state bytes, where reading all of it first adds all of them.
// Every allocation of 64 KiB or more is its own mapping here, so freed memory cannot be reused
// unseen.
TEST(Offload, CheckpointLoadHoldsOneUnitAtATime) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' allocators ignore mallopt (AddressSanitizer's keeps freed "
                  "memory in quarantine, ThreadSanitizer's shadow memory is resident too), so "
                  "resident memory does not show what the load holds";
#endif
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const std::string dir = empty_job_dir(*comm, "streamed_checkpoint");
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 64 << 10), 1);
  const models::MlpConfig mlp{64, 768, 64, 8};
  EngineConfig config;
  config.stage = 3;
  config.precision.dtype = DType::kBFloat16;
  nvme(size_t{1} << 20, true)(config);
  uint64_t shard_state_bytes = 0;
  {
    ZeroModel model(*comm, models::make_mlp(mlp), config);
    train_one_step(model, mlp, comm->rank());
    save_checkpoint(model.engine(), dir, TrainerState{1, 7});
    shard_state_bytes = model.engine().nvme_bytes();
  }
  ZeroModel model(*comm, models::make_mlp(mlp), config);
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // VmHWM := VmRSS
  }
  const uint64_t before = status_bytes("VmRSS");
  load_checkpoint(model.engine(), dir + "/latest", nullptr);
  const uint64_t added = status_bytes("VmHWM") - before;
  EXPECT_GT(shard_state_bytes, uint64_t{16} << 20) << "a shard too small to tell the two apart";
  EXPECT_LT(added, shard_state_bytes / 2)
      << "the load added " << added << " bytes of resident memory; the shard's state is "
      << shard_state_bytes << " bytes";
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 128 << 10), 1);
}

// The shards on NVMe (2 buffers) beside each place the optimizer's state can be, named.
std::vector<std::pair<std::string, std::function<void(EngineConfig&)>>> beside_params_on_nvme() {
  return {{"optimizer on nvme", both(nvme(100, true), params_on_nvme(2))},
          {"optimizer in memory", params_on_nvme(2)},
          {"optimizer on the host", both(optimizer_on_host, params_on_nvme(2))}};
}

// Saved at step 3 with the shards on NVMe beside the optimizer state on NVMe, in memory or in
// host memory, resumed into a fresh offloaded engine and into an in-memory one: steps 4-6 are
// those of the run that never stopped, in fp32 and bf16.
TEST(ParamOffload, CheckpointResumeIsBitwise) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (const auto& [setting_name, setting] : beside_params_on_nvme()) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      const std::string dir = empty_job_dir(*comm, "param_checkpoint");
      const auto run = [&](bool offloaded, int from, int to, bool save, bool load) {
        EngineConfig config;
        config.stage = 3;
        config.precision.dtype = dtype;
        config.optimizer.lr = 1e-2f;
        if (offloaded) setting(config);
        return train_around_checkpoint(*comm, config, dir, from, to, save, load).losses;
      };
      const std::vector<float> whole = run(true, 1, 6, true, false);
      const std::vector<float> tail(whole.begin() + 3, whole.end());
      const std::string what = std::string(dtype_name(dtype)) + ", " + setting_name;
      EXPECT_EQ(run(true, 4, 6, false, true), tail) << what;
      EXPECT_EQ(run(false, 4, 6, false, true), tail) << what;
      const std::vector<float> in_memory = run(false, 1, 6, false, false);
      EXPECT_EQ(in_memory, whole) << what;
    }
  }
}

// A save and a load hold one unit's copy of its parameter shard at a time, not a copy of every
// swapped shard: the engine allocator's kOther bytes (where the copies come from, and nothing
// else in a save or load) peak at the largest shard, beside the optimizer's state on NVMe, in
// memory and in host memory (each load streamed, as any with state on NVMe).
TEST(ParamOffload, CheckpointHoldsOneShardCopyAtATime) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const models::MlpConfig mlp{8, 24, 4, 6};
  for (const auto& [what, setting] : beside_params_on_nvme()) {
    const std::string dir = empty_job_dir(*comm, "shard_copies");
    EngineConfig config;
    config.stage = 3;
    config.precision.dtype = DType::kBFloat16;
    setting(config);
    const auto copies_held = [](Engine& engine, const std::function<void()>& checkpoint) {
      Allocator& allocator = engine.allocator();
      const size_t other = static_cast<size_t>(MemoryCategory::kOther);
      const uint64_t before = allocator.stats().current[other];
      allocator.start_window();
      checkpoint();
      return allocator.stats().window_peak[other] - before;
    };
    uint64_t largest_shard = 0;
    {
      ZeroModel model(*comm, models::make_mlp(mlp), config);
      for (const Unit& unit : model.engine().layout().units()) {
        largest_shard =
            std::max<uint64_t>(largest_shard, unit.shard * dtype_size(config.precision.dtype));
      }
      train_one_step(model, mlp, comm->rank());
      EXPECT_EQ(copies_held(model.engine(),
                            [&] {
                              save_checkpoint(model.engine(), dir, TrainerState{1, 7});
                            }),
                largest_shard)
          << what << ": save";
    }
    ZeroModel model(*comm, models::make_mlp(mlp), config);
    EXPECT_GE(model.engine().layout().units().size(), size_t{5}) << "too few units to tell";
    EXPECT_EQ(copies_held(model.engine(),
                          [&] { load_checkpoint(model.engine(), dir + "/latest", nullptr); }),
              largest_shard)
        << what << ": load";
  }
}

// A load refused for a corrupt shard file (found in the first pass, after a unit's view was
// taken) changes nothing: training on afterwards, with the shards and the optimizer state on
// NVMe, is bitwise the run that never tried, also for the unit whose shard copy the view made.
TEST(ParamOffload, ARefusedLoadChangesNothing) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const std::string dir = empty_job_dir(*comm, "corrupt_checkpoint");
  const models::MlpConfig mlp{8, 24, 4, 3};
  const auto run = [&](bool save, bool load) {
    EngineConfig config;
    config.stage = 3;
    config.optimizer.lr = 1e-2f;
    both(nvme(100, true), params_on_nvme(2))(config);
    ZeroModel model(*comm, models::make_mlp(mlp), config);
    if (load) {
      const std::string message = error_of([&] { load_checkpoint(model.engine(), dir, nullptr); });
      expect_naming(message, "checksum mismatch");
    }
    models::TeacherTask task(mlp, 7);
    std::vector<float> losses;
    for (int step = 1; step <= 4; ++step) {
      models::Batch batch = task.batch(step, comm->rank() * 6, 6);
      Tensor grad;
      losses.push_back(models::mse_loss(model.forward(batch.inputs), batch.targets, grad));
      model.backward(grad);
      model.step();
    }
    if (save) save_checkpoint(model.engine(), dir, TrainerState{4, 7});
    return losses;
  };
  const std::vector<float> untouched = run(true, false);
  comm->barrier_sync();
  if (comm->rank() == 0) {
    // One byte of every shard file flipped: each rank's first read fails its check.
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
      if (entry.path().filename().string().rfind("rank_", 0) != 0) continue;
      std::fstream file(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
      char byte = 0;
      file.seekg(0);
      file.get(byte);
      file.seekp(0);
      file.put(static_cast<char>(byte ^ 0x5a));
    }
  }
  comm->barrier_sync();
  EXPECT_EQ(run(false, true), untouched);
}

}  // namespace
}  // namespace zero
