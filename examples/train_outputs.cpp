#include "examples/train_outputs.h"

#include <mpi.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <utility>

#include "examples/memory_timeline.h"
#include "zero/collectives/process_grid.h"
#include "zero/runtime/checkpoint.h"

namespace zero::examples {

void check_outputs(const Flags& f, const TrainingConfig& tc, int rank,
                   std::optional<SaveDirLock>* lock, Monitors* monitors) {
  if (!f.save_dir.empty()) {
    const std::string why = unusable_save_dir(f.save_dir);
    if (!why.empty()) throw SetupError("--save-dir: " + why);
    if (rank == 0) {
      try {
        lock->emplace(f.save_dir);
      } catch (const std::runtime_error& e) {
        throw SetupError(std::string("--save-dir: ") + e.what());
      }
    }
    // Another run's checkpoints are not overwritten by surprise: its step directories would be
    // replaced by this run's of the same steps, and `latest` would move back to them.
    const std::optional<long> saved = newest_saved_step(f.save_dir);
    const std::string holds = "--save-dir " + f.save_dir +
                              " already holds checkpoints up to step " +
                              (saved ? std::to_string(*saved) : "");
    if (saved && f.resume.empty()) {
      throw SetupError(holds +
                       "; pass --resume latest to continue that run, or choose another "
                       "--save-dir");
    }
    if (saved && f.resume != "latest" && !is_within(f.resume, f.save_dir)) {
      throw SetupError(holds + ", and --resume " + f.resume +
                       " is not one of them; resume with --resume latest, or choose another "
                       "--save-dir");
    }
  }
  if (rank != 0) return;
  for (const auto& [flag, path] : {std::pair{"--metrics", &f.metrics},
                                   {"--trace", &f.trace},
                                   {"--memory-timeline", &f.memory_timeline}}) {
    if (path->empty()) continue;
    const std::string why = unwritable_file(*path);
    if (!why.empty()) throw SetupError(std::string(flag) + ": " + why);
  }
  const FlopsProfilerConfig& flops = tc.flops_profiler;
  if (flops.enabled && flops.profile_step > f.steps) {
    throw SetupError("flops_profiler.profile_step " + std::to_string(flops.profile_step) + " in " +
                     tc.origin + " is beyond the run's last step " + std::to_string(f.steps) +
                     " (--steps)");
  }
  if (flops.enabled && tc.tensor_parallel_size > 1) {
    throw SetupError("flops_profiler in " + tc.origin +
                     " with tensor parallelism is not built: it counts the whole model's "
                     "parameters on one rank");
  }
  if (flops.enabled && !flops.output_file.empty()) {
    const std::string why = unwritable_file(flops.output_file);
    if (!why.empty()) throw SetupError("flops_profiler.output_file in " + tc.origin + ": " + why);
  }
  if (!f.memory_timeline.empty()) {
    const std::string why = gnuplot_problem();
    if (!why.empty()) throw SetupError("--memory-timeline: " + why);
  }
  for (const auto& [key, monitor] :
       {std::pair{"tensorboard", &tc.tensorboard}, {"csv_monitor", &tc.csv_monitor}}) {
    if (!monitor->enabled) continue;
    // The directory DeepSpeed would make, made now (the same check as a save directory's).
    const std::string why = unusable_save_dir(monitor->log_dir());
    if (!why.empty()) {
      throw SetupError(std::string(key) + ".output_path and job_name in " + tc.origin + ": " + why);
    }
  }
  try {
    *monitors = Monitors(tc.tensorboard, tc.csv_monitor);
  } catch (const Error& e) {
    throw SetupError(std::string("tensorboard/csv_monitor in ") + tc.origin + ": " + e.what());
  }
}

namespace {

// A record's number; JSON's null (a non-finite value) comes back as NaN, as DeepSpeed would
// log it.
double number(const driver::JsonRecord& record, const char* key) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_number()) return std::numeric_limits<double>::quiet_NaN();
  return it->get<double>();
}

}  // namespace

void print_skipped_step(long step, float loss_scale) {
  std::printf("step %ld: gradient overflow, step skipped; loss scale now %g\n", step, loss_scale);
}

