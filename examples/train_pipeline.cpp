#include "examples/train_pipeline.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "driver/metrics_writer.h"
#include "examples/comms_log.h"
#include "examples/flops_profile.h"
#include "examples/memory_timeline.h"
#include "examples/train_outputs.h"
#include "models/pipeline_step.h"
#include "zero/collectives/mpi_check.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/collectives/peer_channel.h"
#include "zero/core/check.h"
#include "zero/runtime/checkpoint.h"
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
  uint64_t buffer_bytes = 0;
  // The engine's collectives in the stage's data-parallel group this step, and the bytes they
  // (and the engine's other communicators) sent.
  uint64_t collectives = 0;
  uint64_t data_parallel_bytes = 0;
  uint64_t peak_bytes = 0;           // the engine's allocator
  uint64_t peak_resident_bytes = 0;  // the process's, less the peers' node-shared buffers
  double comm_wait_ms = 0.0;
};

// One 64-bit value per world rank, gathered on every rank.
std::vector<uint64_t> all_ranks_u64(uint64_t mine) {
  int size = 1;
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  std::vector<uint64_t> all(static_cast<size_t>(size));
  ZERO_MPI_CHECK(
      MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));
  return all;
}

std::vector<RankFigures> all_ranks(const RankFigures& mine) {
  int size = 1;
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  std::vector<RankFigures> all(static_cast<size_t>(size));
  ZERO_MPI_CHECK(MPI_Allgather(&mine, sizeof(RankFigures), MPI_BYTE, all.data(),
                               sizeof(RankFigures), MPI_BYTE, MPI_COMM_WORLD));
  return all;
}

