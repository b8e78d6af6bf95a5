// The training config: DeepSpeed-style files map onto EngineConfig as config.h documents (the
// bad inputs are in config_errors_test.cpp, "auto" in config_auto_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "tests/runtime/config_test_util.h"
#include "zero/optimizer/loss_scaler.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/config.h"

namespace zero {
namespace {

TEST(Config, DeepSpeedStage3Bf16File) {
  const TrainingConfig c = load_training_config(example_config("ds_stage3_bf16.json"), 2);
  EXPECT_EQ(c.origin, example_config("ds_stage3_bf16.json"));
  EXPECT_EQ(c.train_batch_size, 24);  // 6 per micro-batch * 2 steps * 2 ranks
  EXPECT_EQ(c.micro_batch_per_rank, 6);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.steps_per_print, 5);

  const EngineConfig& e = c.engine;
  EXPECT_EQ(e.stage, 3);
  EXPECT_EQ(e.micro_batches, 2);
  EXPECT_FLOAT_EQ(e.gradient_clipping, 1.0f);
  EXPECT_EQ(e.precision.dtype, DType::kBFloat16);
  EXPECT_TRUE(e.precision.reduce_in_fp32);
  EXPECT_FLOAT_EQ(e.precision.gradient_predivide_factor, 1.0f);
  EXPECT_TRUE(e.schedule.overlap_comm);
  EXPECT_TRUE(e.schedule.reduce_scatter);
  // Buckets are elements per collective; they never merge units (merge_bytes is ours).
  EXPECT_EQ(e.schedule.reduce_bucket_elements, 20000u);
  EXPECT_EQ(e.schedule.allgather_bucket_elements, 50000u);
  EXPECT_EQ(e.schedule.merge_bytes, EngineConfig().schedule.merge_bytes);
  EXPECT_EQ(e.schedule.prefetch_elements, 40000u);
  EXPECT_EQ(e.schedule.persistence_threshold, 1000u);
  EXPECT_EQ(e.schedule.max_live_elements, 100000u);
  EXPECT_EQ(e.schedule.max_reuse_distance, 100000u);
  EXPECT_EQ(e.seed, EngineConfig().seed);

  EXPECT_EQ(e.optimizer.type, OptimizerType::kAdamW);
  EXPECT_FLOAT_EQ(e.optimizer.lr, 1e-3f);
  EXPECT_DOUBLE_EQ(e.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(e.optimizer.beta2, 0.95);
  EXPECT_FLOAT_EQ(e.optimizer.eps, 1e-8f);
  EXPECT_FLOAT_EQ(e.optimizer.weight_decay, 0.01f);

  EXPECT_EQ(e.lr_schedule.type, LrScheduleType::kWarmupCosine);
  EXPECT_FLOAT_EQ(e.lr_schedule.max_lr, 1e-3f);  // WarmupCosineLR scales the optimizer's lr
  EXPECT_FLOAT_EQ(e.lr_schedule.min_lr, 1e-4f);  // warmup_min_ratio 0.1
  EXPECT_EQ(e.lr_schedule.warmup_steps, 5);
  EXPECT_EQ(e.lr_schedule.total_steps, 100);
  EXPECT_FLOAT_EQ(e.lr_schedule.cos_min_ratio, 0.1f);
  expect_engine_accepts(e);
}

TEST(Config, DeepSpeedStage2Fp16File) {
  const TrainingConfig c = load_training_config(example_config("ds_stage2_fp16.json"), 4);
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_EQ(c.micro_batch_per_rank, 6);  // 24 / (1 step * 4 ranks)
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.steps_per_print, 10);

