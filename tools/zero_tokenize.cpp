// zero-tokenize: text files to byte-level token files, for training the GPT-2 without a BPE.
//
//   zero-tokenize INPUT... --out FILE [--val-out FILE [--val-fraction F]]
//
// Every byte of the inputs (concatenated in the order given) is one token, so the vocabulary is
// 256 and decoding is the identity. The output is llm.c's token-file format, the one its data
// scripts write for GPT-2 BPE tokens, so zero-train reads both the same way. With --val-out the
// last F of the tokens (default 0.1) go to the validation file instead. Files are written to a
// temporary name and renamed, so a reader never sees half of one. Exit codes: 0 ok, 1 a file
// could not be written, 2 bad arguments or inputs.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include "driver/cli.h"
#include "models/token_data.h"

namespace {

constexpr const char* kUsage =
    "usage: zero-tokenize INPUT... --out FILE [--val-out FILE [--val-fraction F]]\n"
    "  INPUT            text files; each byte becomes one token (vocabulary 256)\n"
    "  --out FILE       the training token file (llm.c's format)\n"
    "  --val-out FILE   also write a validation token file from the end of the input\n"
    "  --val-fraction F the fraction of tokens, 0 < F < 1, that go to --val-out (default 0.1)\n";

using zero::driver::usage_error;

struct Options {
  std::vector<std::string> inputs;
  std::string out;
  std::string val_out;
  double val_fraction = 0.1;
  std::string val_fraction_text = "0.1";  // as given, for messages
};

Options parse_options(const std::vector<std::string>& args) {
  Options options;
  bool fraction_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    }
    if (arg.rfind("-", 0) != 0) {
      options.inputs.push_back(arg);
      continue;
    }
    if (arg != "--out" && arg != "--val-out" && arg != "--val-fraction") {
      usage_error("unknown option '" + arg + "'");
    }
    if (i + 1 == args.size()) usage_error(arg + " needs a value");
    const std::string& value = args[++i];
    if (arg == "--out") {
      options.out = value;
    } else if (arg == "--val-out") {
      options.val_out = value;
    } else {
      // Any number passes this check, so that the range below is the one message for all of
      // them; the value is then read again in double, which splits large inputs exactly.
      zero::driver::parse_float_at_least(arg, value, std::numeric_limits<float>::lowest());
      options.val_fraction = std::strtod(value.c_str(), nullptr);
      if (options.val_fraction <= 0.0 || options.val_fraction >= 1.0) {
        usage_error("--val-fraction must be between 0 and 1 (both excluded), got " + value);
      }
      options.val_fraction_text = value;
      fraction_given = true;
    }
  }
  if (options.inputs.empty()) usage_error("no input files");
  if (options.out.empty()) usage_error("missing --out FILE");
  if (fraction_given && options.val_out.empty()) usage_error("--val-fraction needs --val-out");
  return options;
}

// Appends the bytes of `file` to `tokens`; an unreadable file is a usage error naming it.
void append_bytes(const std::string& file, std::vector<uint16_t>* tokens) {
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) usage_error("cannot read '" + file + "': " + std::strerror(errno));
  unsigned char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) {
    tokens->insert(tokens->end(), buffer, buffer + n);
  }
  const bool failed = std::ferror(f) != 0;
  const std::string reason = std::strerror(errno);
  std::fclose(f);
  if (failed) usage_error("cannot read '" + file + "': " + reason);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  std::vector<uint16_t> tokens;
  std::vector<uint16_t> val;
  try {
    options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
    for (const std::string& input : options.inputs) append_bytes(input, &tokens);
    if (tokens.empty()) usage_error("the input files are empty: no tokens to write");
    if (!options.val_out.empty()) {
      const size_t val_count =
          static_cast<size_t>(static_cast<double>(tokens.size()) * options.val_fraction);
      if (val_count == 0 || val_count == tokens.size()) {
        usage_error("--val-fraction " + options.val_fraction_text + " of " +
                    std::to_string(tokens.size()) +
                    " tokens leaves the training or the validation file empty");
      }
      val.assign(tokens.end() - static_cast<std::ptrdiff_t>(val_count), tokens.end());
      tokens.resize(tokens.size() - val_count);
    }
  } catch (const zero::driver::UsageError& e) {
    std::fprintf(stderr, "zero-tokenize: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    zero::models::write_token_file(options.out, tokens);
    std::printf("wrote %s: %zu tokens (vocabulary 256) from %zu input file(s)\n",
                options.out.c_str(), tokens.size(), options.inputs.size());
    if (!val.empty()) {
      zero::models::write_token_file(options.val_out, val);
      std::printf("wrote %s: %zu validation tokens (the last %s of the input)\n",
                  options.val_out.c_str(), val.size(), options.val_fraction_text.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
