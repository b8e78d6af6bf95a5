// zero-train's config: the config file (or the built-in defaults) with every flag the user gave
// on top, and the run's description that rank 0 prints.
#include <sstream>
#include <string>
#include <vector>

#include "examples/train_flags.h"
#include "zero/core/check.h"

namespace zero::examples {

namespace {

// The run's values where neither a flag nor the config gives one.
constexpr long kDefaultGlobalBatch = 24;
constexpr float kDefaultLr = 1e-3f;
constexpr float kDefaultWeightDecay = 0.0f;

// What "auto" in a config file becomes: the flags, or zero-train's defaults for them (the values
// the run uses when the file does not say), and the MLP's hidden size.
// --global-batch need not divide over ranks and micro-batches (DeepSpeed's train_batch_size
// must): the slices then differ by one sample, weighted by their sizes (see batch_slice). The
// config's batch rule is checked with the batch rounded up to the next multiple, and the run
// then takes the flag's own value.
long divisible_batch(long global, long slices) {
  return global >= slices && global % slices != 0 ? (global / slices + 1) * slices : global;
}

zero::ConfigContext auto_values(const Flags& f, int world_size) {
  zero::ConfigContext c;
  c.train_batch_size =
      f.global_batch ? divisible_batch(*f.global_batch,
                                       static_cast<long>(f.micro_batches.value_or(1)) * world_size)
                     : kDefaultGlobalBatch;
  c.batch_from_caller = f.global_batch.has_value();  // --global-batch overrides the file
  c.gradient_accumulation_steps = f.micro_batches.value_or(1);
  c.gradient_clipping = f.clip.value_or(0.0f);
  c.dtype = f.dtype.value_or(zero::DType::kFloat32);
  c.lr = f.lr.value_or(kDefaultLr);
  c.weight_decay = f.weight_decay.value_or(kDefaultWeightDecay);
  c.warmup_num_steps = f.warmup.value_or(0);
  c.total_num_steps = f.steps;
  c.hidden_size = f.model == "gpt2" ? f.gpt2.n_embd : f.mlp.hidden_dim;
  c.cuda = f.cuda;
  c.source = "zero-train's flags or their defaults";
  if (f.pp) c.pipeline_stages = *f.pp;
  return c;
}

std::string text_of(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// The data-parallel ranks of a tensor-parallel size (--tp over tensor_parallel.tp_size) that the
// world holds; a ConfigError naming the problem otherwise.
int data_parallel_size(int world_size, const zero::TrainingConfig& tc, const Flags& f) {
  const int tp = tc.tensor_parallel_size;
  const int pp = tc.pipeline_stages;
  const std::string source = f.tp ? "--tp" : "tensor_parallel.tp_size in " + tc.origin;
  if (tp > world_size || world_size % tp != 0) {
    throw zero::ConfigError(source + " is " + std::to_string(tp) + " and the job has " +
                            std::to_string(world_size) +
                            " rank(s): they must divide into tensor-parallel groups of that size");
  }
  if (tp > 1 && f.model != "gpt2") {
    throw zero::ConfigError(source + " is " + std::to_string(tp) +
                            ": only --model gpt2 splits its layers over tensor-parallel ranks");
  }
  if (pp > 1 && f.model != "gpt2") {
    throw zero::ConfigError("--pp is " + std::to_string(pp) +
                            ": only --model gpt2 is cut into pipeline stages");
  }
  if (static_cast<long>(tp) * pp > world_size || world_size % (tp * pp) != 0) {
    throw zero::ConfigError("--pp " + std::to_string(pp) + " x " + source + " " +
                            std::to_string(tp) + " does not divide the job's " +
                            std::to_string(world_size) +
                            " rank(s): each pipeline stage takes world / pp ranks, in "
                            "tensor-parallel groups");
  }
  return world_size / (tp * pp);
}

}  // namespace

// The config file (or the built-in defaults), then every flag the user gave on top.
zero::TrainingConfig resolve_config(const Flags& f, int world_size) {
  zero::TrainingConfig tc;
  if (f.pp && world_size % *f.pp != 0) {
    throw zero::ConfigError("--pp is " + std::to_string(*f.pp) + " and the job has " +
                            std::to_string(world_size) +
                            " rank(s): they must divide into pipeline stages of equal size");
  }
  if (!f.config.empty()) {
    tc = zero::load_training_config(f.config, world_size, auto_values(f, world_size));
  } else {
    tc.engine.stage = 3;
    tc.engine.optimizer.lr = kDefaultLr;
    tc.engine.optimizer.weight_decay = kDefaultWeightDecay;
    tc.engine.schedule.merge_bytes = 32 * 1024;
    tc.train_batch_size = kDefaultGlobalBatch;
    tc.steps_per_print = 1;
    tc.origin = "the command line";
  }
  zero::EngineConfig& e = tc.engine;
  if (f.stage) e.stage = *f.stage;
  if (f.dtype) e.precision.dtype = *f.dtype;
  if (f.seed) e.seed = *f.seed;
  if (f.weight_decay) e.optimizer.weight_decay = *f.weight_decay;
  if (f.clip) e.gradient_clipping = *f.clip;
  if (f.merge_bytes) e.schedule.merge_bytes = *f.merge_bytes;
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
  // The batch is cut over the data-parallel ranks: --tp changes how many there are.
  const bool tp_changed = f.tp && *f.tp != tc.tensor_parallel_size;
  if (f.tp) tc.tensor_parallel_size = *f.tp;
  const bool pp_changed = f.pp && *f.pp != tc.pipeline_stages;
  if (f.pp) tc.pipeline_stages = *f.pp;
  if (f.pp_partition) tc.pipeline_partition = *f.pp_partition;
  const int data_parallel = data_parallel_size(world_size, tc, f);
  if (f.global_batch || f.micro_batches || ((tp_changed || pp_changed) && !f.config.empty())) {
    const long global = f.global_batch ? *f.global_batch : tc.train_batch_size;
    const int accumulation = f.micro_batches ? *f.micro_batches : tc.gradient_accumulation_steps;
    const long slices = static_cast<long>(accumulation) * data_parallel;
    zero::BatchSizes b = zero::derive_batch_sizes(
        f.global_batch ? divisible_batch(global, slices) : global, std::nullopt, accumulation,
        data_parallel, "--global-batch/--micro-batches/--tp/--pp");
    b.train_batch_size = global;
    tc.train_batch_size = b.train_batch_size;
    tc.micro_batch_per_rank = b.micro_batch_per_rank;
    tc.gradient_accumulation_steps = b.gradient_accumulation_steps;
  } else if (f.config.empty()) {
    const zero::BatchSizes b =
        zero::derive_batch_sizes(tc.train_batch_size, std::nullopt, 1, data_parallel, tc.origin);
    tc.micro_batch_per_rank = b.micro_batch_per_rank;
    tc.gradient_accumulation_steps = b.gradient_accumulation_steps;
  }
  e.micro_batches = tc.gradient_accumulation_steps;
  e.kernel_threads = f.threads.value_or(1);
  e.memory_limit_bytes = f.memory_limit;
  if (f.skip_nonfinite) e.precision.skip_nonfinite_steps = *f.skip_nonfinite;
  if (f.override_optimizer) tc.override_optimizer = true;
  // The memory timeline finds each allocation's phase among the compute spans (CPU only, as
  // the trace: a GPU's spans would be launch times).
  // So do comms_logger (the collectives' latencies) and flops_profiler (the modules').
  e.trace = !f.trace.empty() ||
            ((!f.memory_timeline.empty() || tc.comms_logger.enabled || tc.flops_profiler.enabled) &&
             !f.cuda);
  zero::ActivationCheckpointingConfig& ac = tc.activation_checkpointing;
  if (f.activation_checkpointing) ac.mode = *f.activation_checkpointing;
  if (f.number_checkpoints) {
    ac.number_checkpoints = *f.number_checkpoints;
    ac.number_checkpoints_given = true;
  }
  if (f.partition_activations) ac.partition_activations = true;
  if (f.checkpoint_nvme_path) ac.nvme_path = *f.checkpoint_nvme_path;
  if (ac.mode != "none" && f.model != "gpt2") {
    throw zero::ConfigError("activation_checkpointing.mode \"" + ac.mode + "\" in " + tc.origin +
                            ": only --model gpt2 recomputes activations");
  }
  if (ac.mode == "none" && ac.number_checkpoints_given) {
    tc.ignored_keys.push_back(
        "activation_checkpointing.number_checkpoints is ignored: no block is checkpointed "
        "(activation_checkpointing.mode or --activation-checkpointing selects selective or "
        "full)");
  }
  if (ac.profile && f.model != "gpt2") {
    throw zero::ConfigError("activation_checkpointing.profile in " + tc.origin +
                            ": only --model gpt2 has blocks to time");
  }
  // The options that act on checkpointed blocks only.
  const std::pair<bool, const char*> block_options[] = {
      {ac.contiguous_memory_optimization, "contiguous_memory_optimization"},
      {ac.synchronize_checkpoint_boundary, "synchronize_checkpoint_boundary"},
      {ac.partition_activations, "partition_activations"}};
  for (const auto& [given, key] : block_options) {
    if (given && ac.mode == "none") {
      tc.ignored_keys.push_back(std::string("activation_checkpointing.") + key +
                                " has no effect: no block is checkpointed");
    }
  }
  // DeepSpeed partitions over the tensor-parallel group whatever its size: over a group of one
  // each rank keeps the whole checkpoint, as without.
  if (ac.partition_activations && ac.mode != "none" && tc.tensor_parallel_size == 1) {
    tc.ignored_keys.push_back(
        "activation_checkpointing.partition_activations has no effect without tensor "
        "parallelism (--tp, tensor_parallel.tp_size): it splits checkpoints over the "
        "tensor-parallel group");
  }
  // DeepSpeed's cpu_checkpointing moves checkpoints from the GPU to pinned host memory.
  if (ac.cpu_checkpointing && ac.contiguous_memory_optimization && f.cuda) {
    throw zero::ConfigError("activation_checkpointing in " + tc.origin +
                            ": cpu_checkpointing with contiguous_memory_optimization on CUDA is "
                            "not built yet; choose one");
  }
  // Ours: the checkpoints spilled to NVMe (models/gpt2_spill.h), the schedule of cpu_checkpointing
  // with a file; the directory itself is checked when the task is made (train_task.cpp).
  if (!ac.nvme_path.empty()) {
    const std::string spill =
        "activation_checkpointing.nvme_path (--checkpoint-nvme-path) in " + tc.origin + ": ";
    if (f.model != "gpt2") {
      throw zero::ConfigError(spill + "only --model gpt2 has activation checkpoints to spill");
    }
    if (ac.mode == "none") {
      throw zero::ConfigError(spill +
                              "no block is checkpointed, so there is nothing to spill "
                              "(--activation-checkpointing selective or full)");
    }
    if (f.cuda) {
      throw zero::ConfigError(spill +
                              "the spill is built on the CPU path only (on CUDA it would need "
                              "pinned staging; cpu_checkpointing moves checkpoints to the host)");
    }
    if (ac.cpu_checkpointing) {
      throw zero::ConfigError(spill + "with cpu_checkpointing is not built; choose one");
    }
    if (ac.contiguous_memory_optimization) {
      throw zero::ConfigError(spill +
                              "with contiguous_memory_optimization is not built (the spill's "
                              "buffer is one allocation already); choose one");
    }
    if (ac.partition_activations && tc.tensor_parallel_size > 1) {
      throw zero::ConfigError(spill + "with partition_activations is not built yet; choose one");
    }
  }
  if (ac.cpu_checkpointing && !f.cuda) {
    tc.ignored_keys.push_back(
        "activation_checkpointing.cpu_checkpointing has no effect here: on the CPU path "
        "checkpoints already live in host memory");
  }
  // Hybrid sharding's groups must divide the data-parallel ranks: checked with the other
  // settings, so every rank stops at once as a config error (exit 2), not in the engine.
  zero::sharding_group_size(tc.engine, data_parallel);
  return tc;
}

std::vector<zero::examples::Setting> run_description(const Flags& f,
                                                     const zero::TrainingConfig& tc) {
  const zero::EngineConfig& e = tc.engine;
  const zero::OptimizerConfig& o = e.optimizer;
  const zero::LrScheduleConfig& s = e.lr_schedule;
  const zero::LossScalerConfig& ls = e.precision.loss_scaler;
  std::ostringstream optimizer, schedule, scaler, zero_opt, model, fault;
  optimizer << static_cast<int>(o.type) << " lr " << o.lr << " betas " << o.beta1 << " " << o.beta2
            << " eps " << o.eps << " weight_decay " << o.weight_decay << " momentum " << o.momentum;
  schedule << static_cast<int>(s.type) << " " << s.min_lr << ".." << s.max_lr << " warmup "
           << s.warmup_steps << " (" << static_cast<int>(s.warmup_type) << ") total "
           << s.total_steps << " cos_min_ratio " << s.cos_min_ratio;
  scaler << ls.static_scale << " 2^" << ls.initial_scale_power << " window " << ls.scale_window
         << " hysteresis " << ls.hysteresis << " min " << ls.min_scale;
  zero_opt << "overlap_comm " << e.schedule.overlap_comm << " reduce_scatter "
           << e.schedule.reduce_scatter << " reduce_bucket " << e.schedule.reduce_bucket_elements
           << " allgather_bucket " << e.schedule.allgather_bucket_elements << " prefetch "
           << e.schedule.prefetch_elements << " persistence " << e.schedule.persistence_threshold
           << " max_live " << e.schedule.max_live_elements << " reuse "
           << e.schedule.max_reuse_distance << " sub_group "
           << e.schedule.optimizer_sub_group_elements << " merge_bytes " << e.schedule.merge_bytes
           << " predivide " << e.precision.gradient_predivide_factor << " fp32_reduce "
           << e.precision.reduce_in_fp32 << " grad_accum "
           << (e.precision.grad_accum_dtype ? zero::dtype_name(*e.precision.grad_accum_dtype)
                                            : "default");
  if (f.model == "gpt2") {
    const zero::models::Gpt2Config& g = f.gpt2;
    model << "gpt2 " << g.n_layer << "x" << g.n_embd << " heads " << g.n_head << " vocab "
          << g.vocab_size << " block " << g.block_size << " seq " << f.seq_len << " decay_all "
          << !g.decay_matrices_only << " data " << f.data << " val " << f.val_data << " every "
          << f.val_every << " x" << f.val_batches.value_or(0) << " init " << f.init_from;
    model << " recompute " << tc.activation_checkpointing.mode << " checkpoints "
          << tc.activation_checkpointing.number_checkpoints << " contiguous "
          << tc.activation_checkpointing.contiguous_memory_optimization << " profile "
          << tc.activation_checkpointing.profile << " partition "
          << tc.activation_checkpointing.partition_activations << " nvme "
          << tc.activation_checkpointing.nvme_path;
  } else {
    model << f.model << " " << f.mlp.input_dim << "-" << f.mlp.hidden_dim << "x" << f.mlp.layers
          << "-" << f.mlp.output_dim;
  }
  fault << static_cast<int>(f.fault.kind) << "@" << f.fault.step;
  return {
      {"the model (--model and its flags)", model.str()},
      {"the ZeRO stage (--stage, zero_optimization.stage)", std::to_string(e.stage)},
      {"the tensor-parallel size (--tp, tensor_parallel.tp_size)",
       std::to_string(tc.tensor_parallel_size)},
      {"the pipeline (--pp, --pp-schedule, --pp-virtual-stages, --pp-partition, "
       "pipeline.pipe_partitioned and grad_partitioned)",
       std::to_string(tc.pipeline_stages) + " " + f.pp_schedule + " x" +
           std::to_string(pipeline_virtual_stages(f)) + " " + tc.pipeline_partition + " regather " +
           std::to_string(f.pp_regather) + " slices " +
           std::to_string(tc.pipeline_partition_activations) +
           std::to_string(tc.pipeline_partition_gradients)},
      {"the dtype (--dtype, bf16/fp16.enabled)", zero::dtype_name(e.precision.dtype)},
      {"--steps", std::to_string(f.steps)},
      {"the global batch (--global-batch, train_batch_size)", std::to_string(tc.train_batch_size)},
      {"the micro-batches (--micro-batches, gradient_accumulation_steps)",
       std::to_string(tc.gradient_accumulation_steps)},
      {"the seed (--seed, seed)", std::to_string(e.seed)},
      {"the optimizer (--lr, --weight-decay, optimizer)", optimizer.str()},
      {"the learning-rate schedule (--schedule, --warmup, scheduler)", schedule.str()},
      {"the gradient clipping (--clip, gradient_clipping)", text_of(e.gradient_clipping)},
      {"the fp16 loss scaler (fp16.*)", scaler.str()},
      {"the non-finite policy (--nonfinite)", std::to_string(e.precision.skip_nonfinite_steps)},
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

}  // namespace zero::examples
