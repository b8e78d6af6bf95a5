// Inside the checkpoint code: names of the files, the manifest's text form, file helpers and
// the reader that maps a saved parameter's elements to byte ranges of the shard files. Shared
// by checkpoint_save.cpp and checkpoint_load.cpp (the collective save and load) and the parts that
// work without MPI: checkpoint_manifest.cpp (the manifest), checkpoint_files.cpp (CRC32C, file I/O,
// the shard reader) and checkpoint_safetensors.cpp. proto/checkpoint.proto documents the formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "zero/runtime/checkpoint_info.h"

namespace zero::checkpoint_files {

constexpr uint32_t kFormatVersion = 1;
constexpr const char* kManifestName = "manifest.pbtxt";
constexpr const char* kLatestName = "latest";
// Directories of unfinished saves start with this; loads never read them, saves remove them.
constexpr const char* kTmpPrefix = ".tmp_";

std::string step_dir_name(long step);   // step_00000010
std::string shard_file_name(int rank);  // rank_00003.bin
std::string join(const std::string& dir, const std::string& name);

// Byte offset of each unit's block in every shard file, plus the file size at the end.
std::vector<uint64_t> unit_byte_offsets(const std::vector<CheckpointInfo::SavedUnit>& units,
                                        int state_count);

// The manifest text: the message in text format, then "# crc32c XXXXXXXX\n" over it.
std::string manifest_text(const CheckpointInfo& info);
// Checks the trailer's checksum, parses and validates; `path` names the file in errors.
CheckpointInfo parse_manifest(const std::string& text, const std::string& path);

// fsync of a file or a directory by path; throws zero::Error naming path.
void fsync_path(const std::string& path);
std::string read_small_file(const std::string& path);

// "" when the file has the size and CRC32C the manifest lists, else what is wrong.
std::string check_shard_file(const CheckpointInfo& info, int rank);

// Reads elements of saved parameters from the shard files with pread, verifying each file's
// size and CRC32C the first time it is opened.
class ShardReader {
 public:
  explicit ShardReader(const CheckpointInfo& info);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // out[0, count) = array `array` (0 master, k + 1 optimizer state k) of saved parameter
  // `param`, elements [first, first + count).
  void read(int array, size_t param, size_t first, size_t count, float* out);

 private:
  int open_verified(int rank);

  const CheckpointInfo& info_;
  std::vector<uint64_t> unit_offsets_;
  std::unordered_map<int, int> fds_;  // rank -> open file
};

// Reads the checkpoints of every tensor-parallel rank of one save (read_checkpoint_grid's, in
// rank order; one for a run without tensor parallelism): a rank's slice of a parameter, or the
// whole tensor with the slices of a split one merged.
class GridReader {
 public:
  // Keeps a reference to `grid`, which must outlive the reader.
  explicit GridReader(const std::vector<CheckpointInfo>& grid);

  // As ShardReader::read, from tensor-parallel rank `rank`'s checkpoint.
  void read(int rank, int array, size_t param, size_t first, size_t count, float* out);
  // Array `array` of saved parameter `param` as the whole tensor (of shape whole_shape(param)):
  // every rank's slice merged when it is split, else rank 0's copy.
  std::vector<float> read_whole(int array, size_t param);
  std::vector<int64_t> whole_shape(size_t param) const;

 private:
  const std::vector<CheckpointInfo>& grid_;
  std::vector<std::unique_ptr<ShardReader>> readers_;
};

}  // namespace zero::checkpoint_files
