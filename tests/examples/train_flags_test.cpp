// zero-train's flags override its config file, each one, as docs/cli.md promises: a config sets
// every value a flag can also set, and the flags then set other values. Without the flags the
// file's values stand, so the test sees each flag make the difference.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "driver/cli.h"
#include "examples/train_flags.h"
#include "examples/train_pipeline.h"

namespace zero::examples {
namespace {

// A DeepSpeed config giving every setting zero-train has a flag for.
std::string write_config() {
  const std::string path = ::testing::TempDir() + "/train_flags_test_config.json";
  std::ofstream(path) << R"({
    "train_batch_size": 8,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 0.5,
    "steps_per_print": 7,
    "seed": 5,
    "bf16": {"enabled": true},
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.2}},
    "scheduler": {"type": "WarmupLR",
                  "params": {"warmup_max_lr": 0.01, "warmup_num_steps": 10}}
  })";
  return path;
}

TrainingConfig resolve(std::vector<std::string> args) {
  args.insert(args.begin(), "zero-train");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const Flags flags = parse_flags(static_cast<int>(argv.size()), argv.data());
  return resolve_config(flags, 2);
}

TEST(TrainFlags, TheConfigAloneGivesItsValues) {
  const TrainingConfig tc = resolve({"--config", write_config()});
  EXPECT_EQ(tc.engine.stage, 1);
  EXPECT_EQ(tc.engine.precision.dtype, DType::kBFloat16);
  EXPECT_EQ(tc.engine.seed, 5u);
  EXPECT_EQ(tc.train_batch_size, 8);
  EXPECT_EQ(tc.gradient_accumulation_steps, 2);
  EXPECT_EQ(tc.micro_batch_per_rank, 2);
  EXPECT_FLOAT_EQ(tc.engine.optimizer.lr, 0.01f);
  EXPECT_FLOAT_EQ(tc.engine.optimizer.weight_decay, 0.2f);
  EXPECT_FLOAT_EQ(tc.engine.gradient_clipping, 0.5f);
  EXPECT_EQ(tc.engine.lr_schedule.type, LrScheduleType::kWarmup);
  EXPECT_EQ(tc.engine.lr_schedule.warmup_steps, 10);
  EXPECT_EQ(tc.steps_per_print, 7);
}

TEST(TrainFlags, EveryFlagOverridesTheConfig) {
  const TrainingConfig tc = resolve({"--config",
                                     write_config(),
                                     "--stage",
                                     "3",
                                     "--dtype",
                                     "fp16",
                                     "--seed",
                                     "9",
                                     "--global-batch",
                                     "12",
                                     "--micro-batches",
                                     "3",
                                     "--lr",
                                     "0.002",
                                     "--weight-decay",
                                     "0.05",
                                     "--clip",
                                     "2",
                                     "--schedule",
                                     "cosine",
                                     "--warmup",
                                     "4",
                                     "--steps-per-print",
                                     "2",
                                     "--merge-bytes",
                                     "100",
                                     "--steps",
                                     "40"});
  EXPECT_EQ(tc.engine.stage, 3);
  EXPECT_EQ(tc.engine.precision.dtype, DType::kFloat16);
  EXPECT_EQ(tc.engine.seed, 9u);
  EXPECT_EQ(tc.train_batch_size, 12);
  EXPECT_EQ(tc.gradient_accumulation_steps, 3);
  EXPECT_EQ(tc.engine.micro_batches, 3);
  EXPECT_EQ(tc.micro_batch_per_rank, 2);
  EXPECT_FLOAT_EQ(tc.engine.optimizer.lr, 0.002f);
  EXPECT_FLOAT_EQ(tc.engine.optimizer.weight_decay, 0.05f);
  EXPECT_FLOAT_EQ(tc.engine.gradient_clipping, 2.0f);
  EXPECT_EQ(tc.engine.lr_schedule.type, LrScheduleType::kWarmupCosine);
  EXPECT_FLOAT_EQ(tc.engine.lr_schedule.max_lr, 0.002f);
  EXPECT_EQ(tc.engine.lr_schedule.warmup_steps, 4);
  EXPECT_EQ(tc.engine.lr_schedule.total_steps, 40);
  EXPECT_EQ(tc.steps_per_print, 2);
  EXPECT_EQ(tc.engine.schedule.merge_bytes, 100u);
}

