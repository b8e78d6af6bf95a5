// Optimizer state offloaded to NVMe (files under a directory of the build tree): training is
// bitwise the in-memory engine's at stages 1-3 in fp32 and bf16, with and without pipelining
// and under every aio setting; the memory of each tier is what the plan says; a full disk, a
// bad path and an I/O error each stop with the file, the offset and errno named; checkpoints
// save and load the state through the files, a resume is bitwise, and a load holds one unit's
// state in memory at a time. The same for stage 3's
// parameter shards on NVMe (offload_param) beside the optimizer's state.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/runtime/train_util.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/nvme_file.h"

namespace zero {
namespace {

using namespace zero::testing;

// This job's directory (by world size: jobs of other sizes may run beside it), and each rank's
// own in it; every state file in them is unlinked once open.
std::string job_dir() {
  return std::string(ZERO_OFFLOAD_TEST_DIR) + "/np" + std::to_string(world_size());
}

// job_dir()/name, emptied by rank 0 before any rank uses it: a checkpoint directory that holds
// nothing of an earlier run.
std::string empty_job_dir(Communicator& comm, const std::string& name) {
  const std::string dir = job_dir() + "/" + name;
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
  comm.barrier_sync();
  return dir;
}

std::string nvme_dir() {
  const std::string dir = job_dir() + "/rank" + std::to_string(make_mpi_communicator()->rank());
  std::filesystem::create_directories(dir);
  return dir;
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

void expect_naming(const std::string& message, const std::string& needle) {
  EXPECT_NE(message.find(needle), std::string::npos)
      << "message '" << message << "' does not name '" << needle << "'";
}

std::function<void(EngineConfig&)> nvme(size_t sub_group, bool pipeline, AioConfig aio = {}) {
  const std::string dir = nvme_dir();
  return [=](EngineConfig& c) {
    c.optimizer_sub_group_elements = sub_group;
    c.offload_optimizer.device = OffloadDevice::kNvme;
    c.offload_optimizer.nvme_path = dir;
    c.offload_optimizer.pipeline_read = pipeline;
    c.offload_optimizer.pipeline_write = pipeline;
    c.offload_optimizer.buffer_count = pipeline ? 3 : 1;
    c.aio = aio;
  };
}

// offload_param on nvme: each shard in the rank's file, `buffers` buffers of `buffer_size`.
std::function<void(EngineConfig&)> params_on_nvme(int buffers, size_t buffer_size = 4096) {
  const std::string dir = nvme_dir();
  return [=](EngineConfig& c) {
    c.offload_param.device = OffloadDevice::kNvme;
    c.offload_param.nvme_path = dir;
    c.offload_param.buffer_count = buffers;
    c.offload_param.buffer_size = buffer_size;
  };
}

// The optimizer's master and state in host memory (offload_optimizer cpu), stepped by the host
// as on a GPU, with the copies inside host memory.
void optimizer_on_host(EngineConfig& c) {
  c.offload_optimizer.device = OffloadDevice::kCpu;
}

std::function<void(EngineConfig&)> both(std::function<void(EngineConfig&)> first,
                                        std::function<void(EngineConfig&)> second) {
  return [=](EngineConfig& c) {
    first(c);
    second(c);
  };
}

TEST(Offload, NvmeTrainingIsBitwiseInMemoryTraining) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage = 1; stage <= 3; ++stage) {
      RunOptions o;
      o.stage = stage;
      o.dtype = dtype;
      o.steps = 6;
      o.weight_decay = 0.05f;
      // 100 elements per sub-group: several records, cut inside units.
      o.tweak = [](EngineConfig& c) { c.optimizer_sub_group_elements = 100; };
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
  o.tweak = [](EngineConfig& c) { c.optimizer_sub_group_elements = 300; };
  const TrainResult reference = train(o);
  AioConfig small;
  small.block_size = 4096;
  small.queue_depth = 2;
  small.intra_op_parallelism = 3;
  small.single_submit = true;
  small.overlap_events = false;
  o.tweak = nvme(300, true, small);
  expect_bitwise(train(o), reference, "4 KiB blocks, depth 2, 3 threads, single submit");
  o.tweak = [](EngineConfig& c) { c.optimizer_sub_group_elements = 0; };
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

TEST(Offload, FreeSpaceIsCheckedWithBothNumbers) {
  const std::string path = nvme_dir() + "/too_large.swp";
  const uint64_t huge = uint64_t{1} << 60;
  const std::string message = error_of([&] { NvmeFile file(path, huge, AioConfig{}, 0); });
  expect_naming(message, "nvme_path " + nvme_dir() + "/ has ");
  expect_naming(message, " bytes (");
  expect_naming(message, "rank 0's offload file " + path +
                             " needs 1152921504606846976 bytes (1073741824.00 GiB)");
  EXPECT_FALSE(std::filesystem::exists(path));
  // What fits is taken.
  NvmeFile fits(path, 1 << 20, AioConfig{}, 0);
  EXPECT_EQ(fits.bytes(), 1u << 20);
}

// The file's busy time is the union of the spans its transfers were outstanding: a pass's wall
// time over it says how much compute the I/O hid, so idle time must not count, nor may two
// transfers in flight together count twice.
TEST(Offload, BusyTimeIsTheSpanTransfersWereOutstanding) {
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  const size_t bytes = size_t{8} << 20;
  std::vector<char> memory(2 * bytes + kNvmeBufferSlack);
  char* buffer = nvme_aligned(memory.data());
  NvmeFile file(nvme_dir() + "/busy.swp", 2 * bytes, AioConfig{}, 0);
  EXPECT_EQ(file.busy_ms(), 0.0);
  const Clock::time_point first = Clock::now();
  file.wait(file.write(buffer, 0, bytes));
  const double first_span = ms_since(first);
  const double busy = file.busy_ms();
  EXPECT_GT(busy, 0.0);
  EXPECT_LE(busy, first_span);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(file.busy_ms(), busy) << "idle time counted as busy";
  const Clock::time_point both = Clock::now();
  const NvmeFile::Ticket write = file.write(buffer + bytes, bytes, bytes);
  const NvmeFile::Ticket read = file.read(buffer, 0, bytes);
  file.wait(write);
  file.wait(read);
  EXPECT_LE(file.busy_ms() - busy, ms_since(both)) << "transfers in flight together counted twice";
}

// A directory holding only a symbolic link at `name` to a file of known text beside it (as an
// attacker would plant one in a shared scratch directory), emptied first.
struct PlantedLink {
  explicit PlantedLink(const std::string& name) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream(target) << kText;
    std::filesystem::create_symlink(target, dir + "/" + name);
  }
  // The target still holds its text, and the directory nothing but the link.
  void expect_untouched() const {
    std::ifstream in(target);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(text == kText) << "the planted link's target was written through: it holds "
                               << text.size() << " bytes";
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1)
        << dir << " should hold the planted link and nothing else";
  }
  static constexpr const char* kText = "not the run's to touch\n";
  const std::string dir = nvme_dir() + "/planted";
  const std::string target = nvme_dir() + "/planted_target";
};

// The mode bits of `fd` (fstat), and whether it has no name left.
std::pair<mode_t, bool> mode_and_unnamed(int fd) {
  struct stat info {};
  EXPECT_EQ(fstat(fd, &info), 0);
  return {info.st_mode & 07777, info.st_nlink == 0};
}

// Both ways of making a scratch file (unnamed, and the fallback's fresh name for a file system
// without O_TMPFILE) leave a link planted under the file's name alone, and give a file of mode
// 0600 that has no name.
TEST(Offload, ScratchFilesFollowNoPlantedLink) {
  for (const bool unnamed : {true, false}) {
    const PlantedLink planted("zero_optimizer_rank0.1234.swp");
    const int fd =
        create_scratch_file(planted.dir + "/zero_optimizer_rank0.1234.swp", O_DIRECT, unnamed);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const auto [mode, nameless] = mode_and_unnamed(fd);
    EXPECT_EQ(mode, 0600u) << "unnamed " << unnamed;
    EXPECT_TRUE(nameless) << "unnamed " << unnamed;
    ASSERT_EQ(close(fd), 0);
    planted.expect_untouched();
  }
}

// An NvmeFile at a name a link was planted under writes its own file (of mode 0600, found
// through /proc/self/fd as nothing else names it), never the link's target.
TEST(Offload, NvmeFilesFollowNoPlantedLink) {
  const PlantedLink planted("activations_rank_0.bin");
  std::vector<char> memory(2 * kNvmeAlignment);
  char* block = nvme_aligned(memory.data());
  std::fill(block, block + kNvmeAlignment, 'x');
  {
    NvmeFile file(planted.dir + "/activations_rank_0.bin", kNvmeAlignment, AioConfig{}, 0);
    file.wait(file.write(block, 0, kNvmeAlignment));
    std::vector<mode_t> modes;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code error;
      const std::string points_to = std::filesystem::read_symlink(entry.path(), error).string();
      if (error || points_to.rfind(planted.dir + "/", 0) != 0) continue;
      modes.push_back(mode_and_unnamed(std::stoi(entry.path().filename().string())).first);
    }
    EXPECT_EQ(modes, std::vector<mode_t>({0600})) << "the file's descriptor and mode";
  }
  planted.expect_untouched();
}

