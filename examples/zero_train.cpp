// zero-train: trains an example model with the ZeRO engine on the ranks mpirun started.
//
//   zerorun -np 2 -- zero-train --model mlp --stage 3 --steps 20 --metrics run.jsonl
//   zerorun -np 4 -- zero-train --config ds_config.json --steps 100 --trace run.trace.json
//
// Settings come from a DeepSpeed-style config (--config) when given, and command-line flags
// override it; "auto" in the file takes the flag's value (or its default), as Hugging Face's
// Trainer does, and rank 0 prints each value it resolved and each config key it ignores. Rank 0
// prints a memory summary at start and a progress line every steps_per_print steps (with
// wall_clock_breakdown, a "time (ms) | forward: ..." line after it, as DeepSpeed); --metrics
// writes JSON lines (an "init" record, then one "step" record per step); --trace writes a Chrome
// trace of every rank's compute and collectives.
// --device cuda trains on each rank's node-local GPU, with NCCL collectives (builds with CUDA).
#include <mpi.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/mlp.h"
#include "examples/run_checks.h"
#include "zero/collectives/mpi_communicator.h"
#if ZERO_HAVE_NCCL
#include "zero/collectives/nccl_communicator.h"
#endif
#include "zero/core/check.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/config.h"
#include "zero/runtime/model.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace {

// --inject-fault KIND@STEP, for users (and our tests) to check how their setup fails. The last
// rank misbehaves at that step: inf-grad makes its loss gradient infinite; kill and stop send it
// SIGKILL or SIGSTOP between forward and backward; skip-step makes it skip the optimizer step
// (and the collectives in it) while the others wait there.
struct Fault {
  enum Kind { kNone, kInfGrad, kKill, kStop, kSkipStep } kind = kNone;
  long step = 0;
};

// Flags as given: unset ones leave the config file's (or the built-in default's) value.
struct Flags {
  std::string model = "mlp";
  std::string config;
  long steps = 20;
  std::optional<int> stage;
  std::optional<uint64_t> seed;
  std::optional<long> global_batch;
  std::optional<int> micro_batches;
  std::optional<float> lr;
  std::optional<float> weight_decay;
  std::optional<float> clip;
  std::optional<std::string> schedule;
  std::optional<long> warmup;
  std::optional<zero::DType> dtype;
  std::optional<size_t> merge_bytes;
  std::optional<long> steps_per_print;
  std::string metrics;
  std::string trace;
  zero::examples::MlpConfig mlp;
  int threads = 1;
  bool cuda = false;
  uint64_t memory_limit = 0;
  std::string save_dir;
  long save_every = 0;
  std::string resume;
  std::optional<bool> skip_nonfinite;
  Fault fault;
  long test_comm_delay_us = 0;
  bool override_optimizer = false;
  bool help = false;
};

constexpr const char* kUsage =
    "usage: zero-train [--config FILE] [--model mlp] [--steps N] [--stage 0|1|2|3]\n"
    "                  [--dtype fp32|bf16|fp16] [--seed S] [--global-batch B]\n"
    "                  [--micro-batches K] [--lr X] [--weight-decay X] [--clip X]\n"
    "                  [--schedule constant|warmup|linear|cosine] [--warmup N]\n"
    "                  [--steps-per-print N] [--metrics FILE] [--trace FILE]\n"
    "                  [--input-dim N] [--hidden N] [--output-dim N] [--layers N]\n"
    "                  [--merge-bytes N] [--threads N] [--memory-limit BYTES[K|M|G]]\n"
    "                  [--save-dir DIR] [--save-every K] [--resume DIR|latest]\n"
    "                  [--override-optimizer]\n"
    "                  [--nonfinite error|skip] [--inject-fault "
    "inf-grad|kill|stop|skip-step@STEP]\n"
    "                  [--device cpu|cuda] [--test-comm-delay-us N]\n";

// The run's values where neither a flag nor the config gives one.
constexpr long kDefaultGlobalBatch = 24;
constexpr float kDefaultLr = 1e-3f;
constexpr float kDefaultWeightDecay = 0.0f;

// A bad command line. Thrown, not exited on: every rank must learn of it (see main).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void usage_error(const std::string& message) {
  throw UsageError(message);
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

float parse_float(const std::string& flag, const std::string& value, float min_value) {
  char* end = nullptr;
  float v = std::strtof(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !std::isfinite(v)) {
    usage_error(flag + " expects a number, got '" + value + "'");
  }
  if (v < min_value) usage_error(flag + " must be at least " + std::to_string(min_value));
  return v;
}

