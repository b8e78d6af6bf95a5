// Reads the training config (config.h lists the rules and the mapping). Three steps, each a
// section below:
//   1. text -> zero.config.TrainingConfig. JSON is walked against the message's descriptor, so
//      the schema itself decides which keys exist, where they nest and what type each value
//      has; protobuf text format goes through protobuf's own parser. JSON "auto" values of the
//      keys Hugging Face resolves are set aside, and resolve_auto() fills them in from the run.
//   2. the message -> TrainingConfig: ranges, combinations, and the defaults of absent keys.
//   3. DeepSpeed's batch-size rule (derive_batch_sizes).
// Every problem is a ConfigError naming the key; the first one found stops the parse.
#include "zero/runtime/config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "zero/proto/config.pb.h"

namespace zero {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
// Keeps keys in file order, so the first bad key reported is the first one in the file.
using Json = nlohmann::ordered_json;

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

[[noreturn]] void config_error(const std::string& message) {
  throw ConfigError(message);
}

std::string in_quotes(const std::string& s) {
  return "\"" + s + "\"";
}

std::string join_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

// ---------------------------------------------------------------------------------------------
// Keys the schema does not have: a DeepSpeed option we lack, or a typo.

// Well-known DeepSpeed keys this runtime does not implement yet, by full path. They get their
// own message so that a user does not hunt for a typo in a key DeepSpeed itself accepts.
const std::set<std::string>& unsupported_deepspeed_keys() {
  static const std::set<std::string> keys = {
      "activation_checkpointing",
      "aio",
      "amp",
      "autotuning",
      "comms_logger",
      "compression_training",
      "csv_monitor",
      "curriculum_learning",
      "data_efficiency",
      "dataloader_drop_last",
      "disable_allgather",
      "dump_state",
      "eigenvalue",
      "elasticity",
      "flops_profiler",
      "hybrid_engine",
      "load_universal_checkpoint",
      "nebula",
      "pipeline",
      "prescale_gradients",
      "progressive_layer_drop",
      "quantize_training",
      "sparse_attention",
      "sparse_gradients",
      "tensorboard",
      "wandb",
      "weight_quantization",
      "zero_force_ds_cpu_optimizer",
      "zero_optimization.cpu_offload",
      "zero_optimization.cpu_offload_params",
      "zero_optimization.cpu_offload_use_pin_memory",
      "zero_optimization.elastic_checkpoint",
      "zero_optimization.ignore_unused_parameters",
      "zero_optimization.legacy_stage1",
      "zero_optimization.load_from_fp32_weights",
      "zero_optimization.memory_efficient_linear",
      "zero_optimization.mics_hierarchical_params_gather",
      "zero_optimization.mics_shard_size",
      "zero_optimization.offload_optimizer",
      "zero_optimization.offload_param",
      "zero_optimization.stage3_gather_fp16_weights_on_model_save",
      "zero_optimization.zero_hpz_partition_size",
      "zero_optimization.zero_quantized_gradients",
      "zero_optimization.zero_quantized_weights",
      "fp16.auto_cast",
      "fp16.consecutive_hysteresis",
      "fp16.fp16_master_weights_and_grads",
      "bf16.immediate_grad_update",
      "checkpoint.load_universal",
      "checkpoint.parallel_write",
      "checkpoint.tag_validation",
      "checkpoint.use_node_local_storage",
      "optimizer.params.amsgrad",
      "optimizer.params.bias_correction",
      "optimizer.params.dampening",
      "optimizer.params.nesterov",
      "optimizer.params.torch_adam",
      "scheduler.params.last_batch_iteration",
  };
  return keys;
}

// Optimal string alignment distance: inserting, deleting or replacing a character, or swapping
// two neighbouring ones (the commonest typo: "stgae"), each costs 1.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t replace = d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, replace});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Full paths of every field named `name` anywhere in the schema under `message`.
void find_field_paths(const Descriptor* message, const std::string& prefix, const std::string& name,
                      std::vector<std::string>* out) {
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* field = message->field(i);
    const std::string path = join_path(prefix, field->name());
    if (field->name() == name) out->push_back(path);
    if (field->message_type() != nullptr) {
      find_field_paths(field->message_type(), path, name, out);
    }
  }
}

// The message for `key`, which `parent` (reached at `path`'s prefix) has no field for. `where`
// is the origin, with a line and column when known.
std::string unknown_key_message(const std::string& path, const std::string& key,
                                const Descriptor* parent, const std::string& where) {
  if (unsupported_deepspeed_keys().count(path) != 0) {
    return in_quotes(path) + " in " + where +
           " is a DeepSpeed option this runtime does not support yet";
  }
  const std::string message = "unknown key " + in_quotes(path) + " in " + where;
  // A valid key written at the wrong level ("stage" at the top): point at where it belongs.
  std::vector<std::string> elsewhere;
  find_field_paths(config::TrainingConfig::descriptor(), "", key, &elsewhere);
  if (elsewhere.size() == 1) return message + "; did you mean " + in_quotes(elsewhere[0]) + "?";

  // Otherwise the closest key of the same section, if it is close enough to be a typo.
  std::string closest;
  size_t closest_distance = std::numeric_limits<size_t>::max();
  std::vector<std::string> names;
  for (int i = 0; i < parent->field_count(); ++i) {
    const std::string& name = parent->field(i)->name();
    names.push_back(name);
    const size_t distance = edit_distance(key, name);
    if (distance < closest_distance) {
      closest = name;
      closest_distance = distance;
    }
  }
  if (closest_distance <= std::max<size_t>(2, key.size() / 3)) {
    return message + "; did you mean " + in_quotes(closest) + "?";
  }
  return message + "; valid keys here: " + join(names, ", ");
}

// ---------------------------------------------------------------------------------------------
// Step 1a: JSON -> message, with the descriptor as the guide.

// "string \"auto\"", "1.5", "null", ...: what a wrong value was, for messages.
std::string describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::string:
      return "string " + value.dump();
    case Json::value_t::array:
      return "a list";
    case Json::value_t::object:
      return "an object";
    default:
      return value.dump();  // booleans and numbers as written back
  }
}

