// A checkpoint as read without MPI or an engine: the trainer's position, the manifest's content
// (CheckpointInfo) and the functions that resolve, verify and read a checkpoint's files.
// zero-checkpoint and the tests use these; checkpoint.h adds the collective save and load.
// proto/checkpoint.proto documents the formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/core/dtype.h"
#include "zero/optimizer/loss_scaler.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/layout.h"

namespace zero {

// What the training loop needs for an exact resume. Data and initialization are counter-based
// (keyed by seed and step), so these two values are the whole data position and RNG state.
struct TrainerState {
  long step = 0;      // trainer steps done
  uint64_t seed = 0;  // the run's seed
};

// CRC32C (Castagnoli polynomial, as iSCSI, ext4 and leveldb use): pass the previous result as
// `crc` to continue over several buffers (start with 0).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// A checkpoint's manifest, read without MPI (zero-checkpoint, tests).
struct CheckpointInfo {
  struct File {
    std::string name;  // relative to step_dir
    uint64_t size = 0;
    uint32_t crc32c = 0;
  };
  struct SavedUnit {
    size_t numel = 0;
    size_t shard = 0;
  };
  std::string step_dir;  // the resolved step directory
  int world_size = 1;
  int stage = 0;
  DType dtype = DType::kFloat32;
  size_t alignment_bytes = 0;
  std::vector<ParamPlacement> params;  // registration order
  std::vector<SavedUnit> units;
  OptimizerConfig optimizer;
  int state_count = 0;
  long optimizer_step = 0;
  LrScheduleConfig lr_schedule;
  LossScaler::State loss_scaler{1.0f, 0, 0};
  TrainerState trainer;
  std::vector<File> files;  // rank order
  // Tensor parallelism: the slices of rank tensor_parallel_rank of tensor_parallel_size (1: the
  // whole model), over world_size data-parallel ranks.
  int tensor_parallel_size = 1;
  int tensor_parallel_rank = 0;
};

// Resolves `path` as load_checkpoint does, checks the manifest's checksum and consistency (the
// layout fits the world size, every file is listed with the size the layout implies) and
// returns it. Throws zero::Error naming the file and the problem.
CheckpointInfo read_checkpoint_info(const std::string& path);

// Checks every shard file's size and CRC32C; returns one line per bad file ("rank_00001.bin:
// checksum ..."), empty when all are good.
std::vector<std::string> verify_checkpoint_files(const CheckpointInfo& info);

// A tensor-parallel run saves one checkpoint per tensor-parallel rank, in PATH/tp_rank_RR/ (each
// with its own step directories and `latest`). Returns the checkpoint of every rank of the save
// at `path` in rank order, each resolved as read_checkpoint_info resolves a path, or the one
// checkpoint at `path` of a run without tensor parallelism. Throws zero::Error naming the
// directory when a rank's checkpoint is missing, when the ranks' checkpoints are not of one save
// (another step, world size, stage, dtype or parameter list), and for the directory of a single
// tensor-parallel rank.
std::vector<CheckpointInfo> read_checkpoint_grid(const std::string& path);

// A pipelined run saves one checkpoint per pipeline stage (each as above, tensor-parallel
// included) in DIR/pp_stage_SS, and DIR/pipeline records the number of stages.
std::string pipeline_stage_dir(const std::string& dir, int stage);
// Writes DIR/pipeline, creating DIR: through a temporary file, fsynced, renamed. Throws
// zero::Error naming the file.
void write_pipeline_record(const std::string& dir, int stages);
// The stages DIR/pipeline records, 0 when there is none (not a pipelined save). Throws
// zero::Error naming the file when it is not a record or a stage's directory is missing.
int read_pipeline_record(const std::string& dir);
// The checkpoints a save at DIR consists of: each stage's directory for a pipelined save, else
// DIR itself (a save of one stage); and the names of every parameter they hold, sorted, once each
// (the stages' copies of a tied parameter are one). Throws zero::Error as read_pipeline_record
// and read_checkpoint_grid do.
std::vector<std::string> saved_stage_dirs(const std::string& dir);
std::vector<std::string> saved_parameter_names(const std::vector<std::string>& stage_dirs);

// The fp32 master of every parameter (registration order) as the whole tensor, of shape
// full_shape(param.split, param.shape): a tensor-parallel save's slices (`grid`, every rank's
// checkpoint from read_checkpoint_grid) merged, padding left out. Read from the shard files,
// their checksums verified first.
std::vector<std::vector<float>> read_full_master(const std::vector<CheckpointInfo>& grid);

}  // namespace zero
