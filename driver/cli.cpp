#include "driver/cli.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace zero::driver {

void usage_error(const std::string& message) {
  throw UsageError(message);
}

bool parse_integer(const std::string& text, long* out) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) return false;
  *out = value;
  return true;
}

bool is_digits(const std::string& text) {
  bool digits = !text.empty();
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  return digits;
}

uint64_t strip_byte_suffix(std::string* text) {
  if (text->empty()) return 1;
  const std::string suffixes = "KMG";
  const size_t i = suffixes.find(static_cast<char>(std::toupper(text->back())));
  if (i == std::string::npos) return 1;
  text->pop_back();
  return 1ull << (10 * (i + 1));
}

namespace {

long parse_integer_or_fail(const std::string& flag, const std::string& text) {
  long value = 0;
  if (!parse_integer(text, &value)) usage_error(flag + " expects an integer, got '" + text + "'");
  return value;
}

}  // namespace

long parse_at_least(const std::string& flag, const std::string& text, long min_value) {
  const long value = parse_integer_or_fail(flag, text);
  if (value < min_value) usage_error(flag + " must be at least " + std::to_string(min_value));
  return value;
}

long parse_between(const std::string& flag, const std::string& text, long min_value,
                   long max_value) {
  const long value = parse_integer_or_fail(flag, text);
  if (value < min_value || value > max_value) {
    usage_error(flag + " must be between " + std::to_string(min_value) + " and " +
                std::to_string(max_value) + ", got " + text);
  }
  return value;
}

float parse_float_at_least(const std::string& flag, const std::string& text, float min_value) {
  char* end = nullptr;
  const float value = std::strtof(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value)) {
    usage_error(flag + " expects a number, got '" + text + "'");
  }
  if (value < min_value) usage_error(flag + " must be at least " + std::to_string(min_value));
  return value;
}

uint64_t parse_bytes(const std::string& flag, const std::string& text) {
  std::string digits = text;
  const uint64_t unit = strip_byte_suffix(&digits);
  return static_cast<uint64_t>(parse_at_least(flag, digits, 1)) * unit;
}

std::vector<std::string> split_commas(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma - begin);
    if (item.empty()) usage_error(flag + " has an empty item in '" + text + "'");
    items.push_back(item);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return items;
}

void parse_flags(int argc, char** argv, const std::string& usage, const FlagTable& flags,
                 const std::map<std::string, bool*>& switches) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::printf("%s", usage.c_str());
      std::exit(0);
    }
    const auto on = switches.find(flag);
    if (on != switches.end()) {
      *on->second = true;
      continue;
    }
    const auto parser = flags.find(flag);
    if (parser == flags.end()) usage_error("unknown flag " + flag);
    if (i + 1 >= argc) usage_error("missing value after " + flag);
    parser->second(flag, argv[++i]);
  }
}

FlagParser text_flag(std::string* out) {
  return [out](const std::string&, const std::string& value) { *out = value; };
}

}  // namespace zero::driver
