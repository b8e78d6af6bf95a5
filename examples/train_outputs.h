// zero-train's start and outputs beside the metrics file: the ranks' agreement at start, the
// check of every output path, the resumed position, DeepSpeed's monitors (tensorboard,
// csv_monitor) fed from the step records, and the memory summary.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "driver/metrics_writer.h"
#include "examples/run_checks.h"
#include "examples/train_flags.h"
#include "examples/train_task.h"
#include "zero/runtime/config.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/monitor.h"

namespace zero::examples {

// Host-clock milliseconds of the step records: of a duration, and since `start`.
inline double to_ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return to_ms(std::chrono::steady_clock::now() - start);
}

// A start-up problem of this process (an output path it cannot write): exit code 2, like a
// usage or config error, and agreed with the other ranks the same way.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Output paths are checked at start, not at the first save or after the last step. The save
// directory is every rank's (each writes its shard) and rank 0 locks it for the job; the
// metrics file, the trace and the monitors' directories are rank 0's, which opens the monitors
// here. Throws SetupError naming the flag or config key.
void check_outputs(const Flags& f, const TrainingConfig& tc, int rank,
                   std::optional<SaveDirLock>* lock, Monitors* monitors);

// The line a step skipped for a gradient overflow (or, with nonfinite_gradients "skip", a
// non-finite gradient) prints on rank 0, with or without a pipeline.
void print_skipped_step(long step, float loss_scale);

// DeepSpeed's events of one step, from its step record (the values the metrics file holds), at
// the samples seen as DeepSpeed counts them: train_loss is written in backward, before the step
// counts its samples, so at (step - 1) * batch; the others after it, at step * batch.
// loss_scale with fp16 only; the elapsed_time_ms series with wall_clock_breakdown only.
std::vector<MonitorEvent> monitor_events(const driver::JsonRecord& step_record, long batch,
                                         bool fp16, bool wall_clock_breakdown);

// This node's ranks and this rank's share of their cores (run_checks.h). Collective; an MPI
// failure here ends the job (exit 1): no rank can go on without the others.
NodeShare node_share_or_end(int rank);

// Every rank's outcome of reading its flags and config, agreed before any other collective: a
// problem seen by only some ranks (a file one rank cannot read) ends every rank at once with
// exit code 2, instead of leaving the others in the engine's first collective until the
// watchdog. Returns the ranks that failed.
std::vector<int> failed_ranks(bool failed, int world_size);

// The CPU path's memory budget of a rank (--memory-limit, else the host's memory over the
// node's ranks) less what the model holds outside the engine (activations, batch data, the
// modules' working copies; a pipeline stage's own) becomes the engine's limit, and rank 0 says
// so. Collective: false on every rank, after the first rank they do not fit on printed why with
// advice, when those alone do not fit on some rank: the run ends with exit 3.
bool fit_host_budget(const Flags& f, const TrainTask& task, int ranks_on_node, int world_size,
                     int rank, TrainingConfig* config);

// Where the run starts: step 1 and the config's seed, or after the checkpoint --resume names
// (loaded into `engine`), with its seed. Throws ConfigError (on every rank at once) when no step
// is left; rank 0 (`leader`) says what it resumed and warns where flags are overridden.
struct StartPosition {
  long first_step = 1;
  uint64_t data_seed = 0;
};
StartPosition resume_position(const Flags& f, const TrainingConfig& tc, Engine& engine,
                              bool leader);

// A save loaded at another number of stages (a pipelined one without a pipeline, or at another
// --pp): every parameter `saved` names must be one that some stage's engine holds (`stages`: each
// stage's parameter names, parameter_names(engine)), or the checkpoint is of another model, whose
// other parameters would be dropped unnoticed. Throws ConfigError naming the first such
// parameter and --resume DIR.
std::vector<std::string> parameter_names(const Engine& engine);
void check_saved_parameters_taken(const std::string& dir, const std::vector<std::string>& saved,
                                  const std::vector<std::vector<std::string>>& stages);

// memory_summary at any step: the engine allocator's table (current, peak and allocations per
// category, in its memory: the GPU's or the host's) and the host tiers of an offloaded
// optimizer, headed "memory on rank R at step N".
std::string memory_summary(Engine& engine, int rank, long step);

// SIGUSR1 asks for a memory summary: the handler only sets a flag, which the training loop
// reads (and clears) between steps. Without the handler SIGUSR1 would end the process.
void watch_memory_summary_signal();
bool memory_summary_requested();

}  // namespace zero::examples
