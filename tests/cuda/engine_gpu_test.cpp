// The engine on one GPU (label gpu, one rank): the example MLP trained through the unchanged
// schedule with device buffers, NCCL collectives, the CUDA kernels and cuBLAS, against the same
// run on the CPU (MPI, AVX2 kernels, OpenBLAS). The GEMMs and the norm's summation order differ
// between the two, so they agree within a tolerance, not bitwise; the stages on the GPU agree
// with one another bitwise, as they do on the CPU at one rank.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "models/mlp.h"
#include "tests/expect_error.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/collectives/nccl_communicator.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/model.h"

namespace zero {
namespace {

constexpr int kSteps = 12;

models::MlpConfig small_mlp() {
  models::MlpConfig mlp;
  mlp.input_dim = 24;
  mlp.hidden_dim = 96;
  mlp.output_dim = 8;
  mlp.layers = 4;
  return mlp;
}

EngineConfig config_for(int stage, DType dtype, bool cuda) {
  EngineConfig config;
  config.device = cuda ? Device::cuda(0) : Device::cpu();
  config.stage = stage;
  config.precision.dtype = dtype;
  config.optimizer.lr = 1e-2f;
  config.gradient_clipping = 1.0f;
  if (dtype == DType::kFloat16) config.precision.loss_scaler.initial_scale_power = 8;
  return config;
}

std::unique_ptr<Communicator> communicator(bool cuda) {
  if (cuda) return make_nccl_communicator(0);
  return make_mpi_communicator();
}

struct TrainedRun {
  std::vector<float> losses;
  std::vector<float> grad_norms;
  std::vector<float> params;  // every parameter, flattened in registration order
  uint64_t model_state_bytes = 0;
  uint64_t planned_model_state_bytes = 0;
  uint64_t host_bytes = 0;  // pinned and pageable
  uint64_t planned_host_bytes = 0;
  uint64_t buffer_bytes = 0;
  uint64_t planned_buffer_bytes = 0;
  uint64_t nvme_bytes = 0;
};

TrainedRun train(const EngineConfig& config, int steps = kSteps) {
  std::unique_ptr<Communicator> comm = communicator(config.device.is_cuda());
  ZeroModel model(*comm, models::make_mlp(small_mlp()), config);
  const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
  const models::TeacherTask task(small_mlp(), 3);
  TrainedRun run;
  for (int step = 1; step <= steps; ++step) {
    const models::Batch batch = task.batch(step, 0, 32);
    Tensor grad;
    run.losses.push_back(
        models::mse_loss(model.forward(batch.inputs.to(device)), batch.targets.to(device), grad));
    model.backward(grad);
    run.grad_norms.push_back(model.step().grad_norm);
  }
  for (const std::vector<float>& p : model.engine().gather_full_params()) {
    run.params.insert(run.params.end(), p.begin(), p.end());
  }
  run.model_state_bytes = model.engine().model_state_bytes();
  const MemoryPlan plan = plan_memory(model.engine().layout(), config);
  run.planned_model_state_bytes = plan.model_state;
  run.host_bytes = model.engine().pinned_host_bytes() + model.engine().pageable_host_bytes();
  run.planned_host_bytes = plan.host_pinned + plan.host_pageable;
  run.buffer_bytes = model.engine().buffer_bytes();
  run.planned_buffer_bytes = plan.buffers;
  run.nvme_bytes = model.engine().nvme_bytes();
  return run;
}

double relative_difference(float a, float b) {
  return std::fabs(static_cast<double>(a) - b) / std::max(1e-12, std::fabs(static_cast<double>(b)));
}

// Losses and norms within `tolerance` relative, the parameters within ten times it as a norm ratio
// |gpu - cpu| / |cpu|. cuBLAS and OpenBLAS sum in different orders, so the runs drift apart by
// rounding; with Adam more than that: its first steps move each parameter by about ±lr whatever
// the gradient's size, so an element whose gradient is below the rounding difference may step the
// other way on one device (2 lr apart from then on), which the norm ratio absorbs and the losses
// feel a little.
void expect_close(const TrainedRun& gpu, const TrainedRun& cpu, double tolerance) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < gpu.losses.size(); ++i) {
    EXPECT_LE(relative_difference(gpu.losses[i], cpu.losses[i]), tolerance)
        << "step " << i + 1 << ": loss on the GPU " << gpu.losses[i] << ", on the CPU "
        << cpu.losses[i];
    EXPECT_LE(relative_difference(gpu.grad_norms[i], cpu.grad_norms[i]), tolerance)
        << "step " << i + 1 << ": gradient norm";
  }
  ASSERT_EQ(gpu.params.size(), cpu.params.size());
  double difference = 0.0, norm = 0.0;
  for (size_t i = 0; i < gpu.params.size(); ++i) {
    const double d = static_cast<double>(gpu.params[i]) - cpu.params[i];
    difference += d * d;
    norm += static_cast<double>(cpu.params[i]) * cpu.params[i];
  }
  EXPECT_LE(std::sqrt(difference / norm), 10 * tolerance)
      << "parameters after training, |gpu - cpu| / |cpu|";
}

