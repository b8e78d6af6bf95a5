// The collective save (checkpoint.h). Every rank writes its own file; after each phase the ranks
// agree on its outcome (checkpoint_reports.h).
//
//   1. rank 0 removes leftovers of interrupted saves and creates DIR/.tmp_step_N
//   2. every rank writes its shard file there and fsyncs it; the reports carry size + CRC
//      (with hybrid sharding only the first shard group: every group holds the whole state)
//   3. rank 0 writes the manifest, fsyncs it and the directory, renames the directory to
//      DIR/step_N, fsyncs DIR, then replaces DIR/latest (latest.tmp, fsync, rename, fsync)
// With tensor parallelism each data-parallel group does the above in its tensor-parallel rank's
// directory (checkpoint_grid.h), and the tensor-parallel ranks then agree on the outcome.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>

#include "checkpoint_format.h"
#include "checkpoint_grid.h"
#include "checkpoint_reports.h"
#include "state_views_released.h"
#include "zero/core/check.h"
#include "zero/core/write_fully.h"
#include "zero/runtime/checkpoint.h"

namespace zero {
namespace {

using checkpoint_files::join;
using checkpoint_reports::agree;
using checkpoint_reports::any_failed;
using checkpoint_reports::attempt;
using checkpoint_reports::exchange;
using checkpoint_reports::RankReport;
using checkpoint_reports::throw_failure;

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
    write_fully(fd, data, size, path, injected_errno);
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

// Every rank that writes a shard, step 2: units in order, each as master then the state arrays,
// elements [rank * shard, (rank + 1) * shard) of the unit (proto/checkpoint.proto has the layout).
RankReport write_shard(Engine& engine, const std::string& path, Fault fault) {
  RankReport report;
  const int rank = engine.communicator().rank();
  const int ranks = engine.communicator().world_size();
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
      const ElementRange mine = shard_range(units[u].numel, rank, ranks);
      ZERO_CHECK(view.begin <= mine.first && mine.end() <= view.end,
                 "unit " << u << ": this rank's state does not cover its shard");
      const size_t first = mine.first;
      const size_t bytes = mine.count * sizeof(float);
      std::vector<const float*> arrays = {view.master};
      for (int k = 0; k < view.state_count; ++k) arrays.push_back(view.state[k]);
      for (const float* array : arrays) {
        const float* data = array + (first - view.begin);
        write_fully(fd, data, bytes, path, injected);
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
  info.dtype = config.precision.dtype;
  info.alignment_bytes = layout.options().alignment_bytes;
  info.params = layout.params();
  for (const Unit& unit : layout.units()) info.units.push_back({unit.numel, unit.shard});
  info.optimizer = config.optimizer;
  info.state_count = Optimizer(config.optimizer).state_count();
  info.optimizer_step = engine.optimizer_step();
  info.lr_schedule = config.lr_schedule;
  info.loss_scaler = engine.loss_scaler_state();
  info.trainer = trainer;
  if (config.grid.tensor_parallel != nullptr) {
    info.tensor_parallel_size = config.grid.tensor_parallel->world_size();
    info.tensor_parallel_rank = config.grid.tensor_parallel->rank();
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
  const Communicator* tp = engine.config().grid.tensor_parallel;
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

}  // namespace zero
