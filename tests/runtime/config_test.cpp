// The training config: DeepSpeed-style files map onto EngineConfig as config.h documents, and
// every bad input is rejected with a message that names the key (asserted word for word).
#include "zero/runtime/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "zero/optimizer/loss_scaler.h"
#include "zero/optimizer/optimizer.h"

namespace zero {
namespace {

std::string example_config(const std::string& name) {
  return std::string(ZERO_SOURCE_DIR) + "/examples/configs/" + name;
}

// The ConfigError message of parsing `text`, or a marker that makes the comparison fail.
std::string error_of(const std::string& text, int world_size = 2,
                     const std::string& origin = "ds.json", const ConfigContext& context = {}) {
  try {
    parse_training_config(text, world_size, origin, context);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(parsed without an error)";
}

struct BadConfig {
  const char* text;
  const char* message;
};

// Each entry is one bad input at 2 ranks, origin "ds.json", and the exact message it gets.
const std::vector<BadConfig>& bad_configs() {
  static const std::vector<BadConfig> cases = {
      // Unknown keys: the full path, and the closest valid key.
      {R"({"train_batch_size": 8, "zero_optimization": {"stgae": 3}})",
       R"(unknown key "zero_optimization.stgae" in ds.json; did you mean "stage"?)"},
      {R"({"train_batch_sise": 8})",
       R"(unknown key "train_batch_sise" in ds.json; did you mean "train_batch_size"?)"},
      {R"({"train_batch_size": 8, "stage": 2})",
       R"(unknown key "stage" in ds.json; did you mean "zero_optimization.stage"?)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"learning_rate": 1}}})",
       R"(unknown key "optimizer.params.learning_rate" in ds.json; valid keys here: lr, betas, )"
       R"(eps, weight_decay, momentum, adam_w_mode)"},
      {R"({"train_batch_size": 8, "fp16": {"bananas": 1}})",
       R"(unknown key "fp16.bananas" in ds.json; valid keys here: enabled, loss_scale, )"
       R"(initial_scale_power, loss_scale_window, hysteresis, min_loss_scale)"},
      // DeepSpeed keys we lack say so instead of calling them typos.
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "cpu"}}})",
       R"("zero_optimization.offload_optimizer" in ds.json is a DeepSpeed option this runtime )"
       R"(does not support yet)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"offload_param": {"device": "cpu"}}})",
       R"("zero_optimization.offload_param" in ds.json is a DeepSpeed option this runtime does )"
       R"(not support yet)"},
      {R"({"train_batch_size": 8, "checkpoint": {"tag_validation": "Warn"}})",
       R"("checkpoint.tag_validation" in ds.json is a DeepSpeed option this runtime does not )"
       R"(support yet)"},
      {R"({"train_batch_size": 8, "autotuning": {}})",
       R"("autotuning" in ds.json is a DeepSpeed option this runtime does not support yet)"},
      // activation_checkpointing: the options that are not built say so when true.
      {R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true}})",
       R"("activation_checkpointing" in ds.json: partition_activations splits checkpoints over )"
       R"(tensor-parallel ranks, and this runtime has no tensor parallelism; set it to false or )"
       R"(leave it out)"},
      {R"({"train_batch_size": 8, "activation_checkpointing": {"cpu_checkpointing": true}})",
       R"("activation_checkpointing" in ds.json: cpu_checkpointing (checkpoints in pinned host )"
       R"(memory, prefetched back) is not built yet; on the CPU checkpoints are in host memory )"
       R"(already; set it to false or leave it out)"},
      {R"({"train_batch_size": 8,
          "activation_checkpointing": {"contiguous_memory_optimization": true}})",
       R"("activation_checkpointing" in ds.json: contiguous_memory_optimization (checkpoints in )"
       R"(one preallocated buffer) is not built yet; set it to false or leave it out)"},
      {R"({"train_batch_size": 8, "activation_checkpointing": {"profile": true}})",
       R"("activation_checkpointing" in ds.json: profile (per-block forward, recompute and )"
       R"(backward times) is not built yet; set it to false or leave it out)"},
      {R"({"train_batch_size": 8, "activation_checkpointing": {"mode": "partial"}})",
       R"("activation_checkpointing.mode" in ds.json must be "none", "selective" or "full", )"
       R"(got "partial")"},
      {R"({"train_batch_size": 8, "activation_checkpointing": {"number_checkpoints": 0}})",
       R"("activation_checkpointing.number_checkpoints" in ds.json must be at least 1, got 0)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"amsgrad": true}}})",
       R"("optimizer.params.amsgrad" in ds.json is a DeepSpeed option this runtime does not )"
       R"(support yet)"},
      // Types.
      {R"({"train_batch_size": 1.5})",
       R"("train_batch_size" in ds.json must be an integer, got 1.5)"},
      // "auto" where nothing resolves it, and where it is not allowed.
      {R"({"train_batch_size": "auto"})",
       R"("train_batch_size" in ds.json is "auto", but the run's global batch size is not )"
       R"(known here; give the key a value)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": "auto"}})",
       R"("zero_optimization.reduce_bucket_size" in ds.json is "auto", but the model's hidden )"
       R"(size is not known here; give the key a value)"},
      {R"({"train_batch_size": 8, "bf16": {"enabled": "auto"}})",
       R"("bf16.enabled" in ds.json is "auto", but the run's dtype is not known here; give the )"
       R"(key a value)"},
      {R"({"train_batch_size": 8, "steps_per_print": "auto"})",
       R"("steps_per_print" in ds.json must be an integer, got string "auto")"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": "auto"}})",
       R"("zero_optimization.stage" in ds.json must be an integer, got string "auto")"},
      {R"({"train_batch_size": 1e30})",
       R"("train_batch_size" in ds.json must be an integer in 64-bit range, got 1e+30)"},
      {R"({"train_batch_size": 8, "bf16": {"enabled": "true"}})",
       R"("bf16.enabled" in ds.json must be true or false, got string "true")"},
      {R"({"train_batch_size": 8, "zero_optimization": 3})",
       R"("zero_optimization" in ds.json must be an object, got 3)"},
      {R"({"train_batch_size": 8, "gradient_clipping": null})",
       R"("gradient_clipping" in ds.json must be a number, got null)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": ["0.9", 0.99]}}})",
       R"("optimizer.params.betas" in ds.json must be a list of numbers, got a list holding )"
       R"(string "0.9")"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 2}})",
       R"(duplicate key "zero_optimization.stage" in ds.json)"},
      // Batch sizes (2 ranks).
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": 4})",
       "batch sizes in ds.json do not multiply out: train_batch_size 32 != "
       "train_micro_batch_size_per_gpu 2 * gradient_accumulation_steps 4 * world size 2 = 16"},
      {R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})",
       R"("train_batch_size" 30 in ds.json is not divisible by train_micro_batch_size_per_gpu 4 )"
       R"(* world size 2 = 8)"},
      {R"({"train_batch_size": 30, "gradient_accumulation_steps": 4})",
       R"("train_batch_size" 30 in ds.json is not divisible by gradient_accumulation_steps 4 * )"
       R"(world size 2 = 8)"},
      {R"({"train_batch_size": 7})",
       R"("train_batch_size" 7 in ds.json is not divisible by world size 2)"},
      {R"({"gradient_accumulation_steps": 4})",
       R"(neither "train_batch_size" nor "train_micro_batch_size_per_gpu" is given in ds.json; )"
       R"(at least one is required)"},
      {R"({"train_batch_size": 0})", R"("train_batch_size" in ds.json must be at least 1, got 0)"},
      // Values and combinations.
      {R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
       "fp16.enabled and bf16.enabled are both true in ds.json; enable at most one"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})",
       R"("zero_optimization.stage" in ds.json must be 0, 1, 2 or 3, got 4)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": -1}})",
       R"("zero_optimization.stage" in ds.json must be 0, 1, 2 or 3, got -1)"},
      {R"({"train_batch_size": 8, "steps_per_print": 0})",
       R"("steps_per_print" in ds.json must be at least 1, got 0)"},
      {R"({"train_batch_size": 8, "gradient_clipping": -1})",
       R"("gradient_clipping" in ds.json must be >= 0 (0 turns clipping off), got -1)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"contiguous_gradients": false}})",
       R"("zero_optimization.contiguous_gradients" in ds.json is false, but this runtime always )"
       R"(keeps gradient buckets contiguous; set it to true or leave it out)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"allgather_partitions": false}})",
       R"("zero_optimization.allgather_partitions" in ds.json is false, but this runtime always )"
       R"(all-gathers the updated partitions after the step; set it to true or leave it out)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": -5}})",
       R"("zero_optimization.reduce_bucket_size" in ds.json must be at least 1, got -5)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage3_prefetch_bucket_size": 0}})",
       R"("zero_optimization.stage3_prefetch_bucket_size" in ds.json must be at least 1 (this )"
       R"(runtime always prefetches the next unit), got 0)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage3_max_live_parameters": 0}})",
       R"("zero_optimization.stage3_max_live_parameters" in ds.json must be at least 1 (leave it )"
       R"(out for no limit), got 0)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"sub_group_size": 0}})",
       R"("zero_optimization.sub_group_size" in ds.json must be at least 1, got 0)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"allgather_bucket_size": 0}})",
       R"("zero_optimization.allgather_bucket_size" in ds.json must be at least 1, got 0)"},
      {R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "fp64"}})",
       R"("data_types.grad_accum_dtype" in ds.json must be "fp32", "fp16" or "bf16", got "fp64")"},
      {R"({"train_batch_size": 8, "bf16": {"enabled": true},
          "data_types": {"grad_accum_dtype": "fp16"}})",
       R"("data_types.grad_accum_dtype" in ds.json is "fp16" but the working dtype is bf16; )"
       R"(gradients accumulate in the working dtype or in fp32)"},
      {R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "bf16"}})",
       R"("data_types.grad_accum_dtype" in ds.json is "bf16" but the working dtype is fp32; )"
       R"(gradients accumulate in the working dtype or in fp32)"},
      {R"({"train_batch_size": 8, "fp16": {"enabled": true, "hysteresis": 0}})",
       R"("fp16.hysteresis" in ds.json must be at least 1, got 0)"},
      {R"({"train_batch_size": 8, "fp16": {"enabled": true, "min_loss_scale": 0}})",
       R"("fp16.min_loss_scale" in ds.json must be > 0, got 0)"},
      {R"({"train_batch_size": 8, "bf16": {"enabled": true}, "communication_data_type": "fp16"})",
       R"("communication_data_type" in ds.json is "fp16" but the working dtype is bf16; )"
       R"(gradients are reduced in the working dtype or in fp32)"},
      {R"({"train_batch_size": 8, "communication_data_type": "float32"})",
       R"("communication_data_type" in ds.json must be "fp32", "fp16" or "bf16", got "float32")"},
      {R"({"train_batch_size": 8, "gradient_predivide_factor": 0})",
       R"("gradient_predivide_factor" in ds.json must be > 0, got 0)"},
      // Optimizer.
      {R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 0.1}}})",
       R"("optimizer.type" is missing in ds.json; expected Adam, AdamW or SGD)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adamm"}})",
       R"("optimizer.type" in ds.json must be Adam, AdamW or SGD, got "Adamm")"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}})",
       R"("optimizer.type" in ds.json is "Lamb", a DeepSpeed optimizer this runtime does not )"
       R"(support yet (supported: Adam, AdamW, SGD))"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": -0.1}}})",
       R"("optimizer.params.lr" in ds.json must be >= 0, got -0.1)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e39}}})",
       R"("optimizer.params.lr" in ds.json must be within float range, got 1e+39)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"momentum": 0.9}}})",
       R"("optimizer.params.momentum" in ds.json is not a parameter of Adam (it takes lr, betas, )"
       R"(eps, weight_decay, adam_w_mode))"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})",
       R"("optimizer.params.betas" in ds.json is not a parameter of SGD (it takes lr, momentum, )"
       R"(weight_decay))"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
          "params": {"adam_w_mode": false}}})",
       R"("optimizer.params.adam_w_mode" in ds.json is false, but the type is AdamW; use type )"
       R"(Adam for Adam with L2 weight decay)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
       R"("optimizer.params.betas" in ds.json must be two numbers, got 1)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.0]}}})",
       R"("optimizer.params.betas[1]" in ds.json must be in [0, 1), got 1)"},
      {R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"eps": 0}}})",
       R"("optimizer.params.eps" in ds.json must be > 0, got 0)"},
      // Scheduler.
      {R"({"train_batch_size": 8, "scheduler": {"params": {"warmup_num_steps": 10}}})",
       R"("scheduler.type" is missing in ds.json; expected WarmupLR, WarmupDecayLR or )"
       R"(WarmupCosineLR)"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle"}})",
       R"("scheduler.type" in ds.json is "OneCycle", a DeepSpeed scheduler this runtime does not )"
       R"(support yet (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR))"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR"}})",
       R"("scheduler.params.total_num_steps" is missing in ds.json; WarmupDecayLR needs it)"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
          "params": {"total_num_steps": 100}}})",
       R"("scheduler.params.total_num_steps" in ds.json is not a parameter of WarmupLR (it takes )"
       R"(warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type))"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
          "params": {"warmup_type": "exp"}}})",
       R"("scheduler.params.warmup_type" in ds.json must be "log" or "linear", got "exp")"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR",
          "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.01}}})",
       R"("scheduler.params.warmup_min_lr" (0.1) exceeds "scheduler.params.warmup_max_lr" )"
       R"((0.01) in ds.json)"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
          "params": {"total_num_steps": 100, "warmup_num_steps": 200}}})",
       R"("scheduler.params.warmup_num_steps" (200) exceeds "scheduler.params.total_num_steps" )"
       R"((100) in ds.json)"},
      {R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR",
          "params": {"total_num_steps": 100, "cos_min_ratio": 2}}})",
       R"("scheduler.params.cos_min_ratio" in ds.json must be in [0, 1], got 2)"},
      // Not a config at all.
      {" \n\t", "config ds.json is empty"},
      {"[1, 2]", "ds.json must hold a JSON object of config keys, got a list"},
  };
  return cases;
}

