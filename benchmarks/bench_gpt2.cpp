// zero-bench-gpt2: training steps of the GPT-2 (models/gpt2.h) at ZeRO stages 0-3 on the ranks
// mpirun started, side by side, as tokens per second and model FLOPs utilisation (MFU).
//
//   zerorun -np 1 -- zero-bench-gpt2                     the model at 1 rank, fp32
//   zerorun -np 2 -- zero-bench-gpt2 --dtype fp32,bf16 --json gpt2.json
//
// The default model is issue 14's target: 6 layers, 384 wide, 6 heads, T = 256, vocabulary
// 50257, a global batch of 8 sequences. Steps are measured as zero-bench-step measures them
// (benchmarks/stage_bench.h; bench_step.cpp's header says how): every stage's engine alive at
// once, measured in interleaved rounds, a step's time the slowest rank's, the median over steps.
//
//  - Data: synthetic (benchmarks/synthetic_tokens.h).
//  - tokens/s: global batch x T over the median step time.
//  - MFU: the model's FLOPs per second (gpt2_flops_per_token(), llm.c's and PaLM's count: 6 per
//    matrix parameter plus the attention's 12 x layers x width x T, per token) over the sgemm
//    peak of this job, measured in the same run: every rank times a large cblas_sgemm at the
//    same moment, on its --threads threads, before and after the steps; each rank's best
//    GFLOP/s, summed over the ranks, is the peak. So MFU says how close the whole step (every
//    GEMM, the element-wise kernels, the optimizer, the collectives) comes to the GEMM speed of
//    the same cores under the same load.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
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
#include "zero/kernels/blas_core.h"
#include "zero/runtime/trace.h"

extern "C" {
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void openblas_set_num_threads(int num_threads);
}

namespace {

using zero::DType;
using zero::bench::Record;
using zero::bench::StageRun;

struct Options {
  zero::models::Gpt2Config gpt2;
  int seq_len = 256;
  long global_batch = 8;
  uint64_t seed = 1;
  int peak_size = 2048;  // M = N = K of the sgemm that measures the peak
  zero::bench::StageOptions run;
};

Options default_options() {
  Options opt;
  opt.gpt2.n_layer = 6;
  opt.gpt2.n_head = 6;
  opt.gpt2.n_embd = 384;
  opt.gpt2.vocab_size = 50257;
  opt.gpt2.block_size = 256;
  // A step of this model takes seconds on one core: few steps, each stage measured in a block
  // of one step per round, so load from other processes lands on every stage alike.
  opt.run.steps = 3;
  opt.run.warmup = 1;
  opt.run.rounds = 3;
  return opt;
}

const std::string kUsage =
    std::string(
        "usage: zero-bench-gpt2 [--n-layer N] [--n-head N] [--n-embd N] [--vocab-size N]\n"
        "                       [--seq-len T] [--global-batch B] [--seed S] [--peak-size N]\n"
        "                       [--dtype LIST] [--stages LIST] [--steps N] [--warmup N]\n"
        "                       [--rounds R] [--threads N] [--json FILE] [other step flags]\n"
        "  --n-layer, --n-head, --n-embd, --vocab-size   the GPT-2 (default 6, 6, 384, 50257)\n"
        "  --seq-len       tokens per sequence, also the block size (default 256)\n"
        "  --global-batch  sequences per step over all ranks (default 8)\n"
        "  --seed          seed of the synthetic token ids (default 1)\n"
        "  --peak-size     M = N = K of the sgemm that measures the peak (default 2048)\n"
        "  (--steps, --warmup, --rounds default to 3, 1, 3)\n") +
    zero::bench::kStageUsage;

Options parse_options(int argc, char** argv) {
  using zero::driver::integer_flag;
  Options opt = default_options();
  zero::driver::FlagTable flags = zero::bench::stage_flags(&opt.run);
  const auto seq_len = [&](const std::string& flag, const std::string& value) {
    integer_flag(&opt.seq_len, 1)(flag, value);
    opt.gpt2.block_size = opt.seq_len;
  };
  flags.insert({{"--n-layer", integer_flag(&opt.gpt2.n_layer, 1)},
                {"--n-head", integer_flag(&opt.gpt2.n_head, 1)},
                {"--n-embd", integer_flag(&opt.gpt2.n_embd, 1)},
                {"--vocab-size", integer_flag(&opt.gpt2.vocab_size, 1)},
                {"--seq-len", seq_len},
                {"--global-batch", integer_flag(&opt.global_batch, 1)},
                {"--seed", integer_flag(&opt.seed, 0, LONG_MAX)},
                {"--peak-size", integer_flag(&opt.peak_size, 1)}});
  zero::driver::parse_flags(argc, argv, kUsage, flags);
  zero::bench::check_stage_options(opt.run);
  try {
    zero::models::check_gpt2_config(opt.gpt2);
  } catch (const zero::Error& e) {
    zero::driver::usage_error(e.what());
  }
  return opt;
}

// --- the sgemm peak --------------------------------------------------------------------------

// The best GFLOP/s of three n x n x n cblas_sgemm calls on `threads` threads, after one
// unmeasured call; every rank runs it at the same moment (a barrier first), as the steps do.
double sgemm_gflops(int n, int threads) {
  const size_t elements = static_cast<size_t>(n) * static_cast<size_t>(n);
  std::vector<float> a(elements), b(elements), c(elements);
  for (size_t i = 0; i < elements; ++i) {
    a[i] = static_cast<float>(i % 7) * 0.1f;
    b[i] = static_cast<float>(i % 5) * 0.1f;
  }
  openblas_set_num_threads(threads);
  ZERO_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  double best = 0.0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    // 101 = CblasRowMajor, 111 = CblasNoTrans
    cblas_sgemm(101, 111, 111, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rep > 0) best = std::max(best, 2.0 * n * static_cast<double>(n) * n / s / 1e9);
  }
  // The kernels split their GEMMs over threads themselves and want OpenBLAS on one.
  openblas_set_num_threads(1);
  return best;
}

