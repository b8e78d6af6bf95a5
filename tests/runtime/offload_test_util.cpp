#include "tests/runtime/offload_test_util.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <utility>

namespace zero::testing {

std::string job_dir() {
  return std::string(ZERO_OFFLOAD_TEST_DIR) + "/np" + std::to_string(world_size());
}

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

ScopedNvmeFault::ScopedNvmeFault(const std::string& fault) {
  EXPECT_EQ(setenv("ZERO_TEST_NVME_FAULT", fault.c_str(), 1), 0);
}

ScopedNvmeFault::~ScopedNvmeFault() {
  EXPECT_EQ(unsetenv("ZERO_TEST_NVME_FAULT"), 0);
}

std::string training_error(int stage, int steps, std::function<void(EngineConfig&)> tweak,
                           const std::string& nvme_fault) {
  RunOptions o;
  o.stage = stage;
  o.steps = steps;
  o.tweak = std::move(tweak);
  std::optional<ScopedNvmeFault> fault;
  if (!nvme_fault.empty()) fault.emplace(nvme_fault);
  return error_of([&] { train(o); });
}

void expect_naming(const std::string& message, const std::string& needle) {
  EXPECT_NE(message.find(needle), std::string::npos)
      << "message '" << message << "' does not name '" << needle << "'";
}

void expect_missing_dir_named(int stage, std::function<void(EngineConfig&)> tweak,
                              const std::string& file) {
  const std::string message = training_error(stage, 1, std::move(tweak));
  expect_naming(message, "cannot create the offload file " + kMissingDir + "/" + file);
  expect_naming(message, "No such file or directory (errno 2)");
}

std::string expect_injected_io_error(int stage, int steps, std::function<void(EngineConfig&)> tweak,
                                     const std::string& nvme_fault, const std::string& access,
                                     const std::string& file, const std::string& where) {
  const std::string message = training_error(stage, steps, std::move(tweak), nvme_fault);
  expect_naming(message, "nvme: " + access + " of " + nvme_dir() + "/" + file);
  expect_naming(message, where + " failed: ");
  expect_naming(message, "Input/output error (errno 5) [injected by ZERO_TEST_NVME_FAULT]");
  return message;
}

std::function<void(EngineConfig&)> nvme(size_t sub_group, bool pipeline, AioConfig aio) {
  const std::string dir = nvme_dir();
  return [=](EngineConfig& c) {
    c.schedule.optimizer_sub_group_elements = sub_group;
    c.offload.optimizer.device = OffloadDevice::kNvme;
    c.offload.optimizer.nvme_path = dir;
    c.offload.optimizer.pipeline_read = pipeline;
    c.offload.optimizer.pipeline_write = pipeline;
    c.offload.optimizer.buffer_count = pipeline ? 3 : 1;
    c.offload.aio = aio;
  };
}

std::function<void(EngineConfig&)> params_on_nvme(int buffers, size_t buffer_size) {
  const std::string dir = nvme_dir();
  return [=](EngineConfig& c) {
    c.offload.param.device = OffloadDevice::kNvme;
    c.offload.param.nvme_path = dir;
    c.offload.param.buffer_count = buffers;
    c.offload.param.buffer_size = buffer_size;
  };
}

void optimizer_on_host(EngineConfig& c) {
  c.offload.optimizer.device = OffloadDevice::kCpu;
}

std::function<void(EngineConfig&)> both(std::function<void(EngineConfig&)> first,
                                        std::function<void(EngineConfig&)> second) {
  return [=](EngineConfig& c) {
    first(c);
    second(c);
  };
}

void train_one_step(ZeroModel& model, const models::MlpConfig& mlp, int rank) {
  models::TeacherTask task(mlp, 7);
  models::Batch batch = task.batch(1, rank * 4, 4);
  Tensor grad;
  models::mse_loss(model.forward(batch.inputs), batch.targets, grad);
  model.backward(grad);
  model.step();
}

}  // namespace zero::testing
