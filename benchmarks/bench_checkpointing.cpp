// zero-bench-checkpointing: the GPT-2 trained with activation checkpointing none, selective and
// full side by side (issue 15's targets): the peak activation bytes the engine's allocator
// measured over a step (StepStats::peak_activation_bytes, which must equal gpt2_memory.h's
// formula: the program fails when it does not) and the step time, each as a ratio to none.
//
//   zerorun -np 1 -- zero-bench-checkpointing   12 layers x 384, 6 heads, T = 1024, vocabulary
//                                               256, one sequence per rank, stage 0, fp32
//
// The three models live at once, one engine each. After --warmup steps of each, every one of
// --rounds rounds runs one step of each setting in turn, so load from other processes falls on
// all of them alike. A step's time is the slowest rank's; each figure is the median over rounds,
// and the time ratio the median of each round's ratio (a round's steps share that round's load).
// Data: synthetic (benchmarks/synthetic_tokens.h).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/stage_bench.h"
#include "benchmarks/synthetic_tokens.h"
#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "models/gpt2.h"
#include "models/train_step.h"
#include "zero/collectives/mpi_check.h"

namespace {

using zero::models::Recompute;

struct Options {
  zero::models::Gpt2Config gpt2;
  int seq_len = 1024;
  int micro_batch = 1;  // sequences per rank
  int stage = 0;
  int warmup = 1;
  int rounds = 3;
  int threads = 1;
  std::string json_path;
  std::string nvme_path;  // --checkpoint-nvme-path: a fourth setting, full spilled there
};

const char* const kUsage =
    "usage: zero-bench-checkpointing [--n-layer N] [--n-head N] [--n-embd N] [--vocab-size N]\n"
    "                                [--seq-len T] [--micro-batch B] [--stage S] [--warmup N]\n"
    "                                [--rounds R] [--threads N] [--json FILE]\n"
    "                                [--checkpoint-nvme-path DIR]\n"
    "  defaults: 12 layers, 6 heads, 384 wide, vocabulary 256, T 1024, 1 sequence per rank,\n"
    "  stage 0, 1 warm-up step, 3 rounds, 1 kernel thread\n";

Options parse_options(int argc, char** argv) {
  using zero::driver::integer_flag;
  using zero::driver::text_flag;
  Options opt;
  opt.gpt2.n_layer = 12;
  opt.gpt2.n_head = 6;
  opt.gpt2.n_embd = 384;
  opt.gpt2.vocab_size = 256;
  zero::driver::parse_flags(argc, argv, kUsage,
                            {{"--n-layer", integer_flag(&opt.gpt2.n_layer, 1)},
                             {"--n-head", integer_flag(&opt.gpt2.n_head, 1)},
                             {"--n-embd", integer_flag(&opt.gpt2.n_embd, 1)},
                             {"--vocab-size", integer_flag(&opt.gpt2.vocab_size, 1)},
                             {"--seq-len", integer_flag(&opt.seq_len, 1)},
                             {"--micro-batch", integer_flag(&opt.micro_batch, 1)},
                             {"--stage", integer_flag(&opt.stage, 0, 3)},
                             {"--warmup", integer_flag(&opt.warmup, 0)},
                             {"--rounds", integer_flag(&opt.rounds, 1)},
                             {"--threads", integer_flag(&opt.threads, 1)},
                             {"--json", text_flag(&opt.json_path)},
                             {"--checkpoint-nvme-path", text_flag(&opt.nvme_path)}});
  opt.gpt2.block_size = opt.seq_len;
  try {
    zero::models::check_gpt2_config(opt.gpt2);
  } catch (const zero::Error& e) {
    zero::driver::usage_error(e.what());
  }
  return opt;
}

// One checkpointing setting's model and what was measured of it.
struct Setting {
  zero::models::Gpt2Checkpointing checkpointing;
  std::string name;         // the recomputation, "+nvme" when spilled
  zero::models::Gpt2 gpt2;  // the model's handles (its modules are the ZeroModel's)
  std::unique_ptr<zero::bench::SyntheticSource> source;
  std::unique_ptr<zero::ZeroModel> model;
  long step = 0;
  std::vector<double> step_ms;  // the slowest rank's, per measured step
  uint64_t peak_activations = 0;
  uint64_t formula = 0;
};

uint64_t max_over_ranks(uint64_t mine) {
  uint64_t all = 0;
  ZERO_MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
  return all;
}

// One optimizer step of `s`, timed; returns the slowest rank's milliseconds.
double run_step(Setting& s, const Options& opt, int rank, int world) {
  ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  const auto start = std::chrono::steady_clock::now();
  const long global_batch = static_cast<long>(opt.micro_batch) * world;
  zero::models::forward_backward(*s.model, *s.source, ++s.step, global_batch, 1, rank, world);
  const zero::StepStats stats = s.model->step();
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  double slowest = 0.0;
  ZERO_MPI_CHECK(MPI_Allreduce(&ms, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  s.peak_activations = max_over_ranks(stats.peak_activation_bytes);
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_benchmark(const Options& opt, zero::Communicator& comm) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  zero::bench::StageOptions engine_options;
  engine_options.kernel_threads = opt.threads;
  std::vector<Setting> settings(opt.nvme_path.empty() ? 3 : 4);
  const Recompute recomputes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull,
                                  Recompute::kFull};
  for (size_t i = 0; i < settings.size(); ++i) {
    Setting& s = settings[i];
    s.checkpointing.recompute = recomputes[i];
    s.name = zero::models::recompute_name(recomputes[i]);
    if (i == 3) {
      // The checkpoints spilled to NVMe: the step time this costs over full's kept ones.
      s.checkpointing.nvme_path = opt.nvme_path;
      s.checkpointing.spill_rank = rank;
      s.name += "+nvme";
    }
    s.gpt2 = zero::models::make_gpt2(opt.gpt2, opt.threads, s.checkpointing);
    s.source = std::make_unique<zero::bench::SyntheticSource>(opt.gpt2.vocab_size, opt.seq_len, 1,
                                                              s.gpt2.targets);
    s.model = std::make_unique<zero::ZeroModel>(
        comm, std::move(s.gpt2.modules),
        zero::bench::engine_config(engine_options, opt.stage, zero::DType::kFloat32, false));
    zero::models::count_gpt2_activations(s.gpt2, s.model->engine().allocator());
    s.formula = zero::models::gpt2_activation_formula(opt.gpt2, s.checkpointing, opt.micro_batch,
                                                      opt.seq_len)
                    .total();
  }
  for (Setting& s : settings) {
    for (int w = 0; w < opt.warmup; ++w) run_step(s, opt, rank, world);
  }
  for (int round = 0; round < opt.rounds; ++round) {
    for (Setting& s : settings) s.step_ms.push_back(run_step(s, opt, rank, world));
  }
  if (rank != 0) return 0;
  std::printf(
      "# zero-bench-checkpointing: gpt2 %d layers x %d wide, %d heads, T %d, vocab %d, %d "
      "rank(s), %d sequence(s) per rank, stage %d, fp32, %d kernel thread(s); median of %d "
      "round(s) after %d warm-up step(s), settings alternating\n",
      opt.gpt2.n_layer, opt.gpt2.n_embd, opt.gpt2.n_head, opt.seq_len, opt.gpt2.vocab_size, world,
      opt.micro_batch, opt.stage, opt.threads, opt.rounds, opt.warmup);
  std::printf("# %-9s %21s %15s %13s %14s %15s\n", "recompute", "peak_activation_bytes",
              "formula_bytes", "none/this", "step_ms", "this/none");
  const double none_bytes = static_cast<double>(settings[0].peak_activations);
  bool all_equal = true;
  std::vector<zero::driver::JsonRecord> json;
  for (const Setting& s : settings) {
    const double ms = median(s.step_ms);
    std::vector<double> ratios;  // this step over none's, round by round
    for (size_t r = 0; r < s.step_ms.size(); ++r) {
      ratios.push_back(s.step_ms[r] / settings[0].step_ms[r]);
    }
    const double time_ratio = median(ratios);
    const double memory_ratio = none_bytes / static_cast<double>(s.peak_activations);
    all_equal = all_equal && s.peak_activations == s.formula;
    std::printf("  %-9s %21llu %15llu %13.3f %14.1f %15.3f\n", s.name.c_str(),
                static_cast<unsigned long long>(s.peak_activations),
                static_cast<unsigned long long>(s.formula), memory_ratio, ms, time_ratio);
    json.push_back({{"recompute", s.name},
                    {"n_layer", opt.gpt2.n_layer},
                    {"n_embd", opt.gpt2.n_embd},
                    {"n_head", opt.gpt2.n_head},
                    {"seq_len", opt.seq_len},
                    {"vocab_size", opt.gpt2.vocab_size},
                    {"micro_batch", opt.micro_batch},
                    {"world", world},
                    {"stage", opt.stage},
                    {"peak_activation_bytes", s.peak_activations},
                    {"formula_bytes", s.formula},
                    {"activation_ratio_to_none", memory_ratio},
                    {"median_step_ms", ms},
                    {"step_ms", s.step_ms},
                    {"time_ratio_to_none", time_ratio}});
  }
  if (!opt.json_path.empty() && !zero::driver::write_json_array(opt.json_path, json)) {
    std::fprintf(stderr, "zero-bench-checkpointing: cannot write %s\n", opt.json_path.c_str());
    return 1;
  }
  if (!all_equal) {
    std::fprintf(stderr,
                 "zero-bench-checkpointing: a measured peak differs from the formula (above)\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> parsed = zero::driver::parse_command_line(
      "zero-bench-checkpointing", kUsage, [&] { return parse_options(argc, argv); });
  if (!parsed) return 2;
  const Options& opt = *parsed;
  zero::bench::StageOptions run;
  run.kernel_threads = opt.threads;
  return zero::bench::run_with_mpi(
      &argc, &argv, "zero-bench-checkpointing", run,
      [&](const zero::bench::Communicators& comms) { return run_benchmark(opt, *comms.front()); });
}
