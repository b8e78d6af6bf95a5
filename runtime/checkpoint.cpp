// The collective save and load. Every rank does its own file I/O; after each phase the ranks
// exchange one fixed-size report each (an all-gather), so a failure anywhere becomes the same
// zero::Error everywhere and no rank is left waiting in a collective the others skipped.
//
// Save:  1. rank 0 removes leftovers of interrupted saves and creates DIR/.tmp_step_N
//        2. every rank writes its shard file there and fsyncs it; the reports carry size + CRC
//           (with hybrid sharding only the first shard group: every group holds the whole state)
//        3. rank 0 writes the manifest, fsyncs it and the directory, renames the directory to
//           DIR/step_N, fsyncs DIR, then replaces DIR/latest (latest.tmp, fsync, rename, fsync)
// Load:  1. every rank reads and checks the manifest and the model, verifies the shard files it
//           needs and reads its elements into staging buffers
//        2. only when every rank succeeded: copy into the engine, restore counters, state_loaded()
// With tensor parallelism each data-parallel group does the above in its tensor-parallel rank's
// directory (checkpoint_grid.h), and the tensor-parallel ranks then agree on the outcome.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <unordered_map>

#include "checkpoint_format.h"
#include "checkpoint_grid.h"
#include "zero/core/check.h"
#include "zero/core/text.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/config.h"

namespace zero {
namespace {

using checkpoint_files::join;

// ---- Agreement between ranks.

// One rank's outcome of a phase. 512 bytes, all-gathered as raw bytes.
struct RankReport {
  uint64_t failed = 0;  // 0 ok, kFailed, or kConfigMismatch (a ConfigError: the user's to fix)
  uint64_t size = 0;    // save: bytes of the rank's shard file
  uint64_t crc32c = 0;  // save: its checksum
  char message[488] = {};
};
static_assert(sizeof(RankReport) == 512, "reports travel as 256 two-byte elements");
constexpr uint64_t kFailed = 1;
constexpr uint64_t kConfigMismatch = 2;

template <typename Work>
RankReport attempt(Work work) {
  RankReport report;
  try {
    work();
  } catch (const ConfigError& e) {
    report.failed = kConfigMismatch;
    std::snprintf(report.message, sizeof(report.message), "%s", e.what());
  } catch (const std::exception& e) {
    report.failed = kFailed;
    std::snprintf(report.message, sizeof(report.message), "%s", e.what());
  }
  return report;
}

std::vector<RankReport> exchange(Communicator& comm, const RankReport& mine) {
  std::vector<RankReport> all(comm.world_size());
  comm.all_gather_bytes_sync(&mine, all.data(), sizeof(RankReport));
  return all;
}

bool any_failed(const std::vector<RankReport>& reports) {
  return std::any_of(reports.begin(), reports.end(), [](const RankReport& r) { return r.failed; });
}

[[noreturn]] void throw_failure(const std::string& what, const std::vector<RankReport>& reports) {
  // Every rank read the same manifest and config: a mismatch is the same message everywhere,
  // and a ConfigError (exit code 2 in zero-train) rather than a failure.
  const bool config_only = std::all_of(reports.begin(), reports.end(), [](const RankReport& r) {
    return r.failed == 0 || r.failed == kConfigMismatch;
  });
  if (config_only) {
    for (const RankReport& r : reports) {
      if (r.failed) throw ConfigError(r.message);
    }
  }
  std::string text = what + " failed";
  for (size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].failed) text += "; on rank " + std::to_string(r) + ": " + reports[r].message;
  }
  throw Error(text);
}

void agree(Communicator& comm, const std::string& what, const RankReport& mine) {
  const std::vector<RankReport> reports = exchange(comm, mine);
  if (any_failed(reports)) throw_failure(what, reports);
}

// ---- Fault injection (tests only): ZERO_TEST_CHECKPOINT_FAULT=KIND@RANK.

enum class Fault { kNone, kWrite, kNoSpace, kFsync, kManifest, kKillAfterWrite, kKillBeforeLatest };