  const EngineConfig& e = c.engine;
  EXPECT_EQ(e.stage, 2);
  EXPECT_EQ(e.precision.dtype, DType::kFloat16);
  EXPECT_FALSE(e.precision.reduce_in_fp32);
  EXPECT_EQ(e.schedule.reduce_bucket_elements, 20000u);
  EXPECT_EQ(e.schedule.allgather_bucket_elements, 20000u);
  EXPECT_EQ(e.schedule.merge_bytes, EngineConfig().schedule.merge_bytes);
  EXPECT_FLOAT_EQ(e.precision.loss_scaler.static_scale, 0.0f);
  EXPECT_EQ(e.precision.loss_scaler.initial_scale_power, 12);
  EXPECT_EQ(e.precision.loss_scaler.scale_window, 500);
  EXPECT_EQ(e.precision.loss_scaler.hysteresis, 2);
  EXPECT_FLOAT_EQ(e.precision.loss_scaler.min_scale, 1.0f);
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
  EXPECT_EQ(e.optimizer.type, OptimizerType::kAdamW);
  EXPECT_FLOAT_EQ(e.optimizer.weight_decay, 0.0f);
  EXPECT_DOUBLE_EQ(e.optimizer.beta2, 0.999);
  EXPECT_EQ(e.lr_schedule.type, LrScheduleType::kWarmup);
  EXPECT_FLOAT_EQ(e.lr_schedule.min_lr, 0.0f);
  EXPECT_FLOAT_EQ(e.lr_schedule.max_lr, 1e-3f);
  EXPECT_EQ(e.lr_schedule.warmup_steps, 5);
  expect_engine_accepts(e);
}

// The stage-3 example written in protobuf text format gives the same config.
TEST(Config, TextFormatMatchesJson) {
  const std::string text = R"(
    # ZeRO stage 3 in bf16, as examples/configs/ds_stage3_bf16.json
    train_micro_batch_size_per_gpu: 6
    gradient_accumulation_steps: 2
    gradient_clipping: 1.0
    steps_per_print: 5
    bf16 { enabled: true }
    zero_optimization {
      stage: 3 overlap_comm: true contiguous_gradients: true reduce_scatter: true
      reduce_bucket_size: 20000 allgather_bucket_size: 50000
      stage3_prefetch_bucket_size: 40000 stage3_param_persistence_threshold: 1000
      stage3_max_live_parameters: 100000 stage3_max_reuse_distance: 100000
    }
    optimizer {
      type: "AdamW"
      params { lr: 1e-3 betas: [0.9, 0.95] eps: 1e-8 weight_decay: 0.01 }
    }
    scheduler {
      type: "WarmupCosineLR"
      params { total_num_steps: 100 warmup_num_steps: 5 warmup_min_ratio: 0.1 cos_min_ratio: 0.1 }
    }
    communication_data_type: "fp32"
  )";
  const TrainingConfig t = parse_training_config(text, 2, "ds.txt");
  const TrainingConfig j = load_training_config(example_config("ds_stage3_bf16.json"), 2);
  EXPECT_EQ(t.train_batch_size, j.train_batch_size);
  EXPECT_EQ(t.micro_batch_per_rank, j.micro_batch_per_rank);
  EXPECT_EQ(t.gradient_accumulation_steps, j.gradient_accumulation_steps);
  EXPECT_EQ(t.steps_per_print, j.steps_per_print);
  const EngineConfig& a = t.engine;
  const EngineConfig& b = j.engine;
  EXPECT_EQ(a.stage, b.stage);
  EXPECT_EQ(a.micro_batches, b.micro_batches);
  EXPECT_EQ(a.gradient_clipping, b.gradient_clipping);
  EXPECT_EQ(a.precision.dtype, b.precision.dtype);
  EXPECT_EQ(a.precision.reduce_in_fp32, b.precision.reduce_in_fp32);
  EXPECT_EQ(a.schedule.reduce_bucket_elements, b.schedule.reduce_bucket_elements);
  EXPECT_EQ(a.schedule.allgather_bucket_elements, b.schedule.allgather_bucket_elements);
  EXPECT_EQ(a.schedule.prefetch_elements, b.schedule.prefetch_elements);
  EXPECT_EQ(a.schedule.persistence_threshold, b.schedule.persistence_threshold);
  EXPECT_EQ(a.schedule.max_live_elements, b.schedule.max_live_elements);
  EXPECT_EQ(a.schedule.max_reuse_distance, b.schedule.max_reuse_distance);
  EXPECT_EQ(a.optimizer.type, b.optimizer.type);
  EXPECT_EQ(a.optimizer.lr, b.optimizer.lr);
  EXPECT_EQ(a.optimizer.beta1, b.optimizer.beta1);
  EXPECT_EQ(a.optimizer.beta2, b.optimizer.beta2);
  EXPECT_EQ(a.optimizer.eps, b.optimizer.eps);
  EXPECT_EQ(a.optimizer.weight_decay, b.optimizer.weight_decay);
  EXPECT_EQ(a.lr_schedule.type, b.lr_schedule.type);
  EXPECT_EQ(a.lr_schedule.min_lr, b.lr_schedule.min_lr);
  EXPECT_EQ(a.lr_schedule.max_lr, b.lr_schedule.max_lr);
  EXPECT_EQ(a.lr_schedule.warmup_steps, b.lr_schedule.warmup_steps);
  EXPECT_EQ(a.lr_schedule.total_steps, b.lr_schedule.total_steps);
  EXPECT_EQ(a.lr_schedule.cos_min_ratio, b.lr_schedule.cos_min_ratio);
}

