// Command-line helpers shared by the drivers: zero-train, zero-estimate, zero-bench-step and
// zero-bench-collectives. Each program keeps its own flags and messages; what they share is
// here, so that "an integer", "a byte size" and "a list" mean the same thing in all of them.
// Used by examples/, tools/ and benchmarks/; the runtime does not depend on it.
#pragma once

#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace zero::driver {

// A bad command line. Thrown, not exited on: the program decides how to report it (zero-train
// must first tell the other ranks).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws UsageError(message).
[[noreturn]] void usage_error(const std::string& message);

// A program's flags from `parse` (its own parser, which throws UsageError); on a usage error,
// "PROGRAM: message" and the usage text on stderr, and nullopt: the program then exits 2, before
// it starts MPI, so every rank of a job stops the same way.
template <typename Parse>
auto parse_command_line(const char* program, const std::string& usage, Parse&& parse)
    -> std::optional<decltype(parse())> {
  try {
    return parse();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n%s", program, e.what(), usage.c_str());
    return std::nullopt;
  }
}

// `text` as a decimal integer, the whole of it, within the range of long; false otherwise.
bool parse_integer(const std::string& text, long* out);

// True when `text` is one or more of 0-9 and nothing else.
bool is_digits(const std::string& text);

// Removes a final K, M or G (either case) from `text` and returns its unit in bytes (powers of
// 1024); 1 when there is none.
uint64_t strip_byte_suffix(std::string* text);

// An integer of at least `min_value` for `flag`: "FLAG expects an integer, got 'TEXT'", or
// "FLAG must be at least MIN".
long parse_at_least(const std::string& flag, const std::string& text, long min_value);

// An integer from `min_value` to `max_value` for `flag`: "FLAG expects an integer, got 'TEXT'",
// or "FLAG must be between MIN and MAX, got TEXT".
long parse_between(const std::string& flag, const std::string& text, long min_value,
                   long max_value);

// A finite number of at least `min_value` for `flag`: "FLAG expects a number, got 'TEXT'", or
// "FLAG must be at least MIN".
float parse_float_at_least(const std::string& flag, const std::string& text, float min_value);

// 512, 64K, 300M, 2G (powers of 1024), at least 1: the messages of parse_at_least.
uint64_t parse_bytes(const std::string& flag, const std::string& text);

// "a,b,c" as its items: "FLAG has an empty item in 'TEXT'" for an empty one.
std::vector<std::string> split_commas(const std::string& flag, const std::string& text);

// What a flag does with the text after it: parses it into the program's options (UsageError for
// a bad value).
using FlagParser = std::function<void(const std::string& flag, const std::string& value)>;
// A program's flags that take a value, by name.
using FlagTable = std::map<std::string, FlagParser>;

// argv[1..] as FLAG VALUE pairs, each value given to its flag's parser in `flags`; a flag in
// `switches` takes no value and sets its bool. -h or --help prints `usage` and exits 0. Throws
// UsageError "unknown flag FLAG" or "missing value after FLAG".
void parse_flags(int argc, char** argv, const std::string& usage, const FlagTable& flags,
                 const std::map<std::string, bool*>& switches = {});

// A parser storing an integer from `min_value` to `max_value` (parse_between's messages).
template <typename Integer>
FlagParser integer_flag(Integer* out, long min_value, long max_value = INT_MAX) {
  return [=](const std::string& flag, const std::string& value) {
    *out = static_cast<Integer>(parse_between(flag, value, min_value, max_value));
  };
}

// A parser storing the value as it is.
FlagParser text_flag(std::string* out);

}  // namespace zero::driver