// An integral JSON number (5e8 included: DeepSpeed's files write bucket sizes so) as int64;
// false when it lies outside int64's range.
bool to_int64(const Json& value, int64_t* out) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(kMaxInt64)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (value.is_number_integer()) {
    *out = value.get<int64_t>();
    return true;
  }
  const double d = value.get<double>();
  // -2^63 is int64's smallest value and 2^63 the first double past its largest.
  if (d < -9223372036854775808.0 || d >= 9223372036854775808.0) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

// The keys Hugging Face's Trainer fills in when they are "auto" (its trainer_config_process
// and trainer_config_finalize); "auto" anywhere else is a wrong type.
const std::set<std::string>& auto_keys_allowed() {
  static const std::set<std::string> keys = {
      "train_batch_size",
      "train_micro_batch_size_per_gpu",
      "gradient_accumulation_steps",
      "gradient_clipping",
      "fp16.enabled",
      "bf16.enabled",
      "optimizer.params.lr",
      "optimizer.params.betas",
      "optimizer.params.eps",
      "optimizer.params.weight_decay",
      "scheduler.params.warmup_min_lr",
      "scheduler.params.warmup_max_lr",
      "scheduler.params.warmup_num_steps",
      "scheduler.params.total_num_steps",
      "zero_optimization.reduce_bucket_size",
      "zero_optimization.stage3_prefetch_bucket_size",
      "zero_optimization.stage3_param_persistence_threshold",
  };
  return keys;
}

class JsonReader {
 public:
  JsonReader(const std::string& origin, std::set<std::string>* auto_keys)
      : origin_(origin), auto_keys_(auto_keys) {}

  void read_object(const Json& object, Message* message, const std::string& path) const {
    const Descriptor* descriptor = message->GetDescriptor();
    for (auto it = object.begin(); it != object.end(); ++it) {
      const std::string key_path = join_path(path, it.key());
      const FieldDescriptor* field = descriptor->FindFieldByName(it.key());
      if (field == nullptr) {
        config_error(unknown_key_message(key_path, it.key(), descriptor, origin_));
      }
      // Left unset here; resolve_auto() fills it in from the run.
      if (it.value() == "auto" && auto_keys_allowed().count(key_path) != 0) {
        auto_keys_->insert(key_path);
        continue;
      }
      if (field->is_repeated()) {
        read_list(it.value(), message, field, key_path);
      } else {
        read_value(it.value(), message, field, key_path);
      }
    }
  }

 private:
  [[noreturn]] void wrong_type(const std::string& path, const char* expected,
                               const std::string& got) const {
    config_error(in_quotes(path) + " in " + origin_ + " must be " + expected + ", got " + got);
  }

  void read_value(const Json& value, Message* message, const FieldDescriptor* field,
                  const std::string& path) const {
    const Reflection* reflection = message->GetReflection();
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (!value.is_object()) wrong_type(path, "an object", describe(value));
        read_object(value, reflection->MutableMessage(message, field), path);
        return;
      case FieldDescriptor::CPPTYPE_BOOL:
        if (!value.is_boolean()) wrong_type(path, "true or false", describe(value));
        reflection->SetBool(message, field, value.get<bool>());
        return;
      case FieldDescriptor::CPPTYPE_INT64: {
        const bool fraction =
            value.is_number_float() && std::floor(value.get<double>()) != value.get<double>();
        if (!value.is_number() || fraction) wrong_type(path, "an integer", describe(value));
        int64_t v = 0;
        if (!to_int64(value, &v)) wrong_type(path, "an integer in 64-bit range", describe(value));
        reflection->SetInt64(message, field, v);
        return;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
        if (!value.is_number()) wrong_type(path, "a number", describe(value));
        reflection->SetDouble(message, field, value.get<double>());
        return;
      case FieldDescriptor::CPPTYPE_STRING:
        if (!value.is_string()) wrong_type(path, "a string", describe(value));
        reflection->SetString(message, field, value.get<std::string>());
        return;
      default:
        ZERO_FAIL("config schema field " << field->full_name() << " has a type the reader lacks");
    }
  }

  // The schema's lists hold numbers (optimizer.params.betas).
  void read_list(const Json& value, Message* message, const FieldDescriptor* field,
                 const std::string& path) const {
    ZERO_CHECK(field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE,
               "config schema list " << field->full_name() << " is not a list of numbers");
    if (!value.is_array()) wrong_type(path, "a list of numbers", describe(value));
    for (const Json& item : value) {
      if (!item.is_number()) {
        wrong_type(path, "a list of numbers", "a list holding " + describe(item));
      }
      message->GetReflection()->AddDouble(message, field, item.get<double>());
    }
  }

  const std::string& origin_;
  std::set<std::string>* auto_keys_;
};

config::TrainingConfig read_json(const std::string& text, const std::string& origin,
                                 std::set<std::string>* auto_keys) {
  // nlohmann keeps the last of two equal keys without a word; DeepSpeed refuses them, and so do
  // we. The parser reports each key and each object's start and end. An object's path is the
  // last keys of the objects around it, joined only for the message: a copy per object would
  // make deep nesting quadratic (a 200 KB file took 1.8 GB; found by tests/fuzz).
  struct OpenObject {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<OpenObject> open;
  const Json::parser_callback_t check_duplicates = [&](int, Json::parse_event_t event,
                                                       Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open.push_back({});
    } else if (event == Json::parse_event_t::object_end) {
      open.pop_back();
    } else if (event == Json::parse_event_t::key) {
      OpenObject& object = open.back();
      object.last_key = parsed.get<std::string>();
      if (!object.keys.insert(object.last_key).second) {
        std::string path;
        for (const OpenObject& level : open) path = join_path(path, level.last_key);
        config_error("duplicate key " + in_quotes(path) + " in " + origin);
      }
    }
    return true;
  };

  Json root;
  try {
    root = Json::parse(text, check_duplicates, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const Json::exception& e) {
    // what() is "[json.exception.parse_error.101] parse error at line 2, column 3: ...", or for a
    // number past double's range (1e400) "[json.exception.out_of_range.406] number overflow ...".
    const std::string what = e.what();
    const size_t tag_end = what.find("] ");
    config_error("invalid JSON in " + origin + ": " +
                 (tag_end == std::string::npos ? what : what.substr(tag_end + 2)));
  }
  if (!root.is_object()) {
    config_error(origin + " must hold a JSON object of config keys, got " + describe(root));
  }
  config::TrainingConfig message;
  JsonReader(origin, auto_keys).read_object(root, &message, "");
  return message;
}

// ---------------------------------------------------------------------------------------------
// Step 1b: protobuf text format -> message.

class FirstTextFormatError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int error_line, google::protobuf::io::ColumnNumber error_column,
                const std::string& error_message) override {
    if (seen) return;
    seen = true;
    line = error_line;
    column = error_column;
    message = error_message;
  }
  bool seen = false;
  int line = 0;  // 0-based, as protobuf reports them
  int column = 0;
  std::string message;
};