Fault parse_fault(const std::string& v) {
  const size_t at = v.find('@');
  const std::string kind = v.substr(0, at);
  Fault fault;
  if (kind == "inf-grad") fault.kind = Fault::kInfGrad;
  if (kind == "kill") fault.kind = Fault::kKill;
  if (kind == "stop") fault.kind = Fault::kStop;
  if (kind == "skip-step") fault.kind = Fault::kSkipStep;
  if (fault.kind == Fault::kNone || at == std::string::npos) {
    usage_error("--inject-fault expects inf-grad|kill|stop|skip-step@STEP, got '" + v + "'");
  }
  fault.step = parse_long("--inject-fault", v.substr(at + 1), 1);
  return fault;
}

// 512, 64K, 300M, 2G (powers of 1024).
uint64_t parse_bytes(const std::string& flag, const std::string& value) {
  std::string digits = value;
  uint64_t unit = 1;
  const std::string suffixes = "KMG";
  if (!digits.empty()) {
    const size_t i = suffixes.find(static_cast<char>(std::toupper(digits.back())));
    if (i != std::string::npos) {
      unit = 1ull << (10 * (i + 1));
      digits.pop_back();
    }
  }
  return static_cast<uint64_t>(parse_long(flag, digits, 1)) * unit;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      f.help = true;
      return f;
    }
    if (flag == "--override-optimizer") {
      f.override_optimizer = true;
      continue;
    }
    if (i + 1 >= argc) usage_error("missing value after " + flag);
    const std::string v = argv[++i];
    if (flag == "--config") {
      f.config = v;
    } else if (flag == "--model") {
      f.model = v;
    } else if (flag == "--steps") {
      f.steps = parse_long(flag, v, 1);
    } else if (flag == "--stage") {
      f.stage = static_cast<int>(parse_long(flag, v, 0));
      if (*f.stage > 3) usage_error("--stage must be 0, 1, 2 or 3");
    } else if (flag == "--dtype") {
      zero::DType dtype;
      if (!zero::parse_dtype(v, &dtype)) usage_error("--dtype must be fp32, bf16 or fp16");
      f.dtype = dtype;
    } else if (flag == "--seed") {
      f.seed = static_cast<uint64_t>(parse_long(flag, v, 0));
    } else if (flag == "--global-batch") {
      f.global_batch = parse_long(flag, v, 1);
    } else if (flag == "--micro-batches") {
      f.micro_batches = static_cast<int>(parse_long(flag, v, 1));
    } else if (flag == "--lr") {
      f.lr = parse_float(flag, v, 0.0f);
    } else if (flag == "--weight-decay") {
      f.weight_decay = parse_float(flag, v, 0.0f);
    } else if (flag == "--clip") {
      f.clip = parse_float(flag, v, 0.0f);
    } else if (flag == "--schedule") {
      if (v != "constant" && v != "warmup" && v != "linear" && v != "cosine") {
        usage_error("unknown schedule '" + v + "' (constant, warmup, linear, cosine)");
      }
      f.schedule = v;
    } else if (flag == "--warmup") {
      f.warmup = parse_long(flag, v, 0);
    } else if (flag == "--steps-per-print") {
      f.steps_per_print = parse_long(flag, v, 1);
    } else if (flag == "--metrics") {
      f.metrics = v;
    } else if (flag == "--trace") {
      f.trace = v;
    } else if (flag == "--input-dim") {
      f.mlp.input_dim = static_cast<int>(parse_long(flag, v, 1));
    } else if (flag == "--hidden") {
      f.mlp.hidden_dim = static_cast<int>(parse_long(flag, v, 1));
    } else if (flag == "--output-dim") {
      f.mlp.output_dim = static_cast<int>(parse_long(flag, v, 1));
    } else if (flag == "--layers") {
      f.mlp.layers = static_cast<int>(parse_long(flag, v, 1));
    } else if (flag == "--merge-bytes") {
      f.merge_bytes = static_cast<size_t>(parse_long(flag, v, 0));
    } else if (flag == "--threads") {
      f.threads = static_cast<int>(parse_long(flag, v, 1));
    } else if (flag == "--device") {
      if (v != "cpu" && v != "cuda") usage_error("--device must be cpu or cuda, got '" + v + "'");
      f.cuda = v == "cuda";
#if !ZERO_HAVE_NCCL
      if (f.cuda) usage_error("--device cuda: this zero-train was built without CUDA and NCCL");
#endif
    } else if (flag == "--inject-fault") {
      f.fault = parse_fault(v);
    } else if (flag == "--save-dir") {
      f.save_dir = v;
    } else if (flag == "--save-every") {
      f.save_every = parse_long(flag, v, 1);
    } else if (flag == "--resume") {
      f.resume = v;
    } else if (flag == "--nonfinite") {
      if (v != "error" && v != "skip") usage_error("--nonfinite must be error or skip");
      f.skip_nonfinite = v == "skip";
    } else if (flag == "--memory-limit") {
      f.memory_limit = parse_bytes(flag, v);
    } else if (flag == "--test-comm-delay-us") {
      f.test_comm_delay_us = parse_long(flag, v, 0);
    } else {
      usage_error("unknown flag " + flag);
    }
  }
  if (f.model != "mlp") usage_error("unknown model '" + f.model + "' (available: mlp)");
  if (f.save_every > 0 && f.save_dir.empty()) usage_error("--save-every needs --save-dir");
  if (f.resume == "latest" && f.save_dir.empty()) {
    usage_error("--resume latest needs --save-dir (the directory whose latest checkpoint to load)");
  }
  if (f.cuda && !f.trace.empty()) {
    usage_error("--trace is CPU-only: on a GPU its host-time spans would show launches, not work");
  }
  if (f.cuda && f.test_comm_delay_us > 0) {
    usage_error("--test-comm-delay-us delays the CPU communication stream; not with --device cuda");
  }
  return f;
}

