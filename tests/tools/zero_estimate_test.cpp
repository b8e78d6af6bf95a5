// The zero-estimate executable: the paper's numbers as printed, the exact table for both
// precisions and for one stage, parameter counts in every accepted spelling, and bad arguments
// (a message naming the problem, the usage, exit code 2).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tests/run_program.h"

namespace {

using Words = std::vector<std::string>;
using zero::testing::ProgramOutcome;

ProgramOutcome run_estimate(const Words& args) {
  return zero::testing::run_program(ZERO_ESTIMATE_PATH, args);
}

// A successful run prints exactly `table` and nothing on stderr.
void expect_table(const Words& args, const std::string& table) {
  const ProgramOutcome outcome = run_estimate(args);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  EXPECT_EQ(outcome.err, "");
  EXPECT_EQ(outcome.out, table);
}

// The ZeRO paper's Figure 1: 7.5B parameters on 64 ranks, 120 / 31.4 / 16.6 / 1.88 GB.
TEST(ZeroEstimate, PrintsThePapersFigure1) {
  expect_table({"--params", "7.5e9", "--ranks", "64", "--dtype", "bf16"},
               "7500000000 parameters, 64 ranks, bf16 parameters and gradients\n"
               "optimizer state: fp32 master + Adam moments (K = 12 bytes per parameter); "
               "GB = 1e9 bytes\n"
               "stage  params GB  grads GB  optimizer GB  total GB     total bytes\n"
               "    0      15.00     15.00         90.00    120.00    120000000000\n"
               "    1      15.00     15.00          1.41     31.41     31406250000\n"
               "    2      15.00      0.23          1.41     16.64     16640625000\n"
               "    3       0.23      0.23          1.41      1.88      1875000000\n");
}

TEST(ZeroEstimate, Fp32TableHasNoMasterCopy) {
  expect_table({"--ranks", "4", "--params", "1B", "--dtype", "fp32"},
               "1000000000 parameters, 4 ranks, fp32 parameters and gradients\n"
               "optimizer state: Adam moments in fp32 (K = 8 bytes per parameter); GB = 1e9 bytes\n"
               "stage  params GB  grads GB  optimizer GB  total GB     total bytes\n"
               "    0       4.00      4.00          8.00     16.00     16000000000\n"
               "    1       4.00      4.00          2.00     10.00     10000000000\n"
               "    2       4.00      1.00          2.00      7.00      7000000000\n"
               "    3       1.00      1.00          2.00      4.00      4000000000\n");
}

TEST(ZeroEstimate, StagePrintsOneRow) {
  // bf16 is the default: 2 x 350M + 14 x 350M / 8 = 700M + 612.5M bytes.
  expect_table({"--params", "350M", "--ranks", "8", "--stage", "2"},
               "350000000 parameters, 8 ranks, bf16 parameters and gradients\n"
               "optimizer state: fp32 master + Adam moments (K = 12 bytes per parameter); "
               "GB = 1e9 bytes\n"
               "stage  params GB  grads GB  optimizer GB  total GB     total bytes\n"
               "    2       0.70      0.09          0.53      1.31      1312500000\n");
}

// The first line echoes the count as a whole number, so each spelling can be checked exactly.
std::string parsed_count(const std::string& params) {
  const ProgramOutcome outcome = run_estimate({"--params", params, "--ranks", "1"});
  if (outcome.exit_code != 0)
    return "exit " + std::to_string(outcome.exit_code) + ": " + outcome.err;
  return outcome.out.substr(0, outcome.out.find(' '));
}

TEST(ZeroEstimate, ParamsAcceptsEverySpelling) {
  EXPECT_EQ(parsed_count("7.5e9"), "7500000000");
  EXPECT_EQ(parsed_count("7.5E+9"), "7500000000");
  EXPECT_EQ(parsed_count("7.5B"), "7500000000");
  EXPECT_EQ(parsed_count("7.5b"), "7500000000");
  EXPECT_EQ(parsed_count("1.3B"), "1300000000");  // exact decimal, no rounding
  EXPECT_EQ(parsed_count("350M"), "350000000");
  EXPECT_EQ(parsed_count("350m"), "350000000");
  EXPECT_EQ(parsed_count("125K"), "125000");
  EXPECT_EQ(parsed_count("1.2T"), "1200000000000");
  EXPECT_EQ(parsed_count("2.5e-3M"), "2500");
  EXPECT_EQ(parsed_count("0.5K"), "500");
  EXPECT_EQ(parsed_count("1000"), "1000");
  EXPECT_EQ(parsed_count("0012"), "12");
}

void expect_usage_error(const Words& args, const std::string& message) {
  const ProgramOutcome outcome = run_estimate(args);
  EXPECT_EQ(outcome.exit_code, 2) << outcome.out;
  EXPECT_EQ(outcome.out, "");
  const std::string first_line = outcome.err.substr(0, outcome.err.find('\n'));
  EXPECT_EQ(first_line, "zero-estimate: " + message);
  EXPECT_NE(outcome.err.find("usage: zero-estimate"), std::string::npos) << outcome.err;
}

TEST(ZeroEstimate, BadArgumentsExit2WithTheProblem) {
  const std::string spell = "--params needs a number of parameters such as 7.5e9, 7.5B or 350M, ";
  expect_usage_error({}, "missing --params P (the number of parameters)");
  expect_usage_error({"--params", "1B"}, "missing --ranks N (the number of data-parallel ranks)");
  expect_usage_error({"--ranks", "2"}, "missing --params P (the number of parameters)");
  expect_usage_error({"--params"}, "--params needs a value");
  expect_usage_error({"--params", "1B", "--ranks"}, "--ranks needs a value");
  expect_usage_error({"--params", "abc", "--ranks", "2"}, spell + "got 'abc'");
  expect_usage_error({"--params", "", "--ranks", "2"}, spell + "got ''");
  expect_usage_error({"--params", "-5", "--ranks", "2"}, spell + "got '-5'");
  expect_usage_error({"--params", "7.5G", "--ranks", "2"}, spell + "got '7.5G'");
  expect_usage_error({"--params", "7.5BB", "--ranks", "2"}, spell + "got '7.5BB'");
  expect_usage_error({"--params", "1e", "--ranks", "2"}, spell + "got '1e'");
  expect_usage_error({"--params", "B", "--ranks", "2"}, spell + "got 'B'");
  expect_usage_error({"--params", "0", "--ranks", "2"}, "--params must be at least 1, got '0'");
  expect_usage_error({"--params", "1.5", "--ranks", "2"}, "--params 1.5 is not a whole number");
  expect_usage_error({"--params", "1e-4K", "--ranks", "2"}, "--params 1e-4K is not a whole number");
  expect_usage_error({"--params", "2e18", "--ranks", "2"}, "--params 2e18 is too large");
  expect_usage_error({"--params", "1e400", "--ranks", "2"}, "--params 1e400 is too large");
  expect_usage_error({"--params", "1B", "--ranks", "0"},
                     "--ranks must be from 1 to 2147483647, got 0");
  expect_usage_error({"--params", "1B", "--ranks", "x"}, "--ranks needs a whole number, got 'x'");
  expect_usage_error({"--params", "1B", "--ranks", "99999999999"},
                     "--ranks must be from 1 to 2147483647, got 99999999999");
  expect_usage_error({"--params", "1B", "--ranks", "2", "--dtype", "int8"},
                     "--dtype must be bf16, fp16 or fp32, got 'int8'");
  expect_usage_error({"--params", "1B", "--ranks", "2", "--stage", "4"},
                     "--stage must be from 0 to 3, got 4");
  expect_usage_error({"--params", "1B", "--ranks", "2", "--stage", "-1"},
                     "--stage needs a whole number, got '-1'");
  expect_usage_error({"--params", "1B", "--ranks", "2", "--verbose"}, "unknown option '--verbose'");
  expect_usage_error({"--params", "1B", "--ranks", "2", "extra"}, "unexpected argument 'extra'");
}

// Sizes past 64 bits are refused naming what was counted, never printed modulo 2^64: a GPT-2
// of 2^17 layers 2^20 wide (1.7e18 parameters, 18 bytes each at stage 0), an MLP of 2^20 layers
// 2^20 wide, and the activations of 2^20 sequences of 2^20 tokens.
TEST(ZeroEstimate, SizesPast64BitsAreRefused) {
  const std::vector<Words> cases = {
      {"--model", "gpt2", "--n-layer", "131072", "--n-embd", "1048576", "--ranks", "1"},
      {"--model", "mlp", "--hidden", "1048576", "--layers", "1048576", "--ranks", "1"},
      {"--model", "gpt2", "--n-layer", "1", "--n-head", "1", "--n-embd", "1048576", "--block-size",
       "1048576", "--micro-batch", "1048576", "--ranks", "1", "--stage", "3"},
  };
  for (const Words& args : cases) {
    const ProgramOutcome outcome = run_estimate(args);
    EXPECT_EQ(outcome.exit_code, 2) << outcome.out;
    EXPECT_NE(outcome.err.find("zero-estimate: too large to count in 64 bits: "), std::string::npos)
        << outcome.err;
  }
}

// ZeRO-Offload planned for a GPU: the device keeps the bf16 parameters and the fp32 gradients
// (Ψ = 39360 padded, N = 2: stage 1 2Ψ + 4Ψ, stage 2 2Ψ + 4Ψ/N, stage 3 2Ψ/N + 4Ψ/N); the host
// per owned element the master and two moments (12 bytes; pageable unless --pin-memory, as
// DeepSpeed's pin_memory defaults to false) and, always pinned, the gradient shard's fp32 copy
// and the bf16 working copy (6 bytes); NCCL stages nothing, so the buffers are a GPU run's.
TEST(ZeroEstimate, OffloadOptimizerCpuPlansEachTier) {
  const std::string header =
      "mlp: 39312 parameters (39360 padded) in 4 units, 2 ranks, bf16\n"
      "stage  model state bytes  buffer bytes  total bytes per rank  nvme bytes  pinned host "
      "bytes  pageable host bytes\n";
  expect_table({"--model", "mlp", "--ranks", "2", "--offload-optimizer", "cpu"},
               header +
                   "    1             236160         66048                302208           0  "
                   "           118080               236160\n"
                   "    2             157440         66048                223488           0  "
                   "           118080               236160\n"
                   "    3             118080        132096                250176           0  "
                   "           118080               236160\n"
                   "tiers per rank (a GPU run): device = total bytes per rank; host: the fp32 "
                   "master and optimizer state (pageable; --pin-memory pins them), the copies of "
                   "the gradient shard and the updated parameters (pinned; fp32 parameters with "
                   "--pin-memory go from the master itself); nvme 0\n");
  expect_table(
      {"--model", "mlp", "--ranks", "2", "--offload-optimizer", "cpu", "--pin-memory", "--stage",
       "3"},
      header +
          "    3             118080        132096                250176           0  "
          "           354240                    0\n"
          "tiers per rank (a GPU run): device = total bytes per rank; host: the fp32 master and "
          "optimizer state (pinned), the copies of the gradient shard and the updated "
          "parameters (pinned; fp32 parameters with --pin-memory go from the master itself); "
          "nvme 0\n");
  expect_usage_error({"--params", "1B", "--ranks", "2", "--offload-optimizer", "cpu"},
                     "--offload-optimizer cpu plans a --model's layout");
  expect_usage_error({"--params", "1B", "--ranks", "2", "--gpu"}, "--gpu plans a --model's layout");
  // ZeRO-Infinity's usual split: the shards leave the device's model state (39360 bytes) for
  // the file, through 5 pinned buffers of the largest shard (20480 bytes, and 4096 to align
  // them) with as many device buffers beside them, and no unit keeps a host copy of its
  // parameters (39360 bytes less of pinned memory).
  expect_table(
      {"--model", "mlp", "--ranks", "2", "--offload-optimizer", "cpu", "--offload-param", "nvme"},
      header +
          "    3              78720        234496                313216       53248  "
          "           185216               236160\n"
          "tiers per rank (a GPU run): device = total bytes per rank; host: the fp32 master and "
          "optimizer state (pageable; --pin-memory pins them), the copies of the gradient shard "
          "and the updated parameters (pinned; fp32 parameters with --pin-memory go from the "
          "master itself), the parameter shards' buffers (pinned; device buffers beside them); "
          "nvme = nvme bytes (the parameter shards)\n");
  expect_usage_error(
      {"--model", "mlp", "--ranks", "4", "--offload-optimizer", "cpu", "--mics-shard-size", "2",
       "--stage", "3"},
      "--offload-optimizer cpu with --mics-shard-size is not supported by the engine");
  expect_usage_error({"--model", "mlp", "--ranks", "2", "--offload-optimizer", "gpu"},
                     "--offload-optimizer must be none, cpu or nvme, got 'gpu'");
  expect_usage_error({"--model", "mlp", "--ranks", "2", "--pin-memory"},
                     "--pin-memory places --offload-optimizer cpu's state; there is none to place");
}

// NVMe offload planned for a GPU (--gpu): with the shards on NVMe the device loses the bf16
// shard (39360 bytes of model state) and gains 5 device buffers of the largest shard (20480
// bytes each), the host holds their 5 page-locked twins and 4096 bytes to align them; with the
// optimizer on NVMe too, the device keeps no master or moments, and the host adds the records'
// 4 pinned staging slots (each 3 arrays of 19680 floats, aligned: 245760 bytes; 4096 more to
// align them), the gradient shard's fp32 copy (78720) and nothing for the parameters (their
// shards' buffers are what the host updates).
TEST(ZeroEstimate, GpuPlansNvmeOffloadTiers) {
  const std::string header =
      "mlp: 39312 parameters (39360 padded) in 4 units, 2 ranks, bf16\n"
      "stage  model state bytes  buffer bytes  total bytes per rank  nvme bytes  pinned host "
      "bytes  pageable host bytes\n";
  expect_table({"--model", "mlp", "--ranks", "2", "--gpu", "--offload-param", "nvme"},
               header +
                   "    3             314880        234496                549376       53248  "
                   "           106496                    0\n"
                   "tiers per rank (a GPU run): device = total bytes per rank; host: the "
                   "parameter shards' buffers (pinned; device buffers beside them); nvme = nvme "
                   "bytes\n");
  expect_table({"--model", "mlp", "--ranks", "2", "--gpu", "--offload-optimizer", "nvme",
                "--offload-param", "nvme"},
               header +
                   "    3              78720        234496                313216      299008  "
                   "          1172352                    0\n"
                   "tiers per rank (a GPU run): device = total bytes per rank; host: the "
                   "optimizer records' and the parameter shards' staging, the copies of the "
                   "gradient shard and the updated parameters (all pinned); nvme = nvme bytes\n");
}

TEST(ZeroEstimate, BadShardSizesAreUsageErrors) {
  // The engine's own check names a shard size the world cannot use (its message ends with
  // where it was raised, so only its text is compared).
  const ProgramOutcome bad =
      run_estimate({"--model", "mlp", "--ranks", "4", "--mics-shard-size", "3"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.err.find("zero-estimate: mics_shard_size must be -1 (off) or a shard group size "
                         "from 1 to the 4 ranks that divides them, got 3"),
            std::string::npos)
      << bad.err;
  expect_usage_error({"--model", "mlp", "--ranks", "4", "--mics-shard-size", "2", "--stage", "2"},
                     "--mics-shard-size is hybrid sharding of stage 3, not stage 2");
  expect_usage_error({"--params", "1B", "--ranks", "4", "--mics-shard-size", "2"},
                     "--mics-shard-size plans a --model's layout");
}

// hpZ's secondary shards split each unit over a node's ranks: a divisor of the ranks, stage 3.
TEST(ZeroEstimate, BadHpzPartitionSizesAreUsageErrors) {
  expect_usage_error({"--model", "mlp", "--ranks", "4", "--hpz-partition-size", "3"},
                     "--hpz-partition-size 3 must divide the 4 data-parallel ranks");
  expect_usage_error(
      {"--model", "mlp", "--ranks", "4", "--hpz-partition-size", "2", "--stage", "2"},
      "--hpz-partition-size is ZeRO++'s hpZ of stage 3, not stage 2");
  expect_usage_error({"--params", "1B", "--ranks", "4", "--hpz-partition-size", "2"},
                     "--hpz-partition-size plans a --model's layout");
  expect_usage_error(
      {"--model", "mlp", "--ranks", "4", "--hpz-partition-size", "2", "--mics-shard-size", "2"},
      "--hpz-partition-size with --mics-shard-size is not supported by the engine");
}

// The GPT-2's activations beside its model state: the reference model (2 layers, 4 heads, 64
// wide, vocabulary 256) with 2 sequences of 16 tokens per rank. The activation bytes are
// gpt2_memory.h's formula worked by hand (N = 32 positions): none keeps 2 x 132096 in its blocks,
// selective 2 x 41472 plus 90624 recomputed, full 2 x 8192 plus 123904; each adds the embedding's
// 128 and the head's 49664 (backward writes its gradients over activations it is done with).
// The stage-3 total adds the table's row.
const Words kGpt2 = {"--model",       "gpt2", "--n-layer",    "2",   "--n-head",     "4",
                     "--n-embd",      "64",   "--vocab-size", "256", "--block-size", "64",
                     "--ranks",       "2",    "--stage",      "3",   "--dtype",      "fp32",
                     "--micro-batch", "2",    "--seq-len",    "16"};

Words with(Words args, const Words& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The stage row's total bytes per rank (its fourth column).
unsigned long long stage_total(const std::string& out, int stage) {
  const std::string row = "\n    " + std::to_string(stage) + "  ";
  const size_t at = out.find(row);
  EXPECT_NE(at, std::string::npos) << out;
  unsigned long long state = 0, buffers = 0, total = 0;
  EXPECT_EQ(std::sscanf(out.c_str() + at, " %*d %llu %llu %llu", &state, &buffers, &total), 3);
  EXPECT_EQ(total, state + buffers);
  return total;
}

TEST(ZeroEstimate, Gpt2ActivationsForEachCheckpointing) {
  const ProgramOutcome outcome = run_estimate(kGpt2);
  ASSERT_EQ(outcome.exit_code, 0) << outcome.err;
  const unsigned long long engine = stage_total(outcome.out, 3);
  char rows[512];
  std::snprintf(rows, sizeof(rows),
                "activations of 2 x 16 tokens per rank (fp32; selective and full checkpoint every "
                "block):\n"
                "recompute  activation bytes  checkpoint bytes  stage 3 total bytes\n"
                "none                 313984                 0  %19llu\n"
                "selective            223360             16384  %19llu\n"
                "full                 190080             16384  %19llu\n",
                engine + 313984, engine + 223360, engine + 190080);
  const std::string& out = outcome.out;
  ASSERT_NE(out.find("activations of"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.find("activations of")), rows);
}

// --partition-activations with --tp T: each checkpointed block keeps 1/T of its input
// (N C / T floats) and the shared recompute buffers one whole input more (gpt2_memory.h), worked
// by hand. At T = 2 with 2 layers the two cancel in the total: the blocks keep 2 x 4096 fewer
// bytes and the buffers hold 8192 more (none 198784, selective 140928, full 124288 as without);
// at T = 4 (Cl = 16, one head per rank) the blocks keep 2 x 6144 fewer and the buffers 8192
// more: full 91392 - 4096. Without --tp it has no effect, and says so.
TEST(ZeroEstimate, Gpt2PartitionedCheckpoints) {
  auto table = [](const Words& more) {
    const ProgramOutcome outcome = run_estimate(with(kGpt2, more));
    EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
    const unsigned long long engine = stage_total(outcome.out, 3);
    const size_t at = outcome.out.find("activations of");
    EXPECT_NE(at, std::string::npos) << outcome.out;
    return std::pair{engine, outcome.out.substr(at)};
  };
  const auto [two, at_two] = table({"--tp", "2", "--partition-activations"});
  char rows[640];
  std::snprintf(rows, sizeof(rows),
                "activations of 2 x 16 tokens per rank (fp32; selective and full checkpoint every "
                "block, partitioned over 2 tensor-parallel ranks):\n"
                "recompute  activation bytes  checkpoint bytes  stage 3 total bytes\n"
                "none                 198784                 0  %19llu\n"
                "selective            140928              8192  %19llu\n"
                "full                 124288              8192  %19llu\n",
                two + 198784, two + 140928, two + 124288);
  EXPECT_EQ(at_two, rows);
  const std::string at_four = table({"--tp", "4", "--partition-activations"}).second;
  EXPECT_NE(at_four.find("\nfull                  87296              4096  "), std::string::npos)
      << at_four;
  const std::string unsplit = table({"--partition-activations"}).second;
  EXPECT_NE(unsplit.find("partition_activations without effect at --tp 1):\n"), std::string::npos)
      << unsplit;
  EXPECT_NE(unsplit.find("\nfull                 190080             16384  "), std::string::npos)
      << unsplit;
  // Nor does it stand in the way of the spill there, as zero-train takes both.
  const std::string spilled =
      table({"--partition-activations", "--checkpoint-nvme-path", "/tmp"}).second;
  EXPECT_NE(spilled.find("without effect at --tp 1, spilled to NVMe):\n"), std::string::npos)
      << spilled;
}

// With a budget: the lightest recomputation that fits, counting what zero-train's budget holds
// beside the activations (fp32: 3 N C + 3 N floats of tensors between modules and batch data).
TEST(ZeroEstimate, Gpt2MemoryLimitNamesTheCheckpointingThatFits) {
  const unsigned long long engine = stage_total(run_estimate(kGpt2).out, 3);
  const unsigned long long beside = (3 * 32 * 64 + 3 * 32) * 4;
  auto verdict = [&](unsigned long long limit) {
    const ProgramOutcome outcome =
        run_estimate(with(kGpt2, {"--memory-limit", std::to_string(limit)}));
    EXPECT_EQ(outcome.exit_code, 0) << outcome.err;
    EXPECT_NE(outcome.out.find("beside them: " + std::to_string(beside) + " bytes"),
              std::string::npos)
        << outcome.out;
    const size_t at = outcome.out.find("stage 3 in ");
    return at == std::string::npos ? outcome.out : outcome.out.substr(at);
  };
  // And the most sequences per rank each setting fits in the limit (held to zero-train's
  // budget by tests/models/gpt2_largest_micro_batch.sh): one more is past the limit.
  const std::pair<unsigned long long, std::string> cases[] = {
      {313984,
       "fits with activation checkpointing none; the most sequences per rank: none 2, "
       "selective 2, full 3\n"},
      {313983,
       "fits with activation checkpointing selective; the most sequences per rank: "
       "none 1, selective 2, full 3\n"},
      {190080,
       "fits with activation checkpointing full; the most sequences per rank: none 1, "
       "selective 1, full 2\n"},
      {190079,
       "does not fit with any activation checkpointing; the most sequences per rank: "
       "none 1, selective 1, full 1\n"},
  };
  for (const auto& [activations, said] : cases) {
    const unsigned long long limit = engine + beside + activations;
    EXPECT_EQ(verdict(limit), "stage 3 in " + std::to_string(limit) + " bytes: " + said);
  }
}

TEST(ZeroEstimate, Gpt2ActivationFlagsNeedTheirContext) {
  expect_usage_error({"--params", "1B", "--ranks", "2", "--micro-batch", "2"},
                     "--micro-batch, --seq-len, --number-checkpoints, --partition-activations, "
                     "--contiguous-memory-optimization, --checkpoint-nvme-path and --memory-limit "
                     "plan the activations of --model gpt2");
  expect_usage_error({"--model", "gpt2", "--ranks", "2", "--seq-len", "16"},
                     "--seq-len, --number-checkpoints, --partition-activations, "
                     "--contiguous-memory-optimization, --checkpoint-nvme-path and --memory-limit "
                     "need --micro-batch B");
  expect_usage_error({"--model", "gpt2", "--ranks", "2", "--contiguous-memory-optimization"},
                     "--seq-len, --number-checkpoints, --partition-activations, "
                     "--contiguous-memory-optimization, --checkpoint-nvme-path and --memory-limit "
                     "need --micro-batch B");
  expect_usage_error({"--model", "gpt2", "--ranks", "2", "--micro-batch", "2",
                      "--contiguous-memory-optimization", "--checkpoint-nvme-path", "/tmp"},
                     "--checkpoint-nvme-path with --contiguous-memory-optimization: zero-train "
                     "does not spill those checkpoints; choose one");
  expect_usage_error(
      {"--model", "gpt2", "--ranks", "2", "--micro-batch", "2", "--checkpoint-nvme-path", ""},
      "--checkpoint-nvme-path needs a directory, got ''");
  expect_usage_error({"--model", "gpt2", "--ranks", "2", "--micro-batch", "2", "--seq-len", "65"},
                     "--seq-len 65 is longer than the block size 64");
}

// --pp: each pipeline stage planned apart, worked by hand for a 4-layer GPT-2 (C 64, H 4, V 256)
// cut uniformly into 2 stages on 4 ranks (2 data-parallel per stage), 2 x 16 tokens (N = 32)
// per micro-batch. Parameters: a block 12 C^2 + 13 C = 49984, wte 16384 and wpe 4096 on the
// first stage, wte again and ln_f (128) on the last. Activations per micro-batch (floats): the
// first stage N + 2 N (16 C + 4 + H) = 66080, the last 2 N (16 C + 4 + H) + N (2 C + V + 4) =
// 78464 without recomputation; with full, the blocks keep N C each and the stage's one set of
// recompute buffers is N (15 C + 4 + H) = 30976. gpipe holds all 4 micro-batches on both
// stages, 1f1b 2 on the first and 1 on the last.
const Words kGpt2Pipeline = {
    "--model",        "gpt2",    "--n-layer",       "4",  "--n-head",  "4",  "--n-embd", "64",
    "--vocab-size",   "256",     "--block-size",    "64", "--ranks",   "4",  "--stage",  "3",
    "--dtype",        "fp32",    "--micro-batch",   "2",  "--seq-len", "16", "--pp",     "2",
    "--pp-partition", "uniform", "--micro-batches", "4"};

// The head of pipeline stage `stage`'s activation table for kGpt2Pipeline and its row without
// recomputation: `activation_bytes`, and `total` bytes at ZeRO stage 3.
std::string pipeline_stage_rows(int stage, unsigned long long activation_bytes,
                                unsigned long long total) {
  char rows[512];
  std::snprintf(rows, sizeof(rows),
                "activations of 2 x 16 tokens per rank on pipeline stage %d, 4 micro-batches in "
                "flight (fp32; selective and full checkpoint every block):\n"
                "recompute  activation bytes  checkpoint bytes  stage 3 total bytes\n"
                "none      %17llu                 0  %19llu\n",
                stage, activation_bytes, total);
  return rows;
}

TEST(ZeroEstimate, Gpt2PipelinePlansEachStage) {
  const ProgramOutcome gpipe = run_estimate(with(kGpt2Pipeline, {"--pp-schedule", "gpipe"}));
  ASSERT_EQ(gpipe.exit_code, 0) << gpipe.err;
  const std::string& out = gpipe.out;
  EXPECT_EQ(out.substr(0, out.find('\n') + 1),
            "pipeline of 2 stages (uniform partition, gpipe schedule, 4 micro-batches per step): "
            "each stage on 2 data-parallel x 1 tensor-parallel ranks, 4 ranks in all\n");
  const size_t first = out.find("\npipeline stage 0:");
  const size_t last = out.find("\npipeline stage 1:");
  ASSERT_NE(first, std::string::npos) << out;
  ASSERT_NE(last, std::string::npos) << out;
  const std::string stage0 = out.substr(first + 1, last - first);
  const std::string stage1 = out.substr(last + 1);
  EXPECT_EQ(stage0.substr(0, stage0.find("stage  model")),
            "pipeline stage 0: layers 0-1 + embeddings, 4 micro-batches in flight\n"
            "gpt2: 120448 parameters (120448 padded) in 3 units, 2 ranks, fp32\n");
  EXPECT_EQ(stage1.substr(0, stage1.find("stage  model")),
            "pipeline stage 1: layers 2-3 + ln_f, head (its own wte), 4 micro-batches in flight\n"
            "gpt2: 116480 parameters (116480 padded) in 4 units, 2 ranks, fp32\n");
  const unsigned long long engine0 = stage_total(stage0, 3);
  const unsigned long long engine1 = stage_total(stage1, 3);
  EXPECT_NE(stage0.find(pipeline_stage_rows(0, 1057280, engine0 + 4 * 4 * 66080ull)),
            std::string::npos)
      << stage0;
  // Full: 4 x (N + 2 N C) + N (15 C + 4 + H); the checkpoints 4 x 2 N C.
  EXPECT_NE(stage0.find("\nfull                 189952             65536  "), std::string::npos)
      << stage0;
  EXPECT_NE(stage1.find(pipeline_stage_rows(1, 1255424, engine1 + 4 * 4 * 78464ull)),
            std::string::npos)
      << stage1;

  const ProgramOutcome one_f_one_b = run_estimate(kGpt2Pipeline);  // 1f1b is the default
  ASSERT_EQ(one_f_one_b.exit_code, 0) << one_f_one_b.err;
  const std::string& b = one_f_one_b.out;
  EXPECT_NE(b.find("pipeline stage 0: layers 0-1 + embeddings, 2 micro-batches in flight\n"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find("pipeline stage 1: layers 2-3 + ln_f, head (its own wte), 1 micro-batch in "
                   "flight\n"),
            std::string::npos)
      << b;
  EXPECT_NE(b.find("\nnone                 528640  "), std::string::npos) << b;  // 2 x 66080 x 4
  EXPECT_NE(b.find("\nnone                 313856  "), std::string::npos) << b;  // 78464 x 4

  // Interleaved: stage s holds virtual stages s and 2 + s, a block each, with 2(p - s - 1) + p + 1
  // (micro-batch, chunk) pairs in flight (estimate_pipeline_matches_engine.sh holds its
  // activations to zero-train's).
  const ProgramOutcome interleaved =
      run_estimate(with(kGpt2Pipeline, {"--pp-schedule", "interleaved"}));
  ASSERT_EQ(interleaved.exit_code, 0) << interleaved.err;
  const std::string& i = interleaved.out;
  EXPECT_NE(i.find("interleaved schedule, 2 model chunks per stage, 4 micro-batches per step"),
            std::string::npos)
      << i;
  EXPECT_NE(i.find("pipeline stage 0: layers 0-0, 2-2 + embeddings, 5 (micro-batch, chunk) pairs "
                   "in flight\n"),
            std::string::npos)
      << i;
  EXPECT_NE(i.find("pipeline stage 1: layers 1-1, 3-3 + ln_f, head (its own wte), 3 (micro-batch, "
                   "chunk) pairs in flight\n"),
            std::string::npos)
      << i;
}

// --pp with the checkpoint spill (as zero-train --pp): per stage, its checkpointed blocks' file
// holds a region (a checkpoint, 2 N C = 8192 bytes, a multiple of 4096 already) per micro-batch one
// chunk of the stage holds in flight, and the checkpoints in memory are the spill's buffer, two
// regions and 4032 bytes of slack, once for all of them: gpipe's full on stage 0 keeps 4 x N of
// the embedding's + N (15 C + 4 + H) of recompute buffers + the buffer, 4 x 2 regions on NVMe.
// Interleaved: stage 0's chunk 0 holds 4 micro-batches in flight at most, stage 1's chunks 3.
TEST(ZeroEstimate, Gpt2PipelinePlansTheSpillPerMicroBatchInFlight) {
  const Words spilled = with(kGpt2Pipeline, {"--checkpoint-nvme-path", "/tmp"});
  const ProgramOutcome gpipe = run_estimate(with(spilled, {"--pp-schedule", "gpipe"}));
  ASSERT_EQ(gpipe.exit_code, 0) << gpipe.err;
  const unsigned long long buffer = 2 * 8192 + 4032;
  EXPECT_EQ(4 * 4 * 32 + 4 * 32 * (15 * 64 + 4 + 4) + buffer, 144832u);
  EXPECT_NE(gpipe.out.find("\nfull                 144832             20416       65536  "),
            std::string::npos)
      << gpipe.out;
  const ProgramOutcome interleaved = run_estimate(with(spilled, {"--pp-schedule", "interleaved"}));
  ASSERT_EQ(interleaved.exit_code, 0) << interleaved.err;
  const std::string& i = interleaved.out;
  const size_t last = i.find("\npipeline stage 1:");
  ASSERT_NE(last, std::string::npos) << i;
  EXPECT_NE(i.substr(0, last).find("\nfull                 144832             20416       65536  "),
            std::string::npos)
      << i;
  EXPECT_NE(i.substr(last).find("\nfull                 193984             20416       49152  "),
            std::string::npos)
      << i;
}

// As expect_usage_error, for a message the model's check gives (its source location follows).
void expect_usage_error_from_model(const Words& args, const std::string& message) {
  const ProgramOutcome outcome = run_estimate(args);
  EXPECT_EQ(outcome.exit_code, 2) << outcome.out;
  EXPECT_EQ(outcome.err.rfind("zero-estimate: " + message + " (", 0), 0u) << outcome.err;
}

TEST(ZeroEstimate, Gpt2PipelineBadArguments) {
  const Words gpt2 = {"--model", "gpt2", "--n-layer", "4", "--n-head", "4", "--n-embd", "64"};
  expect_usage_error(with(gpt2, {"--ranks", "4", "--pp", "3"}),
                     "--pp 3 does not divide --ranks 4: with --pp, --ranks is the job's ranks, "
                     "pipeline stages x data-parallel x tensor-parallel ranks");
  expect_usage_error(with(gpt2, {"--ranks", "6", "--pp", "2", "--tp", "2"}),
                     "--pp 2 x --tp 2 does not divide --ranks 6: with --pp, --ranks is the job's "
                     "ranks, pipeline stages x data-parallel x tensor-parallel ranks");
  expect_usage_error_from_model(
      with(gpt2, {"--ranks", "5", "--pp", "5"}),
      "--pp 5: a GPT-2 of 4 layers cannot be cut into 5 pipeline stages of at "
      "least one block each");
  expect_usage_error_from_model(
      with(gpt2, {"--ranks", "3", "--pp", "3", "--pp-partition", "uniform"}),
      "--pp 3: --pp-partition uniform: 3 pipeline stages do not divide the 4 "
      "layers (n_layer)");
  expect_usage_error_from_model(
      with(gpt2, {"--ranks", "2", "--pp", "2", "--pp-schedule", "fifo"}),
      "--pp-schedule: unknown pipeline schedule 'fifo': expected gpipe, 1f1b, interleaved or "
      "zb-h1");
  // Interleaved: 2 model chunks per stage unless --pp-virtual-stages says otherwise, each
  // virtual stage a block at least, the micro-batches a multiple of the stages.
  expect_usage_error_from_model(
      with(gpt2,
           {"--ranks", "4", "--pp", "4", "--pp-schedule", "interleaved", "--micro-batches", "4"}),
      "--pp 4 x --pp-virtual-stages 2 = 8 virtual stages: a GPT-2 of 4 layers cannot be cut into "
      "8 pipeline stages of at least one block each");
  expect_usage_error_from_model(
      with(gpt2,
           {"--ranks", "2", "--pp", "2", "--pp-schedule", "interleaved", "--micro-batches", "3"}),
      "--pp-schedule: the interleaved schedule needs the micro-batches to be a multiple of the "
      "stages (as Megatron's), got 3 micro-batches for 2 stages");
  expect_usage_error(with(gpt2, {"--ranks", "2", "--pp", "2", "--pp-virtual-stages", "2"}),
                     "--pp-virtual-stages 2: only --pp-schedule interleaved runs several model "
                     "chunks per stage, not 1f1b");
  expect_usage_error(with(gpt2, {"--ranks", "2", "--pp", "2", "--pp-partition", "blocks"}),
                     "--pp-partition must be parameters, uniform, flops or type:REGEX, got "
                     "'blocks'");
  expect_usage_error(with(gpt2, {"--ranks", "2", "--micro-batches", "4"}),
                     "--pp-partition, --pp-schedule and --micro-batches plan a pipeline: they "
                     "need --pp P (2 or more stages)");
  expect_usage_error({"--model", "mlp", "--ranks", "2", "--pp", "2"},
                     "--pp cuts --model gpt2 into pipeline stages; the --model mlp has no stages");
  expect_usage_error({"--params", "1B", "--ranks", "2", "--pp", "2"},
                     "--pp cuts --model gpt2 into pipeline stages; the --params formulas have no "
                     "stages");
  expect_usage_error(with(gpt2, {"--ranks", "2", "--pp", "2", "--gpu"}),
                     "--gpu with --pp: zero-train runs pipeline parallelism on the CPU only");
  expect_usage_error(with(gpt2, {"--ranks", "2", "--pp", "2", "--offload-optimizer", "cpu"}),
                     "--offload-optimizer cpu (a GPU run) with --pp: zero-train runs pipeline "
                     "parallelism on the CPU only");
  // Hybrid sharding divides each stage's data-parallel ranks, not the job's (the engine's
  // message ends with where it was raised).
  const ProgramOutcome hybrid =
      run_estimate(with(gpt2, {"--ranks", "4", "--pp", "2", "--mics-shard-size", "4"}));
  EXPECT_EQ(hybrid.exit_code, 2) << hybrid.out;
  EXPECT_NE(hybrid.err.find("zero-estimate: mics_shard_size must be -1 (off) or a shard group "
                            "size from 1 to the 2 ranks that divides them, got 4"),
            std::string::npos)
      << hybrid.err;
  expect_usage_error(with(gpt2, {"--ranks", "2", "--pp", "2", "--micro-batches", "0"}),
                     "--micro-batches must be from 1 to 1048576, got 0");
}

TEST(ZeroEstimate, HelpPrintsUsage) {
  const ProgramOutcome outcome = run_estimate({"--help"});
  EXPECT_EQ(outcome.exit_code, 0);
  EXPECT_EQ(outcome.out.compare(0, 20, "usage: zero-estimate"), 0) << outcome.out;
}

}  // namespace