TEST(Config, EveryBadInputGetsItsExactMessage) {
  ASSERT_GE(bad_configs().size(), 20u);
  for (const BadConfig& bad : bad_configs()) {
    SCOPED_TRACE(bad.text);
    EXPECT_EQ(error_of(bad.text), bad.message);
  }
}

TEST(Config, InvalidJsonSaysWhere) {
  EXPECT_EQ(error_of(R"({"train_batch_size": 8,})"),
            "invalid JSON in ds.json: parse error at line 1, column 24: syntax error while parsing "
            "object key - unexpected '}'; expected string literal");
}

TEST(Config, UnreadableFileIsAConfigError) {
  try {
    load_training_config("/nonexistent/ds.json", 1);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "cannot open config file \"/nonexistent/ds.json\": No such file or directory");
  }
}

// The engine's own constructors accept what the parser produced.
void expect_engine_accepts(const EngineConfig& e) {
  EXPECT_NO_THROW(Optimizer{e.optimizer});
  EXPECT_NO_THROW(LrSchedule{e.lr_schedule});
  EXPECT_NO_THROW(LossScaler{e.loss_scaler});
}

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
  EXPECT_EQ(e.dtype, DType::kBFloat16);
  EXPECT_TRUE(e.reduce_in_fp32);
  EXPECT_FLOAT_EQ(e.gradient_predivide_factor, 1.0f);
  EXPECT_TRUE(e.overlap_comm);
  EXPECT_TRUE(e.reduce_scatter);
  // Buckets are elements per collective; they never merge units (merge_bytes is ours).
  EXPECT_EQ(e.reduce_bucket_elements, 20000u);
  EXPECT_EQ(e.allgather_bucket_elements, 50000u);
  EXPECT_EQ(e.merge_bytes, EngineConfig().merge_bytes);
  EXPECT_EQ(e.prefetch_elements, 40000u);
  EXPECT_EQ(e.persistence_threshold, 1000u);
  EXPECT_EQ(e.max_live_elements, 100000u);
  EXPECT_EQ(e.max_reuse_distance, 100000u);
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
  EXPECT_EQ(e.dtype, DType::kFloat16);
  EXPECT_FALSE(e.reduce_in_fp32);
  EXPECT_EQ(e.reduce_bucket_elements, 20000u);
  EXPECT_EQ(e.allgather_bucket_elements, 20000u);
  EXPECT_EQ(e.merge_bytes, EngineConfig().merge_bytes);
  EXPECT_FLOAT_EQ(e.loss_scaler.static_scale, 0.0f);
  EXPECT_EQ(e.loss_scaler.initial_scale_power, 12);
  EXPECT_EQ(e.loss_scaler.scale_window, 500);
  EXPECT_EQ(e.loss_scaler.hysteresis, 2);
  EXPECT_FLOAT_EQ(e.loss_scaler.min_scale, 1.0f);
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
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.reduce_in_fp32, b.reduce_in_fp32);
  EXPECT_EQ(a.reduce_bucket_elements, b.reduce_bucket_elements);
  EXPECT_EQ(a.allgather_bucket_elements, b.allgather_bucket_elements);
  EXPECT_EQ(a.prefetch_elements, b.prefetch_elements);
  EXPECT_EQ(a.persistence_threshold, b.persistence_threshold);
  EXPECT_EQ(a.max_live_elements, b.max_live_elements);
  EXPECT_EQ(a.max_reuse_distance, b.max_reuse_distance);
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