// What "auto" in a config file becomes: the flags, or zero-train's defaults for them (the values
// the run uses when the file does not say), and the MLP's hidden size.
zero::ConfigContext auto_values(const Flags& f) {
  zero::ConfigContext c;
  c.train_batch_size = f.global_batch.value_or(kDefaultGlobalBatch);
  c.batch_from_caller = f.global_batch.has_value();  // --global-batch overrides the file
  c.gradient_accumulation_steps = f.micro_batches.value_or(1);
  c.gradient_clipping = f.clip.value_or(0.0f);
  c.dtype = f.dtype.value_or(zero::DType::kFloat32);
  c.lr = f.lr.value_or(kDefaultLr);
  c.weight_decay = f.weight_decay.value_or(kDefaultWeightDecay);
  c.warmup_num_steps = f.warmup.value_or(0);
  c.total_num_steps = f.steps;
  c.hidden_size = f.mlp.hidden_dim;
  c.source = "zero-train's flags or their defaults";
  return c;
}

// The config file (or the built-in defaults), then every flag the user gave on top.
zero::TrainingConfig resolve_config(const Flags& f, int world_size) {
  zero::TrainingConfig tc;
  if (!f.config.empty()) {
    tc = zero::load_training_config(f.config, world_size, auto_values(f));
  } else {
    tc.engine.stage = 3;
    tc.engine.optimizer.lr = kDefaultLr;
    tc.engine.optimizer.weight_decay = kDefaultWeightDecay;
    tc.engine.merge_bytes = 32 * 1024;
    tc.train_batch_size = kDefaultGlobalBatch;
    tc.steps_per_print = 1;
    tc.origin = "the command line";
  }
  zero::EngineConfig& e = tc.engine;
  if (f.stage) e.stage = *f.stage;
  if (f.dtype) e.dtype = *f.dtype;
  if (f.seed) e.seed = *f.seed;
  if (f.weight_decay) e.optimizer.weight_decay = *f.weight_decay;
  if (f.clip) e.gradient_clipping = *f.clip;
  if (f.merge_bytes) e.merge_bytes = *f.merge_bytes;
  if (f.steps_per_print) tc.steps_per_print = *f.steps_per_print;
  if (f.lr) {
    e.optimizer.lr = *f.lr;
    e.lr_schedule.max_lr = *f.lr;
  }
  if (f.schedule) {
    const std::string& s = *f.schedule;
    e.lr_schedule.type = s == "constant" ? zero::LrScheduleType::kConstant
                         : s == "warmup" ? zero::LrScheduleType::kWarmup
                         : s == "linear" ? zero::LrScheduleType::kWarmupLinearDecay
                                         : zero::LrScheduleType::kWarmupCosine;
    e.lr_schedule.max_lr = e.optimizer.lr;
    e.lr_schedule.min_lr = 0.0f;
    e.lr_schedule.total_steps = f.steps;
  }
  if (f.warmup) e.lr_schedule.warmup_steps = *f.warmup;
  if (f.global_batch || f.micro_batches) {
    const zero::BatchSizes b = zero::derive_batch_sizes(
        f.global_batch ? *f.global_batch : tc.train_batch_size, std::nullopt,
        f.micro_batches ? *f.micro_batches : tc.gradient_accumulation_steps, world_size,
        "--global-batch/--micro-batches");
    tc.train_batch_size = b.train_batch_size;
    tc.micro_batch_per_rank = b.micro_batch_per_rank;
    tc.gradient_accumulation_steps = b.gradient_accumulation_steps;
  } else if (f.config.empty()) {
    const zero::BatchSizes b =
        zero::derive_batch_sizes(tc.train_batch_size, std::nullopt, 1, world_size, tc.origin);
    tc.micro_batch_per_rank = b.micro_batch_per_rank;
    tc.gradient_accumulation_steps = b.gradient_accumulation_steps;
  }
  e.micro_batches = tc.gradient_accumulation_steps;
  e.kernel_threads = f.threads;
  e.memory_limit_bytes = f.memory_limit;
  if (f.skip_nonfinite) e.skip_nonfinite_steps = *f.skip_nonfinite;
  if (f.override_optimizer) tc.override_optimizer = true;
  e.trace = !f.trace.empty();
  return tc;
}

