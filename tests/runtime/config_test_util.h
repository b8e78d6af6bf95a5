// Shared by the config tests: the example files, the message a bad config gets, and the check
// that the engine's own constructors accept what the parser produced.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "zero/optimizer/loss_scaler.h"
#include "zero/optimizer/optimizer.h"
#include "zero/runtime/config.h"

namespace zero {

inline std::string example_config(const std::string& name) {
  return std::string(ZERO_SOURCE_DIR) + "/examples/configs/" + name;
}

// The ConfigError message of parsing `text`, or a marker that makes the comparison fail.
inline std::string error_of(const std::string& text, int world_size = 2,
                            const std::string& origin = "ds.json",
                            const ConfigContext& context = {}) {
  try {
    parse_training_config(text, world_size, origin, context);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(parsed without an error)";
}

// The engine's own constructors accept what the parser produced.
inline void expect_engine_accepts(const EngineConfig& e) {
  EXPECT_NO_THROW(Optimizer{e.optimizer});
  EXPECT_NO_THROW(LrSchedule{e.lr_schedule});
  EXPECT_NO_THROW(LossScaler{e.precision.loss_scaler});
}

}  // namespace zero