TEST(Config, TextFormatErrorsSayWhere) {
  EXPECT_EQ(error_of("train_batch_size: 8\nzero_optimization {\n  stgae: 3\n}\n", 2, "ds.txt"),
            "unknown key \"zero_optimization.stgae\" in ds.txt at line 3, column 3; did you mean "
            "\"stage\"?");
  EXPECT_EQ(error_of("train_batch_size: 8\nzero_optimization { offload_param { } }\n", 2, "ds.txt"),
            "\"zero_optimization.offload_param\" in ds.txt at line 2, column 21 is a DeepSpeed "
            "option this runtime does not support yet");
  EXPECT_EQ(error_of("train_batch_size: \"eight\"\n", 2, "ds.txt"),
            "cannot parse ds.txt at line 1, column 19 as protobuf text format: Expected integer, "
            "got: \"eight\"");
  // The value checks are the JSON path's: text format only changes the reader.
  EXPECT_EQ(error_of("train_batch_size: 8\nzero_optimization { stage: 5 }\n", 2, "ds.txt"),
            "\"zero_optimization.stage\" in ds.txt must be 0, 1, 2 or 3, got 5");
}

TEST(Config, IntegerKeysAcceptExponentNotation) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 1.6e1, "bf16": {"enabled": true},
          "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8,
                                "allgather_bucket_size": 5E8}})",
      2, "ds.json");
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.micro_batch_per_rank, 8);
  EXPECT_EQ(c.engine.reduce_bucket_elements, 500000000u);
  EXPECT_EQ(c.engine.allgather_bucket_elements, 500000000u);
  EXPECT_EQ(c.engine.merge_bytes, EngineConfig().merge_bytes);
}

