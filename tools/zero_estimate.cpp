// zero-estimate: model-state memory per rank for each ZeRO stage, before anything runs.
//
//   zero-estimate --params 7.5B --ranks 64 [--dtype bf16|fp16|fp32] [--stage S]
//   zero-estimate --model mlp [--input-dim N --hidden N --output-dim N --layers N]
//                 [--merge-bytes N] --ranks 2 [--dtype D] [--stage S]
//   zero-estimate --model gpt2 [--preset gpt2-1.5B] [--n-layer N --n-head N --n-embd N
//                 --vocab-size N --block-size N] --ranks 8 [--dtype D] [--stage S]
//   zero-estimate --model mlp --ranks 8 --mics-shard-size 2    (hybrid sharding, stage 3)
//   zero-estimate --model gpt2 ... --micro-batch B [--seq-len T] [--number-checkpoints K]
//                 [--partition-activations] [--checkpoint-nvme-path DIR] [--memory-limit BYTES]
//                                              (activations too, for none/selective/full)
//
// prints one row per stage (or only stage S): parameters, gradients, optimizer state (fp32
// master and Adam moments) and their total per rank, in GB (1e9 bytes) and in bytes. With the
// arguments above it gives the ZeRO paper's Figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.88 GB.
// With --model, the model's real layout is planned instead: padding, units and the
// engine's pooled buffers included, the exact bytes the engine then allocates (the defaults
// are zero-train's). With --micro-batch the GPT-2's activations of B sequences of T tokens per
// rank follow (models/gpt2_memory.h's formula: what zero-train's allocator counts and its step
// records' peak_activation_bytes measure), for each activation-checkpointing setting, with the
// total per rank at each stage and, with --memory-limit, the setting that fits. Exit code 2 for
// bad arguments, a plan the engine refuses and sizes past 64 bits.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "driver/cli.h"
#include "models/gpt2.h"
#include "models/mlp.h"
#include "zero/core/check.h"
#include "zero/core/checked_size.h"
#include "zero/core/dtype.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/estimate.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-estimate --params P --ranks N [--dtype bf16|fp16|fp32] [--stage S]\n"
    "  --params P  number of parameters: 7.5e9, 7.5B, 350M, 125K, 1.2T or 1000000\n"
    "  --ranks N   data-parallel ranks (N >= 1)\n"
    "  --dtype D   dtype of parameters and gradients: bf16 (default), fp16 or fp32\n"
    "  --stage S   print only ZeRO stage S (0-3); default: every stage\n"
    "  --model mlp instead of --params: plan the MLP's real layout (and its shape\n"
    "              flags --input-dim --hidden --output-dim --layers --merge-bytes)\n"
    "  --model gpt2 the same for the GPT-2: --preset tiny|gpt2-124M|gpt2-350M|gpt2-774M|\n"
    "              gpt2-1.5B, then --n-layer --n-head --n-embd --vocab-size --block-size\n"
    "  with --model: --offload-optimizer none|cpu|nvme: cpu plans a GPU run with the\n"
    "              master and optimizer state in host memory (ZeRO-Offload; the host\n"
    "              columns; page-locked with --pin-memory, as the config's pin_memory),\n"
    "              nvme the optimizer state on NVMe, with\n"
    "              --sub-group-size N (default 1e9) and --buffer-count N (default 4), as the\n"
    "              config's offload_optimizer and sub_group_size; the nvme column is the files\n"
    "  with --model: --gpu plans a GPU run (implied by --offload-optimizer cpu): the device\n"
    "              holds the table's bytes, the host columns what the copies across the bus\n"
    "              go through (an NVMe offload's staging, the gradient and parameter copies)\n"
    "  with --model: --offload-param none|nvme (stage 3's parameter shards on NVMe, only\n"
    "              stage 3 is planned), --param-buffer-count N (default 5) and\n"
    "              --param-buffer-size N (elements, default 1e8), as the config's offload_param\n"
    "  with --model: --grad-accum-dtype D: the dtype gradients accumulate in (the config's\n"
    "              data_types.grad_accum_dtype; default fp32 for bf16, else the dtype)\n"
    "  with --model: --mics-shard-size K: hybrid sharding (the config's mics_shard_size):\n"
    "              stage 3 sharded over groups of K of the N ranks, replicated across them\n"
    "  with --model gpt2: --tp T: tensor parallelism over T ranks (the config's\n"
    "              tensor_parallel.tp_size): each rank holds its slices; --ranks N is then\n"
    "              the data-parallel ranks (N x T in the job)\n"
    "  with --model gpt2: --micro-batch B: the activations of B sequences per rank for each\n"
    "              activation checkpointing (none, selective, full), with --seq-len T\n"
    "              (default: --block-size), --number-checkpoints K (default: every block),\n"
    "              --partition-activations (with --tp: each checkpoint split over the T\n"
    "              ranks, the config's activation_checkpointing.partition_activations),\n"
    "              --checkpoint-nvme-path DIR (checkpoints spilled to NVMe, as zero-train's)\n"
    "              and --memory-limit BYTES[K|M|G] (which setting fits at each stage, and the\n"
    "              most sequences per rank each one fits)\n";