// A directory of this test's own under the working directory: O_DIRECT files (the NVMe offload)
// need a real file system, which /tmp may not be (tmpfs refuses O_DIRECT before Linux 6.6).
std::string scratch_dir(const std::string& name) {
  const std::string dir =
      (std::filesystem::current_path() / (name + "_" + std::to_string(getpid()))).string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Steps `from` to `to` of the teacher task on the model's device, saving a checkpoint to `dir`
// after step 3; the losses.
std::vector<float> train_saving_step_3(ZeroModel& model, const models::TeacherTask& task,
                                       const std::string& dir, int from, int to) {
  const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
  std::vector<float> losses;
  for (int step = from; step <= to; ++step) {
    const models::Batch batch = task.batch(step, 0, 32);
    Tensor grad;
    losses.push_back(
        models::mse_loss(model.forward(batch.inputs.to(device)), batch.targets.to(device), grad));
    model.backward(grad);
    model.step();
    if (step == 3) save_checkpoint(model.engine(), dir, TrainerState{3, 3});
  }
  return losses;
}

class EngineOnGpu : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(EngineOnGpu, Fp32MatchesTheCpuRun) {
  const int stage = GetParam();
  const TrainedRun gpu = train(config_for(stage, DType::kFloat32, true));
  const TrainedRun cpu = train(config_for(stage, DType::kFloat32, false));
  expect_close(gpu, cpu, 1e-3);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front()) << "the loss must fall on the GPU";
  EXPECT_EQ(gpu.model_state_bytes, gpu.planned_model_state_bytes);
  EXPECT_EQ(gpu.model_state_bytes, cpu.model_state_bytes);
}

// SGD with momentum moves each parameter in proportion to its gradient, so no element can step
// the other way as with Adam (and the CUDA SGD kernel runs in the engine here).
TEST_P(EngineOnGpu, SgdWithMomentumMatchesTheCpuRun) {
  EngineConfig gpu_config = config_for(GetParam(), DType::kFloat32, true);
  gpu_config.optimizer.type = OptimizerType::kSgd;
  gpu_config.optimizer.lr = 0.05f;
  gpu_config.optimizer.momentum = 0.9f;
  EngineConfig cpu_config = gpu_config;
  cpu_config.device = Device::cpu();
  const TrainedRun gpu = train(gpu_config);
  const TrainedRun cpu = train(cpu_config);
  expect_close(gpu, cpu, 1e-4);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
}

TEST_P(EngineOnGpu, Bf16AndFp16TrackTheCpuRun) {
  const int stage = GetParam();
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const TrainedRun gpu = train(config_for(stage, dtype, true));
    const TrainedRun cpu = train(config_for(stage, dtype, false));
    SCOPED_TRACE(dtype_name(dtype));
    // 16-bit storage rounds the tiny GEMM differences up to a unit in the last place of bf16.
    expect_close(gpu, cpu, 2e-2);
    EXPECT_EQ(gpu.model_state_bytes, gpu.planned_model_state_bytes);
  }
}

