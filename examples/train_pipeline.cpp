#include "examples/train_pipeline.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "driver/metrics_writer.h"
#include "models/pipeline_step.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/peer_channel.h"
#include "zero/core/check.h"
#include "zero/runtime/model.h"
#include "zero/runtime/pipeline_executor.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero::examples {

namespace {

using driver::json_number;
using driver::JsonRecord;

void refuse(bool given, const std::string& what) {
  if (given) throw ConfigError("--pp: " + what + " is not supported with pipeline parallelism yet");
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// What each rank contributes to a step's record, gathered on every rank in one MPI_Allgather.
struct RankFigures {
  // The last stage's tensor-parallel rank 0s: their micro-batches' losses (a float, held in a
  // double so that the record has no padding for MPI_BYTE to carry uninitialized).
  double loss_sum = 0.0;
  double step_ms = 0.0;  // the executor's step
  double busy_ms = 0.0;  // its computations
  double wait_ms = 0.0;  // its transfers
  uint64_t bytes_sent = 0;
  uint64_t peak_activation_bytes = 0;
  uint64_t model_state_bytes = 0;
};

std::vector<RankFigures> all_ranks(const RankFigures& mine) {
  int size = 1;
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  std::vector<RankFigures> all(static_cast<size_t>(size));
  ZERO_MPI_CHECK(MPI_Allgather(&mine, sizeof(RankFigures), MPI_BYTE, all.data(),
                               sizeof(RankFigures), MPI_BYTE, MPI_COMM_WORLD));
  return all;
}

// The pipeline's ranks as an MPI communicator (rank = stage) for the point-to-point channel:
// the ranks at this rank's data- and tensor-parallel place in every stage.
MPI_Comm pipeline_mpi_comm(const GridPlace& place) {
  MPI_Comm comm = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, place.dp_rank * place.tp_size + place.tp_rank,
                                place.pp_rank, &comm));
  return comm;
}

}  // namespace

void check_pipeline_settings(const Flags& f, const TrainingConfig& tc) {
  if (tc.pipeline_stages == 1) return;
  const PipelineScheduleKind kind = [&] {
    try {
      return parse_pipeline_schedule(f.pp_schedule);
    } catch (const Error& e) {
      throw ConfigError(std::string("--pp-schedule: ") + e.what());
    }
  }();
  refuse(kind == PipelineScheduleKind::kInterleaved,
         "--pp-schedule interleaved (the GPT-2's stages hold one chunk each)");
  refuse(kind == PipelineScheduleKind::kZeroBubbleH1,
         "--pp-schedule zb-h1 (the GPT-2's backward does not split the input and weight "
         "gradients)");
  refuse(f.cuda, "--device cuda");
  refuse(!f.save_dir.empty(), "--save-dir");
  refuse(!f.resume.empty(), "--resume");
  refuse(!f.val_data.empty(), "--val-data");
  refuse(!f.trace.empty(), "--trace");
  refuse(!f.memory_timeline.empty(), "--memory-timeline");
  refuse(f.fault.kind != Fault::kNone, "--inject-fault");
  refuse(tc.tensorboard.enabled, "tensorboard");
  refuse(tc.csv_monitor.enabled, "csv_monitor");
  refuse(tc.comms_logger.enabled, "comms_logger");
  refuse(tc.flops_profiler.enabled, "flops_profiler");
  refuse(tc.engine.offload_optimizer.device != OffloadDevice::kNone, "offload_optimizer");
  refuse(tc.engine.offload_param.device != OffloadDevice::kNone, "offload_param");
  refuse(tc.engine.mics_shard_size > 0, "mics_shard_size (hybrid sharding)");
  const ActivationCheckpointingConfig& ac = tc.activation_checkpointing;
  // These keep one slot per block, which a second micro-batch in flight would overwrite.
  refuse(ac.contiguous_memory_optimization,
         "activation_checkpointing.contiguous_memory_"
         "optimization");
  refuse(ac.cpu_checkpointing, "activation_checkpointing.cpu_checkpointing");
  refuse(ac.partition_activations, "activation_checkpointing.partition_activations");
  refuse(!ac.nvme_path.empty(), "--checkpoint-nvme-path (activation_checkpointing.nvme_path)");
}