struct Options {
  uint64_t params = 0;
  int ranks = 0;
  zero::DType dtype = zero::DType::kBFloat16;  // mixed precision, as in the paper
  std::optional<int> stage;
  std::string model;  // "mlp" or "gpt2"; empty: --params
  zero::models::MlpConfig mlp;
  zero::models::Gpt2Config gpt2;
  size_t merge_bytes = 32 * 1024;  // zero-train's default
  bool offload_nvme = false;
  bool offload_cpu = false;  // a GPU run's optimizer in host memory
  bool pin_memory = false;   // offload_optimizer.pin_memory
  bool gpu = false;          // plan a GPU run (--gpu, or implied by offload_cpu)
  bool offload_param_nvme = false;
  int param_buffer_count = 5;  // DeepSpeed's offload_param defaults
  size_t param_buffer_size = 100000000;
  size_t sub_group_size = 1000000000;  // DeepSpeed's default, as the config takes it
  int buffer_count = 4;
  int mics_shard_size = -1;  // off
  // The GPT-2's activations: sequences per rank (0: not printed), their length (0: block_size),
  // checkpointed blocks (0: every one), whether checkpoints are partitioned over the
  // tensor-parallel ranks, and the per-rank budget (0: none).
  int micro_batch = 0;
  int seq_len = 0;
  int number_checkpoints = 0;
  bool partition_activations = false;
  uint64_t memory_limit = 0;
  // The checkpoints spilled to this directory (zero-train --checkpoint-nvme-path): planned, not
  // touched.
  std::string checkpoint_nvme_path;
  // The config's data_types.grad_accum_dtype; unset: the engine's default for the dtype.
  std::optional<zero::DType> grad_accum_dtype;
};

using zero::driver::usage_error;

