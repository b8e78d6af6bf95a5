// Shared by the engine's MPI tests: train the example MLP through the engine (or without it,
// as the unsharded reference written from the formulas) and record what the tests compare.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/mlp.h"
#include "tests/runtime/reference_training.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/checkpoint.h"
#include "zero/runtime/model.h"

namespace zero::testing {

using models::MlpConfig;

struct TrainResult {
  std::vector<float> losses;
  std::vector<float> grad_norms;
  std::vector<bool> skipped;
  std::vector<float> loss_scales;  // after each step
  std::vector<std::vector<std::vector<float>>> params_after_step;
  uint64_t buffer_bytes = 0;
  MemoryPlan plan;
  std::vector<uint64_t> comm_bytes;  // per step, this rank
  // Per step, this rank: the all-gathers on the communicator the engine was given, and what the
  // engine's own communicators sent (Engine::own_comm_bytes).
  std::vector<uint64_t> group_all_gather_bytes;
  std::vector<uint64_t> own_comm_bytes;
  std::vector<int> collectives;  // per step, as the engine counts them
  // Reductions and gathers of all steps (each step's loss all-reduce too) that did not run
  // straight on node-shared buffers: all but the communicator's direct_collectives().
  uint64_t staged_collectives = 0;
  std::vector<StepStats> stats;  // per step, what the engine returned
  uint64_t peak_bytes = 0;       // the engine allocator's peak over the run
  size_t units = 0;
  std::vector<size_t> unit_numels;  // padded, in unit order
  uint64_t model_state_bytes = 0;
  uint64_t pinned_host_bytes = 0;
  uint64_t pageable_host_bytes = 0;
  uint64_t nvme_bytes = 0;
  size_t padded_params = 0;
  std::vector<std::vector<float>> final_params;
  std::vector<TraceSpan> trace;  // this rank's spans, when the tweak enabled the trace
};

struct RunOptions {
  int stage = 0;
  int micro_batches = 1;
  int steps = 20;
  long global_batch = 24;
  long comm_delay_us = 0;
  MlpConfig mlp{8, 24, 4, 3};
  size_t merge_bytes = 0;
  float clip = 0.0f;
  float lr = 1e-2f;
  float weight_decay = 0.01f;  // AdamW's, decoupled
  uint64_t seed = 7;
  DType dtype = DType::kFloat32;
  int inf_grad_step = 0;       // the last rank's loss gradient is infinite at this step
  bool record_params = false;  // keep the full parameters after every step
  std::function<void(EngineConfig&)> tweak;       // any other setting
  std::function<void(int rank)> before_backward;  // runs before every micro-batch's backward
  // Sum each step's loss over the engine's own communicator, whose stream then runs the
  // all-reduce behind the step's collectives and so waits for them. False: over another
  // communicator, as zero-train with hybrid sharding does, so the next forward starts while the
  // post-step all-gathers may still be in flight (what it reads must wait for them itself).
  bool drain_after_step = true;
};

// Reduce-scatters, all-gathers and all-reduces `comm` has run: what the shared-memory path
// either stages or runs straight on node-shared buffers.
// Stage 3's backward gathers again every unit of the MLP but the last two: the last, which it
// starts with, and the one before, which it prefetches first, stay gathered from forward
// (UnitSchedule). Its fraction of the padded parameters.
inline double stage3_backward_gathered_fraction(const TrainResult& run) {
  const std::vector<size_t>& numels = run.unit_numels;
  size_t regathered = 0;
  for (size_t u = 0; u + 2 < numels.size(); ++u) regathered += numels[u];
  return static_cast<double>(regathered) / static_cast<double>(run.padded_params);
}

inline uint64_t moved_collectives(const Communicator& comm) {
  const CommCounters& c = comm.counters();
  return c.calls[static_cast<size_t>(CollectiveOp::kReduceScatter)] +
         c.calls[static_cast<size_t>(CollectiveOp::kAllGather)] +
         c.calls[static_cast<size_t>(CollectiveOp::kAllReduce)];
}

// Trains the example MLP and records what the tests compare. The loss of a step is the mean
// over the global batch (all ranks, all micro-batches), like zero-train's.
inline TrainResult train(const RunOptions& o) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int world = comm->world_size();
  const long per_micro = o.global_batch / (world * o.micro_batches);
  EngineConfig config;
  config.stage = o.stage;
  config.micro_batches = o.micro_batches;
  config.optimizer.lr = o.lr;
  config.optimizer.weight_decay = o.weight_decay;
  config.schedule.merge_bytes = o.merge_bytes;
  config.gradient_clipping = o.clip;
  config.seed = o.seed;
  config.precision.dtype = o.dtype;
  if (o.tweak) o.tweak(config);
  if (o.comm_delay_us > 0) {
    comm->stream().set_delay_for_testing(std::chrono::microseconds(o.comm_delay_us));
  }
  // Made before the engine, on every rank alike (a communicator's creation is collective).
  std::unique_ptr<Communicator> loss_comm = o.drain_after_step ? nullptr : make_mpi_communicator();
  Communicator& sums_losses = loss_comm ? *loss_comm : *comm;
  TrainResult run;
  {
    ZeroModel model(*comm, models::make_mlp(o.mlp), config);
    models::TeacherTask task(o.mlp, o.seed);
    run.model_state_bytes = model.engine().model_state_bytes();
    run.buffer_bytes = model.engine().buffer_bytes();
    run.pinned_host_bytes = model.engine().pinned_host_bytes();
    run.pageable_host_bytes = model.engine().pageable_host_bytes();
    run.nvme_bytes = model.engine().nvme_bytes();
    run.plan = plan_memory(model.engine().layout(), config);
    run.padded_params = model.engine().layout().padded_numel();
    const uint64_t staged_before = moved_collectives(*comm) - comm->direct_collectives();
    for (int step = 1; step <= o.steps; ++step) {
      const uint64_t before = comm->counters().total_bytes() + model.engine().own_comm_bytes();
      const uint64_t gathered_before =
          comm->counters().bytes[static_cast<size_t>(CollectiveOp::kAllGather)];
      const uint64_t own_before = model.engine().own_comm_bytes();
      float loss_sum = 0.0f;
      for (int k = 0; k < o.micro_batches; ++k) {
        const int64_t first = (static_cast<int64_t>(k) * world + comm->rank()) * per_micro;
        models::Batch batch = task.batch(step, first, per_micro);
        Tensor grad;
        loss_sum += models::mse_loss(model.forward(batch.inputs), batch.targets, grad);
        const bool inject =
            step == o.inf_grad_step && k == o.micro_batches - 1 && comm->rank() == world - 1;
        if (inject) grad.data()[0] = std::numeric_limits<float>::infinity();
        if (o.before_backward) o.before_backward(comm->rank());
        model.backward(grad);
      }
      const StepStats stats = model.step();
      run.grad_norms.push_back(stats.grad_norm);
      run.skipped.push_back(stats.skipped);
      run.loss_scales.push_back(stats.loss_scale);
      run.collectives.push_back(stats.collectives);
      run.stats.push_back(stats);
      if (o.record_params) run.params_after_step.push_back(model.engine().gather_full_params());
      run.comm_bytes.push_back(comm->counters().total_bytes() + model.engine().own_comm_bytes() -
                               before);
      run.group_all_gather_bytes.push_back(
          comm->counters().bytes[static_cast<size_t>(CollectiveOp::kAllGather)] - gathered_before);
      run.own_comm_bytes.push_back(model.engine().own_comm_bytes() - own_before);
      float total = 0.0f;
      sums_losses.all_reduce_sync(&loss_sum, &total, 1, DType::kFloat32);
      run.losses.push_back(total / static_cast<float>(world * o.micro_batches));
    }
    // A collective counts as issued at once, as direct once it has run: the last step's
    // gathers may still be in flight.
    comm->stream().synchronize();
    run.staged_collectives = moved_collectives(*comm) - comm->direct_collectives() - staged_before;
    run.final_params = model.engine().gather_full_params();
    run.trace = model.engine().trace().spans();
    run.peak_bytes = model.engine().allocator().stats().peak_total;
    run.units = model.engine().layout().units().size();
    for (const Unit& unit : model.engine().layout().units()) run.unit_numels.push_back(unit.numel);
  }
  return run;
}

