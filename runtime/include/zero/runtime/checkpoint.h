// Sharded checkpoints: every rank writes its shard of the fp32 master weights and optimizer
// state, rank 0 writes a manifest (proto/checkpoint.proto, which also documents the files' byte
// layout), and a load re-slices the saved shards for the current world size and ZeRO stage.
//
//   save_checkpoint(engine, "ckpt", {step, seed});       -> ckpt/step_00000010/, ckpt/latest
//   load_checkpoint(engine, "ckpt", &trainer);           resumes from ckpt/latest
//
// Crash safety: a save writes into DIR/.tmp_step_N, fsyncs every file and the directory, renames
// it to DIR/step_N and only then replaces DIR/latest (write latest.tmp, fsync, rename). A kill
// at any moment leaves the previous checkpoint and `latest` intact; a step directory exists only
// once complete, and leftovers of an interrupted save are removed by the next one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "zero/core/dtype.h"
#include "zero/optimizer/loss_scaler.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/layout.h"

namespace zero {

// What the training loop needs for an exact resume. Data and initialization are counter-based
// (keyed by seed and step), so these two values are the whole data position and RNG state.
struct TrainerState {
  long step = 0;      // trainer steps done
  uint64_t seed = 0;  // the run's seed
};

// Collective. Saves the engine's fp32 master weights, optimizer state, optimizer step and
// loss-scaler state, and `trainer`, as DIR/step_<trainer.step, 8 digits>, then points
// DIR/latest at it. DIR is created when missing; re-saving an existing step replaces it
// atomically. Throws zero::Error on every rank when any rank fails (write error, no space,
// fsync error): the message names the rank, the file and the cause; the previous checkpoint
// and `latest` are untouched, the temporary directory is removed and the engine is unchanged.
//
// Fault injection for tests: the environment variable ZERO_TEST_CHECKPOINT_FAULT=KIND@RANK,
// read at every save, makes rank RANK fail at one point: write (a write returns EIO), nospace
// (ENOSPC), fsync (fsync returns EIO), manifest (rank 0's manifest write fails), kill-after-write
// (SIGKILL once the rank's shard file is written), kill-before-latest (SIGKILL after the step
// directory is renamed into place, before `latest` is replaced; rank 0 does this step).
struct SaveOptions {
  // DeepSpeed's stage3_gather_16bit_weights_on_model_save: the step directory also holds
  // model.safetensors, the whole model in the working dtype (registration order, parameter
  // names), gathered from the ranks and written by rank 0 before the directory is renamed into
  // place, so it is there exactly when the checkpoint is.
  bool consolidated_weights = false;
};
void save_checkpoint(Engine& engine, const std::string& dir, const TrainerState& trainer,
                     const SaveOptions& options = {});
constexpr const char* kConsolidatedWeightsName = "model.safetensors";

// Collective. Loads a checkpoint into the engine: `path` is a step directory, a save directory
// (its `latest` is followed) or a `latest` file. Checks the manifest's checksum and that the
// saved model has exactly the engine's parameters (names and shapes; an error names the
// parameter and the manifest), that the optimizer keeps as many state arrays, and the size and
// CRC32C of every shard file this rank reads (the whole file, before anything is modified). Each
// rank reads only the byte ranges of the elements it holds. Any failure on any rank throws
// zero::Error on every rank and leaves the engine unchanged.
//
// The saved world size, stage and working dtype may differ from the engine's: the master is
// always fp32, so an fp32 checkpoint loads into a bf16 engine and back (the working copy is the
// master rounded to the engine's dtype). The engine's own hyperparameters and LR schedule are
// kept (the LR schedule may change); the optimizer step is restored, and the loss-scaler state
// when both the checkpoint and the engine are fp16. Writes the trainer state to *trainer when
// not null.
//
// The optimizer type and hyperparameters (everything but the scheduled lr) must be the
// checkpoint's: otherwise a ConfigError on every rank lists each difference, unless
// options.override_optimizer says the change is on purpose.
struct LoadOptions {
  bool override_optimizer = false;
};
void load_checkpoint(Engine& engine, const std::string& path, TrainerState* trainer,
                     const LoadOptions& options = {});

// The differences between a checkpoint's optimizer and a run's, lr aside (it is scheduled), one
// per line: `weight_decay 0.01 in the checkpoint, 0 in this run`. Empty when they agree.
std::vector<std::string> optimizer_differences(const OptimizerConfig& saved,
                                               const OptimizerConfig& run);

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
};

// Resolves `path` as load_checkpoint does, checks the manifest's checksum and consistency (the
// layout fits the world size, every file is listed with the size the layout implies) and
// returns it. Throws zero::Error naming the file and the problem.
CheckpointInfo read_checkpoint_info(const std::string& path);

// Checks every shard file's size and CRC32C; returns one line per bad file ("rank_00001.bin:
// checksum ..."), empty when all are good.
std::vector<std::string> verify_checkpoint_files(const CheckpointInfo& info);

// The full fp32 master of every parameter (registration order), read from the shard files
// (their checksums verified first).
std::vector<std::vector<float>> read_full_master(const CheckpointInfo& info);

// Writes tensors in the safetensors format (8-byte little-endian header length, a JSON header
// naming each tensor's dtype "F32", "BF16" or "F16", shape and data_offsets, then the raw data in
// the order given). `dtype` is kFloat32, kBFloat16 or kFloat16 (rounded to nearest even).
// Throws zero::Error.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const std::vector<float>* values;
};
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       DType dtype,
                       const std::vector<std::pair<std::string, std::string>>& metadata);

}  // namespace zero