TEST_P(EngineOnGpu, EveryStageGivesTheSameLossesAsStageZero) {
  const TrainedRun reference = train(config_for(0, DType::kFloat32, true));
  const TrainedRun run = train(config_for(GetParam(), DType::kFloat32, true));
  EXPECT_EQ(run.losses, reference.losses);
  EXPECT_EQ(run.params, reference.params);
}

// ZeRO-Offload (offload_optimizer cpu): the master and optimizer state in host memory, each
// gradient shard copied there behind its reduction, the CPU kernels stepping it, the parameters
// copied back; and ZeRO-Infinity's offload to nvme, whose records stream through page-locked
// host memory and are stepped there the same way. The CUDA AdamW kernel is bitwise the CPU one,
// so each run equals the in-memory GPU run bit for bit, and tracks the CPU run as that does;
// the device holds the plan's bytes without the optimizer's, the host the plan's.
TEST_P(EngineOnGpu, OffloadToHostIsBitwiseTheInMemoryRun) {
  const int stage = GetParam();
  if (stage == 0) GTEST_SKIP() << "stage 0 has no partitioned optimizer to offload";
  const std::string nvme_dir = scratch_dir("zero_gpu_nvme");
  for (OffloadDevice to : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(offload_device_name(to)) + " " + dtype_name(dtype));
      EngineConfig offloaded_config = config_for(stage, dtype, true);
      offloaded_config.schedule.optimizer_sub_group_elements =
          1000;  // several sub-groups, cut in units
      offloaded_config.offload.optimizer.device = to;
      // Both kinds of host memory for the master and state.
      offloaded_config.offload.optimizer.pin_memory = dtype == DType::kBFloat16;
      offloaded_config.offload.optimizer.nvme_path = nvme_dir;
      offloaded_config.offload.optimizer.pipeline_read = true;
      offloaded_config.offload.optimizer.pipeline_write = true;
      const TrainedRun offloaded = train(offloaded_config);
      EngineConfig in_memory_config = offloaded_config;
      in_memory_config.offload.optimizer.device = OffloadDevice::kNone;
      const TrainedRun in_memory = train(in_memory_config);
      EXPECT_EQ(offloaded.losses, in_memory.losses);
      EXPECT_EQ(offloaded.grad_norms, in_memory.grad_norms);
      EXPECT_EQ(offloaded.params, in_memory.params);
      EngineConfig cpu_config = in_memory_config;
      cpu_config.device = Device::cpu();
      expect_close(offloaded, train(cpu_config), dtype == DType::kFloat32 ? 1e-3 : 2e-2);
      EXPECT_EQ(offloaded.model_state_bytes, offloaded.planned_model_state_bytes);
      EXPECT_EQ(offloaded.host_bytes, offloaded.planned_host_bytes);
      EXPECT_LT(offloaded.model_state_bytes, in_memory.model_state_bytes);
      EXPECT_GT(offloaded.host_bytes, 0u);
    }
  }
  std::filesystem::remove_all(nvme_dir);
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineOnGpu, ::testing::Values(0, 1, 2, 3));

class GpuModel : public ::testing::Test {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// Stage 3's parameter shards on NVMe (offload_param nvme): each shard is read into a page-locked
// buffer, copied to its device buffer ahead of its all-gather, and, updated on the device, copied
// back before its write; with the optimizer on the host (cpu or nvme) the host updates it in its
// buffer. With one buffer (every read waits for the last write) and three, each run equals the
// in-memory GPU run bit for bit, and each tier holds the plan's bytes.
TEST_F(GpuModel, ParamsOnNvmeAreBitwiseTheInMemoryRun) {
  const std::string nvme_dir = scratch_dir("zero_gpu_param_nvme");
  for (OffloadDevice optimizer :
       {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int buffers : {1, 3}) {
        SCOPED_TRACE(std::string("optimizer ") + offload_device_name(optimizer) + " " +
                     dtype_name(dtype) + " " + std::to_string(buffers) + " buffer(s)");
        EngineConfig in_memory_config = config_for(3, dtype, true);
        in_memory_config.schedule.optimizer_sub_group_elements = 1000;
        in_memory_config.offload.optimizer.device = optimizer;
        in_memory_config.offload.optimizer.nvme_path = nvme_dir;
        EngineConfig swapped_config = in_memory_config;
        swapped_config.offload.param.device = OffloadDevice::kNvme;
        swapped_config.offload.param.nvme_path = nvme_dir;
        swapped_config.offload.param.buffer_count = buffers;
        const TrainedRun swapped = train(swapped_config);
        const TrainedRun in_memory = train(in_memory_config);
        EXPECT_EQ(swapped.losses, in_memory.losses);
        EXPECT_EQ(swapped.grad_norms, in_memory.grad_norms);
        EXPECT_EQ(swapped.params, in_memory.params);
        EXPECT_GT(swapped.nvme_bytes, in_memory.nvme_bytes);
        EXPECT_LT(swapped.model_state_bytes, in_memory.model_state_bytes);
        EXPECT_EQ(swapped.model_state_bytes, swapped.planned_model_state_bytes);
        EXPECT_EQ(swapped.buffer_bytes, swapped.planned_buffer_bytes);
        EXPECT_EQ(swapped.host_bytes, swapped.planned_host_bytes);
      }
    }
  }
  std::filesystem::remove_all(nvme_dir);
}