Fault fault_for_rank(int rank) {
  const char* value = std::getenv("ZERO_TEST_CHECKPOINT_FAULT");
  if (value == nullptr || *value == '\0') return Fault::kNone;
  const std::string text = value;
  const size_t at = text.find('@');
  const std::string kind = text.substr(0, at);
  const std::string target = at == std::string::npos ? "" : text.substr(at + 1);
  ZERO_CHECK(!target.empty() && target.find_first_not_of("0123456789") == std::string::npos,
             "ZERO_TEST_CHECKPOINT_FAULT must be KIND@RANK, got '" << text << "'");
  if (std::stoi(target) != rank) return Fault::kNone;
  if (kind == "write") return Fault::kWrite;
  if (kind == "nospace") return Fault::kNoSpace;
  if (kind == "fsync") return Fault::kFsync;
  if (kind == "manifest") return Fault::kManifest;
  if (kind == "kill-after-write") return Fault::kKillAfterWrite;
  if (kind == "kill-before-latest") return Fault::kKillBeforeLatest;
  ZERO_FAIL("ZERO_TEST_CHECKPOINT_FAULT: unknown kind '"
            << kind << "' (write, nospace, fsync, manifest, kill-after-write, kill-before-latest)");
}

// ---- Files.

void remove_quietly(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

// Creates (or truncates) path, writes data, fsyncs and closes it; every step checked.
void write_file(const std::string& path, const void* data, size_t size, int injected_errno) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0, "cannot create " << path << ": " << std::strerror(errno));
  try {
    checkpoint_files::write_fully(fd, data, size, path, injected_errno);
    ZERO_CHECK(::fsync(fd) == 0, "fsync of " << path << " failed: " << std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ZERO_CHECK(::close(fd) == 0, "cannot close " << path << ": " << std::strerror(errno));
}

// Rank 0, step 1: DIR exists, leftovers of interrupted saves are gone, tmp_dir is new and empty.
void prepare_directory(const std::string& dir, const std::string& tmp_dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ZERO_CHECK(!ec, "cannot create checkpoint directory " << dir << ": " << ec.message());
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(checkpoint_files::kTmpPrefix, 0) == 0) remove_quietly(entry.path().string());
  }
  ZERO_CHECK(!ec, "cannot list checkpoint directory " << dir << ": " << ec.message());
  ZERO_CHECK(::mkdir(tmp_dir.c_str(), 0755) == 0,
             "cannot create " << tmp_dir << ": " << std::strerror(errno));
}

// On CUDA, state_view() makes host copies: a pass that only reads them lets each go after its
// unit, and this gives back the rest when the pass ends early with an error.
class StateViewsReleased {
 public:
  explicit StateViewsReleased(Engine& engine) : engine_(engine) {}
  ~StateViewsReleased() { engine_.release_state_views(); }
  StateViewsReleased(const StateViewsReleased&) = delete;
  StateViewsReleased& operator=(const StateViewsReleased&) = delete;

 private:
  Engine& engine_;
};

