#include "examples/train_outputs.h"

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

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
  for (const auto& [flag, path] : {std::pair{"--metrics", &f.metrics}, {"--trace", &f.trace}}) {
    if (path->empty()) continue;
    const std::string why = unwritable_file(*path);
    if (!why.empty()) throw SetupError(std::string(flag) + ": " + why);
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