// The checkpointing zero-train runs with these flags and `recompute` (none spills nothing).
zero::models::Gpt2Checkpointing checkpointing_of(const Options& options,
                                                 zero::models::Recompute recompute) {
  zero::models::Gpt2Checkpointing checkpointing{recompute, options.number_checkpoints};
  // As zero-train: over a group of one the partition is the whole checkpoint, and off.
  checkpointing.partition_activations =
      options.partition_activations && options.gpt2.tensor_parallel_size > 1;
  if (recompute != zero::models::Recompute::kNone) {
    checkpointing.nvme_path = options.checkpoint_nvme_path;
  }
  return checkpointing;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// A parameter count, parsed exactly in decimal (no floating point, so 1.3B is 1300000000):
// digits with an optional fraction, an optional exponent (e9) and an optional suffix K, M, B
// or T (thousand, million, billion, trillion; either case). The result must be a whole number
// from 1 up to what 16 bytes per parameter can count in 64 bits.
uint64_t parse_param_count(const std::string& text) {
  const std::string bad =
      "--params needs a number of parameters such as 7.5e9, 7.5B or 350M, got '" + text + "'";
  size_t i = 0;
  std::string digits;  // integer and fraction digits, without the point
  int fraction_digits = 0;
  for (; i < text.size() && is_digit(text[i]); ++i) digits += text[i];
  if (i < text.size() && text[i] == '.') {
    for (++i; i < text.size() && is_digit(text[i]); ++i, ++fraction_digits) digits += text[i];
  }
  if (digits.empty()) usage_error(bad);
  long exponent = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    const bool negative = i < text.size() && text[i] == '-';
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
    if (i == text.size() || !is_digit(text[i])) usage_error(bad);
    for (; i < text.size() && is_digit(text[i]); ++i) {
      if (exponent < 1000) exponent = exponent * 10 + (text[i] - '0');  // beyond: too large anyway
    }
    if (negative) exponent = -exponent;
  }
  if (i < text.size()) {
    const std::string suffixes = "kKmMbBtT";
    const size_t which = suffixes.find(text[i]);
    if (which == std::string::npos || i + 1 != text.size()) usage_error(bad);
    exponent += 3 * static_cast<long>(which / 2 + 1);
    ++i;
  }
  exponent -= fraction_digits;

  // digits x 10^exponent as a whole number: drop leading zeros, then trailing zeros the
  // negative exponent cancels; any other digit it would cut off is a fraction of a parameter.
  digits.erase(0, digits.find_first_not_of('0'));
  if (digits.empty()) usage_error("--params must be at least 1, got '" + text + "'");
  for (; exponent < 0; ++exponent) {
    if (digits.back() != '0') usage_error("--params " + text + " is not a whole number");
    digits.pop_back();
  }
  const uint64_t limit = UINT64_MAX / 16;  // the largest stage-0 byte count must fit
  const std::string too_large = "--params " + text + " is too large";
  if (exponent > 19) usage_error(too_large);
  digits.append(static_cast<size_t>(exponent), '0');
  uint64_t value = 0;
  for (char c : digits) {
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (limit - digit) / 10) usage_error(too_large);
    value = value * 10 + digit;
  }
  return value;
}

// A whole number within [min_value, max_value] for `flag`, else a usage error.
long parse_whole(const std::string& flag, const std::string& text, long min_value, long max_value) {
  if (!zero::driver::is_digits(text)) {
    usage_error(flag + " needs a whole number, got '" + text + "'");
  }
  long value = 0;
  if (!zero::driver::parse_integer(text, &value) || value < min_value || value > max_value) {
    usage_error(flag + " must be from " + std::to_string(min_value) + " to " +
                std::to_string(max_value) + ", got " + text);
  }
  return value;
}

