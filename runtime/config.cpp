// Reads the training config (config.h lists the rules and the mapping). Three steps:
//   1. text -> zero.config.TrainingConfig (config_parse.cpp), with JSON "auto" values resolved
//      from the run (config_auto.cpp).
//   2. the message -> TrainingConfig: ranges, combinations, and the defaults of absent keys; a
//      reader per section below (the optimizer and scheduler in config_sections.cpp).
//   3. DeepSpeed's batch-size rule (derive_batch_sizes).
// Every problem is a ConfigError naming the key; the first one found stops the parse.
#include "zero/runtime/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "config_parse.h"
#include "zero/proto/config.pb.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero {
using namespace config_internal;
namespace {

// ---------------------------------------------------------------------------------------------
// Step 2: the message -> TrainingConfig.

std::optional<long> given(bool has, int64_t value) {
  return has ? std::optional<long>(value) : std::nullopt;
}

// train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps; a file without
// the first two takes the caller's global batch when its flag gives one.
void read_batch_sizes(const config::TrainingConfig& c, int world_size, const std::string& origin,
                      const ConfigContext& context, TrainingConfig* out) {
  const std::optional<long> steps =
      given(c.has_gradient_accumulation_steps(), c.gradient_accumulation_steps());
  const bool file_has_batch = c.has_train_batch_size() || c.has_train_micro_batch_size_per_gpu();
  const BatchSizes batch =
      !file_has_batch && context.batch_from_caller && context.train_batch_size
          ? derive_batch_sizes(context.train_batch_size, std::nullopt,
                               steps ? steps : context.gradient_accumulation_steps, world_size,
                               context.source)
          : derive_batch_sizes(
                given(c.has_train_batch_size(), c.train_batch_size()),
                given(c.has_train_micro_batch_size_per_gpu(), c.train_micro_batch_size_per_gpu()),
                steps, world_size, origin);
  out->train_batch_size = batch.train_batch_size;
  out->micro_batch_per_rank = batch.micro_batch_per_rank;
  out->gradient_accumulation_steps = batch.gradient_accumulation_steps;
  out->engine.micro_batches = batch.gradient_accumulation_steps;
}

// pipeline: the stages (the caller's, when it gives them), the partition and the keys that
// change nothing here; the ranks of one stage, which tensor_parallel and the batch keys count.
int read_pipeline(const config::TrainingConfig& c, int world_size, const ConfigContext& context,
                  const Checker& check, TrainingConfig* out) {
  const config::Pipeline& p = c.pipeline();
  const int64_t stages = context.pipeline_stages ? *context.pipeline_stages
                         : p.has_stages()        ? p.stages()
                                                 : 1;
  check.integer("pipeline.stages", stages, 1, world_size);
  if (world_size % stages != 0) {
    check.fail("pipeline.stages", "a divisor of the world size " + std::to_string(world_size),
               std::to_string(stages));
  }
  out->pipeline_stages = static_cast<int>(stages);
  if (p.has_partition()) {
    const std::string& partition = p.partition();
    if (!is_pipeline_partition_method(partition)) {
      check.fail("pipeline.partition", kPipelinePartitionMethods, "\"" + partition + "\"");
    }
    out->pipeline_partition = partition;
  }
  const int64_t interval = p.activation_checkpoint_interval();
  if (interval != 0 && interval != 1) {
    check.fail("pipeline.activation_checkpoint_interval",
               "0 (off) or 1 (every block recomputes; groups of several blocks are not built)",
               std::to_string(interval));
  }
  if (interval == 1) {
    ActivationCheckpointingConfig& ac = out->activation_checkpointing;
    if (ac.mode != "none" && ac.mode != "full") {
      check.fail("pipeline.activation_checkpoint_interval",
                 "0 with activation_checkpointing.mode \"" + ac.mode + "\"", "1");
    }
    ac.mode = "full";
  }
  if (p.has_pipe_partitioned()) out->pipeline_partition_activations = p.pipe_partitioned();
  if (p.has_grad_partitioned()) out->pipeline_partition_gradients = p.grad_partitioned();
  if (p.seed_layers()) {
    out->ignored_keys.push_back(
        "pipeline.seed_layers is ignored: every parameter's initial values are a function of "
        "its own index already, whatever the stages");
  }
  return world_size / static_cast<int>(stages);
}

// tensor_parallel: the degree, checked against the world; the data-parallel size it leaves.
int read_tensor_parallel(const config::TrainingConfig& c, int world_size, const Checker& check,
                         TrainingConfig* out) {
  const config::TensorParallel& t = c.tensor_parallel();
  if (t.has_tp_size() && t.has_autotp_size() && t.tp_size() != t.autotp_size()) {
    check.fail("tensor_parallel.autotp_size",
               "the same as tensor_parallel.tp_size (" + std::to_string(t.tp_size()) +
                   ") when both are given",
               std::to_string(t.autotp_size()));
  }
  const char* key = t.has_tp_size() ? "tensor_parallel.tp_size" : "tensor_parallel.autotp_size";
  const int64_t tp = t.has_tp_size() ? t.tp_size() : t.has_autotp_size() ? t.autotp_size() : 1;
  check.integer(key, tp, 1, world_size);
  if (world_size % tp != 0) {
    check.fail(key, "a divisor of the world size " + std::to_string(world_size),
               std::to_string(tp));
  }
  // Hybrid sharding groups the ranks of each data-parallel group (Megatron + MiCS).
  const int64_t mics = c.zero_optimization().mics_shard_size();
  const int64_t data_parallel = world_size / tp;
  if (tp > 1 && c.zero_optimization().has_mics_shard_size() && mics >= 1 &&
      (mics > data_parallel || data_parallel % mics != 0)) {
    check.fail("zero_optimization.mics_shard_size",
               "a divisor of the " + std::to_string(data_parallel) +
                   " data-parallel rank(s) (the world's " + std::to_string(world_size) + " over " +
                   key + " " + std::to_string(tp) + ")",
               std::to_string(mics));
  }
  out->tensor_parallel_size = static_cast<int>(tp);
  return world_size / static_cast<int>(tp);
}

// The top-level keys of the run: clipping, printing, seed, debug and non-finite gradients.
void read_run_keys(const config::TrainingConfig& c, const Checker& check, TrainingConfig* out) {
  EngineConfig& e = out->engine;
  if (c.has_gradient_clipping()) {
    e.gradient_clipping = check.real("gradient_clipping", c.gradient_clipping(),
                                     c.gradient_clipping() >= 0, ">= 0 (0 turns clipping off)");
  }
  if (c.has_steps_per_print()) {
    out->steps_per_print = check.integer("steps_per_print", c.steps_per_print(), 1, kMaxInt64);
  }
  if (c.has_seed()) {
    e.seed = static_cast<uint64_t>(check.integer("seed", c.seed(), 0, kMaxInt64));
  }
  if (c.debug().collectives()) e.desync_check = true;
  if (c.has_nonfinite_gradients()) {
    const std::string& mode = c.nonfinite_gradients();
    if (mode != "error" && mode != "skip") {
      check.fail("nonfinite_gradients", "\"error\" or \"skip\"", in_quotes(mode));
    }
    e.precision.skip_nonfinite_steps = mode == "skip";
  }
}

// fp16 / bf16: the working dtype and the fp16 loss scaler.
void read_precision(const config::TrainingConfig& c, const Checker& check, EngineConfig* e) {
  const std::string& origin = check.origin();
  const config::Fp16& fp16 = c.fp16();
  if (fp16.enabled() && c.bf16().enabled()) {
    config_error("fp16.enabled and bf16.enabled are both true in " + origin +
                 "; enable at most one");
  }
  e->precision.dtype = fp16.enabled()       ? DType::kFloat16
                       : c.bf16().enabled() ? DType::kBFloat16
                                            : DType::kFloat32;
  LossScalerConfig& scaler = e->precision.loss_scaler;
  if (fp16.has_loss_scale()) {
    scaler.static_scale = check.real("fp16.loss_scale", fp16.loss_scale(), fp16.loss_scale() >= 0,
                                     ">= 0 (0: dynamic scaling)");
  }
  if (fp16.has_initial_scale_power()) {
    scaler.initial_scale_power = static_cast<int>(
        check.integer("fp16.initial_scale_power", fp16.initial_scale_power(), 0, 127));
  }
  if (fp16.has_loss_scale_window()) {
    scaler.scale_window = static_cast<int>(
        check.integer("fp16.loss_scale_window", fp16.loss_scale_window(), 1, kMaxInt));
  }
  if (fp16.has_hysteresis()) {
    scaler.hysteresis =
        static_cast<int>(check.integer("fp16.hysteresis", fp16.hysteresis(), 1, kMaxInt));
  }
  if (fp16.has_min_loss_scale()) {
    scaler.min_scale =
        check.real("fp16.min_loss_scale", fp16.min_loss_scale(), fp16.min_loss_scale() > 0, "> 0");
  }
}

// A dtype key (`name` its value) that may only be the working dtype or fp32; `rule` ends the
// message that says so.
DType working_or_fp32(const std::string& key, const std::string& name, DType working,
                      const Checker& check, const std::string& rule) {
  DType t = DType::kFloat32;
  if (!parse_dtype(name, &t, /*short_only=*/true)) {
    check.fail(key, "\"fp32\", \"fp16\" or \"bf16\"", in_quotes(name));
  }
  if (t != working && t != DType::kFloat32) {
    config_error(in_quotes(key) + " in " + check.origin() + " is " + in_quotes(name) +
                 " but the working dtype is " + dtype_name(working) + "; " + rule);
  }
  return t;
}

// communication_data_type and gradient_predivide_factor: how gradients are reduced. Checked
// against the working dtype, so read after read_precision.
void read_communication(const config::TrainingConfig& c, const Checker& check, EngineConfig* e) {
  if (c.has_communication_data_type()) {
    // The engine reduces gradients in the working dtype, or in fp32 when told to.
    const DType comm =
        working_or_fp32("communication_data_type", c.communication_data_type(), e->precision.dtype,
                        check, "gradients are reduced in the working dtype or in fp32");
    e->precision.reduce_in_fp32 = comm == DType::kFloat32 && e->precision.dtype != DType::kFloat32;
  }
  if (c.has_gradient_predivide_factor()) {
    e->precision.gradient_predivide_factor =
        check.real("gradient_predivide_factor", c.gradient_predivide_factor(),
                   c.gradient_predivide_factor() > 0, "> 0");
  }
}

void read_zero_optimization(const config::ZeroOptimization& zero, const Checker& check,
                            TrainingConfig* out) {
  const std::string& origin = check.origin();
  EngineConfig& e = out->engine;
  e.stage = 0;  // DeepSpeed's default: no zero_optimization section means no sharding
  if (zero.has_stage() && (zero.stage() < 0 || zero.stage() > 3)) {
    check.fail("zero_optimization.stage", "0, 1, 2 or 3", std::to_string(zero.stage()));
  }
  if (zero.has_stage()) e.stage = static_cast<int>(zero.stage());
  if (zero.has_overlap_comm()) e.schedule.overlap_comm = zero.overlap_comm();
  if (zero.has_reduce_scatter()) e.schedule.reduce_scatter = zero.reduce_scatter();
  if (zero.has_contiguous_gradients() && !zero.contiguous_gradients()) {
    config_error("\"zero_optimization.contiguous_gradients\" in " + origin +
                 " is false, but this runtime always keeps gradient buckets contiguous; set it "
                 "to true or leave it out");
  }
  if (zero.has_allgather_partitions() && !zero.allgather_partitions()) {
    config_error("\"zero_optimization.allgather_partitions\" in " + origin +
                 " is false, but this runtime always all-gathers the updated partitions after "
                 "the step; set it to true or leave it out");
  }
  // Elements per collective: the engine packs units up to them; they never merge units.
  const int64_t max_elements = static_cast<int64_t>(std::numeric_limits<size_t>::max() / 4);
  if (zero.has_reduce_bucket_size()) {
    e.schedule.reduce_bucket_elements = static_cast<size_t>(check.integer(
        "zero_optimization.reduce_bucket_size", zero.reduce_bucket_size(), 1, max_elements));
  }
  if (zero.has_allgather_bucket_size()) {
    e.schedule.allgather_bucket_elements = static_cast<size_t>(check.integer(
        "zero_optimization.allgather_bucket_size", zero.allgather_bucket_size(), 1, max_elements));
  }
  // DeepSpeed's default of 1e9: for memory-resident state it changes only how the update is
  // cut into passes (not its result); with NVMe offload it is the unit of I/O.
  e.schedule.optimizer_sub_group_elements = 1000000000;
  if (zero.has_sub_group_size()) {
    e.schedule.optimizer_sub_group_elements = static_cast<size_t>(
        check.integer("zero_optimization.sub_group_size", zero.sub_group_size(), 1, max_elements));
  }
  out->gather_16bit_weights_on_model_save = zero.stage3_gather_16bit_weights_on_model_save();
  if (zero.has_stage3_prefetch_bucket_size()) {
    const int64_t v = zero.stage3_prefetch_bucket_size();
    if (v < 1) {
      check.fail("zero_optimization.stage3_prefetch_bucket_size",
                 "at least 1 (this runtime always prefetches the next unit)", std::to_string(v));
    }
    e.schedule.prefetch_elements = static_cast<size_t>(v);
  }
  if (zero.has_stage3_param_persistence_threshold()) {
    e.schedule.persistence_threshold =
        static_cast<size_t>(check.integer("zero_optimization.stage3_param_persistence_threshold",
                                          zero.stage3_param_persistence_threshold(), 0, kMaxInt64));
  }
  if (zero.has_stage3_max_live_parameters()) {
    const int64_t v = zero.stage3_max_live_parameters();
    if (v < 1) {
      check.fail("zero_optimization.stage3_max_live_parameters",
                 "at least 1 (leave it out for no limit)", std::to_string(v));
    }
    e.schedule.max_live_elements = static_cast<size_t>(v);
  }
  if (zero.has_mics_shard_size()) {
    const int64_t v = zero.mics_shard_size();
    if (v != -1 && (v < 1 || v > std::numeric_limits<int>::max())) {
      check.fail("zero_optimization.mics_shard_size",
                 "-1 (off) or a shard group size of at least 1", std::to_string(v));
    }
    e.grid.mics_shard_size = static_cast<int>(v);
  }
  if (zero.has_stage3_max_reuse_distance()) {
    e.schedule.max_reuse_distance =
        static_cast<size_t>(check.integer("zero_optimization.stage3_max_reuse_distance",
                                          zero.stage3_max_reuse_distance(), 0, kMaxInt64));
  }
}

// ZeRO++'s keys, with DeepSpeed's meanings: each changes how stage 3 moves its parameters or
// gradients, so each needs stage 3. A combination not built yet is refused by name.
void read_zero_plus_plus(const config::ZeroOptimization& zero, int data_parallel_size,
                         const Checker& check, EngineConfig* e) {
  const auto needs_stage3 = [&](const std::string& key, const std::string& value,
                                const std::string& why) {
    if (e->stage == 3) return;
    config_error(in_quotes("zero_optimization." + key) + " in " + check.origin() + " is " + value +
                 ", which needs zero_optimization.stage 3 (it is " + std::to_string(e->stage) +
                 "): " + why);
  };
  if (zero.zero_quantized_weights()) {
    needs_stage3("zero_quantized_weights", "true", "only stage 3 all-gathers parameters");
    e->precision.quantized_weights = true;
  }
  if (zero.has_zero_hpz_partition_size()) {
    const int64_t v =
        check.integer("zero_optimization.zero_hpz_partition_size", zero.zero_hpz_partition_size(),
                      1, std::numeric_limits<int>::max());
    if (v > 1) {
      needs_stage3("zero_hpz_partition_size", std::to_string(v),
                   "only stage 3 partitions the parameters");
      // The secondary shards split each unit over the ranks of a node: a node's share of the
      // data-parallel group. The engine checks it against the nodes the ranks are on.
      if (data_parallel_size % v != 0) {
        check.fail("zero_optimization.zero_hpz_partition_size",
                   "1 (off) or a divisor of the " + std::to_string(data_parallel_size) +
                       " data-parallel rank(s) (the ranks of one node)",
                   std::to_string(v));
      }
      e->grid.hpz_partition_size = static_cast<int>(v);
    }
  }
  if (zero.zero_quantized_gradients()) {
    needs_stage3("zero_quantized_gradients", "true",
                 "the quantized reduction replaces stage 3's reduce-scatter");
    if (e->grid.mics_shard_size != -1) {
      config_error("\"zero_optimization.zero_quantized_gradients\" in " + check.origin() +
                   " is true with zero_optimization.mics_shard_size " +
                   std::to_string(e->grid.mics_shard_size) +
                   ": quantized gradient reduction with hybrid sharding is not built yet");
    }
    e->precision.quantized_gradients = true;
  }
}

// data_types.grad_accum_dtype, checked against the working dtype.
void read_data_types(const config::DataTypes& types, const Checker& check, EngineConfig* e) {
  if (types.has_grad_accum_dtype()) {
    // Accumulating in a narrower type than the working one, or another 2-byte one, is not a
    // mode DeepSpeed has either.
    e->precision.grad_accum_dtype =
        working_or_fp32("data_types.grad_accum_dtype", types.grad_accum_dtype(), e->precision.dtype,
                        check, "gradients accumulate in the working dtype or in fp32");
  }
}

// activation_checkpointing: the mode, number_checkpoints and DeepSpeed's options, and our
// nvme_path.
void read_activation_checkpointing(const config::ActivationCheckpointing& a, const Checker& check,
                                   ActivationCheckpointingConfig* out) {
  if (a.has_mode()) {
    if (a.mode() != "none" && a.mode() != "selective" && a.mode() != "full") {
      check.fail("activation_checkpointing.mode", "\"none\", \"selective\" or \"full\"",
                 in_quotes(a.mode()));
    }
    out->mode = a.mode();
  }
  if (a.has_number_checkpoints()) {
    out->number_checkpoints = check.integer("activation_checkpointing.number_checkpoints",
                                            a.number_checkpoints(), 1, kMaxInt);
    out->number_checkpoints_given = true;
  }
  out->cpu_checkpointing = a.cpu_checkpointing();
  out->contiguous_memory_optimization = a.contiguous_memory_optimization();
  out->profile = a.profile();
  out->partition_activations = a.partition_activations();
  if (a.has_nvme_path()) {
    if (a.nvme_path().empty()) {
      check.fail("activation_checkpointing.nvme_path", "a directory", in_quotes(a.nvme_path()));
    }
    out->nvme_path = a.nvme_path();
  }
  out->synchronize_checkpoint_boundary = a.synchronize_checkpoint_boundary();
}

// tensorboard / csv_monitor: where rank 0 writes the events. Whether the directory can be made
// is checked by the program that writes there, before step 1.
void read_monitor(const config::Monitor& m, const std::string& section, const Checker& check,
                  MonitorConfig* out) {
  out->enabled = m.enabled();
  if (m.has_output_path()) out->output_path = m.output_path();
  if (m.has_job_name()) {
    if (m.job_name().empty() || m.job_name().find('/') != std::string::npos ||
        m.job_name() == "." || m.job_name() == "..") {
      check.fail(section + ".job_name", "one directory name (not empty, no '/')",
                 in_quotes(m.job_name()));
    }
    out->job_name = m.job_name();
  }
}

void read_comms_logger(const config::CommsLogger& c, const Checker& check, CommsLoggerConfig* out) {
  out->enabled = c.enabled();
  out->verbose = c.verbose();
  if (c.has_prof_all()) out->prof_all = c.prof_all();
  for (const std::string& op : c.prof_ops()) {
    if (op != "all_gather" && op != "reduce_scatter" && op != "all_reduce" && op != "broadcast" &&
        op != "barrier") {
      check.fail("comms_logger.prof_ops",
                 "names of collectives (all_gather, reduce_scatter, all_reduce, broadcast, "
                 "barrier)",
                 in_quotes(op));
    }
    out->prof_ops.push_back(op);
  }
  if (c.debug()) {
    config_error("\"comms_logger.debug\" in " + check.origin() +
                 " is not built: it adds the Python caller's name to each collective, and the "
                 "engine's collectives have none; set it false or remove it");
  }
}

void read_flops_profiler(const config::FlopsProfiler& c, const Checker& check,
                         FlopsProfilerConfig* out) {
  out->enabled = c.enabled();
  if (c.has_profile_step()) {
    out->profile_step =
        check.integer("flops_profiler.profile_step", c.profile_step(), 1, kMaxInt64);
  }
  if (c.has_module_depth()) {
    out->module_depth = check.integer("flops_profiler.module_depth", c.module_depth(), -1, kMaxInt);
  }
  if (c.has_top_modules()) {
    out->top_modules = check.integer("flops_profiler.top_modules", c.top_modules(), 1, kMaxInt);
  }
  if (c.has_detailed()) out->detailed = c.detailed();
  out->output_file = c.output_file();
}

// Keys whose effect here would be none: accepted, and each named once with why.
void read_ignored_keys(const config::TrainingConfig& c, std::vector<std::string>* ignored) {
  if (c.has_memory_breakdown()) {
    ignored->push_back(
        "memory_breakdown is ignored: the memory summary by category is "
        "printed at start anyway");
  }
  if (c.has_zero_allow_untested_optimizer()) {
    ignored->push_back(
        "zero_allow_untested_optimizer is ignored: every optimizer here "
        "is built into the engine and runs at every stage");
  }
  if (c.zero_optimization().has_round_robin_gradients()) {
    ignored->push_back(
        "zero_optimization.round_robin_gradients is ignored: it orders "
        "gradient copies to a GPU run's host-side optimizer, which the CPU path does not "
        "make; results are the same");
  }
}

TrainingConfig interpret(const config::TrainingConfig& c, int world_size, const std::string& origin,
                         const ConfigContext& context, std::vector<std::string> resolved) {
  const Checker check(origin);
  TrainingConfig out;
  out.origin = origin;
  out.resolved_auto = std::move(resolved);
  EngineConfig& e = out.engine;
  // The batch keys count data-parallel ranks: a pipeline stage's over its tensor parallelism.
  read_activation_checkpointing(c.activation_checkpointing(), check, &out.activation_checkpointing);
  const int stage_ranks = read_pipeline(c, world_size, context, check, &out);
  const int data_parallel_size = read_tensor_parallel(c, stage_ranks, check, &out);
  read_batch_sizes(c, data_parallel_size, origin, context, &out);
  read_run_keys(c, check, &out);
  // Precision first: grad_accum_dtype and communication_data_type are checked against it.
  read_precision(c, check, &e);
  read_communication(c, check, &e);
  read_zero_optimization(c.zero_optimization(), check, &out);
  read_zero_plus_plus(c.zero_optimization(), data_parallel_size, check, &e);
  read_data_types(c.data_types(), check, &e);
  read_offload(c, context.cuda, check, &out);
  out.wall_clock_breakdown = c.wall_clock_breakdown();
  read_monitor(c.tensorboard(), "tensorboard", check, &out.tensorboard);
  read_monitor(c.csv_monitor(), "csv_monitor", check, &out.csv_monitor);
  read_comms_logger(c.comms_logger(), check, &out.comms_logger);
  read_flops_profiler(c.flops_profiler(), check, &out.flops_profiler);
  out.override_optimizer = c.checkpoint().override_optimizer();
  read_ignored_keys(c, &out.ignored_keys);

  if (c.has_optimizer()) {
    read_optimizer(c.optimizer(), check, &e.optimizer);
  } else {
    // DeepSpeed then trains with the client's optimizer: here the caller's lr and weight decay,
    // so that a file without the section trains as the caller does without a file.
    if (context.lr) e.optimizer.lr = *context.lr;
    if (context.weight_decay) e.optimizer.weight_decay = *context.weight_decay;
  }
  // Without a scheduler the optimizer's lr holds for the whole run.
  e.lr_schedule = LrScheduleConfig();
  e.lr_schedule.type = LrScheduleType::kConstant;
  e.lr_schedule.max_lr = e.optimizer.lr;
  if (c.has_scheduler()) read_scheduler(c.scheduler(), e.optimizer.lr, check, &e.lr_schedule);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Step 3: DeepSpeed's batch-size rule.

BatchSizes derive_batch_sizes(std::optional<long> train_batch_size,
                              std::optional<long> micro_batch_per_rank,
                              std::optional<long> gradient_accumulation_steps, int world_size,
                              const std::string& origin) {
  if (world_size < 1) {
    config_error("world size must be at least 1, got " + std::to_string(world_size));
  }
  const Checker check(origin);
  if (train_batch_size) check.integer("train_batch_size", *train_batch_size, 1, kMaxInt64);
  if (micro_batch_per_rank) {
    check.integer("train_micro_batch_size_per_gpu", *micro_batch_per_rank, 1, kMaxInt64);
  }
  if (gradient_accumulation_steps) {
    check.integer("gradient_accumulation_steps", *gradient_accumulation_steps, 1, kMaxInt);
  }

  const long world = world_size;
  const auto product = [&](long a, long b) {
    long p = 0;
    if (__builtin_mul_overflow(a, b, &p)) {
      config_error("batch sizes in " + origin + " overflow: " + std::to_string(a) + " * " +
                   std::to_string(b));
    }
    return p;
  };
  const std::string micro_text = "train_micro_batch_size_per_gpu ";
  const std::string steps_text = "gradient_accumulation_steps ";
  const std::string world_text = "world size " + std::to_string(world);
  BatchSizes b;
  if (train_batch_size && micro_batch_per_rank && gradient_accumulation_steps) {
    const long expected =
        product(product(*micro_batch_per_rank, *gradient_accumulation_steps), world);
    if (*train_batch_size != expected) {
      config_error("batch sizes in " + origin + " do not multiply out: train_batch_size " +
                   std::to_string(*train_batch_size) + " != " + micro_text +
                   std::to_string(*micro_batch_per_rank) + " * " + steps_text +
                   std::to_string(*gradient_accumulation_steps) + " * " + world_text + " = " +
                   std::to_string(expected));
    }
    b = {*train_batch_size, *micro_batch_per_rank, static_cast<int>(*gradient_accumulation_steps)};
  } else if (train_batch_size && (micro_batch_per_rank || gradient_accumulation_steps)) {
    // The given one of the other two, times the world size, must divide train_batch_size.
    const bool micro_given = micro_batch_per_rank.has_value();
    const long other = micro_given ? *micro_batch_per_rank : *gradient_accumulation_steps;
    const long divisor = product(other, world);
    if (*train_batch_size % divisor != 0) {
      config_error("\"train_batch_size\" " + std::to_string(*train_batch_size) + " in " + origin +
                   " is not divisible by " + (micro_given ? micro_text : steps_text) +
                   std::to_string(other) + " * " + world_text + " = " + std::to_string(divisor));
    }
    const long derived = *train_batch_size / divisor;
    if (micro_given && derived > kMaxInt) {
      config_error("batch sizes in " + origin + " give " + std::to_string(derived) +
                   " gradient accumulation steps; at most " + std::to_string(kMaxInt) +
                   " are supported");
    }
    b.train_batch_size = *train_batch_size;
    b.micro_batch_per_rank = micro_given ? *micro_batch_per_rank : derived;
    b.gradient_accumulation_steps =
        static_cast<int>(micro_given ? derived : *gradient_accumulation_steps);
  } else if (micro_batch_per_rank) {
    const long steps = gradient_accumulation_steps.value_or(1);
    b = {product(product(*micro_batch_per_rank, steps), world), *micro_batch_per_rank,
         static_cast<int>(steps)};
  } else if (train_batch_size) {
    if (*train_batch_size % world != 0) {
      config_error("\"train_batch_size\" " + std::to_string(*train_batch_size) + " in " + origin +
                   " is not divisible by " + world_text);
    }
    b = {*train_batch_size, *train_batch_size / world, 1};
  } else {
    config_error(
        "neither \"train_batch_size\" nor \"train_micro_batch_size_per_gpu\" is given in " +
        origin + "; at least one is required");
  }
  return b;
}

bool CommsLoggerConfig::logs(const std::string& op) const {
  return prof_all || std::find(prof_ops.begin(), prof_ops.end(), op) != prof_ops.end();
}

std::string MonitorConfig::log_dir() const {
  if (output_path.empty()) return job_name;
  return output_path.back() == '/' ? output_path + job_name : output_path + "/" + job_name;
}

TrainingConfig parse_training_config(const std::string& text, int world_size,
                                     const std::string& origin, const ConfigContext& context) {
  std::set<std::string> auto_keys;
  config::TrainingConfig message = config_internal::parse_config_text(text, origin, &auto_keys);
  std::vector<std::string> resolved;
  resolve_auto(auto_keys, context, world_size, origin, &message, &resolved);
  return interpret(message, world_size, origin, context, std::move(resolved));
}

TrainingConfig load_training_config(const std::string& path, int world_size,
                                    const ConfigContext& context) {
  // Opened without blocking and checked before a byte is read: a named pipe would block open()
  // until a writer came, and a device such as /dev/zero never ends.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    config_error("cannot open config file " + in_quotes(path) + ": " + std::strerror(errno));
  }
  std::string text;
  std::string problem;
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    problem =
        std::string("cannot stat config file ") + in_quotes(path) + ": " + std::strerror(errno);
  } else if (!S_ISREG(info.st_mode)) {
    problem = "config file " + in_quotes(path) + " is not a regular file";
  } else {
    // One byte past the cap tells a file at the cap from a longer one (a file that grows while
    // read, or one of /proc whose size says 0, included).
    text.resize(kMaxConfigBytes + 1);
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        problem = "cannot read config file " + in_quotes(path) + ": " + std::strerror(errno);
        break;
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    text.resize(done);
    if (problem.empty() && done > kMaxConfigBytes) {
      problem = "config file " + in_quotes(path) + " is larger than " +
                std::to_string(kMaxConfigBytes >> 20) + " MiB (" + std::to_string(kMaxConfigBytes) +
                " bytes), the most a config may hold";
    }
  }
  ::close(fd);  // read-only: nothing to lose on a failing close
  if (!problem.empty()) config_error(problem);
  return parse_training_config(text, world_size, path, context);
}

}  // namespace zero