// Every rank that writes a shard, step 2: units in order, each as master then the state arrays,
// elements [rank * shard, (rank + 1) * shard) of the unit (proto/checkpoint.proto has the layout).
RankReport write_shard(Engine& engine, const std::string& path, Fault fault) {
  RankReport report;
  const int rank = engine.communicator().rank();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZERO_CHECK(fd >= 0, "cannot create " << path << ": " << std::strerror(errno));
  uint32_t crc = 0;
  try {
    int injected = fault == Fault::kWrite ? EIO : fault == Fault::kNoSpace ? ENOSPC : 0;
    const std::vector<Unit>& units = engine.layout().units();
    const StateViewsReleased released(engine);
    for (size_t u = 0; u < units.size(); ++u) {
      engine.release_state_views();
      const Engine::StateView view = engine.state_view(static_cast<int>(u));
      const size_t first = static_cast<size_t>(rank) * units[u].shard;
      ZERO_CHECK(view.begin <= first && first + units[u].shard <= view.end,
                 "unit " << u << ": this rank's state does not cover its shard");
      const size_t bytes = units[u].shard * sizeof(float);
      std::vector<const float*> arrays = {view.master};
      for (int k = 0; k < view.state_count; ++k) arrays.push_back(view.state[k]);
      for (const float* array : arrays) {
        const float* data = array + (first - view.begin);
        checkpoint_files::write_fully(fd, data, bytes, path, injected);
        injected = 0;
        crc = crc32c(data, bytes, crc);
        report.size += bytes;
      }
    }
    // The injected fsync failure reports EIO, as a failing disk does.
    errno = EIO;
    ZERO_CHECK(fault != Fault::kFsync && ::fsync(fd) == 0,
               "fsync of " << path << " failed: " << std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ZERO_CHECK(::close(fd) == 0, "cannot close " << path << ": " << std::strerror(errno));
  if (fault == Fault::kKillAfterWrite) std::raise(SIGKILL);
  report.crc32c = crc;
  return report;
}

CheckpointInfo describe(Engine& engine, const TrainerState& trainer,
                        const std::vector<RankReport>& reports) {
  const Layout& layout = engine.layout();
  const EngineConfig& config = engine.config();
  CheckpointInfo info;
  info.world_size = layout.world_size();
  info.stage = config.stage;
  info.dtype = config.dtype;
  info.alignment_bytes = layout.options().alignment_bytes;
  info.params = layout.params();
  for (const Unit& unit : layout.units()) info.units.push_back({unit.numel, unit.shard});
  info.optimizer = config.optimizer;
  info.state_count = Optimizer(config.optimizer).state_count();
  info.optimizer_step = engine.optimizer_step();
  info.lr_schedule = config.lr_schedule;
  info.loss_scaler = engine.loss_scaler_state();
  info.trainer = trainer;
  if (config.tensor_parallel != nullptr) {
    info.tensor_parallel_size = config.tensor_parallel->world_size();
    info.tensor_parallel_rank = config.tensor_parallel->rank();
  }
  // One file per shard: the reports of the first world_size ranks (writes_a_shard).
  for (size_t r = 0; r < static_cast<size_t>(info.world_size); ++r) {
    info.files.push_back({checkpoint_files::shard_file_name(static_cast<int>(r)), reports[r].size,
                          static_cast<uint32_t>(reports[r].crc32c)});
  }
  return info;
}

// Puts tmp_dir in place as final_dir. An existing final_dir (the step saved again, e.g. after a
// resume from an earlier step) is swapped out atomically, so final_dir is whole at every moment;
// returns where the replaced copy now is ("" when there was none), to remove once `latest` is
// written.
std::string install_step_dir(const std::string& dir, const std::string& tmp_dir,
                             const std::string& final_dir, const std::string& name) {
  struct stat st;
  if (::lstat(final_dir.c_str(), &st) != 0) {
    ZERO_CHECK(errno == ENOENT, "cannot stat " << final_dir << ": " << std::strerror(errno));
    ZERO_CHECK(::rename(tmp_dir.c_str(), final_dir.c_str()) == 0,
               "cannot rename " << tmp_dir << " to " << final_dir << ": " << std::strerror(errno));
    return "";
  }
  if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    return tmp_dir;
  }
  // Filesystems without RENAME_EXCHANGE: move the old copy aside first (a short window in which
  // final_dir is missing; `latest` still names the previous step unless it was this one).
  ZERO_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP,
             "cannot replace " << final_dir << ": " << std::strerror(errno));
  const std::string aside =
      join(dir, std::string(checkpoint_files::kTmpPrefix) + "replaced_" + name);
  remove_quietly(aside);
  ZERO_CHECK(::rename(final_dir.c_str(), aside.c_str()) == 0,
             "cannot move " << final_dir << " aside: " << std::strerror(errno));
  ZERO_CHECK(::rename(tmp_dir.c_str(), final_dir.c_str()) == 0,
             "cannot rename " << tmp_dir << " to " << final_dir << ": " << std::strerror(errno));
  return aside;
}