Options parse_options(const std::vector<std::string>& args) {
  Options options;
  bool have_params = false;
  bool have_ranks = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag == "--pin-memory") {
      options.pin_memory = true;
      continue;
    }
    if (flag == "--gpu") {
      options.gpu = true;
      continue;
    }
    if (flag == "--partition-activations") {
      options.partition_activations = true;
      continue;
    }
    const bool model_flag =
        flag == "--model" || flag == "--input-dim" || flag == "--hidden" ||
        flag == "--output-dim" || flag == "--layers" || flag == "--merge-bytes" ||
        flag == "--preset" || flag == "--n-layer" || flag == "--n-head" || flag == "--n-embd" ||
        flag == "--vocab-size" || flag == "--block-size" || flag == "--offload-optimizer" ||
        flag == "--sub-group-size" || flag == "--buffer-count" || flag == "--mics-shard-size" ||
        flag == "--micro-batch" || flag == "--seq-len" || flag == "--number-checkpoints" ||
        flag == "--memory-limit" || flag == "--tp" || flag == "--offload-param" ||
        flag == "--param-buffer-count" || flag == "--param-buffer-size" ||
        flag == "--checkpoint-nvme-path" || flag == "--grad-accum-dtype";
    if (flag != "--params" && flag != "--ranks" && flag != "--dtype" && flag != "--stage" &&
        !model_flag) {
      usage_error(flag.compare(0, 1, "-") == 0 ? "unknown option '" + flag + "'"
                                               : "unexpected argument '" + flag + "'");
    }
    if (i + 1 == args.size()) usage_error(flag + " needs a value");
    const std::string& value = args[++i];
    if (flag == "--params") {
      options.params = parse_param_count(value);
      have_params = true;
    } else if (flag == "--ranks") {
      options.ranks = static_cast<int>(parse_whole(flag, value, 1, INT_MAX));
      have_ranks = true;
    } else if (flag == "--dtype") {
      if (!zero::parse_dtype(value, &options.dtype)) {
        usage_error("--dtype must be bf16, fp16 or fp32, got '" + value + "'");
      }
    } else if (flag == "--stage") {
      options.stage = static_cast<int>(parse_whole(flag, value, 0, 3));
    } else if (flag == "--model") {
      if (value != "mlp" && value != "gpt2") {
        usage_error("--model must be mlp or gpt2, got '" + value + "'");
      }
      options.model = value;
    } else if (flag == "--preset") {
      if (!zero::models::gpt2_preset(value, &options.gpt2)) {
        usage_error("unknown --preset '" + value + "' (" + zero::models::gpt2_preset_names() + ")");
      }
    } else if (flag == "--offload-optimizer") {
      if (value != "none" && value != "cpu" && value != "nvme") {
        usage_error("--offload-optimizer must be none, cpu or nvme, got '" + value + "'");
      }
      options.offload_nvme = value == "nvme";
      options.offload_cpu = value == "cpu";
    } else if (flag == "--offload-param") {
      if (value != "none" && value != "nvme") {
        usage_error("--offload-param must be none or nvme, got '" + value + "'");
      }
      options.offload_param_nvme = value == "nvme";
    } else if (flag == "--param-buffer-count") {
      options.param_buffer_count = static_cast<int>(parse_whole(flag, value, 1, 1024));
    } else if (flag == "--param-buffer-size") {
      options.param_buffer_size = static_cast<size_t>(parse_whole(flag, value, 1, LONG_MAX));
    } else if (flag == "--sub-group-size") {
      options.sub_group_size = static_cast<size_t>(parse_whole(flag, value, 1, LONG_MAX));
    } else if (flag == "--mics-shard-size") {
      options.mics_shard_size = static_cast<int>(parse_whole(flag, value, 1, INT_MAX));
    } else if (flag == "--buffer-count") {
      options.buffer_count = static_cast<int>(parse_whole(flag, value, 1, 1024));
    } else if (flag == "--memory-limit") {
      options.memory_limit = zero::driver::parse_bytes(flag, value);
    } else if (flag == "--grad-accum-dtype") {
      zero::DType accum = zero::DType::kFloat32;
      if (!zero::parse_dtype(value, &accum)) {
        usage_error("--grad-accum-dtype must be fp32, bf16 or fp16, got '" + value + "'");
      }
      options.grad_accum_dtype = accum;
    } else if (flag == "--checkpoint-nvme-path") {
      if (value.empty()) usage_error("--checkpoint-nvme-path needs a directory, got ''");
      options.checkpoint_nvme_path = value;
    } else if (flag == "--merge-bytes") {
      options.merge_bytes = static_cast<size_t>(parse_whole(flag, value, 0, INT_MAX));
    } else {
      const int v = static_cast<int>(parse_whole(flag, value, 1, 1 << 20));
      if (flag == "--input-dim") options.mlp.input_dim = v;
      if (flag == "--hidden") options.mlp.hidden_dim = v;
      if (flag == "--output-dim") options.mlp.output_dim = v;
      if (flag == "--layers") options.mlp.layers = v;
      if (flag == "--n-layer") options.gpt2.n_layer = v;
      if (flag == "--n-head") options.gpt2.n_head = v;
      if (flag == "--n-embd") options.gpt2.n_embd = v;
      if (flag == "--vocab-size") options.gpt2.vocab_size = v;
      if (flag == "--block-size") options.gpt2.block_size = v;
      if (flag == "--tp") options.gpt2.tensor_parallel_size = v;
      if (flag == "--micro-batch") options.micro_batch = v;
      if (flag == "--seq-len") options.seq_len = v;
      if (flag == "--number-checkpoints") options.number_checkpoints = v;
    }
  }
  if (!options.model.empty() && have_params) usage_error("give --params or --model, not both");
  if (!options.model.empty()) have_params = true;
  if (options.model == "gpt2") {
    try {
      zero::models::check_gpt2_config(options.gpt2);
    } catch (const zero::Error& e) {
      usage_error(e.what());
    }
  }
  if (options.gpt2.tensor_parallel_size > 1 && options.model != "gpt2") {
    usage_error("--tp splits the layers of --model gpt2 only");
  }
  const bool activation_flags = options.micro_batch > 0 || options.seq_len > 0 ||
                                options.number_checkpoints > 0 || options.memory_limit > 0 ||
                                options.partition_activations ||
                                !options.checkpoint_nvme_path.empty();
  if (activation_flags && options.model != "gpt2") {
    usage_error(
        "--micro-batch, --seq-len, --number-checkpoints, --partition-activations, "
        "--checkpoint-nvme-path and --memory-limit plan the activations of --model gpt2");
  }
  if (activation_flags && options.micro_batch == 0) {
    usage_error(
        "--seq-len, --number-checkpoints, --partition-activations, --checkpoint-nvme-path and "
        "--memory-limit need --micro-batch B");
  }
  if (options.seq_len == 0) options.seq_len = options.gpt2.block_size;
  if (options.seq_len > options.gpt2.block_size) {
    usage_error("--seq-len " + std::to_string(options.seq_len) + " is longer than the block size " +
                std::to_string(options.gpt2.block_size));
  }
  if (options.model == "gpt2") {
    try {
      zero::models::check_gpt2_checkpointing(
          checkpointing_of(options, zero::models::Recompute::kFull), options.gpt2.n_layer);
    } catch (const zero::Error& e) {
      usage_error(e.what());
    }
  }
  if (!have_params) usage_error("missing --params P (the number of parameters)");
  if (!have_ranks) usage_error("missing --ranks N (the number of data-parallel ranks)");
  if (options.gpu && options.model.empty()) usage_error("--gpu plans a --model's layout");
  if (options.offload_cpu) {
    options.gpu = true;  // ZeRO-Offload moves the optimizer off a GPU
    if (options.model.empty()) usage_error("--offload-optimizer cpu plans a --model's layout");
    if (options.mics_shard_size != -1) {
      usage_error("--offload-optimizer cpu with --mics-shard-size is not supported by the engine");
    }
  } else if (options.pin_memory) {
    usage_error("--pin-memory places --offload-optimizer cpu's state; there is none to place");
  }
  if (options.offload_param_nvme) {
    if (options.model.empty()) usage_error("--offload-param plans a --model's layout");
    if (options.mics_shard_size != -1) {
      usage_error("--offload-param nvme with --mics-shard-size is not supported by the engine");
    }
    if (options.stage && *options.stage != 3) {
      usage_error(
          "--offload-param nvme needs stage 3 (only stage 3 partitions the parameters), "
          "not stage " +
          std::to_string(*options.stage));
    }
    options.stage = 3;
  }
  if (options.mics_shard_size != -1) {
    if (options.model.empty()) usage_error("--mics-shard-size plans a --model's layout");
    if (options.stage && *options.stage != 3) {
      usage_error("--mics-shard-size is hybrid sharding of stage 3, not stage " +
                  std::to_string(*options.stage));
    }
    options.stage = 3;
    zero::EngineConfig config;
    config.mics_shard_size = options.mics_shard_size;
    if (options.offload_nvme) config.offload_optimizer.device = zero::OffloadDevice::kNvme;
    try {
      zero::sharding_group_size(config, options.ranks);
    } catch (const zero::Error& e) {
      usage_error(e.what());
    }
  }
  return options;
}