TEST(Config, IntegerKeysAcceptExponentNotation) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 1.6e1, "bf16": {"enabled": true},
          "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8,
                                "allgather_bucket_size": 5E8}})",
      2, "ds.json");
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.micro_batch_per_rank, 8);
  EXPECT_EQ(c.engine.schedule.reduce_bucket_elements, 500000000u);
  EXPECT_EQ(c.engine.schedule.allgather_bucket_elements, 500000000u);
  EXPECT_EQ(c.engine.schedule.merge_bytes, EngineConfig().schedule.merge_bytes);
}

// DeepSpeed's MiCS key: absent is off (-1), a value reaches the engine as it is (the engine
// checks it against the world: runtime_hybrid_test).
TEST(Config, MicsShardSizeReachesTheEngine) {
  EXPECT_EQ(
      parse_training_config(R"({"train_batch_size": 8})", 4, "ds.json").engine.grid.mics_shard_size,
      -1);
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 2}})", 4,
      "ds.json");
  EXPECT_EQ(c.engine.grid.mics_shard_size, 2);
}

// ZeRO++'s keys at their off values are accepted at any stage, as DeepSpeed's defaults; qwZ
// and qgZ at stage 3 reach the engine.
TEST(Config, ZeroPlusPlusKeysReachTheEngine) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
          "zero_quantized_weights": false, "zero_quantized_gradients": false,
          "zero_hpz_partition_size": 1}})",
      4, "ds.json");
  EXPECT_EQ(c.engine.stage, 1);
  EXPECT_FALSE(c.engine.precision.quantized_weights);
  const TrainingConfig qwz = parse_training_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "zero_quantized_weights": true}})",
      4, "ds.json");
  EXPECT_TRUE(qwz.engine.precision.quantized_weights);
  EXPECT_FALSE(qwz.engine.precision.quantized_gradients);
  const TrainingConfig qgz = parse_training_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "zero_quantized_gradients": true}})",
      4, "ds.json");
  EXPECT_TRUE(qgz.engine.precision.quantized_gradients);
  EXPECT_EQ(c.engine.grid.hpz_partition_size, 1);
  const TrainingConfig hpz = parse_training_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "zero_hpz_partition_size": 2}})",
      4, "ds.json");
  EXPECT_EQ(hpz.engine.grid.hpz_partition_size, 2);
}