// --lr alone moves the schedule's peak with it: a WarmupLR from the file warms up to the flag's
// rate, not the file's.
// --threads sets every CPU kernel's threads (1 by default: a rank per core); --decay-all decays
// the GPT-2's 1-D tensors too (gpt2_test holds what each setting decays).
TEST(TrainFlags, ThreadsAndDecayAll) {
  EXPECT_EQ(resolve({}).engine.kernel_threads, 1);
  EXPECT_EQ(resolve({"--threads", "3"}).engine.kernel_threads, 3);
  const auto gpt2_flags = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"zero-train", "--model", "gpt2", "--data", "tokens.bin"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return parse_flags(static_cast<int>(argv.size()), argv.data());
  };
  EXPECT_TRUE(gpt2_flags({}).gpt2.decay_matrices_only);
  EXPECT_FALSE(gpt2_flags({"--decay-all"}).gpt2.decay_matrices_only);
}

TEST(TrainFlags, LrFlagMovesTheConfigSchedulePeak) {
  const TrainingConfig tc = resolve({"--config", write_config(), "--lr", "0.003"});
  EXPECT_EQ(tc.engine.lr_schedule.type, LrScheduleType::kWarmup);
  EXPECT_FLOAT_EQ(tc.engine.lr_schedule.max_lr, 0.003f);
  EXPECT_FLOAT_EQ(tc.engine.optimizer.lr, 0.003f);
}

// --global-batch alone keeps the file's accumulation steps; --micro-batches alone keeps its
// batch.
TEST(TrainFlags, BatchFlagsEachOverrideTheirOwnValue) {
  TrainingConfig tc = resolve({"--config", write_config(), "--global-batch", "16"});
  EXPECT_EQ(tc.train_batch_size, 16);
  EXPECT_EQ(tc.gradient_accumulation_steps, 2);
  EXPECT_EQ(tc.micro_batch_per_rank, 4);
  tc = resolve({"--config", write_config(), "--micro-batches", "4"});
  EXPECT_EQ(tc.train_batch_size, 8);
  EXPECT_EQ(tc.gradient_accumulation_steps, 4);
  EXPECT_EQ(tc.micro_batch_per_rank, 1);
}

// activation_checkpointing.cpu_checkpointing: a note on the CPU path, where checkpoints are in
// host memory already; on CUDA it moves them, but not into contiguous_memory_optimization's
// buffer (not built). Flags are set here directly: --device cuda needs a CUDA build.
TEST(TrainFlags, CpuCheckpointingDependsOnTheDevice) {
  const std::string path = ::testing::TempDir() + "/train_flags_test_cpu_checkpointing.json";
  std::ofstream(path) << R"({"train_batch_size": 8, "activation_checkpointing": {
    "mode": "full", "cpu_checkpointing": true, "contiguous_memory_optimization": true}})";
  Flags flags;
  flags.model = "gpt2";
  flags.config = path;
  const TrainingConfig on_cpu = resolve_config(flags, 2);
  ASSERT_EQ(on_cpu.ignored_keys.size(), 1u);
  EXPECT_EQ(on_cpu.ignored_keys[0],
            "activation_checkpointing.cpu_checkpointing has no effect here: on the CPU path "
            "checkpoints already live in host memory");
  flags.cuda = true;
  try {
    resolve_config(flags, 2);
    FAIL() << "cpu_checkpointing with contiguous_memory_optimization was accepted on CUDA";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu_checkpointing with contiguous_memory_optimization "
                                         "on CUDA is not built yet; choose one"),
              std::string::npos)
        << e.what();
  }
}