double gigabytes(uint64_t bytes) {
  return static_cast<double>(bytes) / 1e9;
}

constexpr zero::models::Recompute kRecomputes[] = {zero::models::Recompute::kNone,
                                                   zero::models::Recompute::kSelective,
                                                   zero::models::Recompute::kFull};

// What zero-train's budget per rank holds for B sequences beside the engine and the counted
// activations: the tensors between modules, the batch data and the modules' fp32 copies.
uint64_t uncounted_bytes(const Options& options, int B) {
  return zero::models::gpt2_uncounted_activation_bytes(options.gpt2, B, options.seq_len) +
         zero::models::gpt2_module_copy_bytes(options.gpt2, options.dtype);
}

// What zero-train's budget per rank holds for B sequences besides the engine: the activations
// of `recompute`, and uncounted_bytes.
uint64_t activation_budget(const Options& options, zero::models::Recompute recompute, int B) {
  return zero::size_sum(zero::models::gpt2_activation_formula(
                            options.gpt2, checkpointing_of(options, recompute), B, options.seq_len)
                            .total(),
                        uncounted_bytes(options, B), "the activation budget");
}

// engine + the activations of `recompute` and B sequences fit the limit (sizes past 64 bits
// fit nothing).
bool fits_limit(const Options& options, zero::models::Recompute recompute, int B, uint64_t engine) {
  try {
    return zero::size_sum(engine, activation_budget(options, recompute, B), "the total per rank") <=
           options.memory_limit;
  } catch (const zero::Error&) {
    return false;
  }
}

