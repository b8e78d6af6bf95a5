// Step 1 of reading the config: text -> zero.config.TrainingConfig. JSON is walked against the
// message's descriptor, so the schema itself decides which keys exist, where they nest and what
// type each value has; protobuf text format goes through protobuf's own parser. JSON "auto"
// values of the keys Hugging Face resolves are set aside for resolve_auto() (config_auto.cpp).
#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "config_parse.h"

namespace zero::config_internal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
// Keeps keys in file order, so the first bad key reported is the first one in the file.
using Json = nlohmann::ordered_json;

// Messages show at most this many bytes of what a file holds: a 1 MB key does not make a 1 MB
// message.
constexpr size_t kShown = 64;

// The first kShown bytes of `text`, cut back to a UTF-8 character boundary, then "...".
std::string shown_part(const std::string& text) {
  size_t cut = kShown;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

// A key as messages quote it: in full up to kShown bytes, else its shown part and its length.
std::string quote_key(const std::string& key) {
  if (key.size() <= kShown) return in_quotes(key);
  return in_quotes(shown_part(key)) + " (" + std::to_string(key.size()) + " bytes)";
}

// A parser's message ends with the text it stopped at, after `marker` (nlohmann's "last read: ",
// protobuf's "got: "): a long one is cut as keys are.
std::string shorten_echo(const std::string& message, const std::string& marker) {
  const size_t at = message.rfind(marker);
  if (at == std::string::npos) return message;
  const size_t begin = at + marker.size();
  if (message.size() - begin <= kShown + 16) return message;
  return message.substr(0, begin) + shown_part(message.substr(begin)) + " (" +
         std::to_string(message.size() - begin) + " bytes)";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Keys the schema does not have: a DeepSpeed option we lack, or a typo.

// They get their own message so that a user does not hunt for a typo in a key DeepSpeed itself
// accepts.
const std::set<std::string>& unsupported_deepspeed_keys() {
  static const std::set<std::string> keys = {
      "aio.use_gds",
      "amp",
      "autotuning",
      "compression_training",
      "curriculum_learning",
      "data_efficiency",
      "dataloader_drop_last",
      "disable_allgather",
      "dump_state",
      "eigenvalue",
      "elasticity",
      "hybrid_engine",
      "load_universal_checkpoint",
      "nebula",
      "prescale_gradients",
      "progressive_layer_drop",
      "quantize_training",
      "sparse_attention",
      "sparse_gradients",
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
      "zero_optimization.offload_optimizer.ratio",
      "zero_optimization.offload_optimizer.super_offload",
      "zero_optimization.stage3_gather_fp16_weights_on_model_save",
      "zero_optimization.zero_quantized_nontrainable_weights",
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

namespace {

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
  if (path == "wandb") {
    return in_quotes(path) + " in " + where +
           " is a DeepSpeed option this runtime does not support: Weights & Biases logs to a "
           "network service; use \"tensorboard\" or \"csv_monitor\", whose files any machine "
           "can read";
  }
  if (unsupported_deepspeed_keys().count(path) != 0) {
    return in_quotes(path) + " in " + where +
           " is a DeepSpeed option this runtime does not support yet";
  }
  const std::string message = "unknown key " + quote_key(path) + " in " + where;
  // A valid key written at the wrong level ("stage" at the top): point at where it belongs.
  std::vector<std::string> elsewhere;
  find_field_paths(config::TrainingConfig::descriptor(), "", key, &elsewhere);
  if (elsewhere.size() == 1) return message + "; did you mean " + in_quotes(elsewhere[0]) + "?";

  // Otherwise the closest key of the same section, if it is close enough to be a typo.
  std::string closest;
  size_t closest_distance = std::numeric_limits<size_t>::max();
  std::vector<std::string> names;
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  for (int i = 0; i < parent->field_count(); ++i) {
    const std::string& name = parent->field(i)->name();
    names.push_back(name);
    // The lengths alone bound the distance from below: a name that cannot come within the
    // limit is not compared (a 1 MB key would otherwise take a table of 1 MB rows).
    const size_t bound =
        key.size() > name.size() ? key.size() - name.size() : name.size() - key.size();
    if (bound > limit) continue;
    const size_t distance = edit_distance(key, name);
    if (distance < closest_distance) {
      closest = name;
      closest_distance = distance;
    }
  }
  if (closest_distance <= limit) {
    return message + "; did you mean " + in_quotes(closest) + "?";
  }
  return message + "; valid keys here: " + join(names, ", ");
}

// ---------------------------------------------------------------------------------------------
// JSON -> message, with the descriptor as the guide.

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
// and trainer_config_finalize), and DeepSpeed's "auto" pipeline stages; "auto" anywhere else is
// a wrong type.
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
      "pipeline.stages",  // DeepSpeed's own default
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

  // The schema's lists hold numbers (optimizer.params.betas) or strings (comms_logger.prof_ops).
  void read_list(const Json& value, Message* message, const FieldDescriptor* field,
                 const std::string& path) const {
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      if (!value.is_array()) wrong_type(path, "a list of strings", describe(value));
      for (const Json& item : value) {
        if (!item.is_string()) {
          wrong_type(path, "a list of strings", "a list holding " + describe(item));
        }
        message->GetReflection()->AddString(message, field, item.get<std::string>());
      }
      return;
    }
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
        config_error("duplicate key " + quote_key(path) + " in " + origin);
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
                 shorten_echo(tag_end == std::string::npos ? what : what.substr(tag_end + 2),
                              "last read: "));
  }
  if (!root.is_object()) {
    config_error(origin + " must hold a JSON object of config keys, got " + describe(root));
  }
  config::TrainingConfig message;
  JsonReader(origin, auto_keys).read_object(root, &message, "");
  return message;
}

// ---------------------------------------------------------------------------------------------
// Protobuf text format -> message.

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

// Where `text` stops looking like protobuf text format, which opens with a field name and then
// ':', '{' or '<' (after white space and # comments), or npos when it opens so. Prose ("this is
// a config") and other files fail here, and are told they are not a config rather than that
// their first word is an unknown key.
size_t not_text_format_at(const std::string& text) {
  const char* space = " \t\r\n";
  size_t pos = text.find_first_not_of(space);
  while (pos != std::string::npos && text[pos] == '#') {
    pos = text.find('\n', pos);
    if (pos != std::string::npos) pos = text.find_first_not_of(space, pos);
  }
  if (pos == std::string::npos) return std::string::npos;
  const auto is_name_char = [&](size_t i, bool first) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    return std::isalpha(c) || c == '_' || (!first && std::isdigit(c));
  };
  if (!is_name_char(pos, true)) return pos;
  size_t end = pos + 1;
  while (end < text.size() && is_name_char(end, false)) ++end;
  const size_t next = text.find_first_not_of(space, end);
  if (next == std::string::npos || std::string(":{<").find(text[next]) == std::string::npos) {
    return pos;
  }
  return std::string::npos;
}