// Where `target` sits in the schema ("" for the root; every message type appears once).
bool schema_path_of(const Descriptor* message, const Descriptor* target, const std::string& prefix,
                    std::string* out) {
  if (message == target) {
    *out = prefix;
    return true;
  }
  for (int i = 0; i < message->field_count(); ++i) {
    const FieldDescriptor* field = message->field(i);
    if (field->message_type() != nullptr &&
        schema_path_of(field->message_type(), target, join_path(prefix, field->name()), out)) {
      return true;
    }
  }
  return false;
}

// The 0-based column where `key` starts on 0-based `line` of `text`, searching back from
// `column`; `column` itself when the key is not found there.
int key_column(const std::string& text, int line, int column, const std::string& key) {
  size_t line_start = 0;
  for (int i = 0; i < line && line_start != std::string::npos; ++i) {
    line_start = text.find('\n', line_start);
    if (line_start != std::string::npos) ++line_start;
  }
  if (line_start == std::string::npos) return column;
  const std::string line_text = text.substr(line_start, text.find('\n', line_start) - line_start);
  const size_t found = line_text.rfind(key, static_cast<size_t>(column));
  return found == std::string::npos ? column : static_cast<int>(found);
}

// Protobuf words an unknown key as `Message type "zero.config.X" has no field named "y".`:
// the message type and the key of such an error; false for any other. A plain search, not
// std::regex: libstdc++'s regex recurses once per character matched, and a key of 100,000
// characters overflowed the stack (found by tests/fuzz).
bool unknown_field_of(const std::string& error, std::string* type, std::string* key) {
  const std::string type_prefix = "Message type \"";
  const std::string key_prefix = "\" has no field named \"";
  const size_t type_start = error.find(type_prefix);
  if (type_start == std::string::npos) return false;
  const size_t type_begin = type_start + type_prefix.size();
  const size_t type_end = error.find(key_prefix, type_begin);
  if (type_end == std::string::npos) return false;
  const size_t key_begin = type_end + key_prefix.size();
  const size_t key_end = error.find('"', key_begin);
  if (key_end == std::string::npos || key_end == key_begin) return false;
  *type = error.substr(type_begin, type_end - type_begin);
  *key = error.substr(key_begin, key_end - key_begin);
  return true;
}

config::TrainingConfig read_text_format(const std::string& text, const std::string& origin) {
  config::TrainingConfig message;
  google::protobuf::TextFormat::Parser parser;
  FirstTextFormatError error;
  parser.RecordErrorsTo(&error);
  if (parser.ParseFromString(text, &message)) return message;

  const auto where = [&](int column) {
    return origin + " at line " + std::to_string(error.line + 1) + ", column " +
           std::to_string(column + 1);
  };
  // An unknown key: say it as the JSON reader does, with the key's path and a suggestion.
  std::string type;
  std::string key;
  if (unknown_field_of(error.message, &type, &key)) {
    const Descriptor* parent =
        google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(type);
    std::string parent_path;
    if (parent != nullptr &&
        schema_path_of(config::TrainingConfig::descriptor(), parent, "", &parent_path)) {
      // Protobuf points at the token after the key; point at the key itself.
      const int column = key_column(text, error.line, error.column, key);
      config_error(unknown_key_message(join_path(parent_path, key), key, parent, where(column)));
    }
  }
  config_error("cannot parse " + where(error.column) +
               " as protobuf text format: " + (error.seen ? error.message : "unknown error"));
}

// ---------------------------------------------------------------------------------------------
// Step 2: the message -> TrainingConfig.

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

// Rejects every parameter given in `params` that `type_name` does not take.
void check_params_taken(const Message& params, const std::vector<std::string>& takes,
                        const std::string& section, const std::string& type_name,
                        const std::string& origin) {
  std::vector<const FieldDescriptor*> given;
  params.GetReflection()->ListFields(params, &given);
  for (const FieldDescriptor* field : given) {
    if (std::find(takes.begin(), takes.end(), field->name()) == takes.end()) {
      config_error(in_quotes(section + "." + field->name()) + " in " + origin +
                   " is not a parameter of " + type_name + " (it takes " + join(takes, ", ") + ")");
    }
  }
}

