// zero-train: trains a model of models/ with the ZeRO engine on the ranks mpirun started.
//
//   zerorun -np 2 -- zero-train --model gpt2 --preset tiny --data train.bin --stage 3
//   zerorun -np 2 -- zero-train --model mlp --stage 3 --steps 20 --metrics run.jsonl
//   zerorun -np 4 -- zero-train --config ds_config.json --steps 100 --trace run.trace.json
//
// The model is a TrainTask (train_task.h): the MLP on its synthetic teacher task, or the GPT-2
// on llm.c token files (--data, --val-data), from Hugging Face weights with --init-from.
// Settings come from a DeepSpeed-style config (--config) when given, and command-line flags
// override it; "auto" in the file takes the flag's value (or its default), as Hugging Face's
// Trainer does, and rank 0 prints each value it resolved and each config key it ignores. Rank 0
// prints a memory summary at start and a progress line every steps_per_print steps (with
// wall_clock_breakdown, a "time (ms) | forward: ..." line after it, as DeepSpeed); --metrics
// writes JSON lines (an "init" record with the model's config, then one "step" record per step,
// with tokens_per_s and, every --val-every steps, val_loss); --trace writes a Chrome trace of
// every rank's compute and collectives.
// --device cuda trains on each rank's node-local GPU, with NCCL collectives (builds with CUDA).
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "driver/cli.h"
#include "driver/metrics_writer.h"
#include "examples/comms_log.h"
#include "examples/flops_profile.h"
#include "examples/memory_timeline.h"
#include "examples/run_checks.h"
#include "examples/train_flags.h"
#include "examples/train_outputs.h"
#include "examples/train_pipeline.h"
#include "examples/train_task.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/collectives/process_grid.h"
#if ZERO_HAVE_NCCL
#include "zero/collectives/nccl_communicator.h"
#endif
#include "zero/core/check.h"
#include "zero/kernels/blas_core.h"
#include "zero/kernels/cpu_features.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/config.h"
#include "zero/runtime/model.h"

extern "C" void openblas_set_num_threads(int num_threads);

