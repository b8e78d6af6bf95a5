// The offload keys: offload_optimizer, offload_param and aio with DeepSpeed's defaults and
// meanings, the example configs that use them, and each bad value named.
#include <gtest/gtest.h>

#include <string>

#include "tests/runtime/config_test_util.h"
#include "zero/runtime/config.h"

namespace zero {
namespace {

TEST(ConfigOffload, AbsentKeysTakeDeepSpeedsDefaults) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
          "offload_optimizer": {"device": "nvme"}}})",
      2, "ds.json");
  const OptimizerOffload& o = c.engine.offload.optimizer;
  EXPECT_EQ(o.device, OffloadDevice::kNvme);
  EXPECT_EQ(o.nvme_path, "/local_nvme");
  EXPECT_FALSE(o.pin_memory);
  EXPECT_EQ(o.buffer_count, 4);
  EXPECT_FALSE(o.pipeline_read);
  EXPECT_FALSE(o.pipeline_write);
  EXPECT_FALSE(o.fast_init);
  const AioConfig& aio = c.engine.offload.aio;
  EXPECT_EQ(aio.block_size, 1048576u);
  EXPECT_EQ(aio.queue_depth, 8);
  EXPECT_EQ(aio.intra_op_parallelism, 1);
  EXPECT_FALSE(aio.single_submit);
  EXPECT_TRUE(aio.overlap_events);
  EXPECT_EQ(c.engine.schedule.optimizer_sub_group_elements, 1000000000u);
  EXPECT_TRUE(c.ignored_keys.empty());
  const ParamOffload& p = c.engine.offload.param;
  EXPECT_EQ(p.device, OffloadDevice::kNone);
  EXPECT_EQ(p.buffer_count, 5);
  EXPECT_EQ(p.buffer_size, 100000000u);
  EXPECT_EQ(p.max_in_cpu, 1000000000u);
}

// offload_param on nvme at stage 3 takes every key with DeepSpeed's meaning; max_in_cpu is said
// to have no effect (every shard but the persistent unit's is on NVMe).
TEST(ConfigOffload, ParamOffloadToNvme) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
          "offload_param": {"device": "nvme", "nvme_path": "/tmp/x", "buffer_count": 3,
                            "buffer_size": 4096, "max_in_cpu": 10, "pin_memory": true}}})",
      2, "ds.json");
  const ParamOffload& p = c.engine.offload.param;
  EXPECT_EQ(p.device, OffloadDevice::kNvme);
  EXPECT_EQ(p.nvme_path, "/tmp/x");
  EXPECT_EQ(p.buffer_count, 3);
  EXPECT_EQ(p.buffer_size, 4096u);
  EXPECT_EQ(p.max_in_cpu, 10u);
  EXPECT_TRUE(p.pin_memory);
  ASSERT_EQ(c.ignored_keys.size(), 1u);
  EXPECT_NE(c.ignored_keys[0].find("offload_param.max_in_cpu has no effect here"),
            std::string::npos)
      << c.ignored_keys[0];
  expect_engine_accepts(c.engine);
}

TEST(ConfigOffload, NvmeExampleFile) {
  const TrainingConfig c = load_training_config(example_config("ds_stage3_nvme_offload.json"), 2);
  const EngineConfig& e = c.engine;
  EXPECT_EQ(e.stage, 3);
  EXPECT_EQ(e.schedule.optimizer_sub_group_elements, 1000u);
  EXPECT_EQ(e.offload.optimizer.device, OffloadDevice::kNvme);
  EXPECT_TRUE(e.offload.optimizer.pin_memory);
  EXPECT_TRUE(e.offload.optimizer.pipeline_read);
  EXPECT_TRUE(e.offload.optimizer.pipeline_write);
  EXPECT_EQ(e.offload.optimizer.buffer_count, 4);
  expect_engine_accepts(e);
}

// Hugging Face's ZeRO-3 file with both offloads on cpu, its "auto" values from a run of 2 ranks
// on the CPU path or on a GPU.
TrainingConfig load_hf_zero3_offload_cpu(bool cuda) {
  ConfigContext context;
  context.train_batch_size = 24;
  context.gradient_accumulation_steps = 1;
  context.gradient_clipping = 1.0f;
  context.dtype = DType::kBFloat16;
  context.lr = 1e-3f;
  context.weight_decay = 0.0f;
  context.warmup_num_steps = 2;
  context.total_num_steps = 20;
  context.hidden_size = 64;
  context.cuda = cuda;
  return load_training_config(example_config("hf_zero3_offload_cpu.json"), 2, context);
}