// Ours: activation_checkpointing.nvme_path, or --checkpoint-nvme-path over it; refused where there
// is nothing to spill or the combination is not built, each naming why.
TEST(TrainFlags, CheckpointNvmePath) {
  const std::string path = ::testing::TempDir() + "/train_flags_test_nvme_path.json";
  std::ofstream(path) << R"({"train_batch_size": 8, "activation_checkpointing": {
    "mode": "full", "nvme_path": "/from/config"}})";
  EXPECT_EQ(resolve({"--model", "gpt2", "--data", "t.bin", "--config", path})
                .activation_checkpointing.nvme_path,
            "/from/config");
  EXPECT_EQ(resolve({"--model", "gpt2", "--data", "t.bin", "--config", path,
                     "--checkpoint-nvme-path", "/flag"})
                .activation_checkpointing.nvme_path,
            "/flag");
  auto refusal = [](const Flags& flags) {
    try {
      resolve_config(flags, 2);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  Flags flags;
  flags.model = "gpt2";
  flags.checkpoint_nvme_path = "/nvme";
  EXPECT_NE(refusal(flags).find("no block is checkpointed, so there is nothing to spill"),
            std::string::npos)
      << refusal(flags);
  flags.activation_checkpointing = "full";
  EXPECT_EQ(refusal(flags), "accepted");
  flags.cuda = true;
  EXPECT_NE(refusal(flags).find("the spill is built on the CPU path only"), std::string::npos)
      << refusal(flags);
  flags.cuda = false;
  const std::pair<const char*, const char*> combinations[] = {
      {"cpu_checkpointing", "with cpu_checkpointing is not built"},
      {"contiguous_memory_optimization", "with contiguous_memory_optimization is not built"}};
  for (const auto& [key, expected] : combinations) {
    flags.config = ::testing::TempDir() + "/train_flags_test_nvme_" + key + ".json";
    std::ofstream(flags.config) << R"({"train_batch_size": 8, "activation_checkpointing": {")"
                                << key << R"(": true}})";
    EXPECT_NE(refusal(flags).find(expected), std::string::npos) << refusal(flags);
  }
  flags.config.clear();
  flags.model = "mlp";
  flags.activation_checkpointing.reset();
  EXPECT_NE(refusal(flags).find("only --model gpt2 has activation checkpoints to spill"),
            std::string::npos)
      << refusal(flags);
}

// activation_checkpointing.partition_activations (or --partition-activations, a GPT-2 flag):
// carried to the model with tensor parallelism and checkpointing; otherwise a partition over a
// group of one, or of nothing, so a note at start says it has no effect.
TEST(TrainFlags, PartitionActivationsNeedsTensorParallelismAndCheckpoints) {
  const std::vector<std::string> gpt2 = {"--model", "gpt2", "--data", "tokens.bin",
                                         "--partition-activations"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), gpt2.begin(), gpt2.end());
    return resolve(more);
  };
  const TrainingConfig split = with({"--activation-checkpointing", "full", "--tp", "2"});
  EXPECT_TRUE(split.activation_checkpointing.partition_activations);
  EXPECT_TRUE(split.ignored_keys.empty());
  const TrainingConfig alone = with({"--activation-checkpointing", "selective"});
  ASSERT_EQ(alone.ignored_keys.size(), 1u);
  EXPECT_EQ(alone.ignored_keys[0],
            "activation_checkpointing.partition_activations has no effect without tensor "
            "parallelism (--tp, tensor_parallel.tp_size): it splits checkpoints over the "
            "tensor-parallel group");
  const std::string nothing_checkpointed =
      "activation_checkpointing.partition_activations has no effect: no block is checkpointed";
  const TrainingConfig none = with({"--tp", "2"});
  ASSERT_EQ(none.ignored_keys.size(), 1u);
  EXPECT_EQ(none.ignored_keys[0], nothing_checkpointed);
  // The MLP checkpoints nothing: the config key is the same note, the flag the GPT-2's.
  const std::string path = ::testing::TempDir() + "/train_flags_test_partition.json";
  std::ofstream(path) << R"({"train_batch_size": 8,
    "activation_checkpointing": {"partition_activations": true}})";
  const TrainingConfig mlp = resolve({"--config", path});
  ASSERT_EQ(mlp.ignored_keys.size(), 1u);
  EXPECT_EQ(mlp.ignored_keys[0], nothing_checkpointed);
  EXPECT_THROW(resolve({"--partition-activations"}), driver::UsageError);
}

