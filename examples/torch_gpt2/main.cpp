// zero-torch-gpt2: the LibTorch GPT-2 of torch_gpt2.h trained through zero::TorchModel.
//
//   zerorun -np 2 -- zero-torch-gpt2 --stage 3 --data train.bin [--init-from model.safetensors]
//   zerorun -np 2 -- zero-torch-gpt2 --bench --stage 3 --n-layer 4 --n-embd 128 --seq-len 128
//
// Training prints the loss and gradient norm of every step. --bench instead measures tokens/s
// per rank through the adapter on N ranks against the same module trained by LibTorch alone
// (torch::optim::AdamW) on one rank's share of the batch, the two alternating in one
// run: each round times --steps steps of each, and the medians are compared. Every rank trains
// its own LibTorch copy at the same time (no communication), so both phases see the same load
// on shared cores: a rank left waiting in a barrier would slow the one measured. It also reports
// the adapter's communication overlap as zero-bench-step does, from the engine's StepStats over
// the measured steps and ranks: 1 - comm_wait / comm_busy. --json writes the figures as one
// record (benchmarks/report_torch.py reads it).
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "examples/torch_gpt2/torch_gpt2.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"

namespace {

using zero::examples::Gpt2;
using zero::examples::Gpt2Batch;

struct Options {
  zero::examples::TorchGpt2Config gpt2;
  int stage = 3;
  zero::DType dtype = zero::DType::kFloat32;
  long steps = 10;
  long global_batch = 4;
  long seq_len = 32;
  float lr = 1e-3f;
  float weight_decay = 0.1f;
  std::string data;
  std::string init_from;
  bool bench = false;
  long rounds = 5;
  long threads = 1;
  std::string json_path;
};

const char* kUsage =
    "usage: zero-torch-gpt2 [--stage 0..3] [--dtype fp32|bf16|fp16] [--steps N] "
    "[--global-batch B] [--seq-len T] [--n-layer L] [--n-head H] [--n-embd C] [--vocab-size V] "
    "[--block-size N] [--lr X] [--weight-decay X] [--data FILE] [--init-from FILE] [--threads N] "
    "[--bench [--rounds R] [--json FILE]]";

Options parse(int argc, char** argv) {
  using zero::driver::parse_at_least;
  using zero::driver::parse_between;
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--bench") {
      opt.bench = true;
      continue;
    }
    if (i + 1 >= argc) zero::driver::usage_error(flag + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    if (flag == "--stage") {
      opt.stage = static_cast<int>(parse_between(flag, value, 0, 3));
    } else if (flag == "--dtype") {
      if (!zero::parse_dtype(value, &opt.dtype, /*short_only=*/true)) {
        zero::driver::usage_error("--dtype: fp32, bf16 or fp16");
      }
    } else if (flag == "--steps") {
      opt.steps = parse_at_least(flag, value, 1);
    } else if (flag == "--global-batch") {
      opt.global_batch = parse_at_least(flag, value, 1);
    } else if (flag == "--seq-len") {
      opt.seq_len = parse_at_least(flag, value, 1);
    } else if (flag == "--n-layer") {
      opt.gpt2.n_layer = parse_at_least(flag, value, 1);
    } else if (flag == "--n-head") {
      opt.gpt2.n_head = parse_at_least(flag, value, 1);
    } else if (flag == "--n-embd") {
      opt.gpt2.n_embd = parse_at_least(flag, value, 1);
    } else if (flag == "--vocab-size") {
      opt.gpt2.vocab_size = parse_at_least(flag, value, 1);
    } else if (flag == "--block-size") {
      opt.gpt2.block_size = parse_at_least(flag, value, 1);
    } else if (flag == "--lr") {
      opt.lr = zero::driver::parse_float_at_least(flag, value, 0.0f);
    } else if (flag == "--weight-decay") {
      opt.weight_decay = zero::driver::parse_float_at_least(flag, value, 0.0f);
    } else if (flag == "--data") {
      opt.data = value;
    } else if (flag == "--init-from") {
      opt.init_from = value;
    } else if (flag == "--rounds") {
      opt.rounds = parse_at_least(flag, value, 1);
    } else if (flag == "--json") {
      opt.json_path = value;
    } else if (flag == "--threads") {
      opt.threads = parse_at_least(flag, value, 1);
    } else {
      zero::driver::usage_error("unknown flag " + flag + "\n" + kUsage);
    }
  }
  if (opt.seq_len > opt.gpt2.block_size) {
    zero::driver::usage_error("--seq-len " + std::to_string(opt.seq_len) +
                              " is longer than --block-size " +
                              std::to_string(opt.gpt2.block_size));
  }
  if (!opt.bench && opt.data.empty()) zero::driver::usage_error("--data is needed to train");
  return opt;
}