// --- results ---------------------------------------------------------------------------------

struct Throughput {
  double tokens_per_s = 0;
  double model_gflops = 0;  // model FLOPs per second / 1e9
  double mfu = 0;
};

Throughput throughput(const Record& r, const Options& opt, double peak_gflops) {
  Throughput t;
  const double tokens = static_cast<double>(opt.global_batch) * opt.seq_len;
  t.tokens_per_s = tokens / (r.median_ms / 1000.0);
  t.model_gflops = t.tokens_per_s * zero::models::gpt2_flops_per_token(opt.gpt2, opt.seq_len) / 1e9;
  t.mfu = peak_gflops > 0 ? t.model_gflops / peak_gflops : 0.0;
  return t;
}

bool write_json(const std::vector<Record>& records, const Options& opt, double peak_gflops) {
  using zero::driver::rounded;
  std::vector<zero::driver::JsonRecord> json;
  for (const Record& r : records) {
    const Throughput t = throughput(r, opt, peak_gflops);
    zero::driver::JsonRecord record = zero::bench::record_json(r, opt.run);
    record["model"] = "gpt2";
    record["n_layer"] = opt.gpt2.n_layer;
    record["n_head"] = opt.gpt2.n_head;
    record["n_embd"] = opt.gpt2.n_embd;
    record["vocab_size"] = opt.gpt2.vocab_size;
    record["seq_len"] = opt.seq_len;
    record["global_batch"] = opt.global_batch;
    record["threads"] = opt.run.kernel_threads;
    record["data"] = "synthetic";
    record["flops_per_token"] = zero::models::gpt2_flops_per_token(opt.gpt2, opt.seq_len);
    record["tokens_per_s"] = rounded(t.tokens_per_s, 2);
    record["model_gflops_per_s"] = rounded(t.model_gflops, 3);
    record["sgemm_peak_gflops"] = rounded(peak_gflops, 3);
    record["mfu"] = rounded(t.mfu, 4);
    record["blas_core"] = zero::kernels::blas_core_name();
    json.push_back(record);
  }
  return zero::driver::write_json_array(opt.run.json_path, json);
}