TEST_F(GpuModel, TensorsMoveBetweenHostAndDevice) {
  const std::shared_ptr<DeviceContext> device = DeviceContext::create(Device::cuda(0));
  const std::vector<float> values = {1.0f, -2.5f, 3.25f, 0.0f, 7.0f, 1e-3f};
  const Tensor on_device = Tensor({2, 3}, values).to(device);
  EXPECT_EQ(on_device.device(), device);
  const Tensor copy = on_device;  // a deep copy on the same device
  EXPECT_NE(copy.data(), on_device.data());
  EXPECT_EQ(copy.to_host(), values);
  EXPECT_EQ(copy.to(nullptr).device(), nullptr);
}

TEST_F(GpuModel, AHostInputToAGpuModelIsAnError) {
  std::unique_ptr<Communicator> comm = communicator(true);
  ZeroModel model(*comm, models::make_mlp(small_mlp()), config_for(3, DType::kFloat32, true));
  const models::Batch batch = models::TeacherTask(small_mlp(), 3).batch(1, 0, 4);
  testing::expect_error_naming(
      [&] { model.forward(batch.inputs); },
      "the input of forward() is in host memory but the model runs on cuda:0");
  // The same GPU through another context: another compute stream, unordered with the engine's.
  const Tensor elsewhere = batch.inputs.to(DeviceContext::create(Device::cuda(0)));
  testing::expect_error_naming([&] { model.forward(elsewhere); },
                               "the input of forward() belongs to another device context of "
                               "cuda:0");
}

// A checkpoint saved from device memory (stage 3) loads on the CPU (stage 1) with the same master
// weights and step: the state went through the host copies unchanged.
TEST_F(GpuModel, CheckpointSavedOnTheGpuResumesOnTheCpu) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zero_gpu_ckpt_" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  const EngineConfig gpu_config = config_for(3, DType::kBFloat16, true);
  std::vector<std::vector<float>> saved_master;
  {
    std::unique_ptr<Communicator> comm = communicator(true);
    ZeroModel model(*comm, models::make_mlp(small_mlp()), gpu_config);
    const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
    const models::TeacherTask task(small_mlp(), 3);
    for (int step = 1; step <= 3; ++step) {
      const models::Batch batch = task.batch(step, 0, 32);
      Tensor grad;
      models::mse_loss(model.forward(batch.inputs.to(device)), batch.targets.to(device), grad);
      model.backward(grad);
      model.step();
    }
    save_checkpoint(model.engine(), dir, TrainerState{3, 3});
    saved_master = model.engine().gather_full_master();
  }
  std::unique_ptr<Communicator> comm = communicator(false);
  ZeroModel model(*comm, models::make_mlp(small_mlp()), config_for(1, DType::kBFloat16, false));
  TrainerState trainer;
  load_checkpoint(model.engine(), dir, &trainer);
  EXPECT_EQ(trainer.step, 3);
  EXPECT_EQ(model.engine().gather_full_master(), saved_master);
  EXPECT_EQ(model.engine().optimizer_step(), 3);
  std::filesystem::remove_all(dir);
}