// The mean validation loss through the pipeline: forward only, outside the step's time. Each
// validation batch is cut as a step's is (batch_slice over the micro-batches and the stage's
// data-parallel ranks); the first stage reads the tokens, each later virtual stage receives its
// input from the one before and waits for it (nothing else is in flight between steps: with
// model chunks the last stage hands chunk c's output to the first stage's chunk c + 1), and the
// last stage's losses, weighted by their slices, add up over the world.
float pipeline_validation_loss(ZeroModel& model, TrainTask& task, PeerChannel& channel,
                               const PipelineSlicing& slicing, const GridPlace& place,
                               int64_t global_batch, int micro_batches,
                               const std::vector<int64_t>& boundary_shape) {
  const int stages = place.pp_size;
  const int chunks = model.chunks();
  const int last_virtual = stages * chunks - 1;
  // Above the executor's tags, which count up from 0.
  const int tag = channel.max_tag();
  const std::shared_ptr<DeviceContext>& device = model.engine().device_context();
  double sum = 0.0;
  for (long b = 0; b < task.validation_batches(); ++b) {
    for (int k = 0; k < micro_batches; ++k) {
      const models::BatchSlice slice =
          models::batch_slice(global_batch, micro_batches, place.dp_size, k, place.dp_rank);
      for (int chunk = 0; chunk < chunks; ++chunk) {
        const int virtual_stage = chunk * stages + place.pp_rank;
        const bool first = virtual_stage == 0;
        const bool last = virtual_stage == last_virtual;
        Tensor input;
        // The last virtual stage's read keeps the targets its loss compares with.
        if (first || last) input = task.validation_input(b, slice.first, slice.count);
        if (!first) {
          input = Tensor(boundary_shape);
          PeerRequest received = slicing.receive(channel, (place.pp_rank + stages - 1) % stages,
                                                 tag, input, PipelineSlicing::kActivation);
          channel.wait(received);
          slicing.gather(PipelineSlicing::kActivation, input);
        }
        const Tensor output = model.forward(input.to(device), chunk);
        (void)model.take_activations(chunk);  // no backward follows
        if (last) {
          // Every tensor-parallel rank holds the loss: the first counts it.
          if (place.tp_rank == 0) {
            sum += static_cast<double>(output.to_host()[0]) * static_cast<double>(slice.count);
          }
        } else {
          const Tensor sent = output.to(nullptr);
          PeerRequest request = slicing.send(channel, (place.pp_rank + 1) % stages, tag, sent,
                                             PipelineSlicing::kActivation);
          channel.wait(request);
        }
      }
    }
  }
  double total = 0.0;
  ZERO_MPI_CHECK(MPI_Allreduce(&sum, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return static_cast<float>(total / static_cast<double>(global_batch * task.validation_batches()));
}

// What the engine's collectives sent: over the stage's data-parallel group and, on the first and
// last stages, the tied wte's all-reduce over the tie group (`ties`, or null).
CommCounters engine_counters(const Communicator& data_parallel, const Communicator* ties) {
  CommCounters counters = data_parallel.counters();
  if (ties == nullptr) return counters;
  const CommCounters tied = ties->counters();
  for (int i = 0; i < kNumCollectiveOps; ++i) {
    counters.calls[i] += tied.calls[i];
    counters.bytes[i] += tied.bytes[i];
  }
  return counters;
}

// flops_profiler with a pipeline: the whole model's profile on the leader (world rank 0). The
// first rank of every stage profiles its stage's modules over the step (`spans`, its own); the
// leader gathers them in the model's order, virtual stage by virtual stage, with its own step
// time: the pipeline's. The tied wte counts on the first stage only (`tied` on the others), as
// the model without a pipeline counts the head's with its embedding.
std::optional<FlopsProfile> gather_flops_profile(const Engine& engine, TrainTask& task,
                                                 const GridPlace& place,
                                                 const std::vector<std::string>& tied,
                                                 const std::vector<TraceSpan>& spans, long step,
                                                 double step_ms, double tokens) {
  std::string mine;
  if (place.dp_rank == 0 && place.tp_rank == 0) {
    const FlopsProfile stage =
        profile_step(engine.layout(), task.model_record(), spans, step, step_ms, tokens,
                     place.pp_rank == 0 ? std::vector<std::string>{} : tied);
    JsonRecord modules = module_profiles_record(stage.modules);
    const std::vector<int> chunk_first = task.chunk_first_modules();
    for (size_t k = 0; k < stage.modules.size(); ++k) {
      const long chunk =
          std::upper_bound(chunk_first.begin(), chunk_first.end(), static_cast<int>(k)) -
          chunk_first.begin();
      modules[k]["virtual_stage"] = std::max(chunk - 1, 0L) * place.pp_size + place.pp_rank;
    }
    mine = modules.dump();
  }
  int world_rank = 0, world_size = 1;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(world_size), 0);
  ZERO_MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<int> offsets(static_cast<size_t>(world_size), 0);
  for (size_t r = 1; r < offsets.size(); ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(world_rank == 0 ? static_cast<size_t>(offsets.back() + lengths.back()) : 0, '\0');
  ZERO_MPI_CHECK(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                             offsets.data(), MPI_CHAR, 0, MPI_COMM_WORLD));
  if (world_rank != 0) return std::nullopt;
  std::vector<std::pair<long, ModuleProfile>> placed;
  for (size_t r = 0; r < lengths.size(); ++r) {
    if (lengths[r] == 0) continue;
    const JsonRecord modules = JsonRecord::parse(
        all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r])));
    const std::vector<ModuleProfile> profiles = module_profiles_from_record(modules);
    for (size_t k = 0; k < profiles.size(); ++k) {
      placed.emplace_back(modules[k].at("virtual_stage").get<long>(), profiles[k]);
    }
  }
  std::stable_sort(placed.begin(), placed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  FlopsProfile profile;
  profile.step = step;
  profile.step_ms = step_ms;
  profile.tokens = tokens;
  profile.latency_of = "every pipeline stage's first rank, added";
  for (auto& [virtual_stage, module] : placed) profile.modules.push_back(std::move(module));
  return profile;
}

// The pipeline's ranks as an MPI communicator (rank = stage) for the point-to-point channel:
// the ranks at this rank's data- and tensor-parallel place in every stage.
MPI_Comm pipeline_mpi_comm(const GridPlace& place) {
  MPI_Comm comm = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, place.dp_rank * place.tp_size + place.tp_rank,
                                place.pp_rank, &comm));
  return comm;
}

// A stage's failure, agreed over the world: every rank rethrows its own or throws one that names
// `what`, so no stage is left waiting for another.
void agree_over_stages(const std::exception_ptr& failure, const std::string& what) {
  int failed = failure ? 1 : 0, any = 0;
  ZERO_MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (failure) std::rethrow_exception(failure);
  ZERO_CHECK(!any, what << ": another pipeline stage failed (its message says why)");
}