// tensor_parallel.tp_size (or DeepSpeed's training name autotp_size): the batch keys then count
// the data-parallel ranks, world / tp.
TEST(Config, TensorParallelSizeCutsTheBatchOverDataParallelRanks) {
  const TrainingConfig none = parse_training_config(R"({"train_batch_size": 8})", 4, "ds.json");
  EXPECT_EQ(none.tensor_parallel_size, 1);
  EXPECT_EQ(none.micro_batch_per_rank, 2);
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 2}})", 4, "ds.json");
  EXPECT_EQ(c.tensor_parallel_size, 2);
  EXPECT_EQ(c.micro_batch_per_rank, 4);  // 2 data-parallel ranks
  const TrainingConfig autotp = parse_training_config(
      R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 4}})", 4,
      "ds.json");
  EXPECT_EQ(autotp.tensor_parallel_size, 4);
  EXPECT_EQ(autotp.train_batch_size, 1);  // one data-parallel rank
}

// DeepSpeed's pipeline section: the batch keys count one stage's data-parallel ranks, world /
// (stages x tp); the caller's stages (zero-train --pp) override the file's and fill "auto".
TEST(Config, PipelineStagesCutTheBatchOverOneStagesRanks) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "pipeline": {"stages": 2, "partition": "uniform"}})", 4,
      "ds.json");
  EXPECT_EQ(c.pipeline_stages, 2);
  EXPECT_EQ(c.pipeline_partition, "uniform");
  EXPECT_EQ(c.micro_batch_per_rank, 4);  // 2 data-parallel ranks per stage
  const TrainingConfig with_tp = parse_training_config(
      R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 2}, "pipeline": {"stages": 2}})", 4,
      "ds.json");
  EXPECT_EQ(with_tp.micro_batch_per_rank, 8);  // 1 data-parallel rank
  EXPECT_EQ(with_tp.pipeline_partition, "parameters");
  ConfigContext flags;
  flags.pipeline_stages = 4;
  const TrainingConfig automatic = parse_training_config(
      R"({"train_batch_size": 8, "pipeline": {"stages": "auto"}})", 4, "ds.json", flags);
  EXPECT_EQ(automatic.pipeline_stages, 4);
  EXPECT_EQ(automatic.micro_batch_per_rank, 8);
  const TrainingConfig no_flag = parse_training_config(
      R"({"train_batch_size": 8, "pipeline": {"stages": "auto"}})", 4, "ds.json");
  EXPECT_EQ(no_flag.pipeline_stages, 1);
  // activation_checkpoint_interval 1: every block recomputes; seed_layers changes nothing here,
  // and says so. The partitioned-tensor keys are DeepSpeed's, true unless given false.
  const TrainingConfig interval = parse_training_config(
      R"({"train_batch_size": 8, "pipeline": {"stages": 2, "activation_checkpoint_interval": 1,
          "pipe_partitioned": false, "seed_layers": true}})",
      4, "ds.json");
  EXPECT_EQ(interval.activation_checkpointing.mode, "full");
  EXPECT_FALSE(interval.pipeline_partition_activations);
  EXPECT_TRUE(interval.pipeline_partition_gradients);
  ASSERT_EQ(interval.ignored_keys.size(), 1u);
  EXPECT_NE(interval.ignored_keys[0].find("seed_layers is ignored"), std::string::npos);
  EXPECT_TRUE(automatic.pipeline_partition_activations);
  EXPECT_TRUE(automatic.pipeline_partition_gradients);
  const TrainingConfig gradients_whole = parse_training_config(
      R"({"train_batch_size": 8, "pipeline": {"stages": 2, "grad_partitioned": false}})", 4,
      "ds.json");
  EXPECT_TRUE(gradients_whole.pipeline_partition_activations);
  EXPECT_FALSE(gradients_whole.pipeline_partition_gradients);
}

TEST(Config, PipelineValuesThatCannotBeAreErrors) {
  EXPECT_NE(
      error_of(R"({"train_batch_size": 8, "pipeline": {"stages": 3}})", 4).find("pipeline.stages"),
      std::string::npos);
  EXPECT_NE(
      error_of(R"({"train_batch_size": 8, "pipeline": {"stages": 2, "partition": "best"}})", 4)
          .find("parameters, uniform, flops or type:REGEX"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"train_batch_size": 8,
                        "pipeline": {"stages": 2, "activation_checkpoint_interval": 2}})",
                     4)
                .find("groups of several blocks are not built"),
            std::string::npos);
}

