// The collective load (checkpoint.h). Every rank reads what it needs itself; the ranks agree on
// each phase's outcome (checkpoint_reports.h).
//
//   1. every rank reads and checks the manifest and the model, verifies the shard files it
//      needs and reads its elements into staging buffers
//   2. only when every rank succeeded: copy into the engine, restore counters, state_loaded()
// With tensor parallelism each data-parallel group reads its tensor-parallel rank's directory
// (checkpoint_grid.h), and the tensor-parallel ranks then agree on the outcome.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <unordered_map>

#include "checkpoint_format.h"
#include "checkpoint_grid.h"
#include "checkpoint_reports.h"
#include "state_views_released.h"
#include "zero/core/check.h"
#include "zero/core/text.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/config.h"

namespace zero {
namespace {

using checkpoint_files::join;
using checkpoint_reports::agree;
using checkpoint_reports::attempt;

// Where a parameter of the engine is saved: which source (one save's grid) and its index there.
struct SavedParam {
  size_t source = 0;
  size_t index = 0;
};

// Each engine parameter found by name in the first source that has it, with the same whole
// tensor; returns where. At the same tensor-parallel size the slices must match too; at another,
// a split parameter must be cut the same way (or be whole in the checkpoint). With one source
// (`whole_model`) the checkpoint must hold no parameter the model lacks; several sources (the
// stages of a pipelined save) hold the parameters of other stages too.
std::vector<SavedParam> match_params(const Layout& layout,
                                     const std::vector<std::vector<CheckpointInfo>>& sources,
                                     int tensor_parallel_size, bool whole_model) {
  std::unordered_map<std::string, SavedParam> saved;
  for (size_t k = 0; k < sources.size(); ++k) {
    const CheckpointInfo& info = sources[k].front();
    for (size_t i = 0; i < info.params.size(); ++i)
      saved.emplace(info.params[i].name, SavedParam{k, i});
  }
  const auto manifest_of = [&](size_t k) {
    return join(sources[k].front().step_dir, checkpoint_files::kManifestName);
  };
  std::string all_manifests;
  for (size_t k = 0; k < sources.size(); ++k) {
    all_manifests += (k == 0 ? "" : ", ") + manifest_of(k);
  }
  std::vector<SavedParam> index;
  for (const ParamPlacement& p : layout.params()) {
    auto found = saved.find(p.name);
    ZERO_CHECK(found != saved.end(), "parameter '" << p.name << "' " << shape_text(p.shape)
                                                   << " of the model is not in checkpoint "
                                                   << all_manifests);
    const std::vector<CheckpointInfo>& grid = sources[found->second.source];
    const CheckpointInfo& info = grid.front();
    const bool same_size = static_cast<int>(grid.size()) == tensor_parallel_size;
    const std::string manifest = manifest_of(found->second.source);
    const ParamPlacement& s = info.params[found->second.index];
    const std::vector<int64_t> whole = full_shape(p.split, p.shape);
    const std::vector<int64_t> saved_whole = full_shape(s.split, s.shape);
    ZERO_CHECK(same_size ? s.shape == p.shape : saved_whole == whole,
               "parameter '" << p.name << "' has shape " << shape_text(p.shape)
                             << " in the model but " << shape_text(s.shape) << " in checkpoint "
                             << manifest
                             << (same_size ? ""
                                           : " (whole tensors: " + shape_text(whole) + " and " +
                                                 shape_text(saved_whole) + ")"));
    // A saved slice must be cut as the model cuts it (a checkpoint written before splits were
    // recorded has none: at the same size its slices are taken as this model's).
    ZERO_CHECK(!s.split.is_split() ||
                   (same_size ? s.split == p.split : !p.split.is_split() || s.split == p.split),
               "parameter '" << p.name << "' is split along dimension " << p.split.dim << " in "
                             << p.split.parts << " part(s) by the model, along dimension "
                             << s.split.dim << " in " << s.split.parts << " by checkpoint "
                             << manifest);
    index.push_back(found->second);
  }
  const CheckpointInfo& info = sources.front().front();
  if (whole_model && info.params.size() != layout.params().size()) {
    const std::string manifest = manifest_of(0);
    for (const ParamPlacement& s : info.params) {
      const bool in_model = std::any_of(layout.params().begin(), layout.params().end(),
                                        [&](const ParamPlacement& p) { return p.name == s.name; });
      ZERO_CHECK(in_model, "checkpoint " << manifest << " has parameter '" << s.name << "' "
                                         << shape_text(s.shape) << " that the model does not");
    }
  }
  return index;
}

// Reads unit u's elements [view.begin, view.end), which this rank holds, into `out`: master,
// then each state array, (end - begin) floats each. Elements outside every parameter (padding)
// are zero. At the checkpoint's tensor-parallel size a rank reads its own rank's slices (and a
// replicated parameter from any); at another, each split parameter is merged from every rank's
// slice and this rank's slice cut from the whole (tensor_split.h), so a run saved at t resumes
// at t'. The first read of a shard file checks its size and CRC.
// Each parameter comes from its source's grid (readers[k] reads sources[k]).
void read_unit_state(const Engine& engine,
                     std::vector<std::unique_ptr<checkpoint_files::GridReader>>& readers,
                     const std::vector<std::vector<CheckpointInfo>>& sources,
                     const std::vector<SavedParam>& saved_index, size_t u,
                     const Engine::StateView& view, std::vector<float>* out) {
  const Layout& layout = engine.layout();
  const Communicator* tp = engine.config().grid.tensor_parallel;
  const int tp_size = tp == nullptr ? 1 : tp->world_size();
  const int tp_rank = tp == nullptr ? 0 : tp->rank();
  const int state_count = sources.front().front().state_count;
  const size_t n = view.end - view.begin;
  out->assign(n * (1 + static_cast<size_t>(state_count)), 0.0f);
  for (int p : layout.units()[u].params) {
    const ParamPlacement& placed = layout.params()[p];
    const size_t lo = std::max(view.begin, placed.offset);
    const size_t hi = std::min(view.end, placed.offset + placed.numel);
    if (lo >= hi) continue;
    const std::vector<CheckpointInfo>& grid = sources[saved_index[p].source];
    checkpoint_files::GridReader& reader = *readers[saved_index[p].source];
    const size_t saved = saved_index[p].index;
    const bool same_size = static_cast<int>(grid.size()) == tp_size;
    const bool resliced =
        !same_size && (placed.split.is_split() || grid.front().params[saved].split.is_split());
    for (int array = 0; array <= state_count; ++array) {
      float* to = out->data() + array * n + (lo - view.begin);
      if (!resliced) {
        reader.read(same_size ? tp_rank : 0, array, saved, lo - placed.offset, hi - lo, to);
        continue;
      }
      const std::vector<float> whole = reader.read_whole(array, saved);
      const std::vector<float> slice =
          placed.split.is_split()
              ? cut_slice(placed.split, reader.whole_shape(saved), whole.data(), tp_size, tp_rank)
              : whole;
      std::memcpy(to, slice.data() + (lo - placed.offset), (hi - lo) * sizeof(float));
    }
  }
}

// One unit's state as read_unit_state lays it out (master, then each state array) into its
// views, and from them to the engine.
void apply_unit_state(Engine& engine, const Engine::StateView& view,
                      const std::vector<float>& state) {
  const size_t n = view.end - view.begin;
  std::memcpy(view.master, state.data(), n * sizeof(float));
  for (int k = 0; k < view.state_count; ++k) {
    std::memcpy(view.state[k], state.data() + (k + 1) * n, n * sizeof(float));
  }
  engine.write_state_views();
}

// A reader of each source's grid, which must outlive them.
std::vector<std::unique_ptr<checkpoint_files::GridReader>> readers_of(
    const std::vector<std::vector<CheckpointInfo>>& sources) {
  std::vector<std::unique_ptr<checkpoint_files::GridReader>> readers;
  for (const std::vector<CheckpointInfo>& grid : sources) {
    readers.push_back(std::make_unique<checkpoint_files::GridReader>(grid));
  }
  return readers;
}

// Every unit's state this rank holds (read_unit_state), all in memory.
std::vector<std::vector<float>> stage_state(Engine& engine,
                                            const std::vector<std::vector<CheckpointInfo>>& sources,
                                            const std::vector<SavedParam>& saved_index) {
  std::vector<std::unique_ptr<checkpoint_files::GridReader>> readers = readers_of(sources);
  std::vector<std::vector<float>> staged(engine.layout().units().size());
  const StateViewsReleased released(engine);
  for (size_t u = 0; u < staged.size(); ++u) {
    engine.release_state_views();
    const Engine::StateView view = engine.state_view(static_cast<int>(u));
    read_unit_state(engine, readers, sources, saved_index, u, view, &staged[u]);
  }
  return staged;
}

// The state of one unit at a time, for an engine whose state lives on NVMe: the whole shard
// would not fit in memory. Without `apply` it only reads (every shard file checked, every read
// made), so a bad checkpoint is refused before anything changes; with it each unit's state goes
// into its view and out to the engine (write_state_views) before the next is read.
void stream_state(Engine& engine, const std::vector<std::vector<CheckpointInfo>>& sources,
                  const std::vector<SavedParam>& saved_index, bool apply) {
  std::vector<std::unique_ptr<checkpoint_files::GridReader>> readers = readers_of(sources);
  std::vector<float> unit_state;
  try {
    for (size_t u = 0; u < engine.layout().units().size(); ++u) {
      const Engine::StateView view = engine.state_view(static_cast<int>(u));
      read_unit_state(engine, readers, sources, saved_index, u, view, &unit_state);
      if (!apply) {
        engine.release_state_views();
        continue;
      }
      apply_unit_state(engine, view, unit_state);
    }
  } catch (...) {
    // A view left behind would outlive the failed load: a shard's stale copy would stand in for
    // its file in training, and the next state_loaded() would write stale views back.
    engine.release_state_views();
    throw;
  }
}

// DeepSpeed's name, with the setting that tells Adam from AdamW there.
std::string optimizer_name(OptimizerType type) {
  const std::string name = optimizer_type_name(type);
  return type == OptimizerType::kAdam ? name + " (adam_w_mode false)" : name;
}

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", v);
  return text;
}

}  // namespace

