#include "tools/zero_estimate_activations.h"

#include <cstdio>
#include <iterator>
#include <string>

#include "zero/core/check.h"
#include "zero/core/checked_size.h"

namespace zero_estimate {
namespace {

constexpr zero::models::Recompute kRecomputes[] = {zero::models::Recompute::kNone,
                                                   zero::models::Recompute::kSelective,
                                                   zero::models::Recompute::kFull};

// What zero-train's budget per rank holds for B sequences beside the engine and the counted
// activations: the tensors between modules, the batch data and the modules' fp32 copies.
uint64_t uncounted_bytes(const Options& options, const StagePlan& plan, int B) {
  const uint64_t between =
      plan.stage.stages > 1
          ? zero::models::gpt2_stage_uncounted_activation_bytes(options.gpt2, plan.stage,
                                                                plan.in_flight, B, options.seq_len)
          : zero::models::gpt2_uncounted_activation_bytes(options.gpt2, B, options.seq_len);
  return zero::size_sum(
      between, zero::models::gpt2_module_copy_bytes(options.gpt2, options.dtype, options.gpu),
      "the bytes beside the activations");
}

// The activations of `recompute` and B sequences: the whole model's, or the stage's peak.
zero::models::Gpt2StageActivationBytes activations(const Options& options, const StagePlan& plan,
                                                   zero::models::Recompute recompute, int B) {
  zero::models::Gpt2Checkpointing checkpointing = checkpointing_of(options, recompute);
  // As zero-train: the spill's file holds a region per micro-batch a chunk holds in flight.
  checkpointing.checkpoint_generations =
      zero::models::gpt2_checkpoint_generations(plan.in_flight, plan.chunk_actions);
  if (!plan.split_loads.empty()) {
    return zero::models::gpt2_split_stage_activation_formula(
        options.gpt2, checkpointing, plan.stage, plan.split_loads, B, options.seq_len);
  }
  if (!plan.chunk_actions.empty()) {
    return zero::models::gpt2_chunked_stage_activation_formula(
        options.gpt2, checkpointing, plan.stage, plan.chunk_actions, B, options.seq_len);
  }
  return zero::models::gpt2_stage_activation_formula(options.gpt2, checkpointing, plan.stage,
                                                     plan.in_flight, B, options.seq_len);
}

// What zero-train's budget per rank holds for B sequences besides the engine: the activations
// of `recompute`, and uncounted_bytes.
uint64_t activation_budget(const Options& options, const StagePlan& plan,
                           zero::models::Recompute recompute, int B) {
  return zero::size_sum(activations(options, plan, recompute, B).peak(),
                        uncounted_bytes(options, plan, B), "the activation budget");
}

// engine + the activations of `recompute` and B sequences fit the limit (sizes past 64 bits
// fit nothing).
bool fits_limit(const Options& options, const StagePlan& plan, zero::models::Recompute recompute,
                int B, uint64_t engine) {
  try {
    return zero::size_sum(engine, activation_budget(options, plan, recompute, B),
                          "the total per rank") <= options.memory_limit;
  } catch (const zero::Error&) {
    return false;
  }
}

// The most sequences per rank whose activations fit beside `engine` bytes in the limit (0: not
// even one); the bytes grow with B, so a doubling search then a bisection finds it.
int largest_micro_batch(const Options& options, const StagePlan& plan,
                        zero::models::Recompute recompute, uint64_t engine) {
  const auto fits = [&](int B) { return fits_limit(options, plan, recompute, B, engine); };
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

}  // namespace

// The GPT-2's activations per rank for each checkpointing setting, beside the engine's bytes of
// each planned stage, and with a budget which setting fits at each stage and the largest
// micro-batch each setting fits.
void print_activations(const Options& options, const StagePlan& plan,
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
  if (options.contiguous_memory) checkpoints += ", in one contiguous buffer";
  const bool spilled = !options.checkpoint_nvme_path.empty();
  if (spilled) checkpoints += ", spilled to NVMe";
  std::string where;
  if (plan.stage.stages > 1) {
    where = " on pipeline stage " + std::to_string(plan.stage.stage) + ", " +
            std::to_string(plan.in_flight) +
            (plan.chunk_actions.empty()
                 ? std::string(" micro-batch") + (plan.in_flight == 1 ? "" : "es")
                 : std::string(" (micro-batch, chunk) pair") + (plan.in_flight == 1 ? "" : "s")) +
            " in flight";
  }
  std::printf(
      "activations of %d x %d tokens per rank%s (fp32; selective and full checkpoint %s):\n",
      options.micro_batch, options.seq_len, where.c_str(), checkpoints.c_str());
  std::printf("recompute  activation bytes  checkpoint bytes");
  if (spilled) std::printf("  nvme bytes");
  for (const auto& stage : engine_bytes) std::printf("  stage %d total bytes", stage.first);
  std::printf("\n");
  const int settings = static_cast<int>(std::size(kRecomputes));
  for (int r = 0; r < settings; ++r) {
    const zero::models::Gpt2StageActivationBytes stage =
        activations(options, plan, kRecomputes[r], options.micro_batch);
    const zero::models::Gpt2ActivationBytes& bytes = stage.micro_batch;
    // With the spill, the checkpoints in memory are the buffer they pass through.
    const uint64_t held = stage.peak_checkpoints();
    std::printf("%-9s  %16llu  %16llu", zero::models::recompute_name(kRecomputes[r]),
                static_cast<unsigned long long>(stage.peak()),
                static_cast<unsigned long long>(held));
    if (spilled) std::printf("  %10llu", static_cast<unsigned long long>(bytes.nvme_checkpoints));
    for (const auto& zero_stage : engine_bytes) {
      std::printf("  %19llu", static_cast<unsigned long long>(zero::size_sum(
                                  zero_stage.second, stage.peak(), "the total per rank")));
    }
    std::printf("\n");
  }
  if (options.memory_limit == 0) return;
  // zero-train's budget per rank also holds what it does not count in the engine's allocator.
  const uint64_t uncounted = uncounted_bytes(options, plan, options.micro_batch);
  std::printf(
      "beside them: %llu bytes of tensors between modules, batch data and the modules' "
      "fp32 working copies\n",
      static_cast<unsigned long long>(uncounted));
  for (const auto& [stage, bytes] : engine_bytes) {
    int fits = 0;
    while (fits < settings &&
           !fits_limit(options, plan, kRecomputes[fits], options.micro_batch, bytes)) {
      ++fits;
    }
    if (fits == settings) {
      std::printf("stage %d in %llu bytes: does not fit with any activation checkpointing", stage,
                  static_cast<unsigned long long>(options.memory_limit));
    } else {
      std::printf("stage %d in %llu bytes: fits with activation checkpointing %s", stage,
                  static_cast<unsigned long long>(options.memory_limit),
                  zero::models::recompute_name(kRecomputes[fits]));
    }
    std::printf("; the most sequences per rank:");
    for (int r = 0; r < settings; ++r) {
      std::printf("%s %s %d", r == 0 ? "" : ",", zero::models::recompute_name(kRecomputes[r]),
                  largest_micro_batch(options, plan, kRecomputes[r], bytes));
    }
    std::printf("\n");
  }
}

}  // namespace zero_estimate