TEST(Offload, BadPathNamesTheFileAndErrno) {
  RunOptions o;
  o.stage = 1;
  o.steps = 1;
  o.tweak = [](EngineConfig& c) {
    c.offload_optimizer.device = OffloadDevice::kNvme;
    c.offload_optimizer.nvme_path = "/nonexistent/nvme";
  };
  const std::string message = error_of([&] { train(o); });
  expect_naming(message, "cannot create the offload file /nonexistent/nvme/zero_optimizer_rank");
  expect_naming(message, "No such file or directory (errno 2)");
}

// The third write of every rank fails as a failing disk would: in fp32 nothing is written at
// start (the moments start as zeros), so it is step 1's third record, at 2 x 8 KiB (100
// elements of two moments, each padded to 4 KiB). The step throws on every rank, naming the
// file, the offset and errno.
TEST(Offload, IoErrorNamesFileOffsetAndErrno) {
  const std::string fault = "write@" + std::to_string(make_mpi_communicator()->rank()) + "#3";
  ASSERT_EQ(setenv("ZERO_TEST_NVME_FAULT", fault.c_str(), 1), 0);
  RunOptions o;
  o.stage = 3;
  o.steps = 3;
  o.tweak = nvme(100, true);
  const std::string message = error_of([&] { train(o); });
  ASSERT_EQ(unsetenv("ZERO_TEST_NVME_FAULT"), 0);
  expect_naming(message, "nvme: write of " + nvme_dir() + "/zero_optimizer_rank");
  expect_naming(message, " at offset 16384 (8192 bytes) failed: ");
  expect_naming(message, "Input/output error (errno 5) [injected by ZERO_TEST_NVME_FAULT]");
  expect_naming(message, "nvme_store.cpp:");
}