TEST(Config, AbsentKeysTakeTheDocumentedDefaults) {
  const TrainingConfig c = parse_training_config(R"({"train_batch_size": 8})", 2, "ds.json");
  const EngineConfig defaults;
  const EngineConfig& e = c.engine;
  EXPECT_EQ(c.micro_batch_per_rank, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(e.stage, 0);  // DeepSpeed: no zero_optimization section, no sharding
  EXPECT_EQ(e.dtype, DType::kFloat32);
  EXPECT_FALSE(e.reduce_in_fp32);
  EXPECT_EQ(e.gradient_clipping, 0.0f);
  EXPECT_EQ(e.merge_bytes, defaults.merge_bytes);
  EXPECT_EQ(e.overlap_comm, defaults.overlap_comm);
  EXPECT_EQ(e.reduce_scatter, defaults.reduce_scatter);
  EXPECT_EQ(e.prefetch_elements, 0u);  // EngineConfig's 0 = off, not DeepSpeed's 5e7
  EXPECT_EQ(e.persistence_threshold, 0u);
  EXPECT_EQ(e.max_live_elements, 0u);
  EXPECT_EQ(e.max_reuse_distance, 0u);
  EXPECT_EQ(e.reduce_bucket_elements, 0u);
  EXPECT_EQ(e.allgather_bucket_elements, 0u);
  EXPECT_EQ(e.optimizer_sub_group_elements, 0u);
  EXPECT_FALSE(e.grad_accum_dtype.has_value());
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
  EXPECT_EQ(e.loss_scaler.initial_scale_power, 16);
  EXPECT_EQ(e.loss_scaler.scale_window, 1000);
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

// What zero-train passes for "auto": its flags or their defaults, and the MLP's hidden size.
ConfigContext run_context(DType dtype) {
  ConfigContext c;
  c.train_batch_size = 24;
  c.gradient_accumulation_steps = 2;
  c.gradient_clipping = 1.0f;
  c.dtype = dtype;
  c.lr = 3e-3f;
  c.weight_decay = 0.01f;
  c.warmup_num_steps = 4;
  c.total_num_steps = 40;
  c.hidden_size = 128;
  c.source = "flags";
  return c;
}

// Hugging Face's ZeRO-2 example (fp16, 2e8-element buckets; batch, optimizer and scheduler
// "auto"): it loads, every "auto" is resolved from the run, and the ignored key is named.
TEST(Config, HuggingFaceZero2Fp16File) {
  const TrainingConfig c =
      load_training_config(example_config("hf_zero2_fp16.json"), 2, run_context(DType::kFloat16));
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.micro_batch_per_rank, 6);
  EXPECT_EQ(c.steps_per_print, 2000);
  EXPECT_FALSE(c.wall_clock_breakdown);
  const EngineConfig& e = c.engine;
  EXPECT_EQ(e.stage, 2);
  EXPECT_EQ(e.dtype, DType::kFloat16);
  EXPECT_EQ(e.reduce_bucket_elements, 200000000u);
  EXPECT_EQ(e.allgather_bucket_elements, 200000000u);
  EXPECT_EQ(e.merge_bytes, EngineConfig().merge_bytes);
  EXPECT_FLOAT_EQ(e.gradient_clipping, 1.0f);
  EXPECT_EQ(e.optimizer.type, OptimizerType::kAdamW);
  EXPECT_FLOAT_EQ(e.optimizer.lr, 3e-3f);
  EXPECT_DOUBLE_EQ(e.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(e.optimizer.beta2, 0.999);
  EXPECT_FLOAT_EQ(e.optimizer.eps, 1e-8f);
  EXPECT_FLOAT_EQ(e.optimizer.weight_decay, 0.01f);
  EXPECT_EQ(e.lr_schedule.type, LrScheduleType::kWarmup);
  EXPECT_EQ(e.lr_schedule.warmup_type, LrWarmupType::kLog);
  EXPECT_EQ(e.lr_schedule.min_lr, 0.0f);
  EXPECT_FLOAT_EQ(e.lr_schedule.max_lr, 3e-3f);
  EXPECT_EQ(e.lr_schedule.warmup_steps, 4);
  EXPECT_EQ(c.resolved_auto,
            (std::vector<std::string>{
                R"(train_batch_size "auto" -> 24 (flags))",
                R"(gradient_accumulation_steps "auto" -> 2 (flags))",
                R"(train_micro_batch_size_per_gpu "auto" -> 6 (global batch 24 / (2 )"
                R"(micro-batches x 2 ranks)))",
                R"(gradient_clipping "auto" -> 1 (flags))",
                R"(optimizer.params.lr "auto" -> 0.003 (flags))",
                R"(optimizer.params.betas "auto" -> [0.9, 0.999] (Adam's default))",
                R"(optimizer.params.eps "auto" -> 1e-08 (Adam's default))",
                R"(optimizer.params.weight_decay "auto" -> 0.01 (flags))",
                R"(scheduler.params.warmup_min_lr "auto" -> 0 (Hugging Face's value))",
                R"(scheduler.params.warmup_max_lr "auto" -> 0.003 (the run's learning rate))",
                R"(scheduler.params.warmup_num_steps "auto" -> 4 (flags))"}));
  EXPECT_EQ(c.ignored_keys,
            std::vector<std::string>{
                "zero_optimization.round_robin_gradients is ignored: it orders gradient copies "
                "to CPU offload, which this runtime does not do; results are the same"});
  expect_engine_accepts(e);
}

// Hugging Face's ZeRO-3 example with "auto" everywhere it is allowed: the dtype comes from the
// run, the bucket sizes from the model's hidden size (128).
TEST(Config, HuggingFaceZero3Bf16AutoFile) {
  const TrainingConfig c = load_training_config(example_config("hf_zero3_bf16_auto.json"), 4,
                                                run_context(DType::kBFloat16));
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_EQ(c.micro_batch_per_rank, 3);
  EXPECT_TRUE(c.gather_16bit_weights_on_model_save);
  const EngineConfig& e = c.engine;
  EXPECT_EQ(e.stage, 3);
  EXPECT_EQ(e.dtype, DType::kBFloat16);
  EXPECT_EQ(e.reduce_bucket_elements, 16384u);
  EXPECT_EQ(e.prefetch_elements, 14745u);  // int(0.9 * 16384)
  EXPECT_EQ(e.persistence_threshold, 1280u);
  EXPECT_EQ(e.optimizer_sub_group_elements, 1000000000u);
  EXPECT_EQ(e.max_live_elements, 1000000000u);
  EXPECT_EQ(e.lr_schedule.type, LrScheduleType::kWarmupLinearDecay);
  EXPECT_EQ(e.lr_schedule.total_steps, 40);
  EXPECT_EQ(e.lr_schedule.warmup_steps, 4);
  const std::vector<std::string>& r = c.resolved_auto;
  for (const char* line :
       {R"(fp16.enabled "auto" -> false (dtype bf16))",
        R"(bf16.enabled "auto" -> true (dtype bf16))",
        R"(scheduler.params.total_num_steps "auto" -> 40 (flags))",
        R"(zero_optimization.reduce_bucket_size "auto" -> 16384 (hidden 128 squared))",
        R"(zero_optimization.stage3_prefetch_bucket_size "auto" -> 14745 (0.9 x hidden 128 )"
        R"(squared))",
        R"(zero_optimization.stage3_param_persistence_threshold "auto" -> 1280 (10 x hidden )"
        R"(128))"}) {
    EXPECT_EQ(std::count(r.begin(), r.end(), line), 1) << line;
  }
  EXPECT_EQ(r.size(), 17u);  // every "auto" in the file, once
  EXPECT_TRUE(c.ignored_keys.empty());
  // The same file run in fp32: both "auto" switches resolve to false.
  const TrainingConfig fp32 = load_training_config(example_config("hf_zero3_bf16_auto.json"), 4,
                                                   run_context(DType::kFloat32));
  EXPECT_EQ(fp32.engine.dtype, DType::kFloat32);
  expect_engine_accepts(e);
}

// A context without a value leaves exactly the keys that need it unresolvable.
TEST(Config, AutoNeedsTheRunsValue) {
  ConfigContext context = run_context(DType::kFloat32);
  context.total_num_steps.reset();
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR",
                         "params": {"total_num_steps": "auto"}}})",
                     2, "ds.json", context),
            "\"scheduler.params.total_num_steps\" in ds.json is \"auto\", but the run's number of "
            "steps is not known here; give the key a value");
  // The run's batch must divide over the ranks, as a written one must.
  EXPECT_EQ(error_of(R"({"train_micro_batch_size_per_gpu": "auto"})", 5, "ds.json", context),
            "\"train_batch_size\" 24 in flags is not divisible by gradient_accumulation_steps 2 * "
            "world size 5 = 10");
  // A written value stays as written next to resolved ones; disagreeing ones are still named.
  EXPECT_EQ(error_of(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
                         "gradient_accumulation_steps": "auto"})",
                     2, "ds.json", context),
            "batch sizes in ds.json do not multiply out: train_batch_size 24 != "
            "train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 * world size 2 = 16");
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
  EXPECT_EQ(c.engine.grad_accum_dtype, DType::kBFloat16);
  EXPECT_EQ(c.engine.optimizer_sub_group_elements, 1000u);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{
                "memory_breakdown is ignored: the memory summary by category is printed at start "
                "anyway",
                "zero_allow_untested_optimizer is ignored: every optimizer here is built into the "
                "engine and runs at every stage",
                "zero_optimization.round_robin_gradients is ignored: it orders gradient copies to "
                "CPU offload, which this runtime does not do; results are the same"}));
  const EngineConfig fp32 =
      parse_training_config(
          R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "fp32"}})", 2, "ds.json")
          .engine;
  EXPECT_EQ(fp32.grad_accum_dtype, DType::kFloat32);
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
  EXPECT_TRUE(c.ignored_keys.empty());
  const TrainingConfig absent = parse_training_config(R"({"train_batch_size": 8})", 2, "ds.json");
  EXPECT_EQ(absent.activation_checkpointing.mode, "none");
  EXPECT_FALSE(absent.activation_checkpointing.number_checkpoints_given);
}

