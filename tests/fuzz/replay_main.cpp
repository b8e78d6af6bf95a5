// Replays saved inputs through a fuzz target without libFuzzer, so any compiler can build the
// target as an ordinary test: every file of the seed corpus and of the regressions folder (the
// inputs that once crashed a parser) runs through LLVMFuzzerTestOneInput once. A crash, a
// sanitizer report or an uncaught exception fails the test, as it would fail the fuzzer.
//
//   fuzz_replay_<target> CORPUS_DIR [MORE_DIRS...]
//
// CORPUS_DIR must exist and hold at least one file (a test that replays nothing proves nothing);
// the other folders may be missing: a target whose fuzzing never crashed has no regressions yet.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

// The regular files directly inside `dir`, sorted so every run replays in the same order.
std::vector<fs::path> inputs_in(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool read_file(const fs::path& path, std::vector<uint8_t>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [MORE_DIRS...]\n", argv[0]);
    return 2;
  }
  size_t replayed = 0;
  for (int a = 1; a < argc; ++a) {
    const fs::path dir = argv[a];
    std::error_code error;
    if (!fs::is_directory(dir, error)) {
      if (a == 1) {
        std::fprintf(stderr, "corpus folder %s does not exist\n", argv[a]);
        return 1;
      }
      std::printf("%s: no such folder, nothing to replay there\n", argv[a]);
      continue;
    }
    const std::vector<fs::path> files = inputs_in(dir);
    if (a == 1 && files.empty()) {
      std::fprintf(stderr, "corpus folder %s holds no inputs\n", argv[a]);
      return 1;
    }
    for (const fs::path& file : files) {
      std::vector<uint8_t> bytes;
      if (!read_file(file, &bytes)) {
        std::fprintf(stderr, "cannot read %s\n", file.c_str());
        return 1;
      }
      // Named before it runs: when the input crashes the process, the log says which one.
      std::printf("replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
      std::fflush(stdout);
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++replayed;
    }
  }
  std::printf("%zu inputs replayed, none crashed\n", replayed);
  return 0;
}