// Rank 0, step 3.
void commit(Engine& engine, const TrainerState& trainer, const std::vector<RankReport>& reports,
            const std::string& dir, const std::string& name, const std::string& tmp_dir,
            Fault fault, const std::vector<std::vector<float>>* consolidated) {
  const std::string final_dir = join(dir, name);
  std::string replaced;
  try {
    if (consolidated != nullptr) {
      const std::vector<ParamPlacement>& params = engine.layout().params();
      std::vector<NamedTensor> tensors;
      for (size_t p = 0; p < params.size(); ++p) {
        tensors.push_back(
            {params[p].name, full_shape(params[p].split, params[p].shape), &(*consolidated)[p]});
      }
      write_safetensors(join(tmp_dir, kConsolidatedWeightsName), tensors, engine.dtype(),
                        {{"format", "pt"}, {"step", std::to_string(trainer.step)}});
    }
    const std::string text = checkpoint_files::manifest_text(describe(engine, trainer, reports));
    write_file(join(tmp_dir, checkpoint_files::kManifestName), text.data(), text.size(),
               fault == Fault::kManifest ? EIO : 0);
    checkpoint_files::fsync_path(tmp_dir);
    replaced = install_step_dir(dir, tmp_dir, final_dir, name);
  } catch (...) {
    remove_quietly(tmp_dir);
    throw;
  }
  checkpoint_files::fsync_path(dir);
  if (fault == Fault::kKillBeforeLatest) std::raise(SIGKILL);
  const std::string latest = join(dir, checkpoint_files::kLatestName);
  const std::string latest_tmp = latest + ".tmp";
  const std::string line = name + "\n";
  write_file(latest_tmp, line.data(), line.size(), 0);
  ZERO_CHECK(::rename(latest_tmp.c_str(), latest.c_str()) == 0,
             "cannot rename " << latest_tmp << " to " << latest << ": " << std::strerror(errno));
  checkpoint_files::fsync_path(dir);
  if (!replaced.empty()) remove_quietly(replaced);
}

// ---- Load.

