// zero-train: trains an example model with the ZeRO engine on the ranks mpirun started.
//
//   zerorun -np 2 -- zero-train --model mlp --stage 3 --steps 20 --metrics run.jsonl
//
// Rank 0 prints one progress line per step and, with --metrics, writes JSON lines: an "init"
// record (world size, stage, parameter counts, model-state and buffer bytes) and one "step"
// record per step (loss, gradient norm, learning rate, time, bytes communicated).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>

#include <mpi.h>

#include "examples/mlp.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/kernels/check.h"
#include "zero/runtime/model.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace {

struct Options {
  std::string model = "mlp";
  int stage = 3;
  long steps = 20;
  uint64_t seed = 1;
  long global_batch = 24;
  int micro_batches = 1;
  float lr = 1e-3f;
  float weight_decay = 0.0f;
  float clip = 0.0f;
  long warmup = 0;
  std::string schedule = "constant";
  std::string metrics;
  zero::examples::MlpConfig mlp;
  size_t merge_bytes = 32 * 1024;
  int threads = 1;
  long test_comm_delay_us = 0;
  zero::DType dtype = zero::DType::kFloat32;
  long inject_inf_grad_step = 0;  // --inject-fault inf-grad@STEP
};

constexpr const char* kUsage =
    "usage: zero-train [--model mlp] [--stage 0|1|2|3] [--steps N] [--seed S]\n"
    "                  [--global-batch B] [--micro-batches K] [--lr X] [--weight-decay X]\n"
    "                  [--clip X] [--schedule constant|warmup|linear|cosine] [--warmup N]\n"
    "                  [--metrics FILE] [--input-dim N] [--hidden N] [--output-dim N]\n"
    "                  [--layers N] [--merge-bytes N] [--threads N] [--dtype fp32|bf16|fp16]\n"
    "                  [--inject-fault inf-grad@STEP] [--test-comm-delay-us N]\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "zero-train: " << message << "\n" << kUsage;
  std::exit(2);
}

long parse_long(const std::string& flag, const std::string& value, long min_value) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0) {
    usage_error(flag + " expects an integer, got '" + value + "'");
  }
  if (v < min_value) usage_error(flag + " must be at least " + std::to_string(min_value));
  return v;
}

float parse_float(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  float v = std::strtof(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(v)) {
    usage_error(flag + " expects a number, got '" + value + "'");
  }
  return v;
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("missing value after " + flag);
    std::string v = argv[++i];
    if (flag == "--model")
      o.model = v;
    else if (flag == "--stage")
      o.stage = static_cast<int>(parse_long(flag, v, 0));
    else if (flag == "--steps")
      o.steps = parse_long(flag, v, 1);
    else if (flag == "--seed")
      o.seed = static_cast<uint64_t>(parse_long(flag, v, 0));
    else if (flag == "--global-batch")
      o.global_batch = parse_long(flag, v, 1);
    else if (flag == "--micro-batches")
      o.micro_batches = static_cast<int>(parse_long(flag, v, 1));
    else if (flag == "--lr")
      o.lr = parse_float(flag, v);
    else if (flag == "--weight-decay")
      o.weight_decay = parse_float(flag, v);
    else if (flag == "--clip")
      o.clip = parse_float(flag, v);
    else if (flag == "--schedule")
      o.schedule = v;
    else if (flag == "--warmup")
      o.warmup = parse_long(flag, v, 0);
    else if (flag == "--metrics")
      o.metrics = v;
    else if (flag == "--input-dim")
      o.mlp.input_dim = static_cast<int>(parse_long(flag, v, 1));
    else if (flag == "--hidden")
      o.mlp.hidden_dim = static_cast<int>(parse_long(flag, v, 1));
    else if (flag == "--output-dim")
      o.mlp.output_dim = static_cast<int>(parse_long(flag, v, 1));
    else if (flag == "--layers")
      o.mlp.layers = static_cast<int>(parse_long(flag, v, 1));
    else if (flag == "--merge-bytes")
      o.merge_bytes = static_cast<size_t>(parse_long(flag, v, 0));
    else if (flag == "--threads")
      o.threads = static_cast<int>(parse_long(flag, v, 1));
    else if (flag == "--test-comm-delay-us")
      o.test_comm_delay_us = parse_long(flag, v, 0);
    else if (flag == "--dtype") {
      if (!zero::parse_dtype(v, &o.dtype)) usage_error("--dtype must be fp32, bf16 or fp16");
    } else if (flag == "--inject-fault") {
      const std::string prefix = "inf-grad@";
      if (v.rfind(prefix, 0) != 0) {
        usage_error("--inject-fault expects inf-grad@STEP, got '" + v + "'");
      }
      o.inject_inf_grad_step = parse_long(flag, v.substr(prefix.size()), 1);
    } else
      usage_error("unknown flag " + flag);
  }
  if (o.model != "mlp") usage_error("unknown model '" + o.model + "' (available: mlp)");
  if (o.stage > 3) usage_error("--stage must be 0, 1, 2 or 3");
  if (o.lr < 0.0f) usage_error("--lr must be >= 0");
  if (o.clip < 0.0f) usage_error("--clip must be >= 0 (0 = off)");
  return o;
}