TEST(Config, AbsentKeysTakeTheDocumentedDefaults) {
  const TrainingConfig c = parse_training_config(R"({"train_batch_size": 8})", 2, "ds.json");
  const EngineConfig defaults;
  const EngineConfig& e = c.engine;
  EXPECT_EQ(c.micro_batch_per_rank, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(e.stage, 0);  // DeepSpeed: no zero_optimization section, no sharding
  EXPECT_EQ(e.precision.dtype, DType::kFloat32);
  EXPECT_FALSE(e.precision.reduce_in_fp32);
  EXPECT_EQ(e.gradient_clipping, 0.0f);
  EXPECT_EQ(e.schedule.merge_bytes, defaults.schedule.merge_bytes);
  EXPECT_EQ(e.schedule.overlap_comm, defaults.schedule.overlap_comm);
  EXPECT_EQ(e.schedule.reduce_scatter, defaults.schedule.reduce_scatter);
  EXPECT_EQ(e.schedule.prefetch_elements, 0u);  // EngineConfig's 0 = off, not DeepSpeed's 5e7
  EXPECT_EQ(e.schedule.persistence_threshold, 0u);
  EXPECT_EQ(e.schedule.max_live_elements, 0u);
  EXPECT_EQ(e.schedule.max_reuse_distance, 0u);
  EXPECT_EQ(e.schedule.reduce_bucket_elements, 0u);
  EXPECT_EQ(e.schedule.allgather_bucket_elements, 0u);
  EXPECT_EQ(e.schedule.optimizer_sub_group_elements, 1000000000u);  // DeepSpeed's 1e9
  EXPECT_EQ(e.offload.optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(e.offload.param.device, OffloadDevice::kNone);
  EXPECT_FALSE(e.precision.grad_accum_dtype.has_value());
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.gather_16bit_weights_on_model_save);
  EXPECT_FALSE(c.override_optimizer);
  EXPECT_TRUE(c.resolved_auto.empty());
  EXPECT_TRUE(c.ignored_keys.empty());
  EXPECT_EQ(e.optimizer.type, defaults.optimizer.type);
  EXPECT_EQ(e.optimizer.lr, defaults.optimizer.lr);
  EXPECT_EQ(e.optimizer.weight_decay, defaults.optimizer.weight_decay);
  EXPECT_EQ(e.lr_schedule.type, LrScheduleType::kConstant);
  EXPECT_EQ(e.lr_schedule.max_lr, e.optimizer.lr);
  EXPECT_EQ(e.precision.loss_scaler.initial_scale_power, 16);
  EXPECT_EQ(e.precision.loss_scaler.scale_window, 1000);
  EXPECT_EQ(e.seed, defaults.seed);
}

TEST(Config, OptimizerTypesAndDefaults) {
  const auto optimizer_of = [](const std::string& optimizer) {
    return parse_training_config(R"({"train_batch_size": 8, "optimizer": )" + optimizer + "}", 2,
                                 "ds.json")
        .engine.optimizer;
  };
  // Params absent: DeepSpeed's FusedAdam defaults (weight_decay 0, not EngineConfig's).
  const OptimizerConfig adam = optimizer_of(R"({"type": "adam"})");
  EXPECT_EQ(adam.type, OptimizerType::kAdamW);
  EXPECT_FLOAT_EQ(adam.lr, 1e-3f);
  EXPECT_DOUBLE_EQ(adam.beta1, 0.9);
  EXPECT_DOUBLE_EQ(adam.beta2, 0.999);
  EXPECT_FLOAT_EQ(adam.eps, 1e-8f);
  EXPECT_EQ(adam.weight_decay, 0.0f);
  EXPECT_EQ(optimizer_of(R"({"type": "ADAMW"})").type, OptimizerType::kAdamW);
  EXPECT_EQ(optimizer_of(R"({"type": "Adam", "params": {"adam_w_mode": false}})").type,
            OptimizerType::kAdam);
  EXPECT_EQ(optimizer_of(R"({"type": "Adam", "params": {"adam_w_mode": true}})").type,
            OptimizerType::kAdamW);
  const OptimizerConfig sgd = optimizer_of(
      R"({"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}})");
  EXPECT_EQ(sgd.type, OptimizerType::kSgd);
  EXPECT_FLOAT_EQ(sgd.lr, 0.1f);
  EXPECT_FLOAT_EQ(sgd.momentum, 0.9f);
  EXPECT_FLOAT_EQ(sgd.weight_decay, 1e-4f);
}