// A transfer of 4 requests (4 KiB blocks) and its wait on rank 0's file under `fault`, with a
// bound: a request left unsubmitted would hang the wait, which ends the test instead. Returns
// the wait's error, or "" when it succeeded.
std::string transfer_under_fault(NvmeFile& file, char* buffer, uint64_t offset) {
  std::promise<std::string> outcome;
  std::future<std::string> result = outcome.get_future();
  std::thread([&file, &outcome, buffer, offset] {
    try {
      file.wait(file.write(buffer, offset, 4 * kNvmeAlignment));
      outcome.set_value("");
    } catch (const Error& e) {
      outcome.set_value(e.what());
    }
  }).detach();
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "the transfer at offset %llu did not finish within 30 s\n",
                 static_cast<unsigned long long>(offset));
    std::_Exit(1);  // its worker waits forever: the file cannot be closed
  }
  return result.get();
}

AioConfig four_kib_blocks() {
  AioConfig aio;
  aio.block_size = kNvmeAlignment;
  return aio;
}

// A submission the kernel takes only part of (the first request of four): the rest go again,
// and the transfer completes with what was written.
TEST(Offload, ShortSubmitSendsTheRest) {
  ASSERT_EQ(setenv("ZERO_TEST_NVME_FAULT", "short-submit@0", 1), 0);
  NvmeFile file(nvme_dir() + "/short_submit.swp", 8 * kNvmeAlignment, four_kib_blocks(), 0);
  ASSERT_EQ(unsetenv("ZERO_TEST_NVME_FAULT"), 0);
  std::vector<char> memory(9 * kNvmeAlignment);
  char* buffer = nvme_aligned(memory.data());
  for (size_t i = 0; i < 4 * kNvmeAlignment; ++i) buffer[i] = static_cast<char>(i / 4096 + 1);
  EXPECT_EQ(transfer_under_fault(file, buffer, 0), "");
  char* back = buffer + 4 * kNvmeAlignment;
  file.wait(file.read(back, 0, 4 * kNvmeAlignment));
  EXPECT_TRUE(std::equal(buffer, back, back)) << "what the short submit left out was not written";
}