zero::LrScheduleConfig schedule_config(const Options& o) {
  zero::LrScheduleConfig s;
  s.max_lr = o.lr;
  s.min_lr = 0.0f;
  s.warmup_steps = o.warmup;
  s.total_steps = o.steps;
  if (o.schedule == "constant")
    s.type = zero::LrScheduleType::kConstant;
  else if (o.schedule == "warmup")
    s.type = zero::LrScheduleType::kWarmup;
  else if (o.schedule == "linear")
    s.type = zero::LrScheduleType::kWarmupLinearDecay;
  else if (o.schedule == "cosine")
    s.type = zero::LrScheduleType::kWarmupCosine;
  else
    usage_error("unknown schedule '" + o.schedule + "' (constant, warmup, linear, cosine)");
  return s;
}

// JSON has no NaN or infinity: a non-finite value (the norm of an overflowing step) is null.
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", v);
  return text;
}

uint64_t max_over_ranks(zero::Communicator& comm, uint64_t value) {
  uint64_t m = 0;
  for (uint64_t v : zero::all_gather_u64(comm, value)) m = v > m ? v : m;
  return m;
}

int train(const Options& o, zero::Communicator& comm) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  const long per_micro_batch = o.global_batch / (static_cast<long>(world) * o.micro_batches);
  if (per_micro_batch * world * o.micro_batches != o.global_batch) {
    if (rank == 0) {
      std::cerr << "zero-train: --global-batch " << o.global_batch << " is not divisible by ranks ("
                << world << ") x micro-batches (" << o.micro_batches << ")\n";
    }
    return 2;
  }
  if (o.test_comm_delay_us > 0) {
    comm.stream().set_delay_for_testing(std::chrono::microseconds(o.test_comm_delay_us));
  }

  zero::EngineConfig config;
  config.stage = o.stage;
  config.micro_batches = o.micro_batches;
  config.gradient_clipping = o.clip;
  config.optimizer.lr = o.lr;
  config.optimizer.weight_decay = o.weight_decay;
  config.lr_schedule = schedule_config(o);
  config.merge_bytes = o.merge_bytes;
  config.kernel_threads = o.threads;
  config.seed = o.seed;
  config.dtype = o.dtype;

  zero::ZeroModel model(comm, zero::examples::make_mlp(o.mlp), config);
  zero::examples::TeacherTask task(o.mlp, o.seed);
  zero::Engine& engine = model.engine();

  std::ofstream metrics;
  if (rank == 0 && !o.metrics.empty()) {
    metrics.open(o.metrics);
    ZERO_CHECK(metrics.good(), "cannot open metrics file '" << o.metrics << "' for writing");
  }
  const uint64_t state_bytes = max_over_ranks(comm, engine.model_state_bytes());
  const uint64_t buffer_bytes = max_over_ranks(comm, engine.buffer_bytes());
  if (rank == 0) {
    std::printf(
        "zero-train: mlp in %s, %zu params (%zu padded) in %zu units, stage %d, %d rank(s), "
        "model state %.2f MiB per rank\n",
        zero::dtype_name(o.dtype), engine.layout().numel(), engine.layout().padded_numel(),
        engine.layout().units().size(), o.stage, world,
        static_cast<double>(state_bytes) / (1 << 20));
    if (metrics.is_open()) {
      metrics << "{\"event\":\"init\",\"world_size\":" << world << ",\"stage\":" << o.stage
              << ",\"params\":" << engine.layout().numel()
              << ",\"padded_params\":" << engine.layout().padded_numel()
              << ",\"units\":" << engine.layout().units().size()
              << ",\"model_state_bytes\":" << state_bytes << ",\"buffer_bytes\":" << buffer_bytes
              << "}\n";
    }
  }

  for (long step = 1; step <= o.steps; ++step) {
    const uint64_t bytes_before = comm.counters().total_bytes();
    const auto start = std::chrono::steady_clock::now();
    float loss_sum = 0.0f;
    for (int k = 0; k < o.micro_batches; ++k) {
      // Micro-batch k of the global batch is split across ranks in contiguous blocks.
      const int64_t first =
          static_cast<int64_t>(k) * world * per_micro_batch + rank * per_micro_batch;
      zero::examples::Batch batch = task.batch(step, first, per_micro_batch);
      zero::Tensor prediction = model.forward(batch.inputs);
      zero::Tensor grad;
      loss_sum += zero::examples::mse_loss(prediction, batch.targets, grad);
      // Fault injection for users testing their setup: the last rank's gradient becomes
      // infinite in the last micro-batch of the chosen step.
      if (step == o.inject_inf_grad_step && k == o.micro_batches - 1 && rank == world - 1) {
        grad.data[0] = std::numeric_limits<float>::infinity();
      }
      model.backward(grad);
    }
    zero::StepStats stats = model.step();
    float global_loss = 0.0f;
    comm.all_reduce_sync(&loss_sum, &global_loss, 1, zero::DType::kFloat32);
    global_loss /= static_cast<float>(world * o.micro_batches);
    const double step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const uint64_t step_bytes = comm.counters().total_bytes() - bytes_before;
    const uint64_t step_state = max_over_ranks(comm, engine.model_state_bytes());
    if (rank == 0) {
      if (stats.skipped) {
        std::printf("step %4ld/%ld  gradient overflow: step skipped, loss scale now %g\n", step,
                    o.steps, stats.loss_scale);
      }
      std::printf("step %4ld/%ld  loss %.6f  grad_norm %.4f  lr %.3g  scale %g  %.2f ms\n", step,
                  o.steps, global_loss, stats.grad_norm, stats.lr, stats.loss_scale, step_ms);
      std::fflush(stdout);
      if (metrics.is_open()) {
        metrics << "{\"event\":\"step\",\"step\":" << step
                << ",\"loss\":" << json_number(global_loss)
                << ",\"grad_norm\":" << json_number(stats.grad_norm)
                << ",\"lr\":" << json_number(stats.lr) << ",\"step_ms\":" << json_number(step_ms)
                << ",\"comm_bytes\":" << step_bytes << ",\"model_state_bytes\":" << step_state
                << ",\"loss_scale\":" << json_number(stats.loss_scale)
                << ",\"skipped\":" << (stats.skipped ? "true" : "false") << "}\n";
        metrics.flush();
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Flags are checked before MPI starts, so a usage error exits 2 on every rank at once.
  Options options = parse_options(argc, argv);
  zero::MpiSession mpi(&argc, &argv);
  // Ranks already use every core; OpenBLAS threads on top would only contend with them.
  openblas_set_num_threads(1);
  int rc = 0;
  try {
    std::unique_ptr<zero::Communicator> comm = zero::make_mpi_communicator();
    rc = train(options, *comm);
  } catch (const std::exception& e) {
    std::cerr << "zero-train: rank " << mpi.world_rank() << ": error: " << e.what() << "\n";
    // The other ranks may be waiting in a collective this rank will never join: end the job.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return rc;
}