TEST(Config, SchedulersMapOntoLrScheduleConfig) {
  const auto schedule_of = [](const std::string& scheduler) {
    return parse_training_config(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                                     "params": {"lr": 0.002}}, "scheduler": )" +
                                     scheduler + "}",
                                 2, "ds.json")
        .engine.lr_schedule;
  };
  const LrScheduleConfig warmup = schedule_of(R"({"type": "WarmupLR"})");  // DeepSpeed's defaults
  EXPECT_EQ(warmup.type, LrScheduleType::kWarmup);
  EXPECT_EQ(warmup.min_lr, 0.0f);
  EXPECT_FLOAT_EQ(warmup.max_lr, 1e-3f);
  EXPECT_EQ(warmup.warmup_steps, 1000);
  EXPECT_EQ(warmup.warmup_type, LrWarmupType::kLog);  // DeepSpeed's default

  const LrScheduleConfig decay = schedule_of(R"({"type": "WarmupDecayLR", "params":
      {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 10,
       "total_num_steps": 200}})");
  EXPECT_EQ(decay.type, LrScheduleType::kWarmupLinearDecay);
  EXPECT_FLOAT_EQ(decay.min_lr, 1e-5f);
  EXPECT_FLOAT_EQ(decay.max_lr, 3e-4f);
  EXPECT_EQ(decay.warmup_steps, 10);
  EXPECT_EQ(decay.total_steps, 200);
  EXPECT_EQ(decay.warmup_type, LrWarmupType::kLog);
  EXPECT_EQ(schedule_of(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 2000,
                           "warmup_type": "linear"}})")
                .warmup_type,
            LrWarmupType::kLinear);
  EXPECT_EQ(schedule_of(R"({"type": "WarmupLR", "params": {"warmup_type": "log"}})").warmup_type,
            LrWarmupType::kLog);

  const LrScheduleConfig cosine = schedule_of(
      R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "warmup_num_steps": 5}})");
  EXPECT_EQ(cosine.type, LrScheduleType::kWarmupCosine);
  EXPECT_FLOAT_EQ(cosine.max_lr, 0.002f);  // the optimizer's lr
  EXPECT_EQ(cosine.min_lr, 0.0f);          // warmup_min_ratio 0
  EXPECT_FLOAT_EQ(cosine.cos_min_ratio, 1e-4f);
  EXPECT_EQ(cosine.warmup_steps, 5);
  EXPECT_EQ(cosine.total_steps, 50);
  EXPECT_EQ(cosine.warmup_type, LrWarmupType::kLog);  // WarmupCosineLR's default is log too
  // DeepSpeed's default warm-up (1000 steps) is checked like a written one, and said to be it.
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
                         "params": {"total_num_steps": 50}}})"),
            "\"scheduler.params.warmup_num_steps\" (1000, the default) exceeds "
            "\"scheduler.params.total_num_steps\" (50) in ds.json");
}

