// The training config's bad inputs: each is rejected with a message that names the key, its
// value and what was expected, asserted word for word; text that is not a config, NUL bytes and
// huge keys are told so with where they are.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config_parse.h"
#include "tests/runtime/config_test_util.h"
#include "zero/optimizer/loss_scaler.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/config.h"

namespace zero {
namespace {

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
          "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
       R"("zero_optimization.offload_optimizer.ratio" in ds.json is a DeepSpeed option this )"
       R"(runtime does not support yet)"},
      {R"({"train_batch_size": 8, "aio": {"use_gds": true}})",
       R"("aio.use_gds" in ds.json is a DeepSpeed option this runtime does not support yet)"},
      {R"({"train_batch_size": 8, "checkpoint": {"tag_validation": "Warn"}})",
       R"("checkpoint.tag_validation" in ds.json is a DeepSpeed option this runtime does not )"
       R"(support yet)"},
      {R"({"train_batch_size": 8, "autotuning": {}})",
       R"("autotuning" in ds.json is a DeepSpeed option this runtime does not support yet)"},
      {R"({"train_batch_size": 8,
          "activation_checkpointing": {"synchronize_checkpoint_boundary": "yes"}})",
       R"("activation_checkpointing.synchronize_checkpoint_boundary" in ds.json must be true or )"
       R"(false, got string "yes")"},
      {R"({"train_batch_size": 8, "activation_checkpointing": {"profile": 1}})",
       R"("activation_checkpointing.profile" in ds.json must be true or false, got 1)"},
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
      {R"({"train_batch_size": 8, "zero_optimization": {"mics_shard_size": 0}})",
       R"("zero_optimization.mics_shard_size" in ds.json must be -1 (off) or a shard group )"
       R"(size of at least 1, got 0)"},
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
      // tensor_parallel, on 2 ranks.
      {R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 3}})",
       R"("tensor_parallel.tp_size" in ds.json must be at most 2, got 3)"},
      {R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": 0}})",
       R"("tensor_parallel.autotp_size" in ds.json must be at least 1, got 0)"},
      {R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 2, "autotp_size": 1}})",
       R"("tensor_parallel.autotp_size" in ds.json must be the same as tensor_parallel.tp_size )"
       R"((2) when both are given, got 1)"},
      {R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 2},
          "zero_optimization": {"stage": 3, "mics_shard_size": 2}})",
       R"("zero_optimization.mics_shard_size" in ds.json must be a divisor of the 1 )"
       R"(data-parallel rank(s) (the world's 2 over tensor_parallel.tp_size 2), got 2)"},
      // ZeRO++ needs stage 3; what is not built is refused by name.
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
          "zero_quantized_weights": true}})",
       R"("zero_optimization.zero_quantized_weights" in ds.json is true, which needs )"
       R"(zero_optimization.stage 3 (it is 2): only stage 3 all-gathers parameters)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"zero_quantized_gradients": true}})",
       R"("zero_optimization.zero_quantized_gradients" in ds.json is true, which needs )"
       R"(zero_optimization.stage 3 (it is 0): the quantized reduction replaces stage 3's )"
       R"(reduce-scatter)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
          "zero_hpz_partition_size": 2}})",
       R"("zero_optimization.zero_hpz_partition_size" in ds.json is 2, which needs )"
       R"(zero_optimization.stage 3 (it is 1): only stage 3 partitions the parameters)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "zero_hpz_partition_size": 0}})",
       R"("zero_optimization.zero_hpz_partition_size" in ds.json must be at least 1, got 0)"},
      // hpZ's secondary shards split a unit over a node's ranks: a divisor of the data-parallel
      // group (2 ranks; 1 with tensor parallelism over 2).
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "zero_hpz_partition_size": 3}})",
       R"("zero_optimization.zero_hpz_partition_size" in ds.json must be 1 (off) or a divisor )"
       R"(of the 2 data-parallel rank(s) (the ranks of one node), got 3)"},
      {R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 2},
          "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 2}})",
       R"("zero_optimization.zero_hpz_partition_size" in ds.json must be 1 (off) or a divisor )"
       R"(of the 1 data-parallel rank(s) (the ranks of one node), got 2)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": 1,
          "zero_quantized_gradients": true}})",
       R"("zero_optimization.zero_quantized_gradients" in ds.json is true with )"
       R"(zero_optimization.mics_shard_size 1: quantized gradient reduction with hybrid )"
       R"(sharding is not built yet)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "zero_quantized_nontrainable_weights": true}})",
       R"("zero_optimization.zero_quantized_nontrainable_weights" in ds.json is a DeepSpeed )"
       R"(option this runtime does not support yet)"},
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

TEST(Config, ATensorParallelSizeThatDoesNotDivideTheWorldIsAnError) {
  EXPECT_EQ(error_of(R"({"train_batch_size": 8, "tensor_parallel": {"tp_size": 4}})", 6),
            R"("tensor_parallel.tp_size" in ds.json must be a divisor of the world size 6, got 4)");
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

// The keys told apart as DeepSpeed options not implemented yet are not in the schema: a key
// that got implemented leaves that list in the same change.
TEST(Config, NoKeyTakenForUnimplementedIsInTheSchema) {
  // Whether the schema has a field at the dotted path `key`, as the JSON reader walks it.
  const auto in_schema = [](const std::string& key) {
    const google::protobuf::Descriptor* message = config::TrainingConfig::descriptor();
    for (size_t begin = 0; message != nullptr;) {
      const size_t dot = std::min(key.find('.', begin), key.size());
      const google::protobuf::FieldDescriptor* field =
          message->FindFieldByName(key.substr(begin, dot - begin));
      if (field == nullptr) return false;
      if (dot == key.size()) return true;
      message = field->message_type();
      begin = dot + 1;
    }
    return false;
  };
  for (const std::string& key : config_internal::unsupported_deepspeed_keys()) {
    EXPECT_FALSE(in_schema(key)) << "\"" << key
                                 << "\" is in the schema, but listed as not implemented yet";
  }
  EXPECT_TRUE(in_schema("zero_optimization.stage")) << "the walk finds what the schema has";
}

TEST(Config, TextFormatErrorsSayWhere) {
  EXPECT_EQ(error_of("train_batch_size: 8\nzero_optimization {\n  stgae: 3\n}\n", 2, "ds.txt"),
            "unknown key \"zero_optimization.stgae\" in ds.txt at line 3, column 3; did you mean "
            "\"stage\"?");
  EXPECT_EQ(error_of("train_batch_size: 8\naio { use_gds: true }\n", 2, "ds.txt"),
            "\"aio.use_gds\" in ds.txt at line 2, column 7 is a DeepSpeed "
            "option this runtime does not support yet");
  EXPECT_EQ(error_of("train_batch_size: \"eight\"\n", 2, "ds.txt"),
            "cannot parse ds.txt at line 1, column 19 as protobuf text format: Expected integer, "
            "got: \"eight\"");
  // The value checks are the JSON path's: text format only changes the reader.
  EXPECT_EQ(error_of("train_batch_size: 8\nzero_optimization { stage: 5 }\n", 2, "ds.txt"),
            "\"zero_optimization.stage\" in ds.txt must be 0, 1, 2 or 3, got 5");
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

}  // namespace
}  // namespace zero