// JSON has no NaN or infinity: a non-finite value (the norm of an overflowing step) is null.
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", v);
  return text;
}

double to_ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return to_ms(std::chrono::steady_clock::now() - start);
}

uint64_t max_over_ranks(zero::Communicator& comm, uint64_t value) {
  uint64_t m = 0;
  for (uint64_t v : zero::all_gather_u64(comm, value)) m = v > m ? v : m;
  return m;
}

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

void train(const Flags& f, const zero::TrainingConfig& tc, zero::Communicator& comm) {
  const int rank = comm.rank();
  const int world = comm.world_size();
  const zero::EngineConfig& config = tc.engine;
  const long per_micro_batch = tc.micro_batch_per_rank;
  const int micro_batches = tc.gradient_accumulation_steps;
  if (f.test_comm_delay_us > 0) {
    comm.stream().set_delay_for_testing(std::chrono::microseconds(f.test_comm_delay_us));
  }

  zero::ZeroModel model(comm, zero::examples::make_mlp(f.mlp), config);
  zero::Engine& engine = model.engine();
  // Metrics, memory figures and traces are host values: they travel over MPI even when the
  // engine's collectives run through NCCL.
  zero::Communicator& host = engine.host_communicator();
  const std::shared_ptr<zero::DeviceContext>& device = engine.device_context();

  // Resume: the checkpoint brings the engine's state; the data position and the seed come back
  // with the trainer state, so steps after it see the data the uninterrupted run saw.
  long first_step = 1;
  uint64_t data_seed = config.seed;
  if (!f.resume.empty()) {
    zero::TrainerState resumed;
    zero::load_checkpoint(engine, f.resume == "latest" ? f.save_dir : f.resume, &resumed,
                          zero::LoadOptions{tc.override_optimizer});
    first_step = resumed.step + 1;
    data_seed = resumed.seed;
    if (rank == 0) {
      std::printf("resumed from %s at step %ld\n", f.resume.c_str(), resumed.step);
    }
  }
  const zero::examples::TeacherTask data(f.mlp, data_seed);

  // A resumed run appends to the metrics file it continues, after a record marking the resume.
  std::ofstream metrics;
  if (rank == 0 && !f.metrics.empty()) {
    metrics.open(f.metrics, f.resume.empty() ? std::ios::trunc : std::ios::app);
    ZERO_CHECK(metrics.good(), "cannot open metrics file '" << f.metrics << "' for writing");
    if (!f.resume.empty()) {
      metrics << "{\"event\":\"resume\",\"step\":" << first_step - 1 << "}\n";
    }
  }
  if (rank == 0 && !f.save_dir.empty() && f.save_every == 0) {
    std::printf(
        "checkpoints: --save-dir without --save-every: the last step (%ld) is saved at "
        "the end\n",
        f.steps);
  }
  const uint64_t state_bytes = max_over_ranks(host, engine.model_state_bytes());
  const uint64_t buffer_bytes = max_over_ranks(host, engine.buffer_bytes());
  if (rank == 0) {
    std::printf(
        "zero-train: mlp in %s, %zu params (%zu padded) in %zu units, stage %d, %d rank(s), "
        "global batch %ld = %ld per micro-batch x %d micro-batches x %d ranks\n",
        zero::dtype_name(config.dtype), engine.layout().numel(), engine.layout().padded_numel(),
        engine.layout().units().size(), config.stage, world, tc.train_batch_size, per_micro_batch,
        micro_batches, world);
    std::printf("memory on rank 0 at start:\n%s", engine.allocator().summary().c_str());
    std::fflush(stdout);
    if (metrics.is_open()) {
      metrics << "{\"event\":\"init\",\"world_size\":" << world << ",\"stage\":" << config.stage
              << ",\"dtype\":\"" << zero::dtype_name(config.dtype) << "\""
              << ",\"params\":" << engine.layout().numel()
              << ",\"padded_params\":" << engine.layout().padded_numel()
              << ",\"units\":" << engine.layout().units().size()
              << ",\"model_state_bytes\":" << state_bytes << ",\"buffer_bytes\":" << buffer_bytes
              << "}\n";
    }
  }

  for (long step = first_step; step <= f.steps; ++step) {
    const uint64_t bytes_before = comm.counters().total_bytes();
    // The last step is always saved when there is a save directory.
    const bool save_now =
        !f.save_dir.empty() && ((f.save_every > 0 && step % f.save_every == 0) || step == f.steps);
    const auto start = std::chrono::steady_clock::now();
    // Host-side timers for wall_clock_breakdown (on CUDA, the time to queue the work).
    std::chrono::steady_clock::duration data_time{}, forward_time{}, backward_time{};
    float loss_sum = 0.0f;
    for (int k = 0; k < micro_batches; ++k) {
      // Micro-batch k of the global batch is split across ranks in contiguous blocks.
      const int64_t first =
          (static_cast<int64_t>(k) * world + rank) * static_cast<int64_t>(per_micro_batch);
      const auto data_start = std::chrono::steady_clock::now();
      zero::examples::Batch batch = data.batch(step, first, per_micro_batch);
      data_time += std::chrono::steady_clock::now() - data_start;
      const auto forward_start = std::chrono::steady_clock::now();
      zero::Tensor prediction = model.forward(batch.inputs.to(device));
      forward_time += std::chrono::steady_clock::now() - forward_start;
      zero::Tensor grad;
      loss_sum += zero::examples::mse_loss(prediction, batch.targets.to(device), grad);
      const bool faulty = step == f.fault.step && k == micro_batches - 1 && rank == world - 1;
      if (faulty && f.fault.kind == Fault::kInfGrad) {
        std::vector<float> values = grad.to_host();
        values[0] = std::numeric_limits<float>::infinity();
        grad = zero::Tensor(grad.shape(), values, grad.device());
      }
      if (faulty && f.fault.kind == Fault::kKill) raise(SIGKILL);
      if (faulty && f.fault.kind == Fault::kStop) raise(SIGSTOP);
      const auto backward_start = std::chrono::steady_clock::now();
      model.backward(grad);
      backward_time += std::chrono::steady_clock::now() - backward_start;
    }
    if (step == f.fault.step && f.fault.kind == Fault::kSkipStep && rank == world - 1) {
      std::fprintf(stderr, "zero-train: rank %d skips the optimizer step of step %ld\n", rank,
                   step);
      continue;
    }
    const auto optimizer_start = std::chrono::steady_clock::now();
    const zero::StepStats stats = model.step();
    const double optimizer_ms = ms_since(optimizer_start);
    float global_loss = 0.0f;
    host.all_reduce_sync(&loss_sum, &global_loss, 1, zero::DType::kFloat32);
    global_loss /= static_cast<float>(world * micro_batches);
    const double step_ms = ms_since(start);
    const uint64_t step_bytes = comm.counters().total_bytes() - bytes_before;
    if (save_now) {
      zero::save_checkpoint(engine, f.save_dir, zero::TrainerState{step, data_seed},
                            zero::SaveOptions{tc.gather_16bit_weights_on_model_save});
      if (rank == 0) std::printf("checkpoint of step %ld saved in %s\n", step, f.save_dir.c_str());
    }
    const uint64_t step_state = max_over_ranks(host, engine.model_state_bytes());
    const uint64_t peak = max_over_ranks(host, engine.allocator().stats().peak_total);
    if (rank != 0) continue;
    if (stats.skipped) {
      std::printf("step %ld: gradient overflow, step skipped; loss scale now %g\n", step,
                  stats.loss_scale);
    }
    if (step % tc.steps_per_print == 0 || step == f.steps || stats.skipped) {
      std::printf(
          "step %5ld/%ld  loss %.6f  lr %.3g  scale %g  grad_norm %.4f  %.2f ms  %.0f samples/s  "
          "state %.2f MiB  peak %.2f MiB\n",
          step, f.steps, global_loss, stats.lr, stats.loss_scale, stats.grad_norm, step_ms,
          static_cast<double>(tc.train_batch_size) / (step_ms / 1000.0), mib(step_state),
          mib(peak));
      if (tc.wall_clock_breakdown) {
        // DeepSpeed's per-step breakdown, rank 0's timers. The engine reports one wait for all
        // collectives (reduce-scatters/all-reduces and all-gathers alike): compute blocked on
        // communication, inside whichever of forward, backward and step it happened.
        std::printf(
            "time (ms) | forward: %.2f | backward: %.2f | step: %.2f | data: %.2f | "
            "comm_wait (reduce+gather): %.2f | comm_busy: %.2f | collectives: %d\n",
            to_ms(forward_time), to_ms(backward_time), optimizer_ms, to_ms(data_time),
            stats.comm_wait_ms, stats.comm_busy_ms, stats.collectives);
      }
      std::fflush(stdout);
    }
    if (metrics.is_open()) {
      metrics << "{\"event\":\"step\",\"step\":" << step << ",\"loss\":" << json_number(global_loss)
              << ",\"grad_norm\":" << json_number(stats.grad_norm)
              << ",\"lr\":" << json_number(stats.lr) << ",\"step_ms\":" << json_number(step_ms)
              << ",\"data_ms\":" << json_number(to_ms(data_time))
              << ",\"collectives\":" << stats.collectives
              << ",\"comm_busy_ms\":" << json_number(stats.comm_busy_ms)
              << ",\"comm_wait_ms\":" << json_number(stats.comm_wait_ms)
              << ",\"comm_bytes\":" << step_bytes << ",\"model_state_bytes\":" << step_state
              << ",\"peak_bytes\":" << peak << ",\"loss_scale\":" << json_number(stats.loss_scale)
              << ",\"skipped\":" << (stats.skipped ? "true" : "false") << "}\n";
      metrics.flush();
    }
  }
  if (!f.trace.empty()) {
    engine.trace().write_chrome_trace(host, f.trace);
    if (rank == 0) std::printf("trace written to %s\n", f.trace.c_str());
  }
}

