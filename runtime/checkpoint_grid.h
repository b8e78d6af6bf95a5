// Checkpoints of a tensor-parallel run (EngineConfig::tensor_parallel): each tensor-parallel rank
// saves the checkpoint of its slices, sharded over its data-parallel group, in SAVE_DIR/tp_rank_RR
// (the format of any other checkpoint; its manifest records the grid). A load reads the directory
// of its own rank and needs the checkpoint to be of the same tensor-parallel size: resharding
// across tensor-parallel sizes (splitting or merging each slice) is not built yet, and both
// directions are refused with a message that says so. Private to runtime/ (checkpoint.cpp).
#pragma once

#include <exception>
#include <string>

#include "zero/runtime/checkpoint_info.h"
#include "zero/runtime/engine.h"

namespace zero::checkpoint_grid {

// Where this rank saves within save directory `dir`: dir itself without tensor parallelism.
std::string own_dir(const Engine& engine, const std::string& dir);

// What this rank loads for `path` (a save directory, a step directory or a `latest` file): its
// own tp_rank_RR under path with tensor parallelism. Throws zero::Error when the checkpoint was
// saved at another tensor-parallel size (as far as the directories tell; check_grid() reads the
// manifest).
std::string own_source(const Engine& engine, const std::string& path);

// Throws zero::Error unless `info` holds this rank's slices at the engine's tensor-parallel size.
void check_grid(const Engine& engine, const CheckpointInfo& info);

// After this rank's part of a save or load (`failure` null when it succeeded; `step` the trainer
// step it saved or read): the tensor-parallel ranks agree, so all go on or all throw. Rethrows
// this rank's own failure; otherwise throws zero::Error naming `what` when another rank failed or
// a rank's checkpoint is of another step (a save a crash left on only some ranks). Nothing to do
// without tensor parallelism but rethrow.
void agree(const Engine& engine, const std::string& what, const std::exception_ptr& failure,
           long step);

}  // namespace zero::checkpoint_grid
