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

#include <string>
#include <vector>

#include "zero/optimizer/optimizer.h"
#include "zero/runtime/checkpoint_info.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/safetensors.h"

namespace zero {

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

// A pipelined run's save loaded at another number of stages: `stage_paths` are the saved
// stages' directories (each read as `path` above, all of one step), and each parameter of this
// engine is taken by name from the first that holds it (the stages' copies of a tied parameter
// are equal), resharded over this run's data- and tensor-parallel ranks as above. The others'
// parameters are left alone; whether every saved parameter is taken by some stage is the
// caller's to check, over the stages. Errors as load_checkpoint's, and for saves of different
// steps.
void load_checkpoint_from_stages(Engine& engine, const std::vector<std::string>& stage_paths,
                                 TrainerState* trainer, const LoadOptions& options = {});

// The differences between a checkpoint's optimizer and a run's, lr aside (it is scheduled), one
// per line: `weight_decay 0.01 in the checkpoint, 0 in this run`. Empty when they agree.
std::vector<std::string> optimizer_differences(const OptimizerConfig& saved,
                                               const OptimizerConfig& run);

}  // namespace zero