// A failed submission fails its requests with the file, the offset and errno; what the ring
// still holds of them never reaches the kernel, and a later transfer of the file fails naming
// that error instead of sending them along.
TEST(Offload, SubmitErrorNamesFileOffsetAndErrno) {
  ASSERT_EQ(setenv("ZERO_TEST_NVME_FAULT", "submit@0", 1), 0);
  const std::string path = nvme_dir() + "/submit_error.swp";
  NvmeFile file(path, 8 * kNvmeAlignment, four_kib_blocks(), 0);
  ASSERT_EQ(unsetenv("ZERO_TEST_NVME_FAULT"), 0);
  std::vector<char> memory(5 * kNvmeAlignment);
  char* buffer = nvme_aligned(memory.data());
  const std::string first = transfer_under_fault(file, buffer, 0);
  expect_naming(first, "nvme: write of " + path + " at offset 0 (4096 bytes) failed: ");
  expect_naming(first,
                "io_uring_submit: Input/output error (errno 5) [injected by "
                "ZERO_TEST_NVME_FAULT]");
  expect_naming(first, "nvme_store.cpp:");
  const std::string later = transfer_under_fault(file, buffer, 4 * kNvmeAlignment);
  expect_naming(later, "nvme: write of " + path + " at offset 16384 (4096 bytes) failed: ");
  expect_naming(later, "an earlier io_uring_submit of this file failed: Input/output error");
}