// A run of the checkpoint tests: the example MLP (8, 24, 4, 3) trained over steps [from, to]
// with `config`, 6 samples per rank from seed 7's teacher, first loading `dir`/latest when
// `load`, saving into `dir` after step 3 when `save`. Its losses, and its full master after the
// last step.
struct CheckpointedRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> master;
};
inline CheckpointedRun train_around_checkpoint(Communicator& comm, const EngineConfig& config,
                                               const std::string& dir, int from, int to, bool save,
                                               bool load) {
  const models::MlpConfig mlp{8, 24, 4, 3};
  ZeroModel model(comm, models::make_mlp(mlp), config);
  if (load) load_checkpoint(model.engine(), dir + "/latest", nullptr);
  models::TeacherTask task(mlp, 7);
  CheckpointedRun run;
  for (int step = from; step <= to; ++step) {
    models::Batch batch = task.batch(step, comm.rank() * 6, 6);
    Tensor grad;
    run.losses.push_back(models::mse_loss(model.forward(batch.inputs), batch.targets, grad));
    model.backward(grad);
    model.step();
    if (save && step == 3) save_checkpoint(model.engine(), dir, TrainerState{step, 7});
  }
  run.master = model.engine().gather_full_master();
  return run;
}

// The same losses and final parameters, bit for bit.
inline void expect_bitwise(const TrainResult& run, const TrainResult& reference,
                           const std::string& what) {
  ASSERT_EQ(run.losses.size(), reference.losses.size()) << what;
  for (size_t i = 0; i < run.losses.size(); ++i) {
    EXPECT_EQ(run.losses[i], reference.losses[i]) << what << " step " << i + 1;
  }
  ASSERT_EQ(run.final_params.size(), reference.final_params.size()) << what;
  for (size_t p = 0; p < run.final_params.size(); ++p) {
    EXPECT_EQ(run.final_params[p], reference.final_params[p]) << what << " parameter " << p;
  }
}