// Keys honoured here, and keys accepted because ignoring them cannot change a result, each of
// the latter named once with why.
TEST(Config, HonouredAndIgnoredKeys) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "bf16": {"enabled": true}, "wall_clock_breakdown": true,
          "memory_breakdown": true, "zero_allow_untested_optimizer": true,
          "data_types": {"grad_accum_dtype": "bf16"}, "checkpoint": {"override_optimizer": true},
          "zero_optimization": {"stage": 2, "sub_group_size": 1000, "round_robin_gradients": false,
                                "stage3_gather_16bit_weights_on_model_save": true}})",
      2, "ds.json");
  EXPECT_TRUE(c.wall_clock_breakdown);
  EXPECT_TRUE(c.override_optimizer);
  EXPECT_TRUE(c.gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.engine.precision.grad_accum_dtype, DType::kBFloat16);
  EXPECT_EQ(c.engine.schedule.optimizer_sub_group_elements, 1000u);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{
                "memory_breakdown is ignored: the memory summary by category is printed at start "
                "anyway",
                "zero_allow_untested_optimizer is ignored: every optimizer here is built into the "
                "engine and runs at every stage",
                "zero_optimization.round_robin_gradients is ignored: it orders gradient copies to "
                "a GPU run's host-side optimizer, which the CPU path does not make; results are "
                "the same"}));
  const EngineConfig fp32 =
      parse_training_config(
          R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "fp32"}})", 2, "ds.json")
          .engine;
  EXPECT_EQ(fp32.precision.grad_accum_dtype, DType::kFloat32);
}

// DeepSpeed's activation_checkpointing section as a Megatron-DeepSpeed user writes it, with our
// mode; absent, nothing is recomputed.
TEST(Config, ActivationCheckpointing) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "activation_checkpointing": {"mode": "selective",
          "number_checkpoints": 4, "partition_activations": false, "cpu_checkpointing": false,
          "contiguous_memory_optimization": false, "synchronize_checkpoint_boundary": false,
          "profile": false}})",
      2, "ds.json");
  EXPECT_EQ(c.activation_checkpointing.mode, "selective");
  EXPECT_EQ(c.activation_checkpointing.number_checkpoints, 4);
  EXPECT_TRUE(c.activation_checkpointing.number_checkpoints_given);
  EXPECT_FALSE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_FALSE(c.activation_checkpointing.contiguous_memory_optimization);
  EXPECT_FALSE(c.activation_checkpointing.profile);
  EXPECT_FALSE(c.activation_checkpointing.partition_activations);
  EXPECT_FALSE(c.activation_checkpointing.synchronize_checkpoint_boundary);
  EXPECT_TRUE(c.ignored_keys.empty());
  const TrainingConfig absent = parse_training_config(R"({"train_batch_size": 8})", 2, "ds.json");
  EXPECT_EQ(absent.activation_checkpointing.mode, "none");
  EXPECT_FALSE(absent.activation_checkpointing.number_checkpoints_given);
  EXPECT_FALSE(absent.activation_checkpointing.contiguous_memory_optimization);
  EXPECT_FALSE(absent.activation_checkpointing.profile);
  EXPECT_FALSE(absent.activation_checkpointing.partition_activations);
  EXPECT_EQ(absent.activation_checkpointing.nvme_path, "");
  const TrainingConfig all = parse_training_config(
      R"({"train_batch_size": 8, "activation_checkpointing": {"mode": "full",
          "cpu_checkpointing": true, "contiguous_memory_optimization": true, "profile": true,
          "partition_activations": true, "synchronize_checkpoint_boundary": true,
          "nvme_path": "/local_nvme"}})",
      2, "ds.json");
  EXPECT_TRUE(all.activation_checkpointing.synchronize_checkpoint_boundary);
  EXPECT_EQ(all.activation_checkpointing.nvme_path, "/local_nvme");
  EXPECT_TRUE(all.activation_checkpointing.partition_activations);
  EXPECT_TRUE(all.activation_checkpointing.cpu_checkpointing);
  EXPECT_TRUE(all.activation_checkpointing.contiguous_memory_optimization);
  EXPECT_TRUE(all.activation_checkpointing.profile);
}