// The save directory records the pipeline once, before any stage saves into it.
void record_pipeline(const std::string& save_dir, int stages, bool leader) {
  std::exception_ptr failure;
  if (leader) {
    try {
      write_pipeline_record(save_dir, stages);
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
  }
  agree_over_stages(failure, "--save-dir " + save_dir);
}

// Each stage saves its own checkpoint in SAVE_DIR/pp_stage_SS (checkpoint_info.h).
void save_stage(const Flags& f, const TrainingConfig& tc, Engine& engine, int stage,
                const TrainerState& trainer) {
  std::exception_ptr failure;
  try {
    save_checkpoint(engine, pipeline_stage_dir(f.save_dir, stage), trainer,
                    SaveOptions{tc.gather_16bit_weights_on_model_save});
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  agree_over_stages(failure, "the checkpoint of step " + std::to_string(trainer.step));
}

// The names of `saved` that some rank's engine holds: each rank's bits, OR-ed over the world.
std::vector<std::string> held_by_some_rank(const std::vector<std::string>& saved,
                                           const std::vector<std::string>& mine) {
  std::vector<std::string> held;
  for (size_t first = 0; first < saved.size(); first += 64) {
    uint64_t bits = 0;
    for (size_t b = 0; b < 64 && first + b < saved.size(); ++b) {
      if (std::find(mine.begin(), mine.end(), saved[first + b]) != mine.end()) bits |= 1ull << b;
    }
    uint64_t any = 0;
    for (uint64_t rank_bits : all_ranks_u64(bits)) any |= rank_bits;
    for (size_t b = 0; b < 64 && first + b < saved.size(); ++b) {
      if ((any >> b) & 1) held.push_back(saved[first + b]);
    }
  }
  return held;
}

// --resume: every stage loads its own checkpoint of a save of the same number of stages (at any
// data- or tensor-parallel size), and all must be of one step. A save of another number of
// stages (or of a run without a pipeline) is resharded: each stage takes its parameters by name
// from the saved stages that hold them, and every saved parameter must be taken by some stage.
StartPosition resume_stage(const Flags& f, const TrainingConfig& tc, Engine& engine, int stage,
                           int stages, bool leader) {
  if (f.resume.empty()) return {1, tc.engine.seed};
  const std::string dir = f.resume == "latest" ? f.save_dir : f.resume;
  const int saved = read_pipeline_record(dir);
  // A save of as many stages is each stage's own only when every stage holds the parameters its
  // saved namesake held: another partition or schedule (interleaved's chunks) cuts them
  // otherwise, and is resharded by parameter name as another number of stages is.
  bool same_cut = saved == stages;
  if (same_cut) {
    std::vector<std::string> mine = parameter_names(engine);
    std::vector<std::string> theirs;
    try {
      theirs = saved_parameter_names({pipeline_stage_dir(dir, stage)});
    } catch (const std::exception&) {
      theirs.clear();  // the load below names what is wrong with the save
    }
    std::sort(mine.begin(), mine.end());
    std::sort(theirs.begin(), theirs.end());
    for (uint64_t same : all_ranks_u64(mine == theirs ? 1 : 0)) same_cut = same_cut && same == 1;
  }
  TrainerState resumed;
  std::exception_ptr failure;
  std::vector<std::string> saved_names;
  try {
    if (same_cut) {
      load_checkpoint(engine, pipeline_stage_dir(dir, stage), &resumed,
                      LoadOptions{tc.override_optimizer});
    } else {
      const std::vector<std::string> stage_dirs = saved_stage_dirs(dir);
      load_checkpoint_from_stages(engine, stage_dirs, &resumed, LoadOptions{tc.override_optimizer});
      saved_names = saved_parameter_names(stage_dirs);
    }
  } catch (const std::exception&) {
    failure = std::current_exception();
  }
  agree_over_stages(failure, "--resume " + dir);
  if (!same_cut) {
    check_saved_parameters_taken(dir, saved_names,
                                 {held_by_some_rank(saved_names, parameter_names(engine))});
  }
  const std::vector<uint64_t> steps = all_ranks_u64(static_cast<uint64_t>(resumed.step));
  for (uint64_t s : steps) {
    if (s != steps.front()) {
      throw ConfigError("--resume " + dir + ": the stages' checkpoints are of different steps (" +
                        std::to_string(steps.front()) + " and " + std::to_string(s) +
                        "); a save was interrupted on some stages");
    }
  }
  if (resumed.step + 1 > f.steps) {
    throw ConfigError("--steps " + std::to_string(f.steps) +
                      ": the resumed checkpoint is at step " + std::to_string(resumed.step) +
                      ", so no step is left to train");
  }
  if (leader) {
    std::printf("resumed from %s at step %ld", dir.c_str(), resumed.step);
    if (saved != stages) {
      std::printf(" (saved by %d pipeline stage(s), resharded over %d)", std::max(saved, 1),
                  stages);
    } else if (!same_cut) {
      std::printf(" (saved by %d pipeline stages cut otherwise, resharded)", saved);
    }
    std::printf("\n");
  }
  return {resumed.step + 1, resumed.seed};
}

}  // namespace

void check_pipeline_settings(const Flags& f, const TrainingConfig& tc, int world_size) {
  if (tc.pipeline_stages == 1) return;
  const PipelineScheduleKind kind = parse_pipeline_schedule(f.pp_schedule);
  const int virtual_stages = pipeline_virtual_stages(f);
  if (kind != PipelineScheduleKind::kInterleaved && virtual_stages != 1) {
    throw ConfigError("--pp-virtual-stages " + std::to_string(virtual_stages) +
                      ": only --pp-schedule interleaved runs several model chunks per stage, not " +
                      f.pp_schedule);
  }
  if (kind == PipelineScheduleKind::kInterleaved && virtual_stages < 2) {
    throw ConfigError("--pp-virtual-stages " + std::to_string(virtual_stages) +
                      ": --pp-schedule interleaved needs at least 2 model chunks per stage");
  }
  refuse(f.cuda, "--device cuda");
  // (cpu_checkpointing has no effect on the CPU path, the only one a pipeline runs on.)
  // The tensors between stages have one shape, agreed at start: every slice the same size.
  const long data_parallel = world_size / (tc.tensor_parallel_size * tc.pipeline_stages);
  const long slices = static_cast<long>(tc.gradient_accumulation_steps) * data_parallel;
  if (tc.train_batch_size % slices != 0) {
    throw ConfigError("--pp: the global batch of " + std::to_string(tc.train_batch_size) +
                      " does not cut into " + std::to_string(tc.gradient_accumulation_steps) +
                      " micro-batches x " + std::to_string(data_parallel) +
                      " data-parallel ranks of equal size, which the tensors passed between "
                      "pipeline stages need");
  }
}

namespace {

void run_pipeline(const Flags& f, const TrainingConfig& tc, TrainTask& task, ProcessGrid& grid,
                  Monitors& monitors) {
  const GridPlace& place = grid.place;
  const int stage = place.pp_rank;
  const int stages = place.pp_size;
  const bool first = stage == 0;
  const bool last = stage == stages - 1;
  const bool leader = stage == 0 && place.dp_rank == 0 && place.tp_rank == 0;
  const int micro_batches = tc.gradient_accumulation_steps;
  int world_rank = 0, world_size = 1;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));

  EngineConfig config = tc.engine;
  config.grid.tensor_parallel = grid.tensor_parallel.get();
  config.grid.pipeline.stages = grid.pipeline.get();
  if (stages > 1 && (first || last)) {
    // wte is the embedding's on the first stage and the head's on the last.
    config.grid.pipeline.tied_parameters = {"wte.weight"};
    config.grid.pipeline.ties = grid.pipeline_ties.get();
    config.grid.pipeline.counts_ties_in_norm = first;
  }
  // Stage 3: gathered once per step, not once per micro-batch; stages 2-3: gradients reduced
  // once per step. --pp-regather does both per micro-batch, in less memory.
  config.grid.pipeline.hold_gathered = !f.pp_regather;
  config.grid.pipeline.reduce_once = !f.pp_regather && tc.gradient_accumulation_steps > 1;
  std::vector<NamedModule> modules = task.take_modules({place.tp_rank, grid.tensor_parallel.get()});
  ZeroModel model(*grid.data_parallel, std::move(modules), config, task.chunk_first_modules());
  Engine& engine = model.engine();
  const StartPosition position = resume_stage(f, tc, engine, stage, stages, leader);
  const long first_step = position.first_step;
  const uint64_t data_seed = position.data_seed;
  if (!f.save_dir.empty()) record_pipeline(f.save_dir, stages, leader);
  // Every rank records (the trace's counter tracks); the leader writes its own, the first stage's.
  std::optional<MemoryTimeline> timeline;
  if (!f.memory_timeline.empty()) {
    timeline.emplace(engine.allocator(), engine.allocator().memory().memory_name(),
                     engine.device_context());
    timeline->add(engine.pinned_host_allocator(), "pinned host memory");
    timeline->add(engine.pageable_host_allocator(), "pageable host memory");
    timeline->set_owner("rank " + std::to_string(world_rank) + ", pipeline stage " +
                        std::to_string(stage) + " of " + std::to_string(stages));
  }
  task.start(engine, data_seed);

  const PipelineScheduleKind kind = parse_pipeline_schedule(f.pp_schedule);
  // The budget reserved the stage's activations outside the engine (main): those of every
  // micro-batch it holds in flight, which the stage allocates from the engine's allocator.
  const uint64_t planned_activations = task.counted_activation_bytes(tc.micro_batch_per_rank);
  if (engine.allocator().limit() > 0) {
    engine.allocator().set_limit(engine.allocator().limit() + planned_activations);
  }
  // Per stage, the largest of its ranks' (all alike), for the init record.
  const std::vector<uint64_t> planned_by_rank = all_ranks_u64(planned_activations);
  std::vector<uint64_t> stage_planned(static_cast<size_t>(stages), 0);
  for (size_t r = 0; r < planned_by_rank.size(); ++r) {
    const size_t s = r / (planned_by_rank.size() / static_cast<size_t>(stages));
    stage_planned[s] = std::max(stage_planned[s], planned_by_rank[r]);
  }
  const int virtual_stages = pipeline_virtual_stages(f);
  const std::vector<std::vector<PipelineAction>> schedules =
      make_pipeline_schedule(kind, stages, micro_batches, virtual_stages);
  models::ZeroModelStage work(model, task, stage, stages, tc.train_batch_size, micro_batches,
                              place.dp_rank, place.dp_size);
  MPI_Comm pipeline_comm = pipeline_mpi_comm(place);
  PeerChannel channel(pipeline_comm);  // works on a duplicate of its own
  ZERO_MPI_CHECK(MPI_Comm_free(&pipeline_comm));
  const PipelineSlicing slicing{grid.tensor_parallel.get(), tc.pipeline_partition_activations,
                                tc.pipeline_partition_gradients};
  PipelineExecutor executor(channel, stage, stages, schedules,
                            task.stage_boundary_shape(work.micro_batch_samples()), virtual_stages,
                            slicing);

  driver::MetricsWriter metrics;
  if (leader && !f.metrics.empty()) {
    // A resumed run appends to the metrics file it continues, after a record marking the resume.
    metrics.open(f.metrics, f.resume.empty() ? driver::MetricsWriter::Mode::kTruncate
                                             : driver::MetricsWriter::Mode::kAppend);
    if (!f.resume.empty()) metrics.write(JsonRecord{{"event", "resume"}, {"step", first_step - 1}});
    JsonRecord init{{"event", "init"},
                    {"world_size", place.pp_size * place.dp_size * place.tp_size},
                    {"pipeline_stages", stages},
                    {"pipeline_schedule", pipeline_schedule_name(kind)},
                    {"pipeline_virtual_stages", virtual_stages},
                    {"tensor_parallel_size", place.tp_size},
                    {"data_parallel_size", place.dp_size},
                    {"stage", config.stage},
                    {"dtype", dtype_name(config.precision.dtype)},
                    {"stage_activation_bytes_planned", stage_planned}};
    init.update(task.model_record());
    metrics.write(init);
  }
  if (leader) {
    const std::string chunks =
        virtual_stages > 1 ? ", " + std::to_string(virtual_stages) + " model chunks per stage" : "";
    std::printf(
        "zero-train: %s in %s, pipeline of %d stages (%s schedule%s) x data-parallel %d x "
        "tensor-parallel %d, ZeRO stage %d, global batch %ld = %ld per micro-batch x %d "
        "micro-batches x %d ranks\n",
        task.description().c_str(), dtype_name(config.precision.dtype), stages,
        pipeline_schedule_name(kind), chunks.c_str(), place.dp_size, place.tp_size, config.stage,
        tc.train_batch_size, static_cast<long>(work.micro_batch_samples()), micro_batches,
        place.dp_size);
    // Rank 0 is the first stage's: its engine and the activations it holds in flight.
    std::printf("memory on rank 0 (pipeline stage 0) at start:\n%s%s",
                engine.allocator().summary().c_str(),
                task.activation_summary(tc.micro_batch_per_rank).c_str());
    std::fflush(stdout);
  }

  // The leader's engine: its stage's data-parallel group and the tie with the last stage. The
  // transfers between stages are not collectives: pp_comm_bytes and pp_wait_ms hold them.
  std::optional<CommsLog> comms_log;
  if (leader && tc.comms_logger.enabled) comms_log.emplace(tc.comms_logger, place.dp_size);
  const Communicator* ties = config.grid.pipeline.ties;
  PipelineStepReport report;
  const auto data_parallel_bytes = [&] {
    return grid.data_parallel->counters().total_bytes() + engine.own_comm_bytes();
  };
  for (long step = first_step; step <= f.steps; ++step) {
    if (timeline) timeline->set_step(step);
    const auto start = std::chrono::steady_clock::now();
    const uint64_t bytes_before = data_parallel_bytes();
    const bool profiled = tc.flops_profiler.enabled && step == tc.flops_profiler.profile_step;
    const size_t spans_before = profiled ? engine.trace().spans().size() : 0;
    const CommCounters counters_before = engine_counters(*grid.data_parallel, ties);
    // --inject-fault: the last rank (of the last stage) misbehaves in the step's last backward.
    const bool faulty = step == f.fault.step && world_rank == world_size - 1;
    work.begin_step(step, [&](int micro_batch, Tensor& grad) {
      if (faulty && micro_batch == micro_batches - 1) inject_fault(f.fault, grad);
    });
    report = executor.run(work);
    if (faulty && f.fault.kind == Fault::kSkipStep) {
      // As without a pipeline: the others wait in the step's collectives (its stage's, and the
      // ties and gradient norm between stages) until the watchdog ends the job.
      std::fprintf(stderr, "zero-train: rank %d skips the optimizer step of step %ld\n", world_rank,
                   step);
      std::fflush(stderr);
      continue;
    }
    const auto optimizer_start = std::chrono::steady_clock::now();
    const StepStats stats = model.step();
    const double optimizer_ms = ms_since(optimizer_start);
    const double step_ms = ms_since(start);
    std::optional<FlopsProfile> flops;
    if (profiled) {
      const std::vector<TraceSpan> spans = engine.trace().spans();
      flops = gather_flops_profile(
          engine, task, place, config.grid.pipeline.tied_parameters,
          {spans.begin() + static_cast<long>(spans_before), spans.end()}, step, step_ms,
          static_cast<double>(tc.train_batch_size * task.tokens_per_sample()));
    }
    std::optional<float> val_loss;
    if (task.validates(step)) {
      val_loss = pipeline_validation_loss(model, task, channel, slicing, place, tc.train_batch_size,
                                          micro_batches,
                                          task.stage_boundary_shape(work.micro_batch_samples()));
    }
    // The last step is always saved when there is a save directory.
    if (!f.save_dir.empty() &&
        ((f.save_every > 0 && step % f.save_every == 0) || step == f.steps)) {
      save_stage(f, tc, engine, stage, TrainerState{step, data_seed});
      if (leader) std::printf("checkpoint of step %ld saved in %s\n", step, f.save_dir.c_str());
    }
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
    mine.buffer_bytes = engine.buffer_bytes();
    mine.collectives = static_cast<uint64_t>(stats.collectives);
    mine.data_parallel_bytes = data_parallel_bytes() - bytes_before;
    mine.peak_bytes = engine.allocator().stats().peak_total;
    mine.peak_resident_bytes =
        peak_resident_bytes() - engine.communicator().peer_memory_mapped_bytes();
    mine.comm_wait_ms = stats.comm_wait_ms;
    const std::vector<RankFigures> ranks = all_ranks(mine);
    if (!leader) continue;
    std::vector<std::string> comm_lines;
    const JsonRecord comm_ops =
        comms_log ? comms_log->add_step(counters_before, engine_counters(*grid.data_parallel, ties),
                                        engine.trace().spans(), &comm_lines)
                  : JsonRecord();
    // Idle is a rank's step time less its compute, the bubble its share over the ranks.
    float loss = 0.0f;
    double busy_sum = 0.0, time_sum = 0.0, wait_max = 0.0, comm_wait_max = 0.0;
    unsigned long long bytes = 0, peak = 0, peak_resident = 0;
    // Per stage, the largest of its ranks.
    const size_t stage_ranks = ranks.size() / static_cast<size_t>(stages);
    std::vector<unsigned long long> stage_activations(static_cast<size_t>(stages), 0);
    std::vector<unsigned long long> stage_state(static_cast<size_t>(stages), 0);
    std::vector<unsigned long long> stage_buffers(static_cast<size_t>(stages), 0);
    std::vector<double> stage_busy(static_cast<size_t>(stages), 0.0);
    std::vector<unsigned long long> stage_collectives(static_cast<size_t>(stages), 0);
    std::vector<unsigned long long> stage_data_parallel_bytes(static_cast<size_t>(stages), 0);
    for (size_t r = 0; r < ranks.size(); ++r) {
      const RankFigures& rank = ranks[r];
      loss += static_cast<float>(rank.loss_sum);
      busy_sum += rank.busy_ms;
      time_sum += rank.step_ms;
      wait_max = std::max(wait_max, rank.wait_ms);
      bytes += rank.bytes_sent;
      peak = std::max<unsigned long long>(peak, rank.peak_bytes);
      peak_resident = std::max<unsigned long long>(peak_resident, rank.peak_resident_bytes);
      comm_wait_max = std::max(comm_wait_max, rank.comm_wait_ms);
      const size_t s = r / stage_ranks;
      stage_activations[s] =
          std::max<unsigned long long>(stage_activations[s], rank.peak_activation_bytes);
      stage_state[s] = std::max<unsigned long long>(stage_state[s], rank.model_state_bytes);
      stage_buffers[s] = std::max<unsigned long long>(stage_buffers[s], rank.buffer_bytes);
      stage_busy[s] = std::max(stage_busy[s], rank.busy_ms);
      stage_collectives[s] = std::max<unsigned long long>(stage_collectives[s], rank.collectives);
      stage_data_parallel_bytes[s] += rank.data_parallel_bytes;
    }
    loss /= static_cast<float>(place.dp_size * micro_batches);
    const double bubble = time_sum > 0.0 ? 1.0 - busy_sum / time_sum : 0.0;
    const double tokens_per_s = static_cast<double>(tc.train_batch_size) *
                                static_cast<double>(task.tokens_per_sample()) / (step_ms / 1000.0);
    // Every stage skipped it: the overflow (or a non-finite gradient) is agreed over the pipeline.
    if (stats.skipped) print_skipped_step(step, stats.loss_scale);
    if (step % tc.steps_per_print == 0 || step == f.steps || stats.skipped) {
      std::printf(
          "step %5ld/%ld  loss %.6f  lr %.3g  grad_norm %.4f  %.2f ms  %.0f tokens/s  bubble "
          "%.3f  pp_wait %.2f ms\n",
          step, f.steps, loss, stats.lr, stats.grad_norm, step_ms, tokens_per_s, bubble, wait_max);
    }
    if (val_loss) std::printf("step %5ld/%ld  val_loss %.6f\n", step, f.steps, *val_loss);
    for (const std::string& line : comm_lines) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    JsonRecord record{{"event", "step"},
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
                      {"stage_buffer_bytes", stage_buffers},
                      {"stage_collectives", stage_collectives},
                      {"stage_data_parallel_bytes", stage_data_parallel_bytes},
                      {"stage_busy_ms", stage_busy},
                      {"skipped", stats.skipped},
                      {"loss_scale", json_number(stats.loss_scale)},
                      {"peak_bytes", peak},
                      {"peak_resident_bytes", peak_resident},
                      {"comm_wait_ms", json_number(comm_wait_max)},
                      // The leader's: the first stage's first rank.
                      {"forward_ms", json_number(to_ms(work.times().forward))},
                      {"backward_ms", json_number(to_ms(work.times().backward))},
                      {"optimizer_ms", json_number(optimizer_ms)}};
    if (val_loss) record["val_loss"] = json_number(*val_loss);
    if (comms_log) record["comm_ops"] = comm_ops;
    if (flops) report_flops_profile(*flops, tc.flops_profiler, &metrics);
    if (!f.metrics.empty()) metrics.write(record);
    monitors.write_events(monitor_events(record, tc.train_batch_size,
                                         config.precision.dtype == DType::kFloat16,
                                         tc.wall_clock_breakdown));
  }
  if (comms_log) {
    // The collectives still in flight (a stage 1-2 step's all-gathers) belong to the table too.
    engine.communicator().stream().synchronize();
    const CommCounters counters = engine_counters(*grid.data_parallel, ties);
    std::vector<std::string> late;
    comms_log->add_step(counters, counters, engine.trace().spans(), &late);
    for (const std::string& line : late) std::printf("%s\n", line.c_str());
    std::printf("comms_logger: the collectives of rank 0's engine (pipeline stage 0)\n%s",
                comms_log->summary().c_str());
    std::fflush(stdout);
  }
  if (timeline && !f.trace.empty()) timeline->add_counters(engine.trace());
  if (timeline && leader) {
    // The run's first step: where the model's buffers are made, so the plot shows them grow.
    timeline->write(f.memory_timeline, engine.trace().spans(), first_step);
    std::printf(
        "memory timeline of pipeline stage 0 (rank 0) written to %s, its plot of step %ld to "
        "%s.png\n",
        f.memory_timeline.c_str(), first_step, f.memory_timeline.c_str());
  }
  if (!f.trace.empty()) {
    // One file holds every rank of every stage (pid = world rank): the engine's group is one
    // stage's data-parallel group of several.
    const std::unique_ptr<Communicator> everyone = make_mpi_communicator();
    engine.trace().write_chrome_trace(*everyone, f.trace);
    if (leader) std::printf("trace written to %s\n", f.trace.c_str());
  }
  if (!f.pp_schedule_dump.empty()) {
    // The last step's timeline of the leader's pipeline, planned with its measured mean forward
    // and backward times (under ZB-H1 those of the input and the weight halves).
    const std::vector<PipelineStepReport> reports = gather_pipeline_reports(channel, report);
    if (leader) {
      // The mean measured time of each kind of compute action; a whole backward is planned as
      // its input half with no weight half after it.
      const auto mean_ms = [&reports](PipelineAction::Kind of) {
        double sum = 0.0;
        int count = 0;
        for (const PipelineStepReport& r : reports) {
          for (const PipelineActionTiming& t : r.timeline) {
            if (t.action.kind != of) continue;
            sum += t.end_ms - t.start_ms;
            ++count;
          }
        }
        return sum / std::max(count, 1);
      };
      PipelineDurations planned;
      planned.forward = mean_ms(PipelineAction::kForward);
      const bool split = kind == PipelineScheduleKind::kZeroBubbleH1;
      planned.backward =
          mean_ms(split ? PipelineAction::kBackwardInput : PipelineAction::kBackward);
      planned.weight = split ? mean_ms(PipelineAction::kBackwardWeight) : 0.0;
      const std::string note =
          write_pipeline_timeline(f.pp_schedule_dump, reports, schedules, planned);
      std::printf(
          "pipeline timeline of step %ld written to %s.json%s\n", f.steps,
          f.pp_schedule_dump.c_str(),
          note.empty() ? (" and " + f.pp_schedule_dump + ".png").c_str() : ("; " + note).c_str());
    }
  }
}

}  // namespace

void train_pipeline(const Flags& f, const TrainingConfig& tc, TrainTask& task, ProcessGrid& grid,
                    Monitors& monitors) {
  try {
    run_pipeline(f, tc, task, grid, monitors);
  } catch (const ConfigError&) {
    throw;  // raised on every rank at once: the caller ends the run cleanly (exit 2)
  } catch (const std::exception& e) {
    // One stage's failure (a transfer that timed out, say) leaves the other stages inside
    // transfers or collectives, which the communicators' destructors would wait for: end the
    // job at once, naming the rank and the error (exit 3 for out of memory, as zero-train's).
    const bool out_of_memory = dynamic_cast<const OutOfMemoryError*>(&e) != nullptr;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "zero-train: rank %d: %s%s\n", rank,
                 out_of_memory ? "" : "error: ", e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, out_of_memory ? 3 : 1);
  }
}

}  // namespace zero::examples
