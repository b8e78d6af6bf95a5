// zero-tokenize: text files to byte-level token files, for training the GPT-2 without a BPE.
//
//   zero-tokenize INPUT... --out FILE [--val-out FILE [--val-fraction F]]
//
// Every byte of the inputs (concatenated in the order given) is one token, so the vocabulary is
// 256 and decoding is the identity. The output is llm.c's token-file format, the one its data
// scripts write for GPT-2 BPE tokens, so zero-train reads both the same way. With --val-out the
// last F of the tokens (default 0.1) go to the validation file instead. Files are written to a
// temporary name and renamed, so a reader never sees half of one; an output that names an input
// or the other output is refused. Exit codes: 0 ok, 1 a file
// could not be written, 2 bad arguments or inputs.
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "driver/cli.h"
#include "driver/paths.h"
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

// Whether `a` and `b` are one file: one inode (through links and any spelling), or, where one
// does not exist yet, one directory entry once the directories are resolved.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  return zero::driver::replaced_entry(a) == zero::driver::replaced_entry(b);
}

// An output that is an input would replace the text with its tokens, and one output the other
// would keep only the validation tokens: both refused before anything is read or written.
void check_outputs_apart(const Options& options) {
  const std::pair<const char*, const std::string*> outputs[] = {{"--out", &options.out},
                                                                {"--val-out", &options.val_out}};
  for (const auto& [flag, output] : outputs) {
    if (output->empty()) continue;
    for (const std::string& input : options.inputs) {
      if (same_file(*output, input)) {
        usage_error(std::string(flag) + " " + *output + " is also input " + input +
                    "; write the tokens to another file");
      }
    }
  }
  if (!options.val_out.empty() && same_file(options.out, options.val_out)) {
    usage_error("--out and --val-out name the same file " + options.out +
                "; give each its own file");
  }
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
    check_outputs_apart(options);
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