TEST(Config, CommunicationDataType) {
  const auto engine_of = [](const std::string& extra) {
    return parse_training_config(R"({"train_batch_size": 8, )" + extra + "}", 2, "ds.json").engine;
  };
  EXPECT_TRUE(engine_of(R"("bf16": {"enabled": true}, "communication_data_type": "fp32")")
                  .precision.reduce_in_fp32);
  EXPECT_FALSE(engine_of(R"("bf16": {"enabled": true}, "communication_data_type": "bf16")")
                   .precision.reduce_in_fp32);
  EXPECT_FALSE(engine_of(R"("communication_data_type": "fp32")").precision.reduce_in_fp32);
  EXPECT_FLOAT_EQ(
      engine_of(R"("gradient_predivide_factor": 4)").precision.gradient_predivide_factor, 4.0f);
}

TEST(Config, NonFiniteGradientPolicy) {
  const auto engine_of = [](const std::string& extra) {
    return parse_training_config(R"({"train_batch_size": 8)" + extra + "}", 2, "ds.json").engine;
  };
  EXPECT_FALSE(engine_of("").precision.skip_nonfinite_steps);
  EXPECT_FALSE(engine_of(R"(, "nonfinite_gradients": "error")").precision.skip_nonfinite_steps);
  EXPECT_TRUE(engine_of(R"(, "nonfinite_gradients": "skip")").precision.skip_nonfinite_steps);
  EXPECT_FALSE(engine_of("").desync_check);
  EXPECT_TRUE(engine_of(R"(, "debug": {"collectives": true})").desync_check);
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "nonfinite_gradients": "ignore"})"),
            "\"nonfinite_gradients\" in ds.json must be \"error\" or \"skip\", got \"ignore\"");
}

TEST(Config, JsonCommentsAreAllowed) {
  // DeepSpeed reads its file with hjson, so commented files exist in the wild.
  const TrainingConfig c = parse_training_config(
      "{\n  // batch for 2 ranks\n  \"train_batch_size\": 8 /* samples */\n}", 2, "ds.json");
  EXPECT_EQ(c.train_batch_size, 8);
}

TEST(Config, BatchSizeDerivation) {
  struct Case {
    std::optional<long> train, micro, steps;
    int world;
    long want_train, want_micro;
    int want_steps;
  };
  const Case cases[] = {
      {32, 2, 4, 4, 32, 2, 4},                        // all three, consistent
      {32, 2, std::nullopt, 4, 32, 2, 4},             // steps derived
      {32, std::nullopt, 4, 4, 32, 2, 4},             // micro-batch derived
      {std::nullopt, 2, 4, 4, 32, 2, 4},              // total derived
      {std::nullopt, 3, std::nullopt, 3, 9, 3, 1},    // micro alone: one step
      {12, std::nullopt, std::nullopt, 3, 12, 4, 1},  // total alone: one step
      {24, 6, std::nullopt, 1, 24, 6, 4},
  };
  for (const Case& c : cases) {
    const BatchSizes b = derive_batch_sizes(c.train, c.micro, c.steps, c.world, "flags");
    EXPECT_EQ(b.train_batch_size, c.want_train);
    EXPECT_EQ(b.micro_batch_per_rank, c.want_micro);
    EXPECT_EQ(b.gradient_accumulation_steps, c.want_steps);
  }
  // The same rule through a file, at a world size that changes the derived value.
  const std::string file = R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3})";
  EXPECT_EQ(parse_training_config(file, 4, "ds.json").gradient_accumulation_steps, 2);
  EXPECT_EQ(parse_training_config(file, 4, "ds.json").engine.micro_batches, 2);
  EXPECT_EQ(parse_training_config(file, 8, "ds.json").gradient_accumulation_steps, 1);
  EXPECT_EQ(error_of(file, 3),
            "\"train_batch_size\" 24 in ds.json is not divisible by "
            "train_micro_batch_size_per_gpu 3 * world size 3 = 9");
}

}  // namespace
}  // namespace zero
