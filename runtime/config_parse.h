// Inside the config reader (config.h lists the rules and the mapping), shared by its files:
//   config_parse.cpp      text -> zero.config.TrainingConfig (JSON, protobuf text format, the
//                         hints for unknown keys); JSON "auto" values are set aside
//   config_auto.cpp       resolve_auto(): those "auto" keys filled in from the run
//   config_sections.cpp   the optimizer and scheduler sections -> OptimizerConfig, LrScheduleConfig
//   config_offload.cpp    offload_optimizer, offload_param and aio -> EngineConfig
//   config.cpp            the message -> TrainingConfig, a reader per section, and
//                         DeepSpeed's batch-size rule
// Every problem is a ConfigError naming the key; the first one found stops the parse.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "zero/core/text.h"
#include "zero/proto/config.pb.h"
#include "zero/runtime/config.h"

namespace zero::config_internal {

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

[[noreturn]] inline void config_error(const std::string& message) {
  throw ConfigError(message);
}

inline std::string in_quotes(const std::string& s) {
  return "\"" + s + "\"";
}

inline std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

inline std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Step 1: the text -> the message. JSON when the first non-space character (after a UTF-8 byte
// order mark) is '{' or '[', else protobuf text format. The full paths of JSON keys whose value
// is "auto" (and that Hugging Face resolves) go to *auto_keys, their fields left unset.
config::TrainingConfig parse_config_text(const std::string& text, const std::string& origin,
                                         std::set<std::string>* auto_keys);

// Well-known DeepSpeed keys this runtime does not implement yet, by full path ("aio.use_gds"):
// an unknown key among them is told so instead of hinted at as a typo. None is in the schema
// (config_errors_test holds that).
const std::set<std::string>& unsupported_deepspeed_keys();

// Hugging Face's resolution of "auto" (see config.h): each key in `auto_keys` gets its value
// from `context` written into `c`, so the checks below treat it as if the file had it, and a
// line saying so goes to `notes`.
void resolve_auto(const std::set<std::string>& auto_keys, const ConfigContext& context,
                  int world_size, const std::string& origin, config::TrainingConfig* c,
                  std::vector<std::string>* notes);

// Step 2's helpers.
// Range checks that name the key: `"key" in origin must be <requirement>, got <value>`.
class Checker {
 public:
  explicit Checker(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(const std::string& key, const std::string& requirement,
                         const std::string& got) const {
    config_error(in_quotes(key) + " in " + origin_ + " must be " + requirement + ", got " + got);
  }

  int64_t integer(const std::string& key, int64_t value, int64_t min, int64_t max) const {
    if (value < min) fail(key, "at least " + std::to_string(min), std::to_string(value));
    if (value > max) fail(key, "at most " + std::to_string(max), std::to_string(value));
    return value;
  }

  // A float key: `ok` is the caller's range test on the value as written; the value must also
  // stay finite once rounded to float.
  float real(const std::string& key, double value, bool ok, const std::string& requirement) const {
    if (!ok) fail(key, requirement, number_text(value));
    if (!std::isfinite(static_cast<float>(value))) {
      fail(key, "within float range", number_text(value));
    }
    return static_cast<float>(value);
  }

  const std::string& origin() const { return origin_; }

 private:
  const std::string& origin_;
};

void read_optimizer(const config::Optimizer& section, const Checker& check, OptimizerConfig* out);
void read_scheduler(const config::Scheduler& section, float optimizer_lr, const Checker& check,
                    LrScheduleConfig* out);
// offload_optimizer, offload_param and aio (config_offload.cpp); after the stage is read. `cuda`:
// the run is on a GPU (ConfigContext::cuda).
void read_offload(const config::TrainingConfig& c, bool cuda, const Checker& check,
                  TrainingConfig* out);

}  // namespace zero::config_internal
