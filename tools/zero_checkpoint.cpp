// zero-checkpoint: look into, check and export a checkpoint without MPI or the model's code.
//
//   zero-checkpoint info DIR                                    what the checkpoint holds
//   zero-checkpoint verify DIR                                  checksums of manifest and files
//   zero-checkpoint export DIR --to model.safetensors [--dtype fp32|bf16]
//
// DIR is a step directory (DIR/step_00000010), a save directory (its `latest` is followed) or a
// `latest` file; for a tensor-parallel run, the save directory that holds tp_rank_RR/ for each
// rank (info and verify then go through every rank's checkpoint); for a pipelined run, the save
// directory that holds pp_stage_SS/ for each stage (export merges the stages). export writes the
// full fp32 master of every parameter, by name and shape, in the safetensors format that PyTorch
// and Hugging Face load, a tensor-parallel run's slices merged into whole tensors, through a
// temporary file and a rename; a --to inside the checkpoint it reads is refused. Resharding needs
// no command: a load re-slices for the world size, stage and tensor-parallel size it runs at. Exit
// codes: 0 ok, 1 a bad or unreadable checkpoint (the message names the file), 2 bad arguments.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "driver/paths.h"
#include "zero/core/dtype.h"
#include "zero/core/text.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/checkpoint.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-checkpoint info DIR\n"
    "       zero-checkpoint verify DIR\n"
    "       zero-checkpoint export DIR --to FILE.safetensors [--dtype fp32|bf16]\n"
    "  DIR  a step directory, a save directory (its 'latest' is used) or a 'latest' file;\n"
    "       for a tensor-parallel run, the directory holding every tp_rank_RR\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "zero-checkpoint: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

void print_info(const zero::CheckpointInfo& c) {
  size_t elements = 0;
  size_t padded = 0;
  for (const zero::ParamPlacement& p : c.params) elements += p.numel;
  for (const zero::CheckpointInfo::SavedUnit& u : c.units) padded += u.numel;
  std::printf("checkpoint   %s\n", c.step_dir.c_str());
  std::printf("trainer      step %ld, seed %llu\n", c.trainer.step,
              static_cast<unsigned long long>(c.trainer.seed));
  std::printf("saved by     %d ranks, ZeRO stage %d, dtype %s, alignment %zu bytes\n", c.world_size,
              c.stage, zero::dtype_name(c.dtype), c.alignment_bytes);
  if (c.tensor_parallel_size > 1) {
    std::printf("tensor par.  the slices of rank %d of %d\n", c.tensor_parallel_rank,
                c.tensor_parallel_size);
  }
  std::printf(
      "optimizer    %s, step %ld, lr %g, betas %g %g, eps %g, weight decay %g, "
      "momentum %g, %d state array(s)\n",
      zero::optimizer_type_key(c.optimizer.type), c.optimizer_step, c.optimizer.lr,
      c.optimizer.beta1, c.optimizer.beta2, c.optimizer.eps, c.optimizer.weight_decay,
      c.optimizer.momentum, c.state_count);
  std::printf("loss scaler  scale %g, hysteresis left %d, clean steps %ld\n", c.loss_scaler.scale,
              c.loss_scaler.hysteresis_left, c.loss_scaler.clean_steps);
  std::printf("parameters   %zu (%zu elements) in %zu units (%zu elements padded)\n",
              c.params.size(), elements, c.units.size(), padded);
  for (const zero::ParamPlacement& p : c.params) {
    std::printf("  %-32s %-16s numel %-10zu unit %-4d offset %zu", p.name.c_str(),
                zero::shape_text(p.shape).c_str(), p.numel, p.unit, p.offset);
    if (p.split.is_split()) {
      std::printf("  split dim %d of %lld in %d part(s)", p.split.dim,
                  static_cast<long long>(p.split.full_extent), p.split.parts);
    }
    std::printf("\n");
  }
  std::printf("files        %zu\n", c.files.size());
  for (const zero::CheckpointInfo::File& f : c.files) {
    std::printf("  %-16s %12llu bytes  crc32c %08x\n", f.name.c_str(),
                static_cast<unsigned long long>(f.size), f.crc32c);
  }
}

// The checkpoint directories of a save: each pipeline stage's for a pipelined run, else DIR.
std::vector<std::string> stage_dirs(const std::string& dir) {
  const int stages = zero::read_pipeline_record(dir);
  if (stages == 0) return {dir};
  std::vector<std::string> dirs;
  for (int s = 0; s < stages; ++s) dirs.push_back(zero::pipeline_stage_dir(dir, s));
  return dirs;
}

int info(const std::string& dir) {
  const std::vector<std::string> dirs = stage_dirs(dir);
  for (size_t s = 0; s < dirs.size(); ++s) {
    if (dirs.size() > 1)
      std::printf("%spipeline stage %zu of %zu\n", s > 0 ? "\n" : "", s, dirs.size());
    const std::vector<zero::CheckpointInfo> grid = zero::read_checkpoint_grid(dirs[s]);
    for (size_t r = 0; r < grid.size(); ++r) {
      if (r > 0) std::printf("\n");
      print_info(grid[r]);
    }
  }
  return 0;
}