// Hugging Face's ZeRO-3 file with both offloads on cpu: accepted, and each said once to be
// where the CPU path keeps the state anyway, and dropped (the engine would only copy).
TEST(ConfigOffload, HuggingFaceZero3CpuOffloadFile) {
  const TrainingConfig c = load_hf_zero3_offload_cpu(/*cuda=*/false);
  EXPECT_EQ(c.engine.offload.optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(c.engine.offload.param.device, OffloadDevice::kNone);
  ASSERT_EQ(c.ignored_keys.size(), 2u);
  EXPECT_EQ(c.ignored_keys[0],
            "zero_optimization.offload_optimizer.device \"cpu\" has no effect here: on the CPU "
            "path the fp32 master and optimizer state already live in host memory");
  EXPECT_EQ(c.ignored_keys[1],
            "zero_optimization.offload_param.device \"cpu\" has no effect here: on the CPU path "
            "the parameter shards already live in host memory");
}

// The same file for a GPU run: the optimizer goes to the host (ZeRO-Offload); the parameter
// shards stay on the GPU, and the note says so.
TEST(ConfigOffload, HuggingFaceZero3CpuOffloadFileOnCuda) {
  const TrainingConfig c = load_hf_zero3_offload_cpu(/*cuda=*/true);
  EXPECT_EQ(c.engine.offload.optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.engine.offload.param.device, OffloadDevice::kNone);
  ASSERT_EQ(c.ignored_keys.size(), 1u);
  EXPECT_EQ(c.ignored_keys[0],
            "zero_optimization.offload_param.device \"cpu\" is not built for CUDA yet: the "
            "parameter shards stay in the GPU's memory (offload_optimizer \"cpu\" moves the "
            "optimizer state)");
}

TEST(ConfigOffload, AioKeysMapWithThreadCountAsAnAlias) {
  const TrainingConfig c = parse_training_config(
      R"({"train_batch_size": 8, "aio": {"block_size": 8192, "queue_depth": 2,
          "thread_count": 3, "single_submit": true, "overlap_events": false}})",
      2, "ds.json");
  EXPECT_EQ(c.engine.offload.aio.block_size, 8192u);
  EXPECT_EQ(c.engine.offload.aio.queue_depth, 2);
  EXPECT_EQ(c.engine.offload.aio.intra_op_parallelism, 3);
  EXPECT_TRUE(c.engine.offload.aio.single_submit);
  EXPECT_FALSE(c.engine.offload.aio.overlap_events);
}

TEST(ConfigOffload, BadValuesAreNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
          "offload_optimizer": {"device": "disk"}}})",
       R"("zero_optimization.offload_optimizer.device" in ds.json must be "none", "cpu" or )"
       R"("nvme", got "disk")"},
      {R"({"train_batch_size": 8, "zero_optimization": {"offload_optimizer": {"device": "nvme"}}})",
       R"("zero_optimization.offload_optimizer.device" in ds.json is "nvme", which needs )"
       R"(zero_optimization.stage 1, 2 or 3 (it is 0))"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "offload_optimizer":
          {"device": "nvme", "pipeline_read": true, "pipeline_write": true, "buffer_count": 2}}})",
       R"("zero_optimization.offload_optimizer.buffer_count" in ds.json must be at least 3 )"
       R"(with pipeline_read true and pipeline_write true, got 2)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
          "offload_param": {"device": "cpu"}}})",
       R"("zero_optimization.offload_param.device" in ds.json is "cpu", which needs )"
       R"(zero_optimization.stage 3 (it is 2): only stage 3 partitions the parameters)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 2,
          "offload_param": {"device": "nvme"}}})",
       R"("zero_optimization.offload_param.device" in ds.json is "nvme", which needs )"
       R"(zero_optimization.stage 3 (it is 2): only stage 3 partitions the parameters)"},
      {R"({"train_batch_size": 8, "aio": {"block_size": 5000}})",
       R"("aio.block_size" in ds.json must be a multiple of 4096, got 5000)"},
      {R"({"train_batch_size": 8, "aio": {"queue_depth": 0}})",
       R"("aio.queue_depth" in ds.json must be at least 1, got 0)"},
      {R"({"train_batch_size": 8, "aio": {"intra_op_parallelism": 2, "thread_count": 4}})",
       R"("aio.intra_op_parallelism" (2) and "aio.thread_count" (4) in ds.json name the same )"
       R"(setting with different values)"},
      {R"({"train_batch_size": 8, "zero_optimization": {"stage": 1,
          "offload_optimizer": {"device": "nvme", "nvme_path": ""}}})",
       R"("zero_optimization.offload_optimizer.nvme_path" in ds.json must be a directory, got )"
       R"(an empty string)"},
  };
  for (const auto& [text, message] : cases) EXPECT_EQ(error_of(text), message) << text;
}

}  // namespace
}  // namespace zero