// The most sequences per rank whose activations fit beside `engine` bytes in the limit (0: not
// even one); the bytes grow with B, so a doubling search then a bisection finds it.
int largest_micro_batch(const Options& options, zero::models::Recompute recompute,
                        uint64_t engine) {
  const auto fits = [&](int B) { return fits_limit(options, recompute, B, engine); };
  if (!fits(1)) return 0;
  int low = 1, high = 2;  // fits(low), and high is above the answer once !fits(high)
  while (high < (1 << 20) && fits(high)) {
    low = high;
    high *= 2;
  }
  if (fits(high)) return high;
  while (high - low > 1) {
    const int mid = low + (high - low) / 2;
    (fits(mid) ? low : high) = mid;
  }
  return low;
}

// The GPT-2's activations per rank for each checkpointing setting, beside the engine's bytes of
// each planned stage, and with a budget which setting fits at each stage and the largest
// micro-batch each setting fits.
void print_activations(const Options& options,
                       const std::vector<std::pair<int, uint64_t>>& engine_bytes) {
  std::string checkpoints = options.number_checkpoints == 0
                                ? "every block"
                                : std::to_string(options.number_checkpoints) + " blocks";
  const int t = options.gpt2.tensor_parallel_size;
  if (options.partition_activations) {
    // As zero-train: over a group of one the partition is the whole checkpoint.
    checkpoints += t > 1 ? ", partitioned over " + std::to_string(t) + " tensor-parallel ranks"
                         : ", partition_activations without effect at --tp 1";
  }
  const bool spilled = !options.checkpoint_nvme_path.empty();
  if (spilled) checkpoints += ", spilled to NVMe";
  std::printf("activations of %d x %d tokens per rank (fp32; selective and full checkpoint %s):\n",
              options.micro_batch, options.seq_len, checkpoints.c_str());
  std::printf("recompute  activation bytes  checkpoint bytes");
  if (spilled) std::printf("  nvme bytes");
  for (const auto& stage : engine_bytes) std::printf("  stage %d total bytes", stage.first);
  std::printf("\n");
  for (int r = 0; r < 3; ++r) {
    const zero::models::Gpt2ActivationBytes bytes = zero::models::gpt2_activation_formula(
        options.gpt2, checkpointing_of(options, kRecomputes[r]), options.micro_batch,
        options.seq_len);
    // With the spill, the checkpoints in memory are the buffer they pass through.
    const uint64_t held = spilled && r > 0 ? bytes.spill_buffer : bytes.checkpoints;
    std::printf("%-9s  %16llu  %16llu", zero::models::recompute_name(kRecomputes[r]),
                static_cast<unsigned long long>(bytes.total()),
                static_cast<unsigned long long>(held));
    if (spilled) std::printf("  %10llu", static_cast<unsigned long long>(bytes.nvme_checkpoints));
    for (const auto& stage : engine_bytes) {
      std::printf("  %19llu", static_cast<unsigned long long>(zero::size_sum(
                                  stage.second, bytes.total(), "the total per rank")));
    }
    std::printf("\n");
  }
  if (options.memory_limit == 0) return;
  // zero-train's budget per rank also holds what it does not count in the engine's allocator.
  const uint64_t uncounted = uncounted_bytes(options, options.micro_batch);
  std::printf(
      "beside them: %llu bytes of tensors between modules, batch data and the modules' "
      "fp32 working copies\n",
      static_cast<unsigned long long>(uncounted));
  for (const auto& [stage, bytes] : engine_bytes) {
    int fits = 0;
    while (fits < 3 && !fits_limit(options, kRecomputes[fits], options.micro_batch, bytes)) ++fits;
    if (fits == 3) {
      std::printf("stage %d in %llu bytes: does not fit with any activation checkpointing", stage,
                  static_cast<unsigned long long>(options.memory_limit));
    } else {
      std::printf("stage %d in %llu bytes: fits with activation checkpointing %s", stage,
                  static_cast<unsigned long long>(options.memory_limit),
                  zero::models::recompute_name(kRecomputes[fits]));
    }
    std::printf("; the most sequences per rank: none %d, selective %d, full %d\n",
                largest_micro_batch(options, kRecomputes[0], bytes),
                largest_micro_batch(options, kRecomputes[1], bytes),
                largest_micro_batch(options, kRecomputes[2], bytes));
  }
}

}  // namespace