// --pp-virtual-stages: 2 model chunks per stage by default with --pp-schedule interleaved, 1
// with the others; chunks with another schedule, fewer than 2 with interleaved, and regathering
// per micro-batch with interleaved are refused by name (exit 2 on every rank).
TEST(TrainFlags, VirtualStagesOnlyWithTheInterleavedSchedule) {
  const auto flags = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"zero-train", "--model", "gpt2", "--data", "tokens.bin", "--pp", "2",
                               "--micro-batches", "2", "--global-batch", "4"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return parse_flags(static_cast<int>(argv.size()), argv.data());
  };
  // The settings' refusal on a world of `world` ranks, after `change` edits the config.
  const auto refusal = [](const Flags& f, int world = 2,
                          const std::function<void(TrainingConfig&)>& change = {}) {
    try {
      TrainingConfig config = resolve_config(f, world);
      if (change) change(config);
      check_pipeline_settings(f, config, world);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no refusal");
  };
  EXPECT_EQ(pipeline_virtual_stages(flags({"--pp-schedule", "interleaved"})), 2);
  EXPECT_EQ(pipeline_virtual_stages(flags({})), 1);
  EXPECT_EQ(
      pipeline_virtual_stages(flags({"--pp-schedule", "interleaved", "--pp-virtual-stages", "3"})),
      3);
  EXPECT_EQ(refusal(flags({"--pp-schedule", "interleaved"})), "no refusal");
  EXPECT_EQ(refusal(flags({"--pp-virtual-stages", "2"})),
            "--pp-virtual-stages 2: only --pp-schedule interleaved runs several model chunks per "
            "stage, not 1f1b");
  EXPECT_EQ(refusal(flags({"--pp-schedule", "interleaved", "--pp-virtual-stages", "1"})),
            "--pp-virtual-stages 1: --pp-schedule interleaved needs at least 2 model chunks per "
            "stage");
  EXPECT_EQ(refusal(flags({"--pp-schedule", "interleaved", "--pp-regather"})), "no refusal");
  // A GPU. (The checkpointing settings run under every schedule.)
  // (--device cuda itself is refused before this in a tree built without CUDA.)
  Flags gpu = flags({});
  gpu.cuda = true;
  EXPECT_EQ(refusal(gpu), "--pp: --device cuda is not supported with pipeline parallelism yet");
  std::vector<std::string> partitioned = {
      "--activation-checkpointing", "full",          "--tp", "2",
      "--partition-activations",    "--pp-schedule", "zb-h1"};
  EXPECT_EQ(refusal(flags(partitioned), 4), "no refusal");
  const auto contiguous = [](TrainingConfig& c) {
    c.activation_checkpointing.contiguous_memory_optimization = true;
  };
  for (const char* schedule : {"1f1b", "zb-h1", "interleaved"}) {
    EXPECT_EQ(refusal(flags({"--activation-checkpointing", "full", "--pp-schedule", schedule}), 2,
                      contiguous),
              "no refusal")
        << schedule;
  }
}

// The flag loop the benchmarks share: values to their parsers, switches set, an unknown flag named
// as unknown even when it comes last, a flag without its value named.
TEST(DriverFlags, TableParsesValuesSwitchesAndNamesBadFlags) {
  const auto parse = [](std::vector<std::string> args, int* steps, std::string* json, bool* quick) {
    args.insert(args.begin(), "zero-bench");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    driver::parse_flags(
        static_cast<int>(argv.size()), argv.data(), "usage",
        {{"--steps", driver::integer_flag(steps, 1, 100)}, {"--json", driver::text_flag(json)}},
        {{"--quick", quick}});
  };
  int steps = 0;
  std::string json;
  bool quick = false;
  parse({"--steps", "7", "--quick", "--json", "out.json"}, &steps, &json, &quick);
  EXPECT_EQ(steps, 7);
  EXPECT_EQ(json, "out.json");
  EXPECT_TRUE(quick);
  const auto message = [&](std::vector<std::string> args) {
    try {
      parse(std::move(args), &steps, &json, &quick);
    } catch (const driver::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({"--bogus", "1"}), "unknown flag --bogus");
  EXPECT_EQ(message({"--bogus"}), "unknown flag --bogus");
  EXPECT_EQ(message({"--steps"}), "missing value after --steps");
  EXPECT_NE(message({"--steps", "0"}).find("--steps"), std::string::npos);
}

}  // namespace
}  // namespace zero::examples