// Same parameter names and whole tensors on both sides; returns, per engine parameter, its saved
// index. At the same tensor-parallel size the slices must match too; at another, a split
// parameter must be cut the same way (or be whole in the checkpoint).
std::vector<size_t> match_params(const Layout& layout, const std::vector<CheckpointInfo>& grid,
                                 int tensor_parallel_size) {
  const CheckpointInfo& info = grid.front();
  const bool same_size = static_cast<int>(grid.size()) == tensor_parallel_size;
  const std::string manifest = join(info.step_dir, checkpoint_files::kManifestName);
  std::unordered_map<std::string, size_t> saved;
  for (size_t i = 0; i < info.params.size(); ++i) saved[info.params[i].name] = i;
  std::vector<size_t> index;
  for (const ParamPlacement& p : layout.params()) {
    auto found = saved.find(p.name);
    ZERO_CHECK(found != saved.end(), "parameter '" << p.name << "' " << shape_text(p.shape)
                                                   << " of the model is not in checkpoint "
                                                   << manifest);
    const ParamPlacement& s = info.params[found->second];
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
  if (info.params.size() != layout.params().size()) {
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
void read_unit_state(const Engine& engine, checkpoint_files::GridReader& reader,
                     const std::vector<CheckpointInfo>& grid,
                     const std::vector<size_t>& saved_index, size_t u,
                     const Engine::StateView& view, std::vector<float>* out) {
  const Layout& layout = engine.layout();
  const Communicator* tp = engine.config().tensor_parallel;
  const int tp_size = tp == nullptr ? 1 : tp->world_size();
  const int tp_rank = tp == nullptr ? 0 : tp->rank();
  const bool same_size = static_cast<int>(grid.size()) == tp_size;
  const int state_count = grid.front().state_count;
  const size_t n = view.end - view.begin;
  out->assign(n * (1 + static_cast<size_t>(state_count)), 0.0f);
  for (int p : layout.units()[u].params) {
    const ParamPlacement& placed = layout.params()[p];
    const size_t lo = std::max(view.begin, placed.offset);
    const size_t hi = std::min(view.end, placed.offset + placed.numel);
    if (lo >= hi) continue;
    const size_t saved = saved_index[p];
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

// Every unit's state this rank holds (read_unit_state), all in memory.
std::vector<std::vector<float>> stage_state(Engine& engine, const std::vector<CheckpointInfo>& grid,
                                            const std::vector<size_t>& saved_index) {
  checkpoint_files::GridReader reader(grid);
  std::vector<std::vector<float>> staged(engine.layout().units().size());
  const StateViewsReleased released(engine);
  for (size_t u = 0; u < staged.size(); ++u) {
    engine.release_state_views();
    const Engine::StateView view = engine.state_view(static_cast<int>(u));
    read_unit_state(engine, reader, grid, saved_index, u, view, &staged[u]);
  }
  return staged;
}

// The state of one unit at a time, for an engine whose state lives on NVMe: the whole shard
// would not fit in memory. Without `apply` it only reads (every shard file checked, every read
// made), so a bad checkpoint is refused before anything changes; with it each unit's state goes
// into its view and out to the engine (write_state_views) before the next is read.
void stream_state(Engine& engine, const std::vector<CheckpointInfo>& grid,
                  const std::vector<size_t>& saved_index, bool apply) {
  checkpoint_files::GridReader reader(grid);
  std::vector<float> unit_state;
  try {
    for (size_t u = 0; u < engine.layout().units().size(); ++u) {
      const Engine::StateView view = engine.state_view(static_cast<int>(u));
      read_unit_state(engine, reader, grid, saved_index, u, view, &unit_state);
      if (!apply) {
        engine.release_state_views();
        continue;
      }
      const size_t n = view.end - view.begin;
      std::memcpy(view.master, unit_state.data(), n * sizeof(float));
      for (int k = 0; k < view.state_count; ++k) {
        std::memcpy(view.state[k], unit_state.data() + (k + 1) * n, n * sizeof(float));
      }
      engine.write_state_views();
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

// The working parameters as whole tensors: gathered over the data-parallel group by the engine,
// then each split parameter's slices gathered over the tensor-parallel group and merged.
// Collective over both groups.
std::vector<std::vector<float>> whole_params(Engine& engine) {
  std::vector<std::vector<float>> params = engine.gather_full_params();
  Communicator* tp = engine.host_tensor_parallel();
  if (tp == nullptr) return params;
  const std::vector<ParamPlacement>& placed = engine.layout().params();
  for (size_t p = 0; p < params.size(); ++p) {
    if (!placed[p].split.is_split()) continue;
    const size_t n = params[p].size();
    std::vector<float> slices(n * static_cast<size_t>(tp->world_size()));
    tp->all_gather_bytes_sync(params[p].data(), slices.data(), n * sizeof(float));
    std::vector<const float*> pointers;
    for (int r = 0; r < tp->world_size(); ++r) pointers.push_back(slices.data() + n * r);
    params[p] =
        merge_slices(placed[p].split, full_shape(placed[p].split, placed[p].shape), pointers);
  }
  return params;
}

// Whether this rank writes a shard file: with hybrid sharding every shard group holds the whole
// state, so only the first group (world ranks 0..k-1, shard ranks alike) writes it, and the
// checkpoint is the one a world of k ranks would save.
bool writes_a_shard(Engine& engine) {
  return engine.host_communicator().rank() < engine.layout().world_size();
}

// This rank's part of save_checkpoint: its data-parallel group's checkpoint in `dir`.
// `consolidated`: the whole model (whole_params) when the options ask for it, else empty.
void save_own(Engine& engine, const std::string& dir, const TrainerState& trainer,
              const SaveOptions& options, const std::vector<std::vector<float>>& consolidated) {
  Communicator& comm = engine.host_communicator();
  const int rank = comm.rank();
  const std::string what =
      "checkpoint save to " + dir + " (step " + std::to_string(trainer.step) + ")";
  const std::string name = checkpoint_files::step_dir_name(trainer.step);
  const std::string tmp_dir = join(dir, checkpoint_files::kTmpPrefix + name);
  Fault fault = Fault::kNone;

  agree(comm, what, attempt([&] {
          ZERO_CHECK(!dir.empty(), "the checkpoint directory name is empty");
          ZERO_CHECK(trainer.step >= 0, "the trainer step must not be negative");
          fault = fault_for_rank(rank);
          if (rank == 0) prepare_directory(dir, tmp_dir);
        }));

  RankReport written;
  RankReport outcome = attempt([&] {
    if (!writes_a_shard(engine)) return;
    const int shard = engine.communicator().rank();
    written = write_shard(engine, join(tmp_dir, checkpoint_files::shard_file_name(shard)), fault);
  });
  written.failed = outcome.failed;
  std::memcpy(written.message, outcome.message, sizeof(written.message));
  const std::vector<RankReport> reports = exchange(comm, written);
  if (any_failed(reports)) {
    if (rank == 0) remove_quietly(tmp_dir);
    throw_failure(what, reports);
  }

  // With tensor parallelism the whole model is written once, beside tensor-parallel rank 0's
  // checkpoint.
  const Communicator* tp = engine.config().tensor_parallel;
  const bool writes_model = options.consolidated_weights && (tp == nullptr || tp->rank() == 0);
  agree(comm, what, attempt([&] {
          if (rank == 0) {
            commit(engine, trainer, reports, dir, name, tmp_dir, fault,
                   writes_model ? &consolidated : nullptr);
          }
        }));
}

}  // namespace

void save_checkpoint(Engine& engine, const std::string& dir, const TrainerState& trainer,
                     const SaveOptions& options) {
  // The working parameters, gathered on every rank before anything can fail (collectives of
  // the engine's and of the tensor-parallel group, which a rank that failed its part of the save
  // would not join); exact in the working dtype, since they are that dtype widened to fp32.
  std::vector<std::vector<float>> consolidated;
  if (options.consolidated_weights) consolidated = whole_params(engine);
  std::exception_ptr failure;
  try {
    save_own(engine, checkpoint_grid::own_dir(engine, dir), trainer, options, consolidated);
  } catch (...) {
    failure = std::current_exception();
  }
  checkpoint_grid::agree(engine, "checkpoint save to " + dir, failure, trainer.step);
}

void load_checkpoint(Engine& engine, const std::string& path, TrainerState* trainer,
                     const LoadOptions& options) {
  Communicator& comm = engine.host_communicator();
  CheckpointInfo info;
  std::vector<CheckpointInfo> grid;
  std::vector<size_t> saved_index;
  // State on NVMe may be far larger than memory: it is checked in a first pass and loaded one
  // unit at a time in a second. Otherwise all of it is read into memory before any is applied.
  const bool streaming = engine.nvme_bytes() > 0;
  std::vector<std::vector<float>> staged;
  // This rank's own text of a mismatch: the reports carry at most 488 characters of it.
  std::string mismatch;
  std::exception_ptr failure;
  try {
    agree(comm, "checkpoint load from " + path, attempt([&] {
            grid = read_checkpoint_grid(path);
            info = grid.front();
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
            const Communicator* tp = engine.config().tensor_parallel;
            saved_index = match_params(engine.layout(), grid, tp == nullptr ? 1 : tp->world_size());
            if (streaming) {
              stream_state(engine, grid, saved_index, /*apply=*/false);
            } else {
              staged = stage_state(engine, grid, saved_index);
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
      agree(comm, what, attempt([&] { stream_state(engine, grid, saved_index, /*apply=*/true); }));
    } catch (...) {
      applied = std::current_exception();
    }
    checkpoint_grid::agree(engine, what, applied, info.trainer.step);
  }
  // Every rank has its state in hand: nothing below can fail for a bad checkpoint. Each unit's
  // views go to the engine before the next unit's are taken.
  for (size_t u = 0; u < staged.size(); ++u) {
    const Engine::StateView view = engine.state_view(static_cast<int>(u));
    const size_t n = view.end - view.begin;
    std::memcpy(view.master, staged[u].data(), n * sizeof(float));
    for (int k = 0; k < view.state_count; ++k) {
      std::memcpy(view.state[k], staged[u].data() + (k + 1) * n, n * sizeof(float));
    }
    engine.write_state_views();
  }
  engine.set_optimizer_step(info.optimizer_step);
  if (info.dtype == DType::kFloat16 && engine.dtype() == DType::kFloat16) {
    engine.set_loss_scaler_state(info.loss_scaler);
  }
  engine.state_loaded();
  if (trainer != nullptr) *trainer = info.trainer;
}

}  // namespace zero