void read_optimizer(const config::Optimizer& section, const Checker& check, OptimizerConfig* out) {
  const std::string& origin = check.origin();
  if (!section.has_type()) {
    config_error("\"optimizer.type\" is missing in " + origin + "; expected Adam, AdamW or SGD");
  }
  const std::string type = lower(section.type());
  const config::OptimizerParams& params = section.params();
  // DeepSpeed hands params to its FusedAdam or to torch.optim.SGD: their defaults apply.
  OptimizerConfig optimizer;
  optimizer.weight_decay = 0.0f;
  std::string type_name;
  if (type == "adam" || type == "adamw") {
    type_name = type == "adam" ? "Adam" : "AdamW";
    check_params_taken(params, {"lr", "betas", "eps", "weight_decay", "adam_w_mode"},
                       "optimizer.params", type_name, origin);
    // DeepSpeed's Adam is AdamW unless adam_w_mode says otherwise.
    optimizer.type = OptimizerType::kAdamW;
    if (params.has_adam_w_mode() && !params.adam_w_mode()) {
      if (type == "adamw") {
        config_error(
            "\"optimizer.params.adam_w_mode\" in " + origin +
            " is false, but the type is AdamW; use type Adam for Adam with L2 weight decay");
      }
      optimizer.type = OptimizerType::kAdam;
    }
  } else if (type == "sgd") {
    type_name = "SGD";
    check_params_taken(params, {"lr", "momentum", "weight_decay"}, "optimizer.params", type_name,
                       origin);
    optimizer.type = OptimizerType::kSgd;
  } else {
    static const std::set<std::string> deepspeed_only = {"adagrad",    "lamb",       "lion",
                                                         "muadam",     "muadamw",    "musgd",
                                                         "onebitadam", "onebitlamb", "zerooneadam"};
    if (deepspeed_only.count(type) != 0) {
      config_error("\"optimizer.type\" in " + origin + " is " + in_quotes(section.type()) +
                   ", a DeepSpeed optimizer this runtime does not support yet (supported: "
                   "Adam, AdamW, SGD)");
    }
    check.fail("optimizer.type", "Adam, AdamW or SGD", in_quotes(section.type()));
  }

  if (params.has_lr()) {
    optimizer.lr = check.real("optimizer.params.lr", params.lr(), params.lr() >= 0, ">= 0");
  }
  if (params.betas_size() != 0) {
    if (params.betas_size() != 2) {
      check.fail("optimizer.params.betas", "two numbers", std::to_string(params.betas_size()));
    }
    double* betas[2] = {&optimizer.beta1, &optimizer.beta2};
    for (int i = 0; i < 2; ++i) {
      const double beta = params.betas(i);
      // Checked as the optimizer will use it: 1 - beta must stay positive in fp32.
      if (!(beta >= 0.0 && static_cast<float>(beta) < 1.0f)) {
        check.fail("optimizer.params.betas[" + std::to_string(i) + "]", "in [0, 1)",
                   number_text(beta));
      }
      *betas[i] = beta;
    }
  }
  if (params.has_eps()) {
    optimizer.eps = check.real("optimizer.params.eps", params.eps(), params.eps() > 0, "> 0");
  }
  if (params.has_weight_decay()) {
    optimizer.weight_decay = check.real("optimizer.params.weight_decay", params.weight_decay(),
                                        params.weight_decay() >= 0, ">= 0");
  }
  if (params.has_momentum()) {
    const double m = params.momentum();
    optimizer.momentum = check.real("optimizer.params.momentum", m,
                                    m >= 0 && static_cast<float>(m) < 1.0f, "in [0, 1)");
  }
  *out = optimizer;
}