TEST(Config, CommunicationDataType) {
  const auto engine_of = [](const std::string& extra) {
    return parse_training_config(R"({"train_batch_size": 8, )" + extra + "}", 2, "ds.json").engine;
  };
  EXPECT_TRUE(
      engine_of(R"("bf16": {"enabled": true}, "communication_data_type": "fp32")").reduce_in_fp32);
  EXPECT_FALSE(
      engine_of(R"("bf16": {"enabled": true}, "communication_data_type": "bf16")").reduce_in_fp32);
  EXPECT_FALSE(engine_of(R"("communication_data_type": "fp32")").reduce_in_fp32);
  EXPECT_FLOAT_EQ(engine_of(R"("gradient_predivide_factor": 4)").gradient_predivide_factor, 4.0f);
}

TEST(Config, NonFiniteGradientPolicy) {
  const auto engine_of = [](const std::string& extra) {
    return parse_training_config(R"({"train_batch_size": 8)" + extra + "}", 2, "ds.json").engine;
  };
  EXPECT_FALSE(engine_of("").skip_nonfinite_steps);
  EXPECT_FALSE(engine_of(R"(, "nonfinite_gradients": "error")").skip_nonfinite_steps);
  EXPECT_TRUE(engine_of(R"(, "nonfinite_gradients": "skip")").skip_nonfinite_steps);
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

// A config is text: a NUL byte is refused where it is, not read up to.
TEST(Config, NulByteIsRefusedWithItsOffset) {
  const std::string json("{\"train_batch_size\": 8}\0{\"stage\": 9}", 36);
  EXPECT_EQ(error_of(json, 2, "config.json"), "config.json: byte 23: a NUL byte; a config is text");
  const std::string text("train_batch_size: 8\n\0", 21);
  EXPECT_EQ(error_of(text, 2, "ds.txt"), "ds.txt: byte 20: a NUL byte; a config is text");
}

// Text that is neither JSON nor text format is told so, with where it stops being either, not
// that its first word is an unknown key; a text format file keeps its key-by-key messages.
TEST(Config, ProseIsNotAConfig) {
  const std::string not_config =
      ": not JSON (a config is a JSON object, starting with '{') nor protobuf text format (a "
      "key, then ':' or '{')";
  EXPECT_EQ(error_of("this is not a config\n"), "ds.json: byte 0" + not_config);
  EXPECT_EQ(error_of("\n\n  hello world"), "ds.json: byte 4" + not_config);
  EXPECT_EQ(error_of("\xEF\xBB\xBFthis is prose"), "ds.json: byte 3" + not_config);
  EXPECT_EQ(error_of("# a comment\n<html>"), "ds.json: byte 12" + not_config);
  EXPECT_EQ(error_of("word"), "ds.json: byte 0" + not_config);
  EXPECT_EQ(error_of("# a comment\ntrain_batch_size: 8\n", 2, "ds.txt"),
            "(parsed without an error)");
  EXPECT_EQ(error_of("stage: 3\n", 2, "ds.txt"),
            "unknown key \"stage\" in ds.txt at line 1, column 1; did you mean "
            "\"zero_optimization.stage\"?");
}

// A key of 1 MB is quoted by its first 64 bytes and its length, in every message that names it.
TEST(Config, LongKeysAreQuotedCutShort) {
  const std::string key(1 << 20, 'k');
  const std::string quoted = "\"" + std::string(64, 'k') + "...\" (1048576 bytes)";
  const std::string unknown = error_of("{\"" + key + "\": 1}");
  EXPECT_EQ(unknown.substr(0, unknown.find(';')), "unknown key " + quoted + " in ds.json");
  EXPECT_LT(unknown.size(), 1000u);
  EXPECT_EQ(error_of("{\"zero_optimization\": {\"" + key + "\": 1, \"" + key + "\": 2}}"),
            "duplicate key \"zero_optimization." + std::string(46, 'k') +
                "...\" (1048594 bytes) in ds.json");
  const std::string text = error_of(key + ": 1\n", 2, "ds.txt");
  EXPECT_EQ(text.substr(0, text.find(';')),
            "unknown key " + quoted + " in ds.txt at line 1, column 1");
  EXPECT_LT(text.size(), 1000u);
  // What a parser stopped at is cut the same way: an unterminated key, a long value.
  const std::string unterminated = error_of("{\"" + key);
  EXPECT_EQ(unterminated.substr(0, unterminated.find(" (")),
            "invalid JSON in ds.json: parse error at line 1, column 1048579: syntax error while "
            "parsing object key - invalid string: missing closing quote; last read: '\"" +
                std::string(62, 'k') + "...");
  EXPECT_LT(unterminated.size(), 400u);
  EXPECT_EQ(error_of("train_batch_size: \"" + key + "\"", 2, "ds.txt"),
            "cannot parse ds.txt at line 1, column 19 as protobuf text format: Expected integer, "
            "got: \"" +
                std::string(63, 'k') + "... (1048578 bytes)");
  // Cut at a character boundary: 63 ASCII bytes, then a 2-byte character across byte 64.
  const std::string utf8 = std::string(63, 'a') + "\xC3\xA9" + std::string(100, 'b');
  const std::string cut = error_of("{\"" + utf8 + "\": 1}");
  EXPECT_EQ(cut.substr(0, cut.find(';')),
            "unknown key \"" + std::string(63, 'a') + "...\" (165 bytes) in ds.json");
}

// zero-train's --global-batch stands in for a file without batch keys (ConfigContext's
// batch_from_caller); without the flag such a file is still an error.
TEST(Config, CallersGlobalBatchStandsInForTheFile) {
  ConfigContext flags;
  flags.train_batch_size = 16;
  flags.gradient_accumulation_steps = 2;
  flags.batch_from_caller = true;
  const std::string no_batch = R"({"zero_optimization": {"stage": 2}})";
  TrainingConfig c = parse_training_config(no_batch, 2, "ds.json", flags);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.micro_batch_per_rank, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.engine.micro_batches, 2);
  // The file's accumulation steps are kept; its batch keys, when given, are read as before.
  c = parse_training_config(R"({"gradient_accumulation_steps": 4})", 2, "ds.json", flags);
  EXPECT_EQ(c.micro_batch_per_rank, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  c = parse_training_config(R"({"train_batch_size": 8})", 2, "ds.json", flags);
  EXPECT_EQ(c.train_batch_size, 8);
  flags.batch_from_caller = false;
  EXPECT_EQ(error_of(no_batch, 2, "ds.json", flags),
            "neither \"train_batch_size\" nor \"train_micro_batch_size_per_gpu\" is given in "
            "ds.json; at least one is required");
}

}  // namespace
}  // namespace zero
