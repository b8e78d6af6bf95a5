// What the tests of offloaded state share (offload_test.cpp, param_offload_test.cpp,
// offload_checkpoint_test.cpp, nvme_file_test.cpp): their directories under the build tree, the
// engine settings that put state on NVMe or in host memory, and errors as text.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <string>

#include "models/mlp.h"
#include "tests/runtime/train_util.h"
#include "zero/runtime/nvme_file.h"

namespace zero::testing {

// This job's directory (by world size: jobs of other sizes may run beside it), and each rank's
// own in it; every state file in them is unlinked once open.
std::string job_dir();

// job_dir()/name, emptied by rank 0 before any rank uses it: a checkpoint directory that holds
// nothing of an earlier run.
std::string empty_job_dir(Communicator& comm, const std::string& name);

// This rank's directory in job_dir(), created when missing.
std::string nvme_dir();

// ZERO_TEST_NVME_FAULT (the NVMe files' fault switch, read when a file is made:
// KIND@RANK[#N]) set while this lives, and unset however the scope is left.
class ScopedNvmeFault {
 public:
  explicit ScopedNvmeFault(const std::string& fault);
  ~ScopedNvmeFault();
  ScopedNvmeFault(const ScopedNvmeFault&) = delete;
  ScopedNvmeFault& operator=(const ScopedNvmeFault&) = delete;
};

// The message of the zero::Error fn throws, or "no error".
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// The message of the error that training `steps` steps at `stage` with `tweak` ends with, or
// "no error". A `nvme_fault` is ZERO_TEST_NVME_FAULT for the run (the NVMe files' fault switch:
// KIND@RANK[#N]).
std::string training_error(int stage, int steps, std::function<void(EngineConfig&)> tweak,
                           const std::string& nvme_fault = "");

void expect_naming(const std::string& message, const std::string& needle);

// A directory that does not exist, for offload files that cannot be created.
inline const std::string kMissingDir = "/nonexistent/nvme";

// Training at `stage` with `tweak`, which puts the offload files in kMissingDir, stops naming
// the file it could not create (`file`: the rank's file's prefix, e.g. "zero_param_rank") and
// errno 2.
void expect_missing_dir_named(int stage, std::function<void(EngineConfig&)> tweak,
                              const std::string& file);

// Training `steps` steps at `stage` with `tweak` and the injected `nvme_fault` (training_error's)
// stops with the I/O error: its `access` ("read" or "write") of this rank's `file` in nvme_dir()
// at `where` (e.g. " at offset 0 (4096 bytes)"), and errno 5, named. Returns the message.
std::string expect_injected_io_error(int stage, int steps, std::function<void(EngineConfig&)> tweak,
                                     const std::string& nvme_fault, const std::string& access,
                                     const std::string& file, const std::string& where);

// offload_optimizer on nvme: sub-groups of `sub_group` elements in the rank's file, pipelined
// reads and writes or not, under `aio`.
std::function<void(EngineConfig&)> nvme(size_t sub_group, bool pipeline, AioConfig aio = {});

// offload_param on nvme: each shard in the rank's file, `buffers` buffers of `buffer_size`.
std::function<void(EngineConfig&)> params_on_nvme(int buffers, size_t buffer_size = 4096);

// The optimizer's master and state in host memory (offload_optimizer cpu), stepped by the host
// as on a GPU, with the copies inside host memory.
void optimizer_on_host(EngineConfig& c);

// `first`, then `second`.
std::function<void(EngineConfig&)> both(std::function<void(EngineConfig&)> first,
                                        std::function<void(EngineConfig&)> second);

// One training step of the teacher task on 4 samples of this rank's: state worth a checkpoint.
void train_one_step(ZeroModel& model, const models::MlpConfig& mlp, int rank);

}  // namespace zero::testing