// The model's layout as the engine builds it at this world size, and the engine's own plan for
// each stage.
int plan_model(const Options& options) {
  const std::vector<zero::ParamSpec> specs = options.model == "gpt2"
                                                 ? zero::models::gpt2_param_specs(options.gpt2)
                                                 : zero::models::mlp_param_specs(options.mlp);
  zero::EngineConfig config;
  config.dtype = options.dtype;
  config.grad_accum_dtype = options.grad_accum_dtype;
  config.merge_bytes = options.merge_bytes;
  config.optimizer_sub_group_elements = options.sub_group_size;
  config.offload_optimizer.buffer_count = options.buffer_count;
  if (options.offload_nvme) config.offload_optimizer.device = zero::OffloadDevice::kNvme;
  if (options.gpu) config.device = zero::Device::cuda(0);
  if (options.offload_cpu) {
    config.offload_optimizer.device = zero::OffloadDevice::kCpu;
    config.offload_optimizer.pin_memory = options.pin_memory;
  }
  if (options.offload_param_nvme) config.offload_param.device = zero::OffloadDevice::kNvme;
  config.offload_param.buffer_count = options.param_buffer_count;
  config.offload_param.buffer_size = options.param_buffer_size;
  // The layout is sharded over the shard group (layout_options); only stage 3 is planned then.
  config.mics_shard_size = options.mics_shard_size;
  const zero::Layout layout =
      zero::Layout::build(specs, zero::layout_options(config, options.ranks));
  std::printf("%s: %zu parameters (%zu padded) in %zu units, %d ranks, %s\n", options.model.c_str(),
              layout.numel(), layout.padded_numel(), layout.units().size(), options.ranks,
              zero::dtype_name(options.dtype));
  if (options.gpt2.tensor_parallel_size > 1) {
    std::printf(
        "tensor parallelism: each rank holds its slices of %d, over %d data-parallel "
        "ranks\n",
        options.gpt2.tensor_parallel_size, options.ranks);
  }
  if (options.mics_shard_size != -1) {
    std::printf("hybrid sharding: shard groups of %d ranks, %d replicas\n", layout.world_size(),
                options.ranks / layout.world_size());
  }
  std::printf("stage  model state bytes  buffer bytes  total bytes per rank  nvme bytes%s\n",
              options.gpu ? "  pinned host bytes  pageable host bytes" : "");
  std::vector<std::pair<int, uint64_t>> engine_bytes;  // per stage planned
  for (int stage = 0; stage <= 3; ++stage) {
    if (options.stage && *options.stage != stage) continue;
    // Stage 0 has no partitioned optimizer to offload (the engine refuses it).
    if ((options.offload_nvme || options.offload_cpu) && stage == 0) continue;
    config.stage = stage;
    const zero::MemoryPlan plan = zero::plan_memory(layout, config);
    std::printf("%5d  %17llu  %12llu  %20llu  %10llu", stage,
                static_cast<unsigned long long>(plan.model_state),
                static_cast<unsigned long long>(plan.buffers),
                static_cast<unsigned long long>(
                    zero::size_sum(plan.model_state, plan.buffers, "the total per rank")),
                static_cast<unsigned long long>(plan.nvme));
    if (options.gpu) {
      std::printf("  %17llu  %19llu", static_cast<unsigned long long>(plan.host_pinned),
                  static_cast<unsigned long long>(plan.host_pageable));
    }
    std::printf("\n");
    engine_bytes.emplace_back(stage,
                              zero::size_sum(plan.model_state, plan.buffers, "the total per rank"));
  }
  // The tiers: this CPU path holds every byte of the table in host memory (pageable; pinned
  // memory and a device are what the CUDA path would add), the nvme column on the disk.
  if (options.offload_cpu) {
    std::printf(
        "tiers per rank (a GPU run): device = total bytes per rank; host: the fp32 master and "
        "optimizer state (%s), the copies of the gradient shard and the updated parameters "
        "(pinned; fp32 parameters with --pin-memory go from the master itself)%s\n",
        options.pin_memory ? "pinned" : "pageable; --pin-memory pins them",
        options.offload_param_nvme
            ? ", the parameter shards' buffers (pinned; device buffers beside them); nvme = nvme "
              "bytes (the parameter shards)"
            : "; nvme 0");
  } else if (options.gpu) {
    std::printf(
        "tiers per rank (a GPU run): device = total bytes per rank; host: %s; nvme = nvme "
        "bytes\n",
        options.offload_nvme
            ? (options.offload_param_nvme
                   ? "the optimizer records' and the parameter shards' staging, the copies of "
                     "the gradient shard and the updated parameters (all pinned)"
                   : "the optimizer records' staging, the copies of the gradient shard and the "
                     "updated parameters (all pinned)")
            : (options.offload_param_nvme ? "the parameter shards' buffers (pinned; device "
                                            "buffers beside them)"
                                          : "nothing"));
  } else if (options.offload_nvme || options.offload_param_nvme) {
    std::printf("tiers per rank: device 0, host = total bytes per rank, nvme = nvme bytes");
    std::printf(" (optimizer state%s on NVMe)\n",
                options.offload_param_nvme ? " and parameters" : "");
  }
  if (options.micro_batch > 0) print_activations(options, engine_bytes);
  return 0;
}