inline int world_size() {
  return make_mpi_communicator()->world_size();
}

// |a - b| <= rel * max(|a|, |b|) + floor: the floor covers values near zero, where a reduction
// summed in another order moves the last bits of a tiny number by a large relative amount.
inline void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel,
                         const std::string& what, double floor = 1e-12) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    const double tolerance = rel * std::max(std::fabs(a[i]), std::fabs(b[i])) + floor;
    EXPECT_NEAR(a[i], b[i], tolerance) << what << " at index " << i;
  }
}

// Plain training without the engine, from the formulas (tests/runtime/reference_training.h):
// the whole global batch on one process, in the given micro-batches, with its own AdamW and
// clipping, starting from the values the engine initializes the same parameters to, on the
// same data. The options that change the numbers are honoured; the ones that only place or
// schedule the work (stage, comm delay, merging) do not enter the math; any other is rejected.
inline TrainResult train_unsharded(const RunOptions& o) {
  if (o.tweak || o.dtype != DType::kFloat32 || o.inf_grad_step != 0) {
    throw std::invalid_argument(
        "train_unsharded models fp32 AdamW with the RunOptions fields only: no tweak, no "
        "16-bit dtype, no injected fault");
  }
  if (o.global_batch % o.micro_batches != 0) {
    throw std::invalid_argument(
        "train_unsharded: the global batch does not split into the "
        "micro-batches");
  }
  const reference::Mlp mlp{o.mlp.input_dim, o.mlp.hidden_dim, o.mlp.output_dim, o.mlp.layers};
  reference::Run run;
  run.steps = o.steps;
  run.global_batch = o.global_batch;
  run.micro_batches = o.micro_batches;
  run.lr = o.lr;
  run.weight_decay = o.weight_decay;
  run.clip = o.clip;
  const models::TeacherTask task(o.mlp, o.seed);
  auto data = [&](long step, int64_t first, int64_t count) {
    const models::Batch batch = task.batch(step, first, count);
    return reference::Rows{batch.inputs.to_host(), batch.targets.to_host()};
  };
  // The engine's initializer: a function of the seed and the element's identity only.
  auto init = [&](uint64_t index, uint64_t element, float bound) {
    return init_value(o.seed, index, element, ParamInit{InitKind::kUniform, bound});
  };
  reference::Result reference_run = reference::train(mlp, run, data, init);
  TrainResult result;
  result.losses = std::move(reference_run.losses);
  result.grad_norms = std::move(reference_run.grad_norms);
  result.final_params = reference_run.params_after_step.back();
  if (o.record_params) result.params_after_step = std::move(reference_run.params_after_step);
  return result;
}

}  // namespace zero::testing
