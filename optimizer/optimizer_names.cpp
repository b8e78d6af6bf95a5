// The text forms of OptimizerType, LrScheduleType and LrWarmupType: one table each, read both
// ways. optimizer.h says which spelling serves where.
#include <cctype>
#include <cstddef>
#include <string>

#include "zero/optimizer/optimizer.h"

namespace zero {
namespace {

template <typename Enum>
struct Spelling {
  Enum value;
  const char* name;
  const char* key;
};

constexpr Spelling<OptimizerType> kOptimizerTypes[] = {
    {OptimizerType::kAdamW, "AdamW", "adamw"},
    {OptimizerType::kAdam, "Adam", "adam"},
    {OptimizerType::kSgd, "SGD", "sgd"},
};

constexpr Spelling<LrScheduleType> kLrScheduleTypes[] = {
    {LrScheduleType::kConstant, "constant", "constant"},
    {LrScheduleType::kWarmup, "WarmupLR", "warmup"},
    {LrScheduleType::kWarmupLinearDecay, "WarmupDecayLR", "warmup_linear_decay"},
    {LrScheduleType::kWarmupCosine, "WarmupCosineLR", "warmup_cosine"},
};

constexpr Spelling<LrWarmupType> kLrWarmupTypes[] = {
    {LrWarmupType::kLog, "log", "log"},
    {LrWarmupType::kLinear, "linear", "linear"},
};

bool same_ignoring_case(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

template <typename Enum, size_t N>
const Spelling<Enum>* find(const Spelling<Enum> (&table)[N], Enum value) {
  for (const Spelling<Enum>& s : table) {
    if (s.value == value) return &s;
  }
  return nullptr;
}

template <typename Enum, size_t N>
const char* name_of(const Spelling<Enum> (&table)[N], Enum value) {
  const Spelling<Enum>* s = find(table, value);
  return s ? s->name : "?";
}

template <typename Enum, size_t N>
const char* key_of(const Spelling<Enum> (&table)[N], Enum value) {
  const Spelling<Enum>* s = find(table, value);
  return s ? s->key : "?";
}

// By name in any case (by_name) or by key exactly.
template <typename Enum, size_t N>
bool parse(const Spelling<Enum> (&table)[N], const std::string& text, bool by_name, Enum* out) {
  for (const Spelling<Enum>& s : table) {
    if (by_name ? same_ignoring_case(text, s.name) : text == s.key) {
      *out = s.value;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* optimizer_type_name(OptimizerType type) {
  return name_of(kOptimizerTypes, type);
}
const char* optimizer_type_key(OptimizerType type) {
  return key_of(kOptimizerTypes, type);
}
bool parse_optimizer_type_name(const std::string& name, OptimizerType* out) {
  return parse(kOptimizerTypes, name, true, out);
}
bool parse_optimizer_type_key(const std::string& key, OptimizerType* out) {
  return parse(kOptimizerTypes, key, false, out);
}

const char* lr_schedule_type_name(LrScheduleType type) {
  return name_of(kLrScheduleTypes, type);
}
const char* lr_schedule_type_key(LrScheduleType type) {
  return key_of(kLrScheduleTypes, type);
}
bool parse_lr_schedule_type_name(const std::string& name, LrScheduleType* out) {
  return parse(kLrScheduleTypes, name, true, out);
}
bool parse_lr_schedule_type_key(const std::string& key, LrScheduleType* out) {
  return parse(kLrScheduleTypes, key, false, out);
}

const char* lr_warmup_type_name(LrWarmupType type) {
  return name_of(kLrWarmupTypes, type);
}
bool parse_lr_warmup_type(const std::string& name, LrWarmupType* out) {
  return parse(kLrWarmupTypes, name, false, out);
}

}  // namespace zero
