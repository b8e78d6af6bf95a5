// "auto" in a config, as Hugging Face's Trainer writes it: each value resolved from the run
// (zero-train's flags or their defaults and the model), named once; the Trainer's example files.
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
  EXPECT_EQ(e.precision.dtype, DType::kFloat16);
  EXPECT_EQ(e.schedule.reduce_bucket_elements, 200000000u);
  EXPECT_EQ(e.schedule.allgather_bucket_elements, 200000000u);
  EXPECT_EQ(e.schedule.merge_bytes, EngineConfig().schedule.merge_bytes);
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
                "to a GPU run's host-side optimizer, which the CPU path does not make; results "
                "are the same"});
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
  EXPECT_EQ(e.precision.dtype, DType::kBFloat16);
  EXPECT_EQ(e.schedule.reduce_bucket_elements, 16384u);
  EXPECT_EQ(e.schedule.prefetch_elements, 14745u);  // int(0.9 * 16384)
  EXPECT_EQ(e.schedule.persistence_threshold, 1280u);
  EXPECT_EQ(e.schedule.optimizer_sub_group_elements, 1000000000u);
  EXPECT_EQ(e.schedule.max_live_elements, 1000000000u);
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
  EXPECT_EQ(fp32.engine.precision.dtype, DType::kFloat32);
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

// A file without an optimizer section trains with the caller's optimizer (DeepSpeed's client
// optimizer): the context's lr and weight decay, where the context gives them, over
// EngineConfig's; the file's own section still wins.
TEST(Config, NoOptimizerSectionTakesTheCallersOptimizer) {
  ConfigContext caller;
  caller.lr = 3e-3f;
  caller.weight_decay = 0.0f;
  const std::string no_optimizer = R"({"train_batch_size": 8})";
  const OptimizerConfig took =
      parse_training_config(no_optimizer, 2, "ds.json", caller).engine.optimizer;
  EXPECT_EQ(took.type, OptimizerType::kAdamW);
  EXPECT_FLOAT_EQ(took.lr, 3e-3f);
  EXPECT_EQ(took.weight_decay, 0.0f);
  EXPECT_FLOAT_EQ(
      parse_training_config(no_optimizer, 2, "ds.json", caller).engine.lr_schedule.max_lr, 3e-3f);
  const OptimizerConfig engine_default;
  const OptimizerConfig without_caller =
      parse_training_config(no_optimizer, 2, "ds.json").engine.optimizer;
  EXPECT_EQ(without_caller.lr, engine_default.lr);
  EXPECT_EQ(without_caller.weight_decay, engine_default.weight_decay);
  const OptimizerConfig written =
      parse_training_config(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW",
                               "params": {"lr": 5e-4, "weight_decay": 0.1}}})",
                            2, "ds.json", caller)
          .engine.optimizer;
  EXPECT_FLOAT_EQ(written.lr, 5e-4f);
  EXPECT_FLOAT_EQ(written.weight_decay, 0.1f);
}

}  // namespace
}  // namespace zero
