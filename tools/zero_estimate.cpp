// zero-estimate: model-state memory per rank for each ZeRO stage, before anything runs.
//
//   zero-estimate --params 7.5B --ranks 64 [--dtype bf16|fp16|fp32] [--stage S]
//
// prints one row per stage (or only stage S): parameters, gradients, optimizer state (fp32
// master and Adam moments) and their total per rank, in GB (1e9 bytes) and in bytes. With the
// arguments above it gives the ZeRO paper's Figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.88 GB.
// Exit code 2 for bad arguments.
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "zero/kernels/dtype.h"
#include "zero/runtime/estimate.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-estimate --params P --ranks N [--dtype bf16|fp16|fp32] [--stage S]\n"
    "  --params P  number of parameters: 7.5e9, 7.5B, 350M, 125K, 1.2T or 1000000\n"
    "  --ranks N   data-parallel ranks (N >= 1)\n"
    "  --dtype D   dtype of parameters and gradients: bf16 (default), fp16 or fp32\n"
    "  --stage S   print only ZeRO stage S (0-3); default: every stage\n";

struct Options {
  uint64_t params = 0;
  int ranks = 0;
  zero::DType dtype = zero::DType::kBFloat16;  // mixed precision, as in the paper
  std::optional<int> stage;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "zero-estimate: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

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
  bool digits_only = !text.empty();
  for (char c : text) digits_only = digits_only && is_digit(c);
  if (!digits_only) usage_error(flag + " needs a whole number, got '" + text + "'");
  errno = 0;
  const long value = std::strtol(text.c_str(), nullptr, 10);
  if (errno == ERANGE || value < min_value || value > max_value) {
    usage_error(flag + " must be from " + std::to_string(min_value) + " to " +
                std::to_string(max_value) + ", got " + text);
  }
  return value;
}

Options parse_options(const std::vector<std::string>& args) {
  Options options;
  bool have_params = false;
  bool have_ranks = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (flag != "--params" && flag != "--ranks" && flag != "--dtype" && flag != "--stage") {
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
    } else {
      options.stage = static_cast<int>(parse_whole(flag, value, 0, 3));
    }
  }
  if (!have_params) usage_error("missing --params P (the number of parameters)");
  if (!have_ranks) usage_error("missing --ranks N (the number of data-parallel ranks)");
  return options;
}

double gigabytes(uint64_t bytes) {
  return static_cast<double>(bytes) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  const bool mixed = options.dtype != zero::DType::kFloat32;
  std::printf("%llu parameters, %d ranks, %s parameters and gradients\n",
              static_cast<unsigned long long>(options.params), options.ranks,
              zero::dtype_name(options.dtype));
  std::printf("optimizer state: %s (K = %d bytes per parameter); GB = 1e9 bytes\n",
              mixed ? "fp32 master + Adam moments" : "Adam moments in fp32", mixed ? 12 : 8);
  std::printf("stage  params GB  grads GB  optimizer GB  total GB     total bytes\n");
  for (int stage = 0; stage <= 3; ++stage) {
    if (options.stage && *options.stage != stage) continue;
    const zero::ModelStateBytes bytes =
        zero::estimate_model_state(options.params, options.ranks, options.dtype, stage);
    std::printf("%5d  %9.2f  %8.2f  %12.2f  %8.2f  %14llu\n", stage, gigabytes(bytes.params),
                gigabytes(bytes.grads), gigabytes(bytes.optimizer), gigabytes(bytes.total()),
                static_cast<unsigned long long>(bytes.total()));
  }
  return 0;
}
