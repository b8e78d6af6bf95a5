// zero-train with pipeline parallelism (--pp): each stage's ranks train their part of the GPT-2
// with ZeRO inside the stage's data-parallel group, the micro-batches passing from stage to stage
// as a pipeline schedule (zero/runtime/pipeline_schedule.h) orders them.
#pragma once

#include "examples/train_flags.h"
#include "examples/train_task.h"
#include "zero/collectives/process_grid.h"
#include "zero/runtime/config.h"
#include "zero/runtime/monitor.h"

namespace zero::examples {

// What a pipelined run does not do (yet): a ConfigError naming the first such flag or config
// key (--pp-virtual-stages other than 1 without the interleaved schedule or below 2 with it,
// CUDA, a global batch that does not cut into equal micro-batches on `world_size` ranks), or
// nothing.
void check_pipeline_settings(const Flags& f, const TrainingConfig& tc, int world_size);

// The training loop of a pipelined run; `grid` has the pipeline's communicators. The task is
// already cut to this rank's stage (TrainTask::set_pipeline_stage). `monitors`: rank 0's, which
// get each step record's events as without a pipeline.
void train_pipeline(const Flags& f, const TrainingConfig& tc, TrainTask& task, ProcessGrid& grid,
                    Monitors& monitors);

}  // namespace zero::examples