config::TrainingConfig read_text_format(const std::string& text, size_t bom,
                                        const std::string& origin) {
  config::TrainingConfig message;
  google::protobuf::TextFormat::Parser parser;
  FirstTextFormatError error;
  parser.RecordErrorsTo(&error);
  if (parser.ParseFromString(text, &message)) return message;
  // `text` starts after any byte order mark; offsets count from the file's first byte.
  const size_t not_config = not_text_format_at(text);
  if (not_config != std::string::npos) {
    config_error(origin + ": byte " + std::to_string(not_config + bom) +
                 ": not JSON (a config is a JSON object, starting with '{') nor protobuf text "
                 "format (a key, then ':' or '{')");
  }

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
  config_error("cannot parse " + where(error.column) + " as protobuf text format: " +
               (error.seen ? shorten_echo(error.message, "got: ") : "unknown error"));
}

}  // namespace

config::TrainingConfig parse_config_text(const std::string& text, const std::string& origin,
                                         std::set<std::string>* auto_keys) {
  // Protobuf's parser and nlohmann's would each stop or go wrong at a NUL byte.
  const size_t nul = text.find('\0');
  if (nul != std::string::npos) {
    config_error(origin + ": byte " + std::to_string(nul) + ": a NUL byte; a config is text");
  }
  // A UTF-8 byte order mark is not content.
  const size_t start = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  const size_t first = text.find_first_not_of(" \t\r\n", start);
  if (first == std::string::npos) config_error("config " + origin + " is empty");
  return text[first] == '{' || text[first] == '['
             ? read_json(text, origin, auto_keys)
             : read_text_format(text.substr(start), start, origin);
}

}  // namespace zero::config_internal