int verify(const std::string& dir) {
  int status = 0;
  std::vector<zero::CheckpointInfo> checkpoints;
  for (const std::string& stage_dir : stage_dirs(dir)) {
    for (zero::CheckpointInfo& c : zero::read_checkpoint_grid(stage_dir)) {
      checkpoints.push_back(std::move(c));
    }
  }
  for (const zero::CheckpointInfo& c : checkpoints) {
    const std::vector<std::string> problems = zero::verify_checkpoint_files(c);
    for (const std::string& problem : problems) {
      std::fprintf(stderr, "zero-checkpoint: %s: %s\n", c.step_dir.c_str(), problem.c_str());
    }
    if (!problems.empty()) {
      status = 1;
      continue;
    }
    std::printf("ok: %s (manifest and %zu shard files)\n", c.step_dir.c_str(), c.files.size());
  }
  return status;
}

namespace fs = std::filesystem;

// An export that replaced a file of the checkpoint it reads (a shard, the manifest, the
// `latest` that names it) would leave a checkpoint that no longer verifies: refused, naming it.
void refuse_output_inside(const std::string& to, const std::string& dir,
                          const std::vector<zero::CheckpointInfo>& grid) {
  const fs::path entry = zero::driver::replaced_entry(to);
  const auto refuse = [&](const std::string& what) {
    usage_error("--to " + to + " is inside the checkpoint it exports (" + what +
                "); write the export elsewhere");
  };
  if (entry == zero::driver::replaced_entry(dir)) refuse(dir);
  for (const zero::CheckpointInfo& c : grid) {
    const fs::path step_dir = fs::canonical(c.step_dir);
    if (zero::driver::is_within(entry, step_dir)) refuse(c.step_dir);
    if (entry == step_dir.parent_path() / "latest") refuse("the 'latest' that names " + c.step_dir);
  }
}

// A pipelined save's stages merged: each parameter once, in stage order. A parameter two stages
// hold (the GPT-2's tied wte) must be equal in both, as the tie keeps it.
int export_model(const std::string& dir, const std::string& to, zero::DType dtype) {
  const std::vector<std::string> dirs = stage_dirs(dir);
  std::vector<std::vector<std::vector<float>>> masters;  // per stage, per parameter
  masters.reserve(dirs.size());
  std::vector<zero::NamedTensor> tensors;
  long step = -1;
  std::string source;
  for (const std::string& stage_dir : dirs) {
    const std::vector<zero::CheckpointInfo> grid = zero::read_checkpoint_grid(stage_dir);
    refuse_output_inside(to, stage_dir, grid);
    const zero::CheckpointInfo& c = grid.front();
    if (step >= 0 && c.trainer.step != step) {
      std::fprintf(stderr,
                   "zero-checkpoint: %s: the pipeline stages' checkpoints are of different "
                   "steps (%ld and %ld); a save was interrupted on some stages\n",
                   dir.c_str(), step, c.trainer.step);
      return 1;
    }
    step = c.trainer.step;
    source += (source.empty() ? "" : ", ") + c.step_dir;
    masters.push_back(zero::read_full_master(grid));
    const std::vector<std::vector<float>>& master = masters.back();
    for (size_t p = 0; p < c.params.size(); ++p) {
      const zero::NamedTensor* held = nullptr;
      for (const zero::NamedTensor& t : tensors) {
        if (t.name == c.params[p].name) held = &t;
      }
      if (held == nullptr) {
        tensors.push_back(
            {c.params[p].name, zero::full_shape(c.params[p].split, c.params[p].shape), &master[p]});
      } else if (*held->values != master[p]) {
        std::fprintf(stderr,
                     "zero-checkpoint: %s: parameter '%s' differs between the pipeline stages "
                     "that hold it\n",
                     stage_dir.c_str(), c.params[p].name.c_str());
        return 1;
      }
    }
  }
  zero::write_safetensors(to, tensors, dtype,
                          {{"format", "pt"},
                           {"step", std::to_string(step)},
                           {"source", "zero-checkpoint export of " + source}});
  std::printf("wrote %s: %zu tensors (%s) from %s\n", to.c_str(), tensors.size(),
              zero::dtype_name(dtype), source.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) usage_error("missing command");
  if (args[0] == "-h" || args[0] == "--help") {
    std::printf("%s", kUsage);
    return 0;
  }
  const std::string& command = args[0];
  if (command != "info" && command != "verify" && command != "export") {
    usage_error("unknown command '" + command + "'");
  }
  if (args.size() < 2) usage_error(command + " needs a checkpoint directory");
  const std::string& dir = args[1];
  std::string to;
  zero::DType dtype = zero::DType::kFloat32;
  for (size_t i = 2; i < args.size(); ++i) {
    if (command != "export") usage_error("unexpected argument '" + args[i] + "'");
    if (args[i] != "--to" && args[i] != "--dtype") usage_error("unknown option '" + args[i] + "'");
    if (i + 1 == args.size()) usage_error(args[i] + " needs a value");
    const std::string& value = args[++i];
    if (args[i - 1] == "--to") {
      to = value;
    } else if (!zero::parse_dtype(value, &dtype) || dtype == zero::DType::kFloat16) {
      usage_error("--dtype must be fp32 or bf16, got '" + value + "'");
    }
  }
  if (command == "export" && to.empty()) usage_error("export needs --to FILE.safetensors");
  try {
    if (command == "info") return info(dir);
    if (command == "verify") return verify(dir);
    return export_model(dir, to, dtype);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-checkpoint: %s\n", e.what());
    return 1;
  }
}