void read_scheduler(const config::Scheduler& section, float optimizer_lr, const Checker& check,
                    LrScheduleConfig* out) {
  const std::string& origin = check.origin();
  if (!section.has_type()) {
    config_error("\"scheduler.type\" is missing in " + origin +
                 "; expected WarmupLR, WarmupDecayLR or WarmupCosineLR");
  }
  const std::string type = lower(section.type());
  const config::SchedulerParams& params = section.params();
  LrScheduleConfig schedule;
  std::string type_name;
  if (type == "warmuplr") {
    type_name = "WarmupLR";
    schedule.type = LrScheduleType::kWarmup;
    check_params_taken(params,
                       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"},
                       "scheduler.params", type_name, origin);
  } else if (type == "warmupdecaylr") {
    type_name = "WarmupDecayLR";
    schedule.type = LrScheduleType::kWarmupLinearDecay;
    check_params_taken(
        params,
        {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"},
        "scheduler.params", type_name, origin);
  } else if (type == "warmupcosinelr") {
    type_name = "WarmupCosineLR";
    schedule.type = LrScheduleType::kWarmupCosine;
    check_params_taken(
        params,
        {"total_num_steps", "warmup_min_ratio", "cos_min_ratio", "warmup_num_steps", "warmup_type"},
        "scheduler.params", type_name, origin);
  } else if (type == "onecycle" || type == "lrrangetest") {
    config_error("\"scheduler.type\" in " + origin + " is " + in_quotes(section.type()) +
                 ", a DeepSpeed scheduler this runtime does not support yet (supported: "
                 "WarmupLR, WarmupDecayLR, WarmupCosineLR)");
  } else {
    check.fail("scheduler.type", "WarmupLR, WarmupDecayLR or WarmupCosineLR",
               in_quotes(section.type()));
  }

  // DeepSpeed's default warm-up is "log". (DeepSpeed falls back to it, with a warning, for a
  // name it does not know; a typo here is an error instead.)
  if (params.has_warmup_type()) {
    const std::string& warmup = params.warmup_type();
    if (warmup != "log" && warmup != "linear") {
      check.fail("scheduler.params.warmup_type", "\"log\" or \"linear\"", in_quotes(warmup));
    }
    schedule.warmup_type = warmup == "log" ? LrWarmupType::kLog : LrWarmupType::kLinear;
  }
  schedule.warmup_steps = params.has_warmup_num_steps()
                              ? check.integer("scheduler.params.warmup_num_steps",
                                              params.warmup_num_steps(), 0, kMaxInt64)
                              : 1000;
  if (schedule.type == LrScheduleType::kWarmupCosine) {
    // WarmupCosineLR scales the optimizer's own lr.
    const double min_ratio = params.has_warmup_min_ratio() ? params.warmup_min_ratio() : 0.0;
    const double cos_ratio = params.has_cos_min_ratio() ? params.cos_min_ratio() : 1e-4;
    check.real("scheduler.params.warmup_min_ratio", min_ratio, min_ratio >= 0 && min_ratio <= 1,
               "in [0, 1]");
    schedule.cos_min_ratio = check.real("scheduler.params.cos_min_ratio", cos_ratio,
                                        cos_ratio >= 0 && cos_ratio <= 1, "in [0, 1]");
    schedule.max_lr = optimizer_lr;
    schedule.min_lr = static_cast<float>(min_ratio * optimizer_lr);
  } else {
    const double min_lr = params.has_warmup_min_lr() ? params.warmup_min_lr() : 0.0;
    const double max_lr = params.has_warmup_max_lr() ? params.warmup_max_lr() : 1e-3;
    schedule.min_lr = check.real("scheduler.params.warmup_min_lr", min_lr, min_lr >= 0, ">= 0");
    schedule.max_lr = check.real("scheduler.params.warmup_max_lr", max_lr, max_lr >= 0, ">= 0");
    if (min_lr > max_lr) {
      config_error("\"scheduler.params.warmup_min_lr\" (" + number_text(min_lr) + ") exceeds " +
                   "\"scheduler.params.warmup_max_lr\" (" + number_text(max_lr) + ") in " + origin);
    }
  }
  if (schedule.type != LrScheduleType::kWarmup) {
    if (!params.has_total_num_steps()) {
      config_error("\"scheduler.params.total_num_steps\" is missing in " + origin + "; " +
                   type_name + " needs it");
    }
    schedule.total_steps =
        check.integer("scheduler.params.total_num_steps", params.total_num_steps(), 1, kMaxInt64);
    if (schedule.warmup_steps > schedule.total_steps) {
      config_error("\"scheduler.params.warmup_num_steps\" (" +
                   std::to_string(schedule.warmup_steps) +
                   (params.has_warmup_num_steps() ? "" : ", the default") + ") exceeds " +
                   "\"scheduler.params.total_num_steps\" (" + std::to_string(schedule.total_steps) +
                   ") in " + origin);
    }
  }
  *out = schedule;
}

// Hugging Face's resolution of "auto" (see config.h): each key in `auto_keys` gets its value
// from `context` written into `c`, so the checks below treat it as if the file had it, and a
// line saying so goes to `notes`.
void resolve_auto(const std::set<std::string>& auto_keys, const ConfigContext& context,
                  int world_size, const std::string& origin, config::TrainingConfig* c,
                  std::vector<std::string>* notes) {
  const auto is_auto = [&](const char* key) { return auto_keys.count(key) != 0; };
  const auto unresolved = [&](const char* key, const std::string& needs) {
    config_error(in_quotes(key) + " in " + origin + " is \"auto\", but " + needs +
                 " is not known here; give the key a value");
  };
  const auto note = [&](const char* key, const std::string& value, const std::string& why) {
    notes->push_back(std::string(key) + " \"auto\" -> " + value + " (" + why + ")");
  };
  const std::string& from = context.source;

  if (is_auto("train_batch_size")) {
    if (!context.train_batch_size) unresolved("train_batch_size", "the run's global batch size");
    c->set_train_batch_size(*context.train_batch_size);
    note("train_batch_size", std::to_string(*context.train_batch_size), from);
  }
  if (is_auto("gradient_accumulation_steps")) {
    if (!context.gradient_accumulation_steps) {
      unresolved("gradient_accumulation_steps", "the run's number of micro-batches");
    }
    c->set_gradient_accumulation_steps(*context.gradient_accumulation_steps);
    note("gradient_accumulation_steps", std::to_string(*context.gradient_accumulation_steps), from);
  }
  if (is_auto("train_micro_batch_size_per_gpu")) {
    if (!context.train_batch_size || !context.gradient_accumulation_steps) {
      unresolved("train_micro_batch_size_per_gpu", "the run's global batch and micro-batches");
    }
    const BatchSizes b = derive_batch_sizes(context.train_batch_size, std::nullopt,
                                            context.gradient_accumulation_steps, world_size, from);
    c->set_train_micro_batch_size_per_gpu(b.micro_batch_per_rank);
    note("train_micro_batch_size_per_gpu", std::to_string(b.micro_batch_per_rank),
         "global batch " + std::to_string(b.train_batch_size) + " / (" +
             std::to_string(b.gradient_accumulation_steps) + " micro-batches x " +
             std::to_string(world_size) + " ranks)");
  }
  if (is_auto("gradient_clipping")) {
    if (!context.gradient_clipping) unresolved("gradient_clipping", "the run's clipping norm");
    c->set_gradient_clipping(*context.gradient_clipping);
    note("gradient_clipping", number_text(*context.gradient_clipping), from);
  }
  for (const char* key : {"fp16.enabled", "bf16.enabled"}) {
    if (!is_auto(key)) continue;
    if (!context.dtype) unresolved(key, "the run's dtype");
    const bool fp16 = std::string(key) == "fp16.enabled";
    const bool on = *context.dtype == (fp16 ? DType::kFloat16 : DType::kBFloat16);
    if (fp16) {
      c->mutable_fp16()->set_enabled(on);
    } else {
      c->mutable_bf16()->set_enabled(on);
    }
    note(key, on ? "true" : "false", std::string("dtype ") + dtype_name(*context.dtype));
  }

  // Sections are only touched where the file has an "auto" in them: a section that exists is
  // one the file gave.
  const auto optimizer = [&] { return c->mutable_optimizer()->mutable_params(); };
  if (is_auto("optimizer.params.lr")) {
    if (!context.lr) unresolved("optimizer.params.lr", "the run's learning rate");
    optimizer()->set_lr(*context.lr);
    note("optimizer.params.lr", number_text(*context.lr), from);
  }
  if (is_auto("optimizer.params.betas")) {
    optimizer()->add_betas(0.9);
    optimizer()->add_betas(0.999);
    note("optimizer.params.betas", "[0.9, 0.999]", "Adam's default");
  }
  if (is_auto("optimizer.params.eps")) {
    optimizer()->set_eps(1e-8);
    note("optimizer.params.eps", "1e-08", "Adam's default");
  }
  if (is_auto("optimizer.params.weight_decay")) {
    if (!context.weight_decay)
      unresolved("optimizer.params.weight_decay", "the run's weight decay");
    optimizer()->set_weight_decay(*context.weight_decay);
    note("optimizer.params.weight_decay", number_text(*context.weight_decay), from);
  }

  const auto scheduler = [&] { return c->mutable_scheduler()->mutable_params(); };
  if (is_auto("scheduler.params.warmup_min_lr")) {
    scheduler()->set_warmup_min_lr(0.0);
    note("scheduler.params.warmup_min_lr", "0", "Hugging Face's value");
  }
  if (is_auto("scheduler.params.warmup_max_lr")) {
    if (!context.lr) unresolved("scheduler.params.warmup_max_lr", "the run's learning rate");
    scheduler()->set_warmup_max_lr(*context.lr);
    note("scheduler.params.warmup_max_lr", number_text(*context.lr), "the run's learning rate");
  }
  if (is_auto("scheduler.params.warmup_num_steps")) {
    if (!context.warmup_num_steps) {
      unresolved("scheduler.params.warmup_num_steps", "the run's warm-up steps");
    }
    scheduler()->set_warmup_num_steps(*context.warmup_num_steps);
    note("scheduler.params.warmup_num_steps", std::to_string(*context.warmup_num_steps), from);
  }
  if (is_auto("scheduler.params.total_num_steps")) {
    if (!context.total_num_steps) {
      unresolved("scheduler.params.total_num_steps", "the run's number of steps");
    }
    scheduler()->set_total_num_steps(*context.total_num_steps);
    note("scheduler.params.total_num_steps", std::to_string(*context.total_num_steps), from);
  }

  // The bucket sizes scale with the model: Hugging Face's trainer_config_finalize.
  config::ZeroOptimization* zero = c->mutable_zero_optimization();
  const char* hidden_keys[] = {"zero_optimization.reduce_bucket_size",
                               "zero_optimization.stage3_prefetch_bucket_size",
                               "zero_optimization.stage3_param_persistence_threshold"};
  for (const char* key : hidden_keys) {
    if (is_auto(key) && !context.hidden_size) unresolved(key, "the model's hidden size");
  }
  if (context.hidden_size) {
    const int64_t h = *context.hidden_size;
    const std::string hidden = "hidden " + std::to_string(h);
    if (is_auto(hidden_keys[0])) {
      zero->set_reduce_bucket_size(h * h);
      note(hidden_keys[0], std::to_string(h * h), hidden + " squared");
    }
    if (is_auto(hidden_keys[1])) {
      const int64_t v = static_cast<int64_t>(0.9 * static_cast<double>(h * h));
      zero->set_stage3_prefetch_bucket_size(v);
      note(hidden_keys[1], std::to_string(v), "0.9 x " + hidden + " squared");
    }
    if (is_auto(hidden_keys[2])) {
      zero->set_stage3_param_persistence_threshold(10 * h);
      note(hidden_keys[2], std::to_string(10 * h), "10 x " + hidden);
    }
  }
}

std::optional<long> given(bool has, int64_t value) {
  return has ? std::optional<long>(value) : std::nullopt;
}

TrainingConfig interpret(const config::TrainingConfig& c, int world_size, const std::string& origin,
                         std::vector<std::string> resolved) {
  const Checker check(origin);
  TrainingConfig out;
  out.origin = origin;
  out.resolved_auto = std::move(resolved);
  EngineConfig& e = out.engine;

  const BatchSizes batch = derive_batch_sizes(
      given(c.has_train_batch_size(), c.train_batch_size()),
      given(c.has_train_micro_batch_size_per_gpu(), c.train_micro_batch_size_per_gpu()),
      given(c.has_gradient_accumulation_steps(), c.gradient_accumulation_steps()), world_size,
      origin);
  out.train_batch_size = batch.train_batch_size;
  out.micro_batch_per_rank = batch.micro_batch_per_rank;
  out.gradient_accumulation_steps = batch.gradient_accumulation_steps;
  e.micro_batches = batch.gradient_accumulation_steps;

  if (c.has_gradient_clipping()) {
    e.gradient_clipping = check.real("gradient_clipping", c.gradient_clipping(),
                                     c.gradient_clipping() >= 0, ">= 0 (0 turns clipping off)");
  }
  if (c.has_steps_per_print()) {
    out.steps_per_print = check.integer("steps_per_print", c.steps_per_print(), 1, kMaxInt64);
  }
  if (c.has_seed()) {
    e.seed = static_cast<uint64_t>(check.integer("seed", c.seed(), 0, kMaxInt64));
  }
  if (c.debug().collectives()) e.desync_check = true;
  if (c.has_nonfinite_gradients()) {
    const std::string& mode = c.nonfinite_gradients();
    if (mode != "error" && mode != "skip") {
      check.fail("nonfinite_gradients", "\"error\" or \"skip\"", in_quotes(mode));
    }
    e.skip_nonfinite_steps = mode == "skip";
  }

  // Precision first: grad_accum_dtype and communication_data_type are checked against it.
  const config::Fp16& fp16 = c.fp16();
  if (fp16.enabled() && c.bf16().enabled()) {
    config_error("fp16.enabled and bf16.enabled are both true in " + origin +
                 "; enable at most one");
  }
  e.dtype = fp16.enabled()       ? DType::kFloat16
            : c.bf16().enabled() ? DType::kBFloat16
                                 : DType::kFloat32;
  LossScalerConfig& scaler = e.loss_scaler;
  if (fp16.has_loss_scale()) {
    scaler.static_scale = check.real("fp16.loss_scale", fp16.loss_scale(), fp16.loss_scale() >= 0,
                                     ">= 0 (0: dynamic scaling)");
  }
  if (fp16.has_initial_scale_power()) {
    scaler.initial_scale_power = static_cast<int>(
        check.integer("fp16.initial_scale_power", fp16.initial_scale_power(), 0, 127));
  }
  if (fp16.has_loss_scale_window()) {
    scaler.scale_window = static_cast<int>(
        check.integer("fp16.loss_scale_window", fp16.loss_scale_window(), 1, kMaxInt));
  }
  if (fp16.has_hysteresis()) {
    scaler.hysteresis =
        static_cast<int>(check.integer("fp16.hysteresis", fp16.hysteresis(), 1, kMaxInt));
  }
  if (fp16.has_min_loss_scale()) {
    scaler.min_scale =
        check.real("fp16.min_loss_scale", fp16.min_loss_scale(), fp16.min_loss_scale() > 0, "> 0");
  }

  if (c.has_communication_data_type()) {
    const std::string& name = c.communication_data_type();
    DType comm = DType::kFloat32;
    if ((name != "fp32" && name != "fp16" && name != "bf16") || !parse_dtype(name, &comm)) {
      check.fail("communication_data_type", "\"fp32\", \"fp16\" or \"bf16\"", in_quotes(name));
    }
    // The engine reduces gradients in the working dtype, or in fp32 when told to.
    if (comm != e.dtype && comm != DType::kFloat32) {
      config_error("\"communication_data_type\" in " + origin + " is " + in_quotes(name) +
                   " but the working dtype is " + dtype_name(e.dtype) +
                   "; gradients are reduced in the working dtype or in fp32");
    }
    e.reduce_in_fp32 = comm == DType::kFloat32 && e.dtype != DType::kFloat32;
  }
  if (c.has_gradient_predivide_factor()) {
    e.gradient_predivide_factor =
        check.real("gradient_predivide_factor", c.gradient_predivide_factor(),
                   c.gradient_predivide_factor() > 0, "> 0");
  }

  const config::ZeroOptimization& zero = c.zero_optimization();
  e.stage = 0;  // DeepSpeed's default: no zero_optimization section means no sharding
  if (zero.has_stage() && (zero.stage() < 0 || zero.stage() > 3)) {
    check.fail("zero_optimization.stage", "0, 1, 2 or 3", std::to_string(zero.stage()));
  }
  if (zero.has_stage()) e.stage = static_cast<int>(zero.stage());
  if (zero.has_overlap_comm()) e.overlap_comm = zero.overlap_comm();
  if (zero.has_reduce_scatter()) e.reduce_scatter = zero.reduce_scatter();
  if (zero.has_contiguous_gradients() && !zero.contiguous_gradients()) {
    config_error("\"zero_optimization.contiguous_gradients\" in " + origin +
                 " is false, but this runtime always keeps gradient buckets contiguous; set it "
                 "to true or leave it out");
  }
  if (zero.has_allgather_partitions() && !zero.allgather_partitions()) {
    config_error("\"zero_optimization.allgather_partitions\" in " + origin +
                 " is false, but this runtime always all-gathers the updated partitions after "
                 "the step; set it to true or leave it out");
  }
  // Elements per collective: the engine packs units up to them; they never merge units.
  const int64_t max_elements = static_cast<int64_t>(std::numeric_limits<size_t>::max() / 4);
  if (zero.has_reduce_bucket_size()) {
    e.reduce_bucket_elements = static_cast<size_t>(check.integer(
        "zero_optimization.reduce_bucket_size", zero.reduce_bucket_size(), 1, max_elements));
  }
  if (zero.has_allgather_bucket_size()) {
    e.allgather_bucket_elements = static_cast<size_t>(check.integer(
        "zero_optimization.allgather_bucket_size", zero.allgather_bucket_size(), 1, max_elements));
  }
  if (zero.has_sub_group_size()) {
    e.optimizer_sub_group_elements = static_cast<size_t>(
        check.integer("zero_optimization.sub_group_size", zero.sub_group_size(), 1, max_elements));
  }
  out.gather_16bit_weights_on_model_save = zero.stage3_gather_16bit_weights_on_model_save();
  if (zero.has_stage3_prefetch_bucket_size()) {
    const int64_t v = zero.stage3_prefetch_bucket_size();
    if (v < 1) {
      check.fail("zero_optimization.stage3_prefetch_bucket_size",
                 "at least 1 (this runtime always prefetches the next unit)", std::to_string(v));
    }
    e.prefetch_elements = static_cast<size_t>(v);
  }
  if (zero.has_stage3_param_persistence_threshold()) {
    e.persistence_threshold =
        static_cast<size_t>(check.integer("zero_optimization.stage3_param_persistence_threshold",
                                          zero.stage3_param_persistence_threshold(), 0, kMaxInt64));
  }
  if (zero.has_stage3_max_live_parameters()) {
    const int64_t v = zero.stage3_max_live_parameters();
    if (v < 1) {
      check.fail("zero_optimization.stage3_max_live_parameters",
                 "at least 1 (leave it out for no limit)", std::to_string(v));
    }
    e.max_live_elements = static_cast<size_t>(v);
  }
  if (zero.has_stage3_max_reuse_distance()) {
    e.max_reuse_distance =
        static_cast<size_t>(check.integer("zero_optimization.stage3_max_reuse_distance",
                                          zero.stage3_max_reuse_distance(), 0, kMaxInt64));
  }

  if (c.data_types().has_grad_accum_dtype()) {
    const std::string& name = c.data_types().grad_accum_dtype();
    DType accum = DType::kFloat32;
    if ((name != "fp32" && name != "fp16" && name != "bf16") || !parse_dtype(name, &accum)) {
      check.fail("data_types.grad_accum_dtype", "\"fp32\", \"fp16\" or \"bf16\"", in_quotes(name));
    }
    // Accumulating in a narrower type than the working one, or another 2-byte one, is not a
    // mode DeepSpeed has either.
    if (accum != e.dtype && accum != DType::kFloat32) {
      config_error("\"data_types.grad_accum_dtype\" in " + origin + " is " + in_quotes(name) +
                   " but the working dtype is " + dtype_name(e.dtype) +
                   "; gradients accumulate in the working dtype or in fp32");
    }
    e.grad_accum_dtype = accum;
  }
  out.wall_clock_breakdown = c.wall_clock_breakdown();
  out.override_optimizer = c.checkpoint().override_optimizer();
  // Keys whose effect here would be none: accepted, and each named once with why.
  if (c.has_memory_breakdown()) {
    out.ignored_keys.push_back(
        "memory_breakdown is ignored: the memory summary by category is "
        "printed at start anyway");
  }
  if (c.has_zero_allow_untested_optimizer()) {
    out.ignored_keys.push_back(
        "zero_allow_untested_optimizer is ignored: every optimizer here "
        "is built into the engine and runs at every stage");
  }
  if (zero.has_round_robin_gradients()) {
    out.ignored_keys.push_back(
        "zero_optimization.round_robin_gradients is ignored: it orders "
        "gradient copies to CPU offload, which this runtime does not do; "
        "results are the same");
  }

  if (c.has_optimizer()) read_optimizer(c.optimizer(), check, &e.optimizer);
  // Without a scheduler the optimizer's lr holds for the whole run.
  e.lr_schedule = LrScheduleConfig();
  e.lr_schedule.type = LrScheduleType::kConstant;
  e.lr_schedule.max_lr = e.optimizer.lr;
  if (c.has_scheduler()) read_scheduler(c.scheduler(), e.optimizer.lr, check, &e.lr_schedule);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Step 3: DeepSpeed's batch-size rule.

BatchSizes derive_batch_sizes(std::optional<long> train_batch_size,
                              std::optional<long> micro_batch_per_rank,
                              std::optional<long> gradient_accumulation_steps, int world_size,
                              const std::string& origin) {
  if (world_size < 1) {
    config_error("world size must be at least 1, got " + std::to_string(world_size));
  }
  const Checker check(origin);
  if (train_batch_size) check.integer("train_batch_size", *train_batch_size, 1, kMaxInt64);
  if (micro_batch_per_rank) {
    check.integer("train_micro_batch_size_per_gpu", *micro_batch_per_rank, 1, kMaxInt64);
  }
  if (gradient_accumulation_steps) {
    check.integer("gradient_accumulation_steps", *gradient_accumulation_steps, 1, kMaxInt);
  }

  const long world = world_size;
  const auto product = [&](long a, long b) {
    long p = 0;
    if (__builtin_mul_overflow(a, b, &p)) {
      config_error("batch sizes in " + origin + " overflow: " + std::to_string(a) + " * " +
                   std::to_string(b));
    }
    return p;
  };
  const std::string micro_text = "train_micro_batch_size_per_gpu ";
  const std::string steps_text = "gradient_accumulation_steps ";
  const std::string world_text = "world size " + std::to_string(world);
  BatchSizes b;
  if (train_batch_size && micro_batch_per_rank && gradient_accumulation_steps) {
    const long expected =
        product(product(*micro_batch_per_rank, *gradient_accumulation_steps), world);
    if (*train_batch_size != expected) {
      config_error("batch sizes in " + origin + " do not multiply out: train_batch_size " +
                   std::to_string(*train_batch_size) + " != " + micro_text +
                   std::to_string(*micro_batch_per_rank) + " * " + steps_text +
                   std::to_string(*gradient_accumulation_steps) + " * " + world_text + " = " +
                   std::to_string(expected));
    }
    b = {*train_batch_size, *micro_batch_per_rank, static_cast<int>(*gradient_accumulation_steps)};
  } else if (train_batch_size && (micro_batch_per_rank || gradient_accumulation_steps)) {
    // The given one of the other two, times the world size, must divide train_batch_size.
    const bool micro_given = micro_batch_per_rank.has_value();
    const long other = micro_given ? *micro_batch_per_rank : *gradient_accumulation_steps;
    const long divisor = product(other, world);
    if (*train_batch_size % divisor != 0) {
      config_error("\"train_batch_size\" " + std::to_string(*train_batch_size) + " in " + origin +
                   " is not divisible by " + (micro_given ? micro_text : steps_text) +
                   std::to_string(other) + " * " + world_text + " = " + std::to_string(divisor));
    }
    const long derived = *train_batch_size / divisor;
    if (micro_given && derived > kMaxInt) {
      config_error("batch sizes in " + origin + " give " + std::to_string(derived) +
                   " gradient accumulation steps; at most " + std::to_string(kMaxInt) +
                   " are supported");
    }
    b.train_batch_size = *train_batch_size;
    b.micro_batch_per_rank = micro_given ? *micro_batch_per_rank : derived;
    b.gradient_accumulation_steps =
        static_cast<int>(micro_given ? derived : *gradient_accumulation_steps);
  } else if (micro_batch_per_rank) {
    const long steps = gradient_accumulation_steps.value_or(1);
    b = {product(product(*micro_batch_per_rank, steps), world), *micro_batch_per_rank,
         static_cast<int>(steps)};
  } else if (train_batch_size) {
    if (*train_batch_size % world != 0) {
      config_error("\"train_batch_size\" " + std::to_string(*train_batch_size) + " in " + origin +
                   " is not divisible by " + world_text);
    }
    b = {*train_batch_size, *train_batch_size / world, 1};
  } else {
    config_error(
        "neither \"train_batch_size\" nor \"train_micro_batch_size_per_gpu\" is given in " +
        origin + "; at least one is required");
  }
  return b;
}

TrainingConfig parse_training_config(const std::string& text, int world_size,
                                     const std::string& origin, const ConfigContext& context) {
  // A UTF-8 byte order mark is not content.
  const size_t start = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  const size_t first = text.find_first_not_of(" \t\r\n", start);
  if (first == std::string::npos) config_error("config " + origin + " is empty");
  std::set<std::string> auto_keys;
  config::TrainingConfig message = text[first] == '{' || text[first] == '['
                                       ? read_json(text, origin, &auto_keys)
                                       : read_text_format(text.substr(start), origin);
  std::vector<std::string> resolved;
  resolve_auto(auto_keys, context, world_size, origin, &message, &resolved);
  return interpret(message, world_size, origin, std::move(resolved));
}

TrainingConfig load_training_config(const std::string& path, int world_size,
                                    const ConfigContext& context) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) {
    config_error("cannot open config file " + in_quotes(path) + ": " + std::strerror(errno));
  }
  std::string text;
  char chunk[65536];
  size_t n = 0;
  while ((n = std::fread(chunk, 1, sizeof(chunk), file)) > 0) text.append(chunk, n);
  const bool failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (failed) {
    config_error("cannot read config file " + in_quotes(path) + ": " + std::strerror(read_errno));
  }
  return parse_training_config(text, world_size, path, context);
}

}  // namespace zero