// A start-up problem of this process (an output path it cannot write): exit code 2, like a
// usage or config error, and agreed with the other ranks the same way.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::string text_of(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Every setting that must agree across ranks for them to train one model: a difference would
// train silently wrong or hang in a collective. Named as the user knows them.
std::vector<zero::examples::Setting> run_description(const Flags& f,
                                                     const zero::TrainingConfig& tc) {
  const zero::EngineConfig& e = tc.engine;
  const zero::OptimizerConfig& o = e.optimizer;
  const zero::LrScheduleConfig& s = e.lr_schedule;
  const zero::LossScalerConfig& ls = e.loss_scaler;
  std::ostringstream optimizer, schedule, scaler, zero_opt, model, fault;
  optimizer << static_cast<int>(o.type) << " lr " << o.lr << " betas " << o.beta1 << " " << o.beta2
            << " eps " << o.eps << " weight_decay " << o.weight_decay << " momentum " << o.momentum;
  schedule << static_cast<int>(s.type) << " " << s.min_lr << ".." << s.max_lr << " warmup "
           << s.warmup_steps << " (" << static_cast<int>(s.warmup_type) << ") total "
           << s.total_steps << " cos_min_ratio " << s.cos_min_ratio;
  scaler << ls.static_scale << " 2^" << ls.initial_scale_power << " window " << ls.scale_window
         << " hysteresis " << ls.hysteresis << " min " << ls.min_scale;
  zero_opt << "overlap_comm " << e.overlap_comm << " reduce_scatter " << e.reduce_scatter
           << " reduce_bucket " << e.reduce_bucket_elements << " allgather_bucket "
           << e.allgather_bucket_elements << " prefetch " << e.prefetch_elements << " persistence "
           << e.persistence_threshold << " max_live " << e.max_live_elements << " reuse "
           << e.max_reuse_distance << " sub_group " << e.optimizer_sub_group_elements
           << " merge_bytes " << e.merge_bytes << " predivide " << e.gradient_predivide_factor
           << " fp32_reduce " << e.reduce_in_fp32 << " grad_accum "
           << (e.grad_accum_dtype ? zero::dtype_name(*e.grad_accum_dtype) : "default");
  model << f.model << " " << f.mlp.input_dim << "-" << f.mlp.hidden_dim << "x" << f.mlp.layers
        << "-" << f.mlp.output_dim;
  fault << static_cast<int>(f.fault.kind) << "@" << f.fault.step;
  return {
      {"the model (--model, --input-dim, --hidden, --layers, --output-dim)", model.str()},
      {"the ZeRO stage (--stage, zero_optimization.stage)", std::to_string(e.stage)},
      {"the dtype (--dtype, bf16/fp16.enabled)", zero::dtype_name(e.dtype)},
      {"--steps", std::to_string(f.steps)},
      {"the global batch (--global-batch, train_batch_size)", std::to_string(tc.train_batch_size)},
      {"the micro-batches (--micro-batches, gradient_accumulation_steps)",
       std::to_string(tc.gradient_accumulation_steps)},
      {"the seed (--seed, seed)", std::to_string(e.seed)},
      {"the optimizer (--lr, --weight-decay, optimizer)", optimizer.str()},
      {"the learning-rate schedule (--schedule, --warmup, scheduler)", schedule.str()},
      {"the gradient clipping (--clip, gradient_clipping)", text_of(e.gradient_clipping)},
      {"the fp16 loss scaler (fp16.*)", scaler.str()},
      {"the non-finite policy (--nonfinite)", std::to_string(e.skip_nonfinite_steps)},
      {"the ZeRO schedule (zero_optimization.*, --merge-bytes)", zero_opt.str()},
      {"--save-dir", f.save_dir},
      {"--save-every", std::to_string(f.save_every)},
      {"--resume", f.resume},
      {"--override-optimizer", std::to_string(tc.override_optimizer)},
      {"--memory-limit", std::to_string(f.memory_limit)},
      {"--device", f.cuda ? "cuda" : "cpu"},
      {"--inject-fault", fault.str()},
      {"--test-comm-delay-us", std::to_string(f.test_comm_delay_us)},
  };
}