int main(int argc, char** argv) {
  const std::optional<Options> parsed = zero::driver::parse_command_line(
      "zero-estimate", kUsage,
      [&] { return parse_options(std::vector<std::string>(argv + 1, argv + argc)); });
  if (!parsed) return 2;
  const Options& options = *parsed;
  if (!options.model.empty()) {
    // A plan the engine refuses, or sizes past 64 bits: the arguments ask for what cannot be.
    try {
      return plan_model(options);
    } catch (const zero::Error& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "zero-estimate: %s\n", e.what());
      return 2;
    }
  }
  const bool mixed = options.dtype != zero::DType::kFloat32;
  std::printf("%llu parameters, %d ranks, %s parameters and gradients\n",
              static_cast<unsigned long long>(options.params), options.ranks,
              zero::dtype_name(options.dtype));
  std::printf("optimizer state: %s (K = %d bytes per parameter); GB = 1e9 bytes\n",
              mixed ? "fp32 master + Adam moments" : "Adam moments in fp32", mixed ? 12 : 8);
  std::printf("stage  params GB  grads GB  optimizer GB  total GB     total bytes\n");
  for (int stage = 0; stage <= 3; ++stage) {
    if (options.stage && *options.stage != stage) continue;
    const zero::ModelStateBytes bytes =
        zero::estimate_model_state(options.params, options.ranks, options.dtype, stage);
    std::printf("%5d  %9.2f  %8.2f  %12.2f  %8.2f  %14llu\n", stage, gigabytes(bytes.params),
                gigabytes(bytes.grads), gigabytes(bytes.optimizer), gigabytes(bytes.total()),
                static_cast<unsigned long long>(bytes.total()));
  }
  return 0;
}
