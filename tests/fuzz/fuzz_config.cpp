// Fuzz target: the training-config parser (JSON and protobuf text format) as zero-train runs it
// on a user's --config file. A ConfigError or zero::Error is the parser doing its job on bad
// input; anything else (a crash, a sanitizer report, another exception) is a bug. A config that
// parses must also obey DeepSpeed's batch-size rule exactly, which catches arithmetic that wraps.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "zero/runtime/config.h"

namespace {

void parse_for(const std::string& text, int world_size) {
  zero::TrainingConfig config;
  try {
    config = zero::parse_training_config(text, world_size, "fuzz.json");
  } catch (const zero::Error&) {
    return;  // ConfigError derives from it: a rejected config, as designed
  }
  // Multiplied with overflow caught, so that a wrap in the parser cannot hide behind one here.
  long per_step = 0;
  long product = 0;
  if (config.micro_batch_per_rank < 1 || config.gradient_accumulation_steps < 1 ||
      __builtin_mul_overflow(config.micro_batch_per_rank,
                             static_cast<long>(config.gradient_accumulation_steps), &per_step) ||
      __builtin_mul_overflow(per_step, static_cast<long>(world_size), &product) ||
      product != config.train_batch_size ||
      config.engine.micro_batches != config.gradient_accumulation_steps) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // One rank and three: with three, batch sizes that do not divide take the error paths.
  parse_for(text, 1);
  parse_for(text, 3);
  return 0;
}