// Output paths are checked at start, not at the first save or after the last step. The save
// directory is every rank's (each writes its shard) and rank 0 locks it for the job; the
// metrics file and the trace are rank 0's.
void check_outputs(const Flags& f, int rank, std::optional<zero::examples::SaveDirLock>* lock) {
  if (!f.save_dir.empty()) {
    const std::string why = zero::examples::unusable_save_dir(f.save_dir);
    if (!why.empty()) throw SetupError("--save-dir: " + why);
    if (rank == 0) {
      try {
        lock->emplace(f.save_dir);
      } catch (const std::runtime_error& e) {
        throw SetupError(std::string("--save-dir: ") + e.what());
      }
    }
  }
  if (rank != 0) return;
  for (const auto& [flag, path] : {std::pair{"--metrics", &f.metrics}, {"--trace", &f.trace}}) {
    if (path->empty()) continue;
    const std::string why = zero::examples::unwritable_file(*path);
    if (!why.empty()) throw SetupError(std::string(flag) + ": " + why);
  }
}

// Exit codes: 0 done, 1 a runtime error, 2 a usage, config or setup error (nothing started),
// 3 out of memory (the plan does not fit, or the system refused an allocation).
constexpr int kExitOutOfMemory = 3;

// Host memory of one micro-batch outside the engine's allocator, from the MLP's shapes: the
// batch (inputs and targets), each layer's output kept for backward, and the gradients that
// flow back (about as large again), in fp32.
uint64_t activation_bytes(const Flags& f, const zero::TrainingConfig& tc) {
  const uint64_t per_sample =
      static_cast<uint64_t>(f.mlp.input_dim) + 2ull * static_cast<uint64_t>(f.mlp.output_dim) +
      2ull * static_cast<uint64_t>(f.mlp.hidden_dim) * static_cast<uint64_t>(f.mlp.layers);
  return static_cast<uint64_t>(tc.micro_batch_per_rank) * per_sample * 2 * sizeof(float);
}