namespace {

using zero::driver::json_number;
using zero::driver::JsonRecord;
using zero::examples::Fault;
using zero::examples::Flags;
using zero::examples::ms_since;
using zero::examples::to_ms;

uint64_t max_over_ranks(zero::Communicator& comm, uint64_t value) {
  uint64_t m = 0;
  for (uint64_t v : zero::all_gather_u64(comm, value)) m = v > m ? v : m;
  return m;
}

uint64_t sum_over_ranks(zero::Communicator& comm, uint64_t value) {
  uint64_t sum = 0;
  for (uint64_t v : zero::all_gather_u64(comm, value)) sum += v;
  return sum;
}

double mib(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

// An error of this rank alone (rank 0's metrics or trace file on a full disk): it ends the job
// at once with exit code 1. Unwinding would not: the engine's communicators free their shared
// windows collectively, and the other ranks are elsewhere.
template <typename Write>
void or_end_job(Write&& write) {
  try {
    write();
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::cerr << ("zero-train: rank " + std::to_string(rank) + ": error: " + e.what() + "\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

// The engine shards over the data-parallel group (`comm`); rank and world are this rank's place
// in it, which cuts the batch. Rank 0 of the world (`leader`) prints and writes the metrics.
void train(const Flags& f, const zero::TrainingConfig& tc, zero::examples::TrainTask& task,
           zero::ProcessGrid& grid, zero::Monitors& monitors) {
  zero::Communicator& comm = *grid.data_parallel;
  zero::Communicator* tensor_parallel = grid.tensor_parallel.get();
  const int rank = comm.rank();
  const int world = comm.world_size();
  const bool leader = rank == 0 && grid.place.tp_rank == 0;
  if (leader && grid.tensor_parallel_group_across_nodes >= 0) {
    const int first = grid.tensor_parallel_group_across_nodes;
    std::fprintf(stderr,
                 "zero-train: warning: the tensor-parallel group of ranks %d-%d spans several "
                 "nodes, so its all-reduces (two per layer each way) cross the network; start "
                 "the job with zerorun --tp %d to keep each group on one node\n",
                 first, first + grid.place.tp_size - 1, grid.place.tp_size);
  }
  const auto tensor_parallel_bytes = [&] {
    return tensor_parallel ? tensor_parallel->counters().total_bytes() : 0;
  };
  const zero::EngineConfig& config = tc.engine;
  const long per_micro_batch = tc.micro_batch_per_rank;  // the largest slice
  const int micro_batches = tc.gradient_accumulation_steps;
  if (f.test_comm_delay_us > 0) {
    comm.stream().set_delay_for_testing(std::chrono::microseconds(f.test_comm_delay_us));
  }

  // What the process holds before the engine allocates (the program, MPI, the libraries): the
  // base of the resident-memory plan.
  const uint64_t baseline_resident = zero::examples::resident_bytes();
  zero::ZeroModel model(comm, task.take_modules({grid.place.tp_rank, tensor_parallel}), config);
  zero::Engine& engine = model.engine();
  // Hybrid sharding's collectives run on a shard group's communicator of the engine's own.
  if (f.test_comm_delay_us > 0 && &engine.communicator() != &comm) {
    engine.communicator().stream().set_delay_for_testing(
        std::chrono::microseconds(f.test_comm_delay_us));
  }
  // Metrics, memory figures and traces are host values: they travel over MPI even when the
  // engine's collectives run through NCCL.
  zero::Communicator& host = engine.host_communicator();

  const zero::examples::StartPosition position =
      zero::examples::resume_position(f, tc, engine, leader);
  const long first_step = position.first_step;
  const uint64_t data_seed = position.data_seed;
  std::optional<zero::examples::CommsLog> comms_log;
  if (tc.comms_logger.enabled) comms_log.emplace(tc.comms_logger, world);
  // Every rank records (the trace's counter tracks); rank 0 writes the files. The host tiers are
  // named for the engine's accounting (pinned_host_bytes): on the CPU path "pinned" memory is
  // plain host memory, as there is no device to copy to.
  std::optional<zero::examples::MemoryTimeline> timeline;
  if (!f.memory_timeline.empty()) {
    timeline.emplace(engine.allocator(), engine.allocator().memory().memory_name(),
                     engine.device_context());
    timeline->add(engine.pinned_host_allocator(), "pinned host memory");
    timeline->add(engine.pageable_host_allocator(), "pageable host memory");
  }
  task.start(engine, data_seed);
  // The budget reserved the model's activations outside the engine (main); those the model now
  // allocates from the engine's allocator are paid from its limit instead.
  if (engine.allocator().limit() > 0) {
    engine.allocator().set_limit(engine.allocator().limit() +
                                 task.counted_activation_bytes(per_micro_batch));
  }

  // A resumed run appends to the metrics file it continues, after a record marking the resume.
  zero::driver::MetricsWriter metrics;
  if (leader && !f.metrics.empty()) {
    or_end_job([&] {
      metrics.open(f.metrics, f.resume.empty() ? zero::driver::MetricsWriter::Mode::kTruncate
                                               : zero::driver::MetricsWriter::Mode::kAppend);
      if (!f.resume.empty()) {
        metrics.write(JsonRecord{{"event", "resume"}, {"step", first_step - 1}});
      }
    });
  }
  if (leader && !f.save_dir.empty() && f.save_every == 0) {
    std::printf(
        "checkpoints: --save-dir without --save-every: the last step (%ld) is saved at "
        "the end\n",
        f.steps);
  }
  const uint64_t state_bytes = max_over_ranks(host, engine.model_state_bytes());
  const uint64_t buffer_bytes = max_over_ranks(host, engine.buffer_bytes());
  const uint64_t nvme_bytes = max_over_ranks(host, engine.nvme_bytes());
  const uint64_t pinned_host_bytes = max_over_ranks(host, engine.pinned_host_bytes());
  const uint64_t pageable_host_bytes = max_over_ranks(host, engine.pageable_host_bytes());
  // The resident memory a rank should peak at: its start, the engine's plan, and the task's
  // activations and batch data. The step records put the measured peak beside it.
  const uint64_t baseline_resident_max = max_over_ranks(host, baseline_resident);
  const uint64_t planned_resident =
      max_over_ranks(host, baseline_resident + engine.model_state_bytes() + engine.buffer_bytes() +
                               engine.pinned_host_bytes() + engine.pageable_host_bytes() +
                               task.activation_bytes(per_micro_batch) +
                               task.module_bytes(config.precision.dtype, config.device.is_cuda()));
  if (leader) {
    // Slices differ by one sample when the batch does not divide (see batch_slice).
    const long smallest = tc.train_batch_size / (static_cast<long>(micro_batches) * world);
    const std::string per_slice = smallest == per_micro_batch ? std::to_string(per_micro_batch)
                                                              : std::to_string(smallest) + "-" +
                                                                    std::to_string(per_micro_batch);
    std::printf(
        "zero-train: %s in %s, %zu params (%zu padded) in %zu units, stage %d, %d rank(s) "
        "(tensor-parallel %d x data-parallel %d), global batch %ld = %s per micro-batch x %d "
        "micro-batches x %d ranks\n",
        task.description().c_str(), zero::dtype_name(config.precision.dtype),
        engine.layout().numel(), engine.layout().padded_numel(), engine.layout().units().size(),
        config.stage, world * grid.place.tp_size, grid.place.tp_size, world, tc.train_batch_size,
        per_slice.c_str(), micro_batches, world);
    std::printf("collectives: %s\n", comm.transport().c_str());
    std::printf("memory on rank 0 at start:\n%s%s", engine.allocator().summary().c_str(),
                task.activation_summary(per_micro_batch).c_str());
    if (nvme_bytes > 0) {
      const bool optimizer_on_nvme = config.offload.optimizer.device == zero::OffloadDevice::kNvme;
      const bool params_on_nvme = config.offload.param.device == zero::OffloadDevice::kNvme;
      std::printf(
          "nvme per rank: %s of %s under %s\n", zero::human_bytes(nvme_bytes).c_str(),
          optimizer_on_nvme && params_on_nvme ? "optimizer state and parameters"
          : params_on_nvme                    ? "parameters"
                                              : "optimizer state",
          (optimizer_on_nvme ? config.offload.optimizer.nvme_path : config.offload.param.nvme_path)
              .c_str());
    }
    if (pinned_host_bytes + pageable_host_bytes > 0) {
      std::printf("host per rank (the optimizer's update on the host): %s pinned, %s pageable\n",
                  zero::human_bytes(pinned_host_bytes).c_str(),
                  zero::human_bytes(pageable_host_bytes).c_str());
    }
    std::fflush(stdout);
    JsonRecord init{{"event", "init"},
                    {"world_size", world * grid.place.tp_size},
                    {"tensor_parallel_size", grid.place.tp_size},
                    {"data_parallel_size", world},
                    {"collectives", comm.transport()},
                    {"stage", config.stage},
                    {"dtype", zero::dtype_name(config.precision.dtype)},
                    {"params", engine.layout().numel()},
                    {"padded_params", engine.layout().padded_numel()},
                    {"units", engine.layout().units().size()},
                    {"model_state_bytes", state_bytes},
                    {"buffer_bytes", buffer_bytes},
                    {"nvme_bytes", nvme_bytes},
                    {"pinned_host_bytes", pinned_host_bytes},
                    {"pageable_host_bytes", pageable_host_bytes},
                    {"baseline_resident_bytes", baseline_resident_max},
                    {"planned_resident_bytes", planned_resident}};
    init.update(task.model_record());
    init["activation_bytes_planned"] = task.activation_bytes(per_micro_batch);
    init["activation_bytes_counted_planned"] = task.counted_activation_bytes(per_micro_batch);
    or_end_job([&] { metrics.write(init); });
  }

  for (long step = first_step; step <= f.steps; ++step) {
    if (timeline) timeline->set_step(step);
    const bool profiled = tc.flops_profiler.enabled && step == tc.flops_profiler.profile_step;
    const size_t spans_before = profiled ? engine.trace().spans().size() : 0;
    const zero::CommCounters counters_before = comm.counters();
    const uint64_t tensor_parallel_before = tensor_parallel_bytes();
    const uint64_t bytes_before =
        comm.counters().total_bytes() + engine.own_comm_bytes() + tensor_parallel_before;
    // The last step is always saved when there is a save directory.
    const bool save_now =
        !f.save_dir.empty() && ((f.save_every > 0 && step % f.save_every == 0) || step == f.steps);
    const auto start = std::chrono::steady_clock::now();
    // Host-side timers for wall_clock_breakdown (on CUDA, the time to queue the work).
    zero::models::MicroBatchTimes times;
    // --inject-fault: the last rank's last micro-batch of the step misbehaves.
    const auto before_backward = [&](int k, zero::Tensor& grad) {
      if (step != f.fault.step || k != micro_batches - 1 || rank != world - 1) return;
      zero::examples::inject_fault(f.fault, grad);
    };
    float loss_sum =
        zero::models::forward_backward(model, task, step, tc.train_batch_size, micro_batches, rank,
                                       world, &times, before_backward);
    if (step == f.fault.step && f.fault.kind == Fault::kSkipStep && rank == world - 1) {
      std::fprintf(stderr, "zero-train: rank %d skips the optimizer step of step %ld\n", rank,
                   step);
      continue;
    }
    const auto optimizer_start = std::chrono::steady_clock::now();
    const zero::StepStats stats = model.step();
    const double optimizer_ms = ms_since(optimizer_start);
    // Taken before validation, whose forward passes are not the step's.
    const JsonRecord block_times = task.profile_record();
    float global_loss = 0.0f;
    host.all_reduce_sync(&loss_sum, &global_loss, 1, zero::DType::kFloat32);
    global_loss /= static_cast<float>(world * micro_batches);
    const double step_ms = ms_since(start);
    std::optional<zero::examples::FlopsProfile> flops;
    if (profiled) {
      const std::vector<zero::TraceSpan> spans = engine.trace().spans();
      flops = zero::examples::profile_step(
          engine.layout(), task.model_record(), {spans.begin() + spans_before, spans.end()}, step,
          step_ms, static_cast<double>(tc.train_batch_size * task.tokens_per_sample()));
    }
    // Validation is outside the step's time: forward only, on the validation batches.
    std::optional<float> val_loss;
    if (task.validates(step)) val_loss = task.validation_loss(model, host);
    const uint64_t step_tensor_parallel_bytes = tensor_parallel_bytes() - tensor_parallel_before;
    const uint64_t step_bytes = comm.counters().total_bytes() + engine.own_comm_bytes() +
                                tensor_parallel_bytes() - bytes_before;
    if (save_now) {
      zero::save_checkpoint(engine, f.save_dir, zero::TrainerState{step, data_seed},
                            zero::SaveOptions{tc.gather_16bit_weights_on_model_save});
      if (leader) std::printf("checkpoint of step %ld saved in %s\n", step, f.save_dir.c_str());
    }
    const uint64_t step_state = max_over_ranks(host, engine.model_state_bytes());
    const uint64_t peak = max_over_ranks(host, engine.allocator().stats().peak_total);
    const uint64_t peak_pinned =
        max_over_ranks(host, engine.pinned_host_allocator().stats().peak_total);
    const uint64_t peak_pageable =
        max_over_ranks(host, engine.pageable_host_allocator().stats().peak_total);
    // The peers' node-shared buffers this rank's collectives touched are in its VmHWM too; they
    // are theirs (and the sum over ranks would count them twice). They stay mapped once
    // touched, in the first step, so subtracting what is mapped now leaves this rank's own peak.
    const uint64_t peers_mapped = engine.communicator().peer_memory_mapped_bytes();
    const uint64_t own_peak_resident = zero::examples::peak_resident_bytes() - peers_mapped;
    const uint64_t peak_resident = max_over_ranks(host, own_peak_resident);
    const uint64_t peak_resident_all = sum_over_ranks(host, own_peak_resident);
    const uint64_t peers_mapped_max = max_over_ranks(host, peers_mapped);
    const uint64_t peak_activations = max_over_ranks(host, stats.peak_activation_bytes);
    const uint64_t peak_checkpoints = max_over_ranks(host, stats.peak_checkpoint_bytes);
    const JsonRecord activations = task.activation_record();
    std::vector<std::string> comm_lines;
    const JsonRecord comm_ops = comms_log ? comms_log->add_step(counters_before, comm.counters(),
                                                                engine.trace().spans(), &comm_lines)
                                          : JsonRecord();
    // Each rank its own table: SIGUSR1 may reach one rank or, through mpirun, all.
    if (zero::examples::memory_summary_requested() ||
        (leader && f.memory_summary_every > 0 && step % f.memory_summary_every == 0)) {
      std::printf("%s", zero::examples::memory_summary(engine, rank, step).c_str());
      std::fflush(stdout);
    }
    if (!leader) continue;
    if (stats.skipped) zero::examples::print_skipped_step(step, stats.loss_scale);
    const double tokens_per_s = static_cast<double>(tc.train_batch_size) *
                                static_cast<double>(task.tokens_per_sample()) / (step_ms / 1000.0);
    if (val_loss) std::printf("step %5ld/%ld  val_loss %.6f\n", step, f.steps, *val_loss);
    if (step % tc.steps_per_print == 0 || step == f.steps || stats.skipped) {
      std::printf(
          "step %5ld/%ld  loss %.6f  lr %.3g  scale %g  grad_norm %.4f  %.2f ms  %.0f %s/s  "
          "state %.2f MiB  peak %.2f MiB\n",
          step, f.steps, global_loss, stats.lr, stats.loss_scale, stats.grad_norm, step_ms,
          tokens_per_s, task.tokens_per_sample() > 1 ? "tokens" : "samples", mib(step_state),
          mib(peak));
      if (tc.wall_clock_breakdown) {
        // DeepSpeed's per-step breakdown, rank 0's timers. The engine reports one wait for all
        // collectives (reduce-scatters/all-reduces and all-gathers alike): compute blocked on
        // communication, inside whichever of forward, backward and step it happened.
        std::printf(
            "time (ms) | forward: %.2f | backward: %.2f | step: %.2f | data: %.2f | "
            "comm_wait (reduce+gather): %.2f | comm_busy: %.2f | collectives: %d\n",
            to_ms(times.forward), to_ms(times.backward), optimizer_ms, to_ms(times.data),
            stats.comm_wait_ms, stats.comm_busy_ms, stats.collectives);
      }
      std::fflush(stdout);
    }
    JsonRecord record{{"event", "step"},
                      {"step", step},
                      {"loss", json_number(global_loss)},
                      {"grad_norm", json_number(stats.grad_norm)},
                      {"lr", json_number(stats.lr)},
                      {"step_ms", json_number(step_ms)},
                      {"tokens_per_s", json_number(tokens_per_s)},
                      {"data_ms", json_number(to_ms(times.data))},
                      {"collectives", stats.collectives},
                      {"comm_busy_ms", json_number(stats.comm_busy_ms)},
                      {"comm_wait_ms", json_number(stats.comm_wait_ms)},
                      {"comm_bytes", step_bytes},
                      {"tensor_parallel_comm_bytes", step_tensor_parallel_bytes},
                      {"model_state_bytes", step_state},
                      {"peak_bytes", peak},
                      {"peak_pinned_host_bytes", peak_pinned},
                      {"peak_pageable_host_bytes", peak_pageable},
                      {"peak_resident_bytes", peak_resident},
                      {"peak_resident_bytes_all_ranks", peak_resident_all},
                      {"peer_shared_mapped_bytes", peers_mapped_max},
                      {"forward_ms", json_number(to_ms(times.forward))},
                      {"backward_ms", json_number(to_ms(times.backward))},
                      {"optimizer_ms", json_number(optimizer_ms)},
                      {"nvme_wait_ms", json_number(stats.nvme_wait_ms)},
                      {"nvme_busy_ms", json_number(stats.nvme_busy_ms)},
                      {"nvme_param_read_wait_ms", json_number(stats.nvme_param_read_wait_ms)},
                      {"nvme_read_bytes", stats.nvme_read_bytes},
                      {"nvme_write_bytes", stats.nvme_write_bytes},
                      {"peak_activation_bytes", peak_activations},
                      {"peak_checkpoint_bytes", peak_checkpoints},
                      {"loss_scale", json_number(stats.loss_scale)},
                      {"skipped", stats.skipped}};
    if (val_loss) record["val_loss"] = json_number(*val_loss);
    if (flops) or_end_job([&] { report_flops_profile(*flops, tc.flops_profiler, &metrics); });
    if (comms_log) record["comm_ops"] = comm_ops;
    for (const std::string& line : comm_lines) std::printf("%s\n", line.c_str());
    record.update(activations);
    record.update(block_times);
    or_end_job([&] {
      metrics.write(record);
      monitors.write_events(zero::examples::monitor_events(
          record, tc.train_batch_size, config.precision.dtype == zero::DType::kFloat16,
          tc.wall_clock_breakdown));
    });
  }
  if (comms_log && leader) {
    // The collectives still in flight (a stage 1-2 step's all-gathers) belong to the table too.
    engine.communicator().stream().synchronize();
    std::vector<std::string> late;
    comms_log->add_step(comm.counters(), comm.counters(), engine.trace().spans(), &late);
    for (const std::string& line : late) std::printf("%s\n", line.c_str());
    std::printf("%s", comms_log->summary().c_str());
  }
  if (timeline && !f.trace.empty()) timeline->add_counters(engine.trace());
  if (timeline && leader) {
    // The run's first step: where the model's buffers are made, so the plot shows them grow.
    or_end_job([&] { timeline->write(f.memory_timeline, engine.trace().spans(), first_step); });
    std::printf("memory timeline written to %s, its plot of step %ld to %s.png\n",
                f.memory_timeline.c_str(), first_step, f.memory_timeline.c_str());
  }
  if (!f.trace.empty()) {
    // With tensor parallelism the engine's group is one data-parallel group of several: the
    // trace gathers over the whole world instead, so one file holds every rank (pid = rank).
    std::unique_ptr<zero::Communicator> everyone;
    if (tensor_parallel != nullptr) everyone = zero::make_mpi_communicator();
    or_end_job([&] { engine.trace().write_chrome_trace(everyone ? *everyone : host, f.trace); });
    if (leader) std::printf("trace written to %s\n", f.trace.c_str());
  }
}

// Exit codes: 0 done, 1 a runtime error, 2 a usage, config or setup error (nothing started),
// 3 out of memory (the plan does not fit, or the system refused an allocation).
constexpr int kExitOutOfMemory = 3;

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  const int rank = mpi.world_rank();
  // Collective, so every rank asks before anything can fail on some of them only.
  const zero::examples::NodeShare node = zero::examples::node_share_or_end(rank);
  Flags flags;
  zero::TrainingConfig config;
  std::optional<zero::examples::SaveDirLock> save_dir_lock;
  zero::Monitors monitors;  // rank 0's
  std::unique_ptr<zero::examples::TrainTask> task;
  std::vector<std::string> pipeline_lines;  // rank 0's: each stage's layers
  std::string kernels;                      // the CPU kernels' summary
  std::string error;
  try {
    flags = zero::examples::parse_flags(argc, argv);
    if (!flags.help) {
      // Here, so that a bad ZERO_BF16_* value in the environment is a setup error of every rank.
      if (!flags.cuda) kernels = zero::kernels::kernel_summary();
      config = zero::examples::resolve_config(flags, mpi.world_size());
      // A GPU run's host work (the host AdamW of an offloaded optimizer) gets this rank's share
      // of the node's cores, where the CPU path runs a rank per core.
      if (flags.cuda && !flags.threads) {
        config.engine.kernel_threads = node.host_threads;
      }
      zero::examples::check_outputs(flags, config, rank, &save_dir_lock, &monitors);
      // The model and its data files (a token file that cannot be read stops the run here).
      task = zero::examples::make_train_task(flags, config);
      if (config.pipeline_stages > 1) {
        zero::examples::check_pipeline_settings(flags, config, mpi.world_size());
        // Rank 0 says where every stage's layers went; each rank keeps its own stage.
        const int virtual_stages = zero::examples::pipeline_virtual_stages(flags);
        for (int s = 0; rank == 0 && s < config.pipeline_stages; ++s) {
          pipeline_lines.push_back(task->set_pipeline_stage(
              s, config.pipeline_stages, config.pipeline_partition, virtual_stages));
        }
        const zero::GridPlace place = zero::grid_place(
            rank, mpi.world_size(), config.tensor_parallel_size, config.pipeline_stages);
        task->set_pipeline_stage(place.pp_rank, config.pipeline_stages, config.pipeline_partition,
                                 virtual_stages);
      }
    }
  } catch (const zero::driver::UsageError& e) {
    error = std::string(e.what()) + "\n" + zero::examples::kTrainUsage;
  } catch (const zero::ConfigError& e) {
    error = e.what();
  } catch (const zero::examples::SetupError& e) {
    error = e.what();
  } catch (const zero::Error& e) {
    error = e.what();
  }
  const std::vector<int> failed = zero::examples::failed_ranks(!error.empty(), mpi.world_size());
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
    if (rank == 0) std::cout << zero::examples::kTrainUsage;
    return 0;
  }
  const std::string disagreement =
      zero::examples::first_disagreement(zero::examples::run_description(flags, config));
  if (!disagreement.empty()) {
    if (rank == 0) std::cerr << ("zero-train: " + disagreement + "\n");
    return 2;
  }
  if (!flags.cuda &&
      !zero::examples::fit_host_budget(flags, *task, node.ranks, mpi.world_size(), rank, &config)) {
    return kExitOutOfMemory;
  }
  // The NVMe paths before the engine: a bad one, or a file system the node's ranks overfill
  // together, stops every rank as a setup error.
  const std::string nvme_problem = zero::examples::nvme_setup_problem(
      *task, config, flags.cuda,
      mpi.world_size() / (config.tensor_parallel_size * config.pipeline_stages));
  if (!nvme_problem.empty()) {
    if (rank == 0) std::cerr << ("zero-train: " + nvme_problem + "\n");
    return 2;
  }
  if (rank == 0) {
    for (const std::string& line : config.resolved_auto) std::printf("config: %s\n", line.c_str());
    for (const std::string& line : config.ignored_keys) std::printf("config: %s\n", line.c_str());
    for (const std::string& line : task->notes()) std::printf("%s\n", line.c_str());
    for (const std::string& line : pipeline_lines) std::printf("%s\n", line.c_str());
    if (flags.cuda && config.engine.offload.optimizer.device != zero::OffloadDevice::kNone) {
      std::printf(
          "host threads per rank: %d (%s)\n", config.engine.kernel_threads,
          flags.threads ? "--threads" : "the cores this rank may use over the ranks on this node");
    }
    std::fflush(stdout);
  }
  zero::examples::watch_memory_summary_signal();
  // Ranks already use every core; OpenBLAS threads on top would only contend with them.
  openblas_set_num_threads(1);
  const std::string blas_warning = zero::kernels::blas_core_warning();
  if (rank == 0 && !flags.cuda && !blas_warning.empty()) {
    std::fprintf(stderr, "zero-train: %s\n", blas_warning.c_str());
  }
  if (rank == 0 && !flags.cuda) {
    std::printf("kernels: %s\n", kernels.c_str());
    std::fflush(stdout);
  }
  try {
    zero::ProcessGrid grid;
    zero::Device device = zero::Device::cpu();
#if ZERO_HAVE_NCCL
    if (flags.cuda) {
      // NCCL groups on the GPU, with MPI ones beside them for the host-side exchanges.
      grid = zero::make_nccl_process_grid(config.tensor_parallel_size);
      device =
          zero::Device::cuda(dynamic_cast<zero::NcclCommunicator&>(*grid.data_parallel).device());
      config.engine.grid.host_communicator = grid.host_data_parallel.get();
      config.engine.grid.host_tensor_parallel = grid.host_tensor_parallel.get();
    }
#endif
    if (!grid.data_parallel) {
      grid = zero::make_mpi_process_grid(config.tensor_parallel_size, config.pipeline_stages);
      // The loss sum and the metrics on communicators of their own: on the engine's, each
      // step's loss all-reduce would wait behind the post-step all-gathers, which the next
      // forward is meant to wait for unit by unit, behind compute.
      zero::ProcessGrid host =
          zero::make_mpi_process_grid(config.tensor_parallel_size, config.pipeline_stages);
      grid.host_data_parallel = std::move(host.data_parallel);
      config.engine.grid.host_communicator = grid.host_data_parallel.get();
    }
    config.engine.device = device;
    config.engine.grid.tensor_parallel = grid.tensor_parallel.get();
    if (config.pipeline_stages > 1) {
      zero::examples::train_pipeline(flags, config, *task, grid, monitors);
    } else {
      train(flags, config, *task, grid, monitors);
    }
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