std::vector<MonitorEvent> monitor_events(const driver::JsonRecord& r, long batch, bool fp16,
                                         bool wall_clock_breakdown) {
  const long step = r.at("step").get<long>();
  const int64_t before = static_cast<int64_t>(step - 1) * batch;
  const int64_t after = static_cast<int64_t>(step) * batch;
  std::vector<MonitorEvent> events = {{"Train/Samples/train_loss", number(r, "loss"), before},
                                      {"Train/Samples/lr", number(r, "lr"), after}};
  if (fp16) events.push_back({"Train/Samples/loss_scale", number(r, "loss_scale"), after});
  if (wall_clock_breakdown) {
    // The engine reports one wait for all collectives: it stands for backward_allreduce.
    for (const auto& [name, key] : {std::pair{"forward", "forward_ms"},
                                    {"backward", "backward_ms"},
                                    {"backward_allreduce", "comm_wait_ms"},
                                    {"step", "optimizer_ms"}}) {
      events.push_back(
          {std::string("Train/Samples/elapsed_time_ms_") + name, number(r, key), after});
    }
  }
  // Ours, under the same prefix and x axis.
  if (r.contains("val_loss"))
    events.push_back({"Train/Samples/val_loss", number(r, "val_loss"), after});
  // peak_bytes is the engine's memory (the GPU's on a GPU), peak_resident_bytes the host's.
  for (const char* key :
       {"tokens_per_s", "grad_norm", "peak_bytes", "peak_resident_bytes", "comm_wait_ms"}) {
    events.push_back({std::string("Train/Samples/") + key, number(r, key), after});
  }
  return events;
}

std::vector<std::string> parameter_names(const Engine& engine) {
  std::vector<std::string> names;
  for (const ParamPlacement& p : engine.layout().params()) names.push_back(p.name);
  return names;
}

void check_saved_parameters_taken(const std::string& dir, const std::vector<std::string>& saved,
                                  const std::vector<std::vector<std::string>>& stages) {
  for (const std::string& name : saved) {
    const bool taken = std::any_of(stages.begin(), stages.end(), [&](const auto& names) {
      return std::find(names.begin(), names.end(), name) != names.end();
    });
    if (!taken) {
      throw ConfigError("--resume " + dir + ": the saved parameter '" + name +
                        "' is in no stage of this run's model: the checkpoint is of another "
                        "model (--n-layer, --n-embd, ...)");
    }
  }
}

StartPosition resume_position(const Flags& f, const TrainingConfig& tc, Engine& engine,
                              bool leader) {
  // The checkpoint brings the engine's state; the data position and the seed come back
  // with the trainer state, so steps after it see the data the uninterrupted run saw.
  long first_step = 1;
  uint64_t data_seed = tc.engine.seed;
  if (!f.resume.empty()) {
    const std::string dir = f.resume == "latest" ? f.save_dir : f.resume;
    TrainerState resumed;
    const int saved_stages = read_pipeline_record(dir);
    if (saved_stages > 0) {
      // A pipelined save: the one engine takes every stage's parameters, and must hold them all.
      const std::vector<std::string> stage_dirs = saved_stage_dirs(dir);
      load_checkpoint_from_stages(engine, stage_dirs, &resumed, LoadOptions{tc.override_optimizer});
      check_saved_parameters_taken(dir, saved_parameter_names(stage_dirs),
                                   {parameter_names(engine)});
    } else {
      load_checkpoint(engine, dir, &resumed, LoadOptions{tc.override_optimizer});
    }
    first_step = resumed.step + 1;
    data_seed = resumed.seed;
    // Every rank read the same checkpoint: all stop here at once.
    if (first_step > f.steps) {
      throw ConfigError("--steps " + std::to_string(f.steps) +
                        ": the resumed checkpoint is at step " + std::to_string(resumed.step) +
                        ", so no step is left to train (--steps counts from the run's "
                        "first step; give more than " +
                        std::to_string(resumed.step) + ")");
    }
    if (leader && f.seed && *f.seed != resumed.seed) {
      std::fprintf(stderr,
                   "zero-train: warning: --seed %llu is ignored: a resumed run keeps its "
                   "checkpoint's seed %llu\n",
                   static_cast<unsigned long long>(*f.seed),
                   static_cast<unsigned long long>(resumed.seed));
    }
    if (leader) {
      std::printf("resumed from %s at step %ld", f.resume.c_str(), resumed.step);
      if (saved_stages > 0) {
        std::printf(" (saved by %d pipeline stage(s), resharded over 1)", saved_stages);
      }
      std::printf("\n");
      const std::optional<long> saved =
          f.save_dir.empty() ? std::nullopt : newest_saved_step(f.save_dir);
      if (saved && *saved > resumed.step) {
        std::fprintf(stderr,
                     "zero-train: warning: --save-dir %s holds checkpoints up to step %ld and "
                     "this run resumed step %ld: its saves replace those of the steps it "
                     "reaches, and latest moves back to them\n",
                     f.save_dir.c_str(), *saved, resumed.step);
      }
    }
  }
  // Validation runs on the multiples of --val-every; a resumed run may have none among its steps.
  if (leader && f.val_every > 0 &&
      (first_step + f.val_every - 1) / f.val_every * f.val_every > f.steps) {
    std::fprintf(stderr,
                 "zero-train: warning: no step of this run (%ld to %ld) is a multiple of "
                 "--val-every %ld: it does not validate\n",
                 first_step, f.steps, f.val_every);
  }
  return {first_step, data_seed};
}

