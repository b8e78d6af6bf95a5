// Fuzz target: the checkpoint manifest reader (what zero-train --resume and zero-checkpoint run
// on manifest.pbtxt). zero::Error naming the file is the documented answer to a bad manifest;
// anything else is a bug.
//
// Each input is read twice: as it is, which exercises the "# crc32c" trailer checks, and with a
// correct trailer appended, so that mutations of the body reach the text-format parser and the
// validation behind it instead of stopping at the checksum. (A manifest's own trailer is a
// comment to the text-format parser, so a real manifest in the corpus serves both reads.)
//
// A manifest that is accepted must be consistent in exact arithmetic, as the loader relies on
// it: shapes multiply out to numel, parameters lie inside their units, units split evenly over
// the ranks, and the shard file size the layout implies does not wrap around.
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/checkpoint_format.h"
#include "zero/runtime/checkpoint.h"

namespace {

// The loader's arithmetic redone with every overflow caught (the builtins return true on a
// wrap); an accepted manifest whose numbers only agree after wrapping aborts.
void check_consistent(const zero::CheckpointInfo& info) {
  uint64_t file_bytes = 0;
  for (const zero::CheckpointInfo::SavedUnit& unit : info.units) {
    uint64_t numel = 0;
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(unit.shard, static_cast<uint64_t>(info.world_size), &numel) ||
        numel != unit.numel ||
        __builtin_mul_overflow(unit.shard, (1 + static_cast<uint64_t>(info.state_count)) * 4,
                               &bytes) ||
        __builtin_add_overflow(file_bytes, bytes, &file_bytes)) {
      std::abort();
    }
  }
  for (const zero::ParamPlacement& p : info.params) {
    uint64_t numel = 1;
    for (int64_t d : p.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) std::abort();
    }
    uint64_t end = 0;
    if (numel != p.numel || p.unit < 0 || static_cast<size_t>(p.unit) >= info.units.size() ||
        __builtin_add_overflow(p.offset, p.numel, &end) || end > info.units[p.unit].numel) {
      std::abort();
    }
  }
  for (const zero::CheckpointInfo::File& f : info.files) {
    if (f.size != file_bytes) std::abort();
  }
}

void read_manifest(const std::string& text) {
  try {
    check_consistent(zero::checkpoint_files::parse_manifest(text, "fuzz/manifest.pbtxt"));
  } catch (const zero::Error&) {
    // a rejected manifest, as designed
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  read_manifest(text);

  // The body must end its last line for the trailer to be a line of its own.
  std::string body = text;
  if (!body.empty() && body.back() != '\n') body += '\n';
  char trailer[32];
  std::snprintf(trailer, sizeof(trailer), "# crc32c %08" PRIx32 "\n",
                zero::crc32c(body.data(), body.size()));
  read_manifest(body + trailer);
  return 0;
}