zero::EngineConfig engine_config(const Options& opt) {
  zero::EngineConfig config;
  config.stage = opt.stage;
  config.precision.dtype = opt.dtype;
  config.optimizer.lr = opt.lr;
  config.optimizer.beta1 = 0.9;
  config.optimizer.beta2 = 0.95;
  config.optimizer.weight_decay = opt.weight_decay;
  return config;
}

int train(zero::Communicator& comm, const Options& opt) {
  Gpt2 model(opt.gpt2);
  std::unique_ptr<zero::TorchModel> wrapped =
      zero::examples::wrap_gpt2(comm, model, engine_config(opt), opt.init_from);
  const zero::models::TokenData data(opt.data);
  for (long step = 0; step < opt.steps; ++step) {
    const Gpt2Batch batch =
        zero::examples::read_gpt2_batch(data, step, opt.global_batch, opt.seq_len);
    const float loss = zero::examples::gpt2_forward_backward(*wrapped, batch);
    const zero::StepStats stats = wrapped->step();
    if (comm.rank() == 0) {
      std::printf("step %4ld  loss %.6f  grad_norm %.6f\n", step + 1, loss, stats.grad_norm);
    }
  }
  return 0;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The adapter's communication over the measured steps, summed over the ranks (collective).
struct CommFigures {
  double busy_ms = 0.0;  // StepStats::comm_busy_ms
  double wait_ms = 0.0;  // StepStats::comm_wait_ms
  double collectives = 0.0;

  void add(const zero::StepStats& stats) {
    busy_ms += stats.comm_busy_ms;
    wait_ms += stats.comm_wait_ms;
    collectives += stats.collectives;
  }
  void sum_over_ranks() {
    double sums[3] = {busy_ms, wait_ms, collectives};
    ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
    busy_ms = sums[0];
    wait_ms = sums[1];
    collectives = sums[2];
  }
  // zero-bench-step's figure: the part of the communication time compute did not wait for.
  double overlap() const {
    return busy_ms > 0 ? std::min(1.0, std::max(0.0, 1.0 - wait_ms / busy_ms)) : 0.0;
  }
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The adapter on every rank, then LibTorch alone on every rank with one rank's share of the
// batch, round after round; both start from the same weights. Rank 0's times are reported.
int bench(zero::Communicator& comm, const Options& opt) {
  const int world = comm.world_size();
  if (opt.global_batch % world != 0) {
    zero::driver::usage_error("--bench needs --global-batch divisible by the ranks");
  }
  torch::manual_seed(1);
  Gpt2 model(opt.gpt2);
  torch::manual_seed(1);
  Gpt2 plain(opt.gpt2);
  std::vector<torch::Tensor> decay, no_decay;
  for (const torch::Tensor& p : plain->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  const auto adamw_options = [&](float weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(opt.lr).betas({0.9, 0.95}).weight_decay(weight_decay));
  };
  torch::optim::AdamW adamw(
      {torch::optim::OptimizerParamGroup(decay, adamw_options(opt.weight_decay)),
       torch::optim::OptimizerParamGroup(no_decay, adamw_options(0.0f))});
  std::unique_ptr<zero::TorchModel> wrapped =
      zero::examples::wrap_gpt2(comm, model, engine_config(opt), "");
  const int64_t per_rank = opt.global_batch / world;
  std::vector<double> adapter_s, plain_s;
  CommFigures comm_figures;
  long step = 0;
  for (long round = 0; round <= opt.rounds; ++round) {  // round 0 warms up, unmeasured
    comm.barrier().wait();
    auto start = std::chrono::steady_clock::now();
    for (long s = 0; s < opt.steps; ++s) {
      const Gpt2Batch batch = zero::examples::random_gpt2_batch(
          static_cast<uint64_t>(step++), opt.global_batch, opt.seq_len, opt.gpt2.vocab_size);
      zero::examples::gpt2_forward_backward(*wrapped, batch);
      const zero::StepStats stats = wrapped->step();
      if (round > 0) comm_figures.add(stats);
    }
    if (round > 0) adapter_s.push_back(seconds_since(start) / static_cast<double>(opt.steps));
    comm.barrier().wait();
    start = std::chrono::steady_clock::now();
    for (long s = 0; s < opt.steps; ++s) {
      const Gpt2Batch batch = zero::examples::random_gpt2_batch(static_cast<uint64_t>(s), per_rank,
                                                                opt.seq_len, opt.gpt2.vocab_size);
      adamw.zero_grad();
      zero::examples::gpt2_loss(plain->forward(batch.inputs), batch.targets).backward();
      adamw.step();
    }
    if (round > 0) plain_s.push_back(seconds_since(start) / static_cast<double>(opt.steps));
  }
  comm_figures.sum_over_ranks();
  if (comm.rank() == 0) {
    const double rank_steps = static_cast<double>(world * opt.rounds * opt.steps);
    const double tokens = static_cast<double>(per_rank * opt.seq_len);
    const double through_adapter = tokens / median(adapter_s);
    const double alone = tokens / median(plain_s);
    std::printf(
        "LibTorch GPT-2 (%ld layers, %ld wide, %ld heads, T %ld), %ld sequences per rank, %ld "
        "torch thread(s), median of %ld rounds of %ld steps\n",
        static_cast<long>(opt.gpt2.n_layer), static_cast<long>(opt.gpt2.n_embd),
        static_cast<long>(opt.gpt2.n_head), opt.seq_len, static_cast<long>(per_rank), opt.threads,
        opt.rounds, opt.steps);
    std::printf("through the adapter, stage %d, %d rank(s): %10.1f tokens/s per rank\n", opt.stage,
                world, through_adapter);
    std::printf("LibTorch alone (AdamW), each rank:       %10.1f tokens/s per rank\n", alone);
    std::printf("ratio adapter / alone: %.3f\n", through_adapter / alone);
    std::printf(
        "adapter communication per step (mean over ranks): %.1f collectives, busy %.2f ms, "
        "exposed %.2f ms, overlap %.1f%% (1 - comm_wait / comm_busy, as zero-bench-step)\n",
        comm_figures.collectives / rank_steps, comm_figures.busy_ms / rank_steps,
        comm_figures.wait_ms / rank_steps, 100.0 * comm_figures.overlap());
    if (!opt.json_path.empty()) {
      using zero::driver::rounded;
      const zero::driver::JsonRecord record = {
          {"world_size", world},
          {"stage", opt.stage},
          {"dtype", zero::dtype_name(opt.dtype)},
          {"n_layer", opt.gpt2.n_layer},
          {"n_embd", opt.gpt2.n_embd},
          {"n_head", opt.gpt2.n_head},
          {"vocab_size", opt.gpt2.vocab_size},
          {"block_size", opt.gpt2.block_size},
          {"seq_len", opt.seq_len},
          {"global_batch", opt.global_batch},
          {"threads", opt.threads},
          {"rounds", opt.rounds},
          {"steps", opt.steps},
          {"adapter_tokens_per_s_per_rank", rounded(through_adapter, 2)},
          {"alone_tokens_per_s_per_rank", rounded(alone, 2)},
          {"adapter_step_ms", rounded(1000.0 * median(adapter_s), 3)},
          {"alone_step_ms", rounded(1000.0 * median(plain_s), 3)},
          {"collectives_per_step", rounded(comm_figures.collectives / rank_steps, 2)},
          {"comm_ms", rounded(comm_figures.busy_ms / rank_steps, 4)},
          {"exposed_comm_ms", rounded(comm_figures.wait_ms / rank_steps, 4)},
          {"overlap_fraction", rounded(comm_figures.overlap(), 4)}};
      ZERO_CHECK(zero::driver::write_json_array(opt.json_path, {record}),
                 "cannot write " << opt.json_path);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  Options opt;
  try {
    opt = parse(argc, argv);
  } catch (const zero::driver::UsageError& e) {
    if (mpi.world_rank() == 0) std::fprintf(stderr, "zero-torch-gpt2: %s\n", e.what());
    return 2;
  }
  try {
    torch::set_num_threads(static_cast<int>(opt.threads));
    std::unique_ptr<zero::Communicator> comm = zero::make_mpi_communicator();
    return opt.bench ? bench(*comm, opt) : train(*comm, opt);
  } catch (const c10::Error& e) {  // LibTorch's own message, without its stack trace
    std::fprintf(stderr, "zero-torch-gpt2: rank %d: %s\n", mpi.world_rank(),
                 e.what_without_backtrace());
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-torch-gpt2: rank %d: %s\n", mpi.world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}