void print_header(const Options& opt, int world, size_t params) {
  std::printf(
      "# zero-bench-gpt2: gpt2 %d layers x %d wide, %d heads, T %d, vocab %d (%zu params), %d "
      "rank(s), global batch %ld (%ld per rank, %d micro-batch(es)), synthetic token ids\n"
      "# %d measured steps per stage in %d interleaved round(s) after %d warm-up step(s); %d "
      "kernel thread(s) per rank; OpenBLAS core %s; %.1f MFLOP per token\n",
      opt.gpt2.n_layer, opt.gpt2.n_embd, opt.gpt2.n_head, opt.seq_len, opt.gpt2.vocab_size, params,
      world, opt.global_batch, opt.global_batch / world, opt.run.micro_batches, opt.run.steps,
      opt.run.rounds, opt.run.warmup, opt.run.kernel_threads,
      zero::kernels::blas_core_name().c_str(),
      zero::models::gpt2_flops_per_token(opt.gpt2, opt.seq_len) / 1e6);
  zero::bench::print_record_header(opt.run);
}

void print_throughput(const std::vector<Record>& records, const Options& opt, double peak) {
  std::printf("# sgemm peak of this job: %.1f GFLOP/s (%d x %d x %d, best per rank, summed)\n",
              peak, opt.peak_size, opt.peak_size, opt.peak_size);
  std::printf("# %5s %5s %12s %12s %7s %8s\n", "stage", "dtype", "tokens_per_s", "model_GFLOPs",
              "MFU", "vs_st0");
  for (const Record& r : records) {
    const Throughput t = throughput(r, opt, peak);
    char ratio[16] = "-";  // tokens/s over stage 0's
    if (r.ratio_to_stage0 > 0) std::snprintf(ratio, sizeof(ratio), "%.3f", 1.0 / r.ratio_to_stage0);
    std::printf("  %5s %5s %12.1f %12.2f %7s %8s\n", zero::bench::stage_label(r).c_str(),
                zero::dtype_name(r.dtype), t.tokens_per_s, t.model_gflops,
                zero::bench::percent(t.mfu).c_str(), ratio);
  }
}

int run_benchmark(const Options& opt, const zero::bench::Communicators& comms) {
  zero::Communicator& comm = *comms.front();
  const int rank = comm.rank();
  const int world = comm.world_size();
  if (opt.global_batch % (static_cast<long>(world) * opt.run.micro_batches) != 0) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "zero-bench-gpt2: --global-batch %ld does not split into %d rank(s) x %d "
                   "micro-batch(es) of equal size\n",
                   opt.global_batch, world, opt.run.micro_batches);
    }
    return 2;
  }
  double own_peak = sgemm_gflops(opt.peak_size, opt.run.kernel_threads);
  // Each model reads its own targets, so each has its own batch source.
  std::map<const zero::ZeroModel*, std::unique_ptr<zero::bench::SyntheticSource>> sources;
  const zero::bench::MakeModel make_model = [&](zero::Communicator& on,
                                                const zero::EngineConfig& config) {
    zero::models::Gpt2 gpt2 = zero::models::make_gpt2(opt.gpt2, opt.run.kernel_threads);
    auto source = std::make_unique<zero::bench::SyntheticSource>(opt.gpt2.vocab_size, opt.seq_len,
                                                                 opt.seed, gpt2.targets);
    auto model = std::make_unique<zero::ZeroModel>(on, std::move(gpt2.modules), config);
    sources[model.get()] = std::move(source);
    return model;
  };
  const zero::bench::TrainStep step = zero::bench::forward_backward_step(
      [&](const zero::bench::StageRun& run) -> zero::models::MicroBatchSource& {
        return *sources.at(run.model.get());
      },
      opt.global_batch, opt.run.micro_batches, rank, world);
  const std::vector<Record> records = zero::bench::measure_dtypes(
      opt.run, comms, make_model, step,
      [&](const Record& first) { print_header(opt, world, first.params); });
  own_peak = std::max(own_peak, sgemm_gflops(opt.peak_size, opt.run.kernel_threads));
  double peak = 0.0;
  ZERO_MPI_CHECK(MPI_Allreduce(&own_peak, &peak, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  if (rank != 0) return 0;
  print_throughput(records, opt, peak);
  if (!opt.run.json_path.empty() && !write_json(records, opt, peak)) {
    std::fprintf(stderr, "zero-bench-gpt2: cannot write %s\n", opt.run.json_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::optional<Options> parsed = zero::driver::parse_command_line(
      "zero-bench-gpt2", kUsage, [&] { return parse_options(argc, argv); });
  if (!parsed) return 2;
  const Options& opt = *parsed;
  return zero::bench::run_with_mpi(
      &argc, &argv, "zero-bench-gpt2", opt.run,
      [&](const zero::bench::Communicators& comms) { return run_benchmark(opt, comms); });
}