// Ranks sharing this node (MPI_COMM_TYPE_SHARED), among which the host's memory is divided.
int ranks_on_node() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int size = 1;
  MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  return size;
}

// Every rank's outcome of reading its flags and config, agreed before any other collective: a
// problem seen by only some ranks (a file one rank cannot read) ends every rank at once with
// exit code 2, instead of leaving the others in the engine's first collective until the
// watchdog. Returns the ranks that failed.
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

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  const int rank = mpi.world_rank();
  Flags flags;
  zero::TrainingConfig config;
  std::optional<zero::examples::SaveDirLock> save_dir_lock;
  std::string error;
  try {
    flags = parse_flags(argc, argv);
    if (!flags.help) {
      config = resolve_config(flags, mpi.world_size());
      check_outputs(flags, rank, &save_dir_lock);
    }
  } catch (const UsageError& e) {
    error = std::string(e.what()) + "\n" + kUsage;
  } catch (const zero::ConfigError& e) {
    error = e.what();
  } catch (const SetupError& e) {
    error = e.what();
  }
  const std::vector<int> failed = failed_ranks(!error.empty(), mpi.world_size());
  if (!failed.empty()) {
    // All ranks failing read the same command line and file: rank 0 speaks for them.
    if (static_cast<int>(failed.size()) == mpi.world_size()) {
      if (rank == 0) std::cerr << "zero-train: " << error << "\n";
    } else if (!error.empty()) {
      // One write per line: the ranks share the terminal, and std::cerr writes each << apart.
      std::cerr << ("zero-train: rank " + std::to_string(rank) + ": " + error + "\n");
    } else {
      std::cerr << ("zero-train: rank " + std::to_string(rank) + ": stopping, rank " +
                    std::to_string(failed[0]) +
                    " could not read its command line or config (its message says why)\n");
    }
    return 2;
  }
  if (flags.help) {
    if (rank == 0) std::cout << kUsage;
    return 0;
  }
  const std::string disagreement =
      zero::examples::first_disagreement(run_description(flags, config));
  if (!disagreement.empty()) {
    if (rank == 0) std::cerr << ("zero-train: " + disagreement + "\n");
    return 2;
  }
  if (!flags.cuda) {
    // The budget of a rank (--memory-limit, else what the host can give it) holds the
    // activations and batch data too: the engine's limit is the rest. So a model or a batch
    // that cannot fit is an error with the plan's numbers (exit 3), not a kill by the kernel
    // halfway through allocating it, and --memory-limit bounds what the process holds.
    const uint64_t budget = flags.memory_limit > 0
                                ? flags.memory_limit
                                : zero::examples::host_memory_per_rank(ranks_on_node());
    const std::string source =
        flags.memory_limit > 0 ? "--memory-limit" : "available memory over the ranks on this node";
    const uint64_t activations = activation_bytes(flags, config);
    if (budget > 0) {
      if (budget <= activations) {
        if (rank == 0) {
          std::cerr << ("zero-train: out of host memory: the activations and batch data of " +
                        std::to_string(config.micro_batch_per_rank) +
                        " samples per micro-batch need about " + zero::human_bytes(activations) +
                        " per rank, and a rank may use " + zero::human_bytes(budget) + " (" +
                        source + "); lower --global-batch\n");
        }
        return kExitOutOfMemory;
      }
      config.engine.memory_limit_bytes = budget - activations;
      if (rank == 0) {
        std::printf("memory per rank: %s (%s), %s of it for activations and batch data\n",
                    zero::human_bytes(budget).c_str(), source.c_str(),
                    zero::human_bytes(activations).c_str());
      }
    }
  }
  if (rank == 0) {
    for (const std::string& line : config.resolved_auto) std::printf("config: %s\n", line.c_str());
    for (const std::string& line : config.ignored_keys) std::printf("config: %s\n", line.c_str());
    std::fflush(stdout);
  }
  // Ranks already use every core; OpenBLAS threads on top would only contend with them.
  openblas_set_num_threads(1);
  try {
    std::unique_ptr<zero::Communicator> comm;
    zero::Device device = zero::Device::cpu();
#if ZERO_HAVE_NCCL
    if (flags.cuda) {
      std::unique_ptr<zero::NcclCommunicator> nccl = zero::make_nccl_communicator();
      device = zero::Device::cuda(nccl->device());
      comm = std::move(nccl);
    }
#endif
    if (!comm) comm = zero::make_mpi_communicator();
    config.engine.device = device;
    train(flags, config, *comm);
  } catch (const zero::ConfigError& e) {
    // Raised on every rank at once (a resume whose checkpoint disagrees with the run): one
    // message, exit 2, and no rank is left in a collective.
    if (rank == 0) std::cerr << "zero-train: " << e.what() << "\n";
    return 2;
  } catch (const zero::OutOfMemoryError& e) {
    std::cerr << ("zero-train: rank " + std::to_string(rank) + ": " + e.what() + "\n");
    MPI_Abort(MPI_COMM_WORLD, kExitOutOfMemory);
  } catch (const std::bad_alloc&) {
    std::cerr << ("zero-train: rank " + std::to_string(rank) +
                  ": out of host memory (the system refused an allocation); lower "
                  "--global-batch or the model size, or use more ranks\n");
    MPI_Abort(MPI_COMM_WORLD, kExitOutOfMemory);
  } catch (const std::exception& e) {
    std::cerr << ("zero-train: rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    // The other ranks may be waiting in a collective this rank will never join: end the job.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