// Saved at step 3 from NVMe-resident state, loaded into a fresh NVMe-offloaded engine (bf16:
// master, moments and working copy all come back), steps 4-6 are those of the run that never
// stopped; the checkpoint also loads into an in-memory engine with the same result.
TEST(Offload, CheckpointResumeIsBitwise) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const std::string dir = empty_job_dir(*comm, "checkpoint");
  const auto run = [&](bool offloaded, int from, int to, bool save, bool load) {
    EngineConfig config;
    config.stage = 3;
    config.dtype = DType::kBFloat16;
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

// One training step of the teacher task on 4 samples of this rank's: state worth a checkpoint.
void train_one_step(ZeroModel& model, const models::MlpConfig& mlp, int rank) {
  models::TeacherTask task(mlp, 7);
  models::Batch batch = task.batch(1, rank * 4, 4);
  Tensor grad;
  models::mse_loss(model.forward(batch.inputs), batch.targets, grad);
  model.backward(grad);
  model.step();
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
  config.dtype = DType::kBFloat16;
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
    const auto sub_groups = [](EngineConfig& c) { c.optimizer_sub_group_elements = 100; };
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
    o.tweak = both(sub_groups, [](EngineConfig& c) { c.prefetch_elements = 1000; });
    const TrainResult prefetched = train(o);
    o.tweak = both(both(sub_groups, [](EngineConfig& c) { c.prefetch_elements = 1000; }),
                   params_on_nvme(3));
    expect_bitwise(train(o), prefetched, std::string(dtype_name(dtype)) + " prefetching");
    // The persistent unit (the biases and the last layer's weight) stays in memory.
    const auto persistent = [](EngineConfig& c) { c.persistence_threshold = 100; };
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
    const TrainResult run = train(o);
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
    // little else to do first: it waits for reads, and says how long.
    EXPECT_GT(read_wait_ms, 0.0) << what << ": the stream's waits for shard reads";
  }
}

// Too small a buffer for a unit's shard is refused before anything runs, naming both sizes;
// other stages refuse offload_param nvme, as DeepSpeed does.
TEST(ParamOffload, ShardLargerThanBufferIsRefused) {
  RunOptions o;
  o.stage = 3;
  o.steps = 1;
  o.tweak = params_on_nvme(2, 16);
  const std::string message = error_of([&] { train(o); });
  expect_naming(message, "offload_param.buffer_size is 16 elements, but unit ");
  expect_naming(message, "'s shard on each rank has ");
  expect_naming(message, "raise buffer_size to at least ");
  o.stage = 2;
  o.tweak = params_on_nvme(2);
  expect_naming(error_of([&] { train(o); }),
                "parameter offload to nvme (offload_param) needs ZeRO stage 3, not stage 2");
}

TEST(ParamOffload, BadPathNamesTheFileAndErrno) {
  RunOptions o;
  o.stage = 3;
  o.steps = 1;
  o.tweak = [](EngineConfig& c) {
    c.offload_param.device = OffloadDevice::kNvme;
    c.offload_param.nvme_path = "/nonexistent/nvme";
  };
  const std::string message = error_of([&] { train(o); });
  expect_naming(message, "cannot create the offload file /nonexistent/nvme/zero_param_rank");
  expect_naming(message, "No such file or directory (errno 2)");
}

// The first shard read of every rank fails as a failing disk would (the first all-gather's):
// the error names the parameter file, the offset and errno.
TEST(ParamOffload, IoErrorNamesFileOffsetAndErrno) {
  const std::string fault = "read@" + std::to_string(make_mpi_communicator()->rank());
  ASSERT_EQ(setenv("ZERO_TEST_NVME_FAULT", fault.c_str(), 1), 0);
  RunOptions o;
  o.stage = 3;
  o.steps = 2;
  o.tweak = params_on_nvme(2);
  const std::string message = error_of([&] { train(o); });
  ASSERT_EQ(unsetenv("ZERO_TEST_NVME_FAULT"), 0);
  expect_naming(message, "nvme: read of " + nvme_dir() + "/zero_param_rank");
  expect_naming(message, " at offset 0 (4096 bytes) failed: ");
  expect_naming(message, "Input/output error (errno 5) [injected by ZERO_TEST_NVME_FAULT]");
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
      const models::MlpConfig mlp{8, 24, 4, 3};
      const auto run = [&](bool offloaded, int from, int to, bool save, bool load) {
        EngineConfig config;
        config.stage = 3;
        config.dtype = dtype;
        config.optimizer.lr = 1e-2f;
        if (offloaded) setting(config);
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
        return losses;
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
    config.dtype = DType::kBFloat16;
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
        largest_shard = std::max<uint64_t>(largest_shard, unit.shard * dtype_size(config.dtype));
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
