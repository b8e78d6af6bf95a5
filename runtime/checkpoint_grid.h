// Checkpoints of a tensor-parallel run (EngineConfig::tensor_parallel): each tensor-parallel rank
// saves the checkpoint of its slices, sharded over its data-parallel group, in SAVE_DIR/tp_rank_RR
// (the format of any other checkpoint; its manifest records the grid and how each slice is cut).
// A load reads every rank's (read_checkpoint_grid, checkpoint_info.h) and, at another
// tensor-parallel size, merges each split parameter's slices and cuts this rank's anew.
// Private to runtime/ (checkpoint_save.cpp, checkpoint_load.cpp).
#pragma once

#include <exception>
#include <string>

#include "zero/runtime/checkpoint_info.h"
#include "zero/runtime/engine.h"

namespace zero::checkpoint_grid {

// Where this rank saves within save directory `dir`: dir itself without tensor parallelism.
std::string own_dir(const Engine& engine, const std::string& dir);

// After this rank's part of a save or load (`failure` null when it succeeded; `step` the trainer
// step it saved or read): the tensor-parallel ranks agree, so all go on or all throw. Rethrows
// this rank's own failure; otherwise throws zero::Error naming `what` when another rank failed or
// a rank's checkpoint is of another step (a save a crash left on only some ranks). Nothing to do
// without tensor parallelism but rethrow.
void agree(const Engine& engine, const std::string& what, const std::exception_ptr& failure,
           long step);

}  // namespace zero::checkpoint_grid