NodeShare node_share_or_end(int rank) {
  try {
    return node_share(this_process_cores());
  } catch (const Error& e) {
    std::cerr << ("zero-train: rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
    return {};
  }
}

std::vector<int> failed_ranks(bool failed, int world_size) {
  int mine = failed ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(world_size));
  MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r) {
    if (all[static_cast<size_t>(r)] != 0) ranks.push_back(r);
  }
  return ranks;
}

bool fit_host_budget(const Flags& f, const TrainTask& task, int ranks_on_node, int world_size,
                     int rank, TrainingConfig* config) {
  // The budget of a rank (--memory-limit, else what the host can give it) holds the
  // activations, batch data and the modules' own working copies too: the engine's limit is
  // the rest. So a model or a batch that cannot fit is an error with the plan's numbers (exit 3),
  // not a kill by the kernel halfway through allocating it, and --memory-limit bounds what the
  // process holds.
  const uint64_t budget = f.memory_limit > 0 ? f.memory_limit : host_memory_per_rank(ranks_on_node);
  const std::string source =
      f.memory_limit > 0 ? "--memory-limit" : "available memory over the ranks on this node";
  const uint64_t activations = task.activation_bytes(config->micro_batch_per_rank);
  const uint64_t module_copies =
      task.module_bytes(config->engine.precision.dtype, config->engine.device.is_cuda());
  const uint64_t outside_engine = activations + module_copies;
  // Collective: pipeline stages hold different activations (and nodes may give their ranks
  // different budgets), so every rank stops when one does not fit, and the first such one says
  // why.
  const std::vector<int> short_ranks =
      failed_ranks(budget > 0 && budget <= outside_engine, world_size);
  if (!short_ranks.empty()) {
    if (rank == short_ranks.front()) {
      std::string where;
      if (config->pipeline_stages > 1) {
        const GridPlace place =
            grid_place(rank, world_size, config->tensor_parallel_size, config->pipeline_stages);
        where = " on pipeline stage " + std::to_string(place.pp_rank) + " (rank " +
                std::to_string(rank) + ")";
      }
      const std::string advice = out_of_memory_advice(
          task, config->engine,
          world_size / (config->tensor_parallel_size * config->pipeline_stages),
          config->micro_batch_per_rank, budget);
      std::cerr << ("zero-train: out of host memory: the activations and batch data of " +
                    std::to_string(config->micro_batch_per_rank) + " samples per micro-batch" +
                    where + " (" + human_bytes(activations) +
                    ") and the modules' fp32 working copies (" + human_bytes(module_copies) +
                    ") need " + human_bytes(outside_engine) + " per rank, and a rank may use " +
                    human_bytes(budget) + " (" + source + "); " + advice + "\n");
    }
    return false;
  }
  if (budget > 0) {
    config->engine.memory_limit_bytes = budget - outside_engine;
    if (rank == 0) {
      std::printf(
          "memory per rank: %s (%s), %s of it for activations, batch data and the modules' "
          "working copies\n",
          human_bytes(budget).c_str(), source.c_str(), human_bytes(outside_engine).c_str());
    }
  }
  return true;
}

std::string memory_summary(Engine& engine, int rank, long step) {
  Allocator& allocator = engine.allocator();
  std::string text = "memory on rank " + std::to_string(rank) + " at step " + std::to_string(step) +
                     " (" + allocator.memory().memory_name() + "):\n" + allocator.summary();
  if (engine.pinned_host_bytes() + engine.pageable_host_bytes() > 0) {
    text +=
        "host (the optimizer's update on the host): " + human_bytes(engine.pinned_host_bytes()) +
        " pinned, " + human_bytes(engine.pageable_host_bytes()) + " pageable\n";
  }
  return text;
}

namespace {
// Lock-free, so the handler may set it.
std::atomic<bool> summary_asked{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void ask_for_summary(int) {
  summary_asked.store(true);
}
}  // namespace

void watch_memory_summary_signal() {
  struct sigaction action {};
  action.sa_handler = ask_for_summary;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ZERO_CHECK(::sigaction(SIGUSR1, &action, nullptr) == 0,
             "cannot install the SIGUSR1 handler: " << std::strerror(errno));
}

bool memory_summary_requested() {
  return summary_asked.exchange(false);
}

}  // namespace zero::examples