// The same from an offloaded GPU run, to the host (its state views are the host arrays
// themselves) and to NVMe (its views are copies out of the records), fp32 and bf16: the master
// goes to the CPU unchanged, and a load into the offloaded run puts the working parameters back
// on the device from the host master, so the resumed run continues bit for bit.
TEST_F(GpuModel, OffloadedCheckpointRoundTripsThroughTheCpu) {
  const std::string dir = scratch_dir("zero_gpu_offload_checkpoint");
  const std::string nvme_dir = scratch_dir("zero_gpu_offload_nvme");
  const models::TeacherTask task(small_mlp(), 3);
  for (OffloadDevice to : {OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(offload_device_name(to)) + " " + dtype_name(dtype));
      std::filesystem::remove_all(dir);
      EngineConfig gpu_config = config_for(2, dtype, true);
      gpu_config.offload.optimizer.device = to;
      gpu_config.offload.optimizer.nvme_path = nvme_dir;
      gpu_config.schedule.optimizer_sub_group_elements = 1000;
      std::unique_ptr<Communicator> gpu_comm = communicator(true);
      std::vector<float> whole;
      std::vector<std::vector<float>> saved_master;
      {
        ZeroModel model(*gpu_comm, models::make_mlp(small_mlp()), gpu_config);
        whole = train_saving_step_3(model, task, dir, 1, 3);
        saved_master = model.engine().gather_full_master();
        const std::vector<float> tail = train_saving_step_3(model, task, dir, 4, 5);
        whole.insert(whole.end(), tail.begin(), tail.end());
      }
      {
        std::unique_ptr<Communicator> comm = communicator(false);
        ZeroModel model(*comm, models::make_mlp(small_mlp()), config_for(1, dtype, false));
        load_checkpoint(model.engine(), dir, nullptr);
        EXPECT_EQ(model.engine().gather_full_master(), saved_master);
      }
      ZeroModel resumed(*gpu_comm, models::make_mlp(small_mlp()), gpu_config);
      load_checkpoint(resumed.engine(), dir, nullptr);
      EXPECT_EQ(resumed.engine().gather_full_master(), saved_master);
      const std::vector<float> tail = train_saving_step_3(resumed, task, dir, 4, 5);
      EXPECT_EQ(tail, std::vector<float>(whole.begin() + 3, whole.end()));
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(nvme_dir);
}

// A checkpoint of a run with its parameter shards on NVMe goes through the device copies the
// engine computes on (each shard read out of the file, saved, loaded into a copy and stored back):
// a fresh engine resumes it bit for bit, with the optimizer on the device, in host memory and on
// NVMe.
TEST_F(GpuModel, ParamsOnNvmeCheckpointResumesBitwise) {
  const std::string dir = scratch_dir("zero_gpu_param_checkpoint");
  const std::string nvme_dir = scratch_dir("zero_gpu_param_checkpoint_nvme");
  const models::TeacherTask task(small_mlp(), 3);
  for (OffloadDevice optimizer :
       {OffloadDevice::kNone, OffloadDevice::kCpu, OffloadDevice::kNvme}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(std::string("optimizer ") + offload_device_name(optimizer) + " " +
                   dtype_name(dtype));
      std::filesystem::remove_all(dir);
      EngineConfig config = config_for(3, dtype, true);
      config.offload.optimizer.device = optimizer;
      config.offload.optimizer.nvme_path = nvme_dir;
      config.offload.param.device = OffloadDevice::kNvme;
      config.offload.param.nvme_path = nvme_dir;
      config.offload.param.buffer_count = 2;
      std::unique_ptr<Communicator> comm = communicator(true);
      std::vector<float> whole;
      {
        ZeroModel model(*comm, models::make_mlp(small_mlp()), config);
        whole = train_saving_step_3(model, task, dir, 1, 5);
      }
      ZeroModel resumed(*comm, models::make_mlp(small_mlp()), config);
      load_checkpoint(resumed.engine(), dir, nullptr);
      EXPECT_EQ(train_saving_step_3(resumed, task, dir, 4, 5),
                std::vector<float>(whole.begin() + 3, whole.end()));
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(nvme_dir);
}

}  // namespace
}  // namespace zero