void train_pipeline(const Flags& f, const TrainingConfig& tc, TrainTask& task, ProcessGrid& grid) {
  const GridPlace& place = grid.place;
  const int stage = place.pp_rank;
  const int stages = place.pp_size;
  const bool first = stage == 0;
  const bool last = stage == stages - 1;
  const bool leader = stage == 0 && place.dp_rank == 0 && place.tp_rank == 0;
  const int micro_batches = tc.gradient_accumulation_steps;

  EngineConfig config = tc.engine;
  config.tensor_parallel = grid.tensor_parallel.get();
  config.pipeline.stages = grid.pipeline.get();
  if (stages > 1 && (first || last)) {
    // wte is the embedding's on the first stage and the head's on the last.
    config.pipeline.tied_parameters = {"wte.weight"};
    config.pipeline.ties = grid.pipeline_ties.get();
    config.pipeline.counts_ties_in_norm = first;
  }
  ZeroModel model(*grid.data_parallel,
                  task.take_modules({place.tp_rank, grid.tensor_parallel.get()}), config);
  Engine& engine = model.engine();
  task.start(engine, config.seed);

  const PipelineScheduleKind kind = parse_pipeline_schedule(f.pp_schedule);
  // The budget reserved one micro-batch's activations outside the engine (main); the stage
  // allocates those of every micro-batch it holds in flight from the engine's allocator.
  if (engine.allocator().limit() > 0) {
    const uint64_t in_flight =
        static_cast<uint64_t>(pipeline_micro_batches_in_flight(kind, stages, stage, micro_batches));
    engine.allocator().set_limit(engine.allocator().limit() +
                                 in_flight *
                                     task.counted_activation_bytes(tc.micro_batch_per_rank));
  }
  const std::vector<std::vector<PipelineAction>> schedules =
      make_pipeline_schedule(kind, stages, micro_batches);
  models::ZeroModelStage work(model, task, stage, stages, tc.train_batch_size, micro_batches,
                              place.dp_rank, place.dp_size);
  MPI_Comm pipeline_comm = pipeline_mpi_comm(place);
  auto free_comm = [](MPI_Comm* comm) { MPI_Comm_free(comm); };
  std::unique_ptr<MPI_Comm, decltype(free_comm)> pipeline_comm_owner(&pipeline_comm, free_comm);
  PeerChannel channel(pipeline_comm);
  PipelineExecutor executor(channel, stage, stages, schedules,
                            task.stage_boundary_shape(work.micro_batch_samples()));

  driver::MetricsWriter metrics;
  if (leader && !f.metrics.empty()) {
    metrics.open(f.metrics, driver::MetricsWriter::Mode::kTruncate);
    JsonRecord init{{"event", "init"},
                    {"world_size", place.pp_size * place.dp_size * place.tp_size},
                    {"pipeline_stages", stages},
                    {"pipeline_schedule", pipeline_schedule_name(kind)},
                    {"tensor_parallel_size", place.tp_size},
                    {"data_parallel_size", place.dp_size},
                    {"stage", config.stage},
                    {"dtype", dtype_name(config.dtype)}};
    init.update(task.model_record());
    metrics.write(init);
  }
  if (leader) {
    std::printf(
        "zero-train: %s in %s, pipeline of %d stages (%s schedule) x data-parallel %d x "
        "tensor-parallel %d, ZeRO stage %d, global batch %ld = %ld per micro-batch x %d "
        "micro-batches x %d ranks\n",
        task.description().c_str(), dtype_name(config.dtype), stages, pipeline_schedule_name(kind),
        place.dp_size, place.tp_size, config.stage, tc.train_batch_size,
        static_cast<long>(work.micro_batch_samples()), micro_batches, place.dp_size);
    std::fflush(stdout);
  }

  PipelineStepReport report;
  for (long step = 1; step <= f.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    work.begin_step(step);
    report = executor.run(work);
    const StepStats stats = model.step();
    const double step_ms = ms_since(start);
    // The loss lives on the last stage: its tensor-parallel rank 0s hold one sum per
    // data-parallel rank, which the leader adds (every other rank adds 0, exactly).
    RankFigures mine;
    mine.loss_sum = last && place.tp_rank == 0 ? work.loss_sum() : 0.0;
    mine.step_ms = report.step_ms;
    mine.busy_ms = report.busy_ms;
    mine.wait_ms = report.wait_ms;
    mine.bytes_sent = report.bytes_sent;
    mine.peak_activation_bytes = stats.peak_activation_bytes;
    mine.model_state_bytes = engine.model_state_bytes();
    const std::vector<RankFigures> ranks = all_ranks(mine);
    if (!leader) continue;
    // Idle is a rank's step time less its compute, the bubble its share over the ranks.
    float loss = 0.0f;
    double busy_sum = 0.0, time_sum = 0.0, wait_max = 0.0;
    unsigned long long bytes = 0;
    // Per stage, the largest of its ranks.
    const size_t stage_ranks = ranks.size() / static_cast<size_t>(stages);
    std::vector<unsigned long long> stage_activations(static_cast<size_t>(stages), 0);
    std::vector<unsigned long long> stage_state(static_cast<size_t>(stages), 0);
    std::vector<double> stage_busy(static_cast<size_t>(stages), 0.0);
    for (size_t r = 0; r < ranks.size(); ++r) {
      const RankFigures& rank = ranks[r];
      loss += static_cast<float>(rank.loss_sum);
      busy_sum += rank.busy_ms;
      time_sum += rank.step_ms;
      wait_max = std::max(wait_max, rank.wait_ms);
      bytes += rank.bytes_sent;
      const size_t s = r / stage_ranks;
      stage_activations[s] =
          std::max<unsigned long long>(stage_activations[s], rank.peak_activation_bytes);
      stage_state[s] = std::max<unsigned long long>(stage_state[s], rank.model_state_bytes);
      stage_busy[s] = std::max(stage_busy[s], rank.busy_ms);
    }
    loss /= static_cast<float>(place.dp_size * micro_batches);
    const double bubble = time_sum > 0.0 ? 1.0 - busy_sum / time_sum : 0.0;
    const double tokens_per_s = static_cast<double>(tc.train_batch_size) *
                                static_cast<double>(task.tokens_per_sample()) / (step_ms / 1000.0);
    if (step % tc.steps_per_print == 0 || step == f.steps || stats.skipped) {
      std::printf(
          "step %5ld/%ld  loss %.6f  lr %.3g  grad_norm %.4f  %.2f ms  %.0f tokens/s  bubble "
          "%.3f  pp_wait %.2f ms\n",
          step, f.steps, loss, stats.lr, stats.grad_norm, step_ms, tokens_per_s, bubble, wait_max);
      std::fflush(stdout);
    }
    if (f.metrics.empty()) continue;
    metrics.write(JsonRecord{{"event", "step"},
                             {"step", step},
                             {"loss", json_number(loss)},
                             {"grad_norm", json_number(stats.grad_norm)},
                             {"lr", json_number(stats.lr)},
                             {"step_ms", json_number(step_ms)},
                             {"tokens_per_s", json_number(tokens_per_s)},
                             {"bubble_fraction", json_number(bubble)},
                             {"pp_wait_ms", json_number(wait_max)},
                             {"pp_comm_bytes", bytes},
                             {"stage_peak_activation_bytes", stage_activations},
                             {"stage_model_state_bytes", stage_state},
                             {"stage_busy_ms", stage_busy},
                             {"skipped", stats.skipped}});
  }
  if (!f.pp_schedule_dump.empty()) {
    // The last step's timeline of the leader's pipeline, planned with its measured mean forward
    // and backward times.
    const std::vector<PipelineStepReport> reports = gather_pipeline_reports(channel, report);
    if (leader) {
      double forward_ms = 0.0, backward_ms = 0.0;
      int forwards = 0, backwards = 0;
      for (const PipelineStepReport& r : reports) {
        for (const PipelineActionTiming& t : r.timeline) {
          if (t.action.kind == PipelineAction::kForward) {
            forward_ms += t.end_ms - t.start_ms;
            ++forwards;
          } else if (t.action.kind == PipelineAction::kBackward) {
            backward_ms += t.end_ms - t.start_ms;
            ++backwards;
          }
        }
      }
      PipelineDurations planned;
      planned.forward = forward_ms / std::max(forwards, 1);
      planned.backward = backward_ms / std::max(backwards, 1);
      planned.weight = 0.0;
      const std::string note =
          write_pipeline_timeline(f.pp_schedule_dump, reports, schedules, planned);
      std::printf(
          "pipeline timeline of step %ld written to %s.json%s\n", f.steps,
          f.pp_schedule_dump.c_str(),
          note.empty() ? (" and " + f.pp_schedule_dump + ".png").c_str() : ("; " + note).c_str());
    }
  }
}

}  // namespace zero::examples
