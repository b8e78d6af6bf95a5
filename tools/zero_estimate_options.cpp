#include "tools/zero_estimate_options.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "driver/cli.h"
#include "zero/core/check.h"
#include "zero/runtime/engine.h"
#include "zero/runtime/pipeline_schedule.h"

namespace zero_estimate {

using zero::driver::usage_error;

// The checkpointing zero-train runs with these flags and `recompute` (none spills nothing).
zero::models::Gpt2Checkpointing checkpointing_of(const Options& options,
                                                 zero::models::Recompute recompute) {
  zero::models::Gpt2Checkpointing checkpointing{recompute, options.number_checkpoints};
  // As zero-train: over a group of one the partition is the whole checkpoint, and off.
  checkpointing.partition_activations =
      options.partition_activations && options.gpt2.tensor_parallel_size > 1;
  checkpointing.contiguous_memory = options.contiguous_memory;
  if (recompute != zero::models::Recompute::kNone) {
    checkpointing.nvme_path = options.checkpoint_nvme_path;
  }
  return checkpointing;
}

namespace {

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

// --pp P and its flags: a GPT-2 that P stages (P x V virtual stages, interleaved) can cut
// (layers) on ranks they divide, with a schedule zero-train runs.
void check_pipeline(bool pipeline_flags, std::optional<int> virtual_stages, Options* options) {
  const int p = options->pipeline_stages;
  const int t = options->gpt2.tensor_parallel_size;
  const bool interleaved = zero::parse_pipeline_schedule(options->pipeline_schedule) ==
                           zero::PipelineScheduleKind::kInterleaved;
  const int v = virtual_stages.value_or(interleaved ? 2 : 1);
  options->pipeline_virtual_stages = v;
  if (!interleaved && v != 1) {
    usage_error("--pp-virtual-stages " + std::to_string(v) +
                ": only --pp-schedule interleaved runs several model chunks per stage, not " +
                options->pipeline_schedule);
  }
  if (interleaved && v < 2) {
    usage_error("--pp-virtual-stages " + std::to_string(v) +
                ": --pp-schedule interleaved needs at least 2 model chunks per stage");
  }
  if (p > 1 && options->model != "gpt2") {
    usage_error("--pp cuts --model gpt2 into pipeline stages; the " +
                (options->model.empty() ? std::string("--params formulas have")
                                        : "--model " + options->model + " has") +
                " no stages");
  }
  if (pipeline_flags && p == 1) {
    usage_error(
        "--pp-partition, --pp-schedule and --micro-batches plan a pipeline: they need "
        "--pp P (2 or more stages)");
  }
  options->data_parallel_ranks = options->ranks;
  if (p == 1) return;
  if (options->ranks % (p * t) != 0) {
    usage_error("--pp " + std::to_string(p) + (t > 1 ? " x --tp " + std::to_string(t) : "") +
                " does not divide --ranks " + std::to_string(options->ranks) +
                ": with --pp, --ranks is the job's ranks, pipeline stages x data-parallel x "
                "tensor-parallel ranks");
  }
  options->data_parallel_ranks = options->ranks / (p * t);
  // What zero-train --pp refuses, so no plan is printed for a run that cannot be.
  if (options->gpu || options->offload_cpu) {
    usage_error(std::string(options->gpu ? "--gpu" : "--offload-optimizer cpu (a GPU run)") +
                " with --pp: zero-train runs pipeline parallelism on the CPU only");
  }
  try {
    zero::models::gpt2_pipeline_partition(options->gpt2, p * v, options->pipeline_partition,
                                          static_cast<int>(options->seq_len));
  } catch (const zero::Error& e) {
    usage_error(std::string("--pp ") + std::to_string(p) +
                (v > 1 ? " x --pp-virtual-stages " + std::to_string(v) + " = " +
                             std::to_string(p * v) + " virtual stages"
                       : std::string()) +
                ": " + e.what());
  }
  try {
    zero::make_pipeline_schedule(zero::parse_pipeline_schedule(options->pipeline_schedule), p,
                                 options->micro_batches, v);
  } catch (const zero::Error& e) {
    usage_error(std::string("--pp-schedule: ") + e.what());
  }
}

}  // namespace

Options parse_options(const std::vector<std::string>& args) {
  Options options;
  bool have_params = false;
  bool have_ranks = false;
  bool pipeline_flags = false;        // --pp-partition, --pp-schedule, --micro-batches, ...
  std::optional<int> virtual_stages;  // --pp-virtual-stages
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
    if (flag == "--contiguous-memory-optimization") {
      options.contiguous_memory = true;
      continue;
    }
    const bool model_flag =
        flag == "--model" || flag == "--input-dim" || flag == "--hidden" ||
        flag == "--output-dim" || flag == "--layers" || flag == "--merge-bytes" ||
        flag == "--preset" || flag == "--n-layer" || flag == "--n-head" || flag == "--n-embd" ||
        flag == "--vocab-size" || flag == "--block-size" || flag == "--offload-optimizer" ||
        flag == "--sub-group-size" || flag == "--buffer-count" || flag == "--mics-shard-size" ||
        flag == "--hpz-partition-size" || flag == "--micro-batch" || flag == "--seq-len" ||
        flag == "--number-checkpoints" || flag == "--memory-limit" || flag == "--tp" ||
        flag == "--offload-param" || flag == "--param-buffer-count" ||
        flag == "--param-buffer-size" || flag == "--checkpoint-nvme-path" ||
        flag == "--grad-accum-dtype" || flag == "--pp" || flag == "--pp-partition" ||
        flag == "--pp-schedule" || flag == "--micro-batches" || flag == "--pp-virtual-stages";
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
    } else if (flag == "--hpz-partition-size") {
      options.hpz_partition_size = static_cast<int>(parse_whole(flag, value, 1, INT_MAX));
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
    } else if (flag == "--pp-partition") {
      if (!zero::is_pipeline_partition_method(value)) {
        usage_error(std::string("--pp-partition must be ") + zero::kPipelinePartitionMethods +
                    ", got '" + value + "'");
      }
      options.pipeline_partition = value;
      pipeline_flags = true;
    } else if (flag == "--pp-schedule") {
      try {
        zero::parse_pipeline_schedule(value);
      } catch (const zero::Error& e) {
        usage_error(std::string("--pp-schedule: ") + e.what());
      }
      options.pipeline_schedule = value;
      pipeline_flags = true;
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
      if (flag == "--pp") options.pipeline_stages = v;
      if (flag == "--pp-virtual-stages") {
        virtual_stages = v;
        pipeline_flags = true;
      }
      if (flag == "--micro-batches") {
        options.micro_batches = v;
        pipeline_flags = true;
      }
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
                                options.partition_activations || options.contiguous_memory ||
                                !options.checkpoint_nvme_path.empty();
  if (activation_flags && options.model != "gpt2") {
    usage_error(
        "--micro-batch, --seq-len, --number-checkpoints, --partition-activations, "
        "--contiguous-memory-optimization, --checkpoint-nvme-path and --memory-limit plan the "
        "activations of --model gpt2");
  }
  if (activation_flags && options.micro_batch == 0) {
    usage_error(
        "--seq-len, --number-checkpoints, --partition-activations, "
        "--contiguous-memory-optimization, --checkpoint-nvme-path and --memory-limit need "
        "--micro-batch B");
  }
  // As zero-train: the spill is its own buffer, and it spills whole checkpoints.
  if (!options.checkpoint_nvme_path.empty() &&
      (options.contiguous_memory ||
       (options.partition_activations && options.gpt2.tensor_parallel_size > 1))) {
    usage_error(std::string("--checkpoint-nvme-path with ") +
                (options.contiguous_memory ? "--contiguous-memory-optimization"
                                           : "--partition-activations") +
                ": zero-train does not spill those checkpoints; choose one");
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
  check_pipeline(pipeline_flags, virtual_stages, &options);
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
    config.grid.mics_shard_size = options.mics_shard_size;
    if (options.offload_nvme) config.offload.optimizer.device = zero::OffloadDevice::kNvme;
    try {
      zero::sharding_group_size(config, options.data_parallel_ranks);
    } catch (const zero::Error& e) {
      usage_error(e.what());
    }
  }
  if (options.hpz_partition_size != 1) {
    const int k = options.hpz_partition_size;
    if (options.model.empty()) usage_error("--hpz-partition-size plans a --model's layout");
    if (options.stage && *options.stage != 3) {
      usage_error("--hpz-partition-size is ZeRO++'s hpZ of stage 3, not stage " +
                  std::to_string(*options.stage));
    }
    if (options.mics_shard_size != -1) {
      usage_error("--hpz-partition-size with --mics-shard-size is not supported by the engine");
    }
    if (options.gpu || options.offload_param_nvme) {
      usage_error(
          "--hpz-partition-size with --gpu, --offload-optimizer cpu or --offload-param nvme "
          "is not supported by the engine");
    }
    if (options.data_parallel_ranks % k != 0) {
      usage_error("--hpz-partition-size " + std::to_string(k) + " must divide the " +
                  std::to_string(options.data_parallel_ranks) + " data-parallel ranks");
    }
    options.stage = 3;
  }
  return options;
}

}  // namespace zero_estimate