std::vector<std::string> optimizer_differences(const OptimizerConfig& saved,
                                               const OptimizerConfig& run) {
  std::vector<std::string> out;
  if (saved.type != run.type) {
    out.push_back("type " + optimizer_name(saved.type) + " in the checkpoint, " +
                  optimizer_name(run.type) + " in this run");
  }
  // The manifest holds each value as written from the run's float or double, so equality is
  // exact; the text only has to show it.
  const auto compare = [&](const std::string& name, double a, double b) {
    if (a != b) {
      out.push_back(name + " " + number(a) + " in the checkpoint, " + number(b) + " in this run");
    }
  };
  compare("betas[0]", saved.beta1, run.beta1);
  compare("betas[1]", saved.beta2, run.beta2);
  compare("eps", saved.eps, run.eps);
  compare("weight_decay", saved.weight_decay, run.weight_decay);
  compare("momentum", saved.momentum, run.momentum);
  return out;
}

namespace {

// load_checkpoint from one save (`whole_model`: paths holds one), or from the saves of a
// pipelined run's stages, which hold one step of one run between them.
void load_sources(Engine& engine, const std::vector<std::string>& paths, bool whole_model,
                  TrainerState* trainer, const LoadOptions& options) {
  Communicator& comm = engine.host_communicator();
  const std::string path = ::zero::join(paths, std::string(", "));
  CheckpointInfo info;
  std::vector<std::vector<CheckpointInfo>> sources;
  std::vector<SavedParam> saved_index;
  // State on NVMe may be far larger than memory: it is checked in a first pass and loaded one
  // unit at a time in a second. Otherwise all of it is read into memory before any is applied.
  const bool streaming = engine.nvme_bytes() > 0;
  std::vector<std::vector<float>> staged;
  // This rank's own text of a mismatch: the reports carry at most 488 characters of it.
  std::string mismatch;
  std::exception_ptr failure;
  try {
    agree(comm, "checkpoint load from " + path, attempt([&] {
            for (const std::string& source : paths) sources.push_back(read_checkpoint_grid(source));
            info = sources.front().front();
            for (const std::vector<CheckpointInfo>& grid : sources) {
              const CheckpointInfo& other = grid.front();
              ZERO_CHECK(other.trainer.step == info.trainer.step &&
                             other.optimizer_step == info.optimizer_step,
                         "checkpoints "
                             << join(info.step_dir, checkpoint_files::kManifestName) << " and "
                             << join(other.step_dir, checkpoint_files::kManifestName)
                             << " are of different steps (" << info.trainer.step << " and "
                             << other.trainer.step << "): a save was interrupted on some stages");
              ZERO_CHECK(other.state_count == info.state_count,
                         "checkpoints "
                             << join(info.step_dir, checkpoint_files::kManifestName) << " and "
                             << join(other.step_dir, checkpoint_files::kManifestName) << " hold "
                             << info.state_count << " and " << other.state_count
                             << " optimizer state arrays per element");
            }
            const std::vector<std::string> differences =
                optimizer_differences(info.optimizer, engine.config().optimizer);
            if (!differences.empty() && !options.override_optimizer) {
              std::string list;
              for (const std::string& d : differences) list += (list.empty() ? "" : "; ") + d;
              mismatch = "checkpoint " + join(info.step_dir, checkpoint_files::kManifestName) +
                         " was saved with other optimizer settings: " + list +
                         ". Resume with the checkpoint's, or allow the change on purpose "
                         "(zero-train --override-optimizer, or \"checkpoint\": "
                         "{\"override_optimizer\": true} in the config)";
              throw ConfigError(mismatch);
            }
            const int state_count = Optimizer(engine.config().optimizer).state_count();
            ZERO_CHECK(info.state_count == state_count,
                       "checkpoint " << join(info.step_dir, checkpoint_files::kManifestName)
                                     << " holds " << info.state_count
                                     << " optimizer state arrays per element, "
                                     << "the engine's optimizer keeps " << state_count
                                     << " (a different optimizer type or momentum setting)");
            const Communicator* tp = engine.config().grid.tensor_parallel;
            saved_index = match_params(engine.layout(), sources,
                                       tp == nullptr ? 1 : tp->world_size(), whole_model);
            if (streaming) {
              stream_state(engine, sources, saved_index, /*apply=*/false);
            } else {
              staged = stage_state(engine, sources, saved_index);
            }
          }));
  } catch (const ConfigError&) {
    failure = mismatch.empty() ? std::current_exception()
                               : std::make_exception_ptr(ConfigError(mismatch));
  } catch (...) {
    failure = std::current_exception();
  }
  // The tensor-parallel ranks load together or not at all.
  checkpoint_grid::agree(engine, "checkpoint load from " + path, failure, info.trainer.step);

  if (streaming) {
    // Every shard file passed its check and every read was made once: only an I/O error now
    // can stop the second pass, which then leaves the state partly loaded, on every rank alike.
    const std::string what = "checkpoint load from " + path + " into the NVMe-resident state";
    std::exception_ptr applied;
    try {
      agree(comm, what,
            attempt([&] { stream_state(engine, sources, saved_index, /*apply=*/true); }));
    } catch (...) {
      applied = std::current_exception();
    }
    checkpoint_grid::agree(engine, what, applied, info.trainer.step);
  }
  // Every rank has its state in hand: nothing below can fail for a bad checkpoint. Each unit's
  // views go to the engine before the next unit's are taken.
  for (size_t u = 0; u < staged.size(); ++u) {
    apply_unit_state(engine, engine.state_view(static_cast<int>(u)), staged[u]);
  }
  engine.set_optimizer_step(info.optimizer_step);
  if (info.dtype == DType::kFloat16 && engine.dtype() == DType::kFloat16) {
    engine.set_loss_scaler_state(info.loss_scaler);
  }
  engine.state_loaded();
  if (trainer != nullptr) *trainer = info.trainer;
}

}  // namespace

void load_checkpoint(Engine& engine, const std::string& path, TrainerState* trainer,
                     const LoadOptions& options) {
  load_sources(engine, {path}, /*whole_model=*/true, trainer, options);
}

void load_checkpoint_from_stages(Engine& engine, const std::vector<std::string>& stage_paths,
                                 TrainerState* trainer, const LoadOptions& options) {
  ZERO_CHECK(!stage_paths.empty(), "a pipelined checkpoint needs at least one stage's directory");
  load_sources(engine, stage_paths, /*whole_model=*/false, trainer, options);
}

}  // namespace zero
