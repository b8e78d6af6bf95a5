// Training tokens in llm.c's token-file format, read as one stream and cut into batches.
//
// A token file is a header of 256 little-endian int32 (magic 20240520, version 1, token count,
// then zeros) followed by `count` little-endian uint16 tokens: what llm.c's data scripts write
// (GPT-2 BPE, vocabulary 50257) and what zero-tokenize writes (bytes, vocabulary 256). The files
// are memory-mapped read-only, so a shard of many gigabytes costs address space, not memory.
//
// Batches follow llm.c's rule, in closed form so that a run resumed at step s reads the batch an
// uninterrupted run would: the global batch of step s is B sequences of T+1 tokens starting at
// p(s) = (s mod nb) * B*T, with nb = floor((size - 1) / (B*T)) batches per pass over the data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zero::models {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr size_t kTokenFileHeaderBytes = 256 * sizeof(int32_t);

// The files a spec names: its comma-separated items in order, each a path or a glob(3) pattern
// whose matches are taken sorted by name. An empty item or a pattern matching nothing is a
// zero::Error naming it.
std::vector<std::string> expand_token_files(const std::string& spec);

// Writes `tokens` as a token file at `path`, atomically: a temporary file in the same directory,
// fsynced, then renamed over `path`. No tokens, or more than an int32 count holds, is an error.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);

// Where a token lies in the stream: its file and its index within that file.
struct TokenLocation {
  std::string file;
  size_t index = 0;
  uint16_t token = 0;
};

class TokenData {
 public:
  // Opens and checks every file of `spec` (see expand_token_files). A file shorter than the
  // header, with another magic or version, a count of 0, or a size other than header + 2*count
  // is a zero::Error naming the file and the problem.
  explicit TokenData(const std::string& spec);
  ~TokenData();
  TokenData(TokenData&& other) noexcept;
  TokenData& operator=(TokenData&& other) noexcept;
  TokenData(const TokenData&) = delete;
  TokenData& operator=(const TokenData&) = delete;

  const std::string& spec() const { return spec_; }
  std::vector<std::string> files() const;
  // Tokens in all files together.
  size_t size() const { return size_; }
  uint16_t token(size_t position) const;
  // Copies tokens [start, start + count) of the stream, across file boundaries, into `out`.
  void read_tokens(size_t start, size_t count, uint16_t* out) const;

  // The largest token of the stream. The first call reads every token and caches the result
  // (make it before sharing the object among threads); later calls do not read.
  uint16_t max_token() const;
  // The first token that is >= `limit` (a vocabulary size), or none: what a model checks before
  // training, so that its error can name the file and the position.
  std::optional<TokenLocation> first_token_at_least(int limit) const;

  // Batches of B sequences of T+1 tokens in one pass: floor((size - 1) / (B*T)). Fewer than
  // B*T + 1 tokens is a zero::Error saying how many a batch needs.
  long batches_per_pass(int B, int T) const;
  // The first token of step `step`'s batch: (step mod batches_per_pass) * B*T.
  size_t batch_start(long step, int B, int T) const;
  // Sequences [first_sequence, first_sequence + count) of step `step`'s batch: count*T input
  // tokens as floats (ids below 2^24 are exact in fp32) and count*T targets, the inputs shifted
  // by one. Sequence i of the batch is tokens [p + i*T, p + i*T + T + 1), p = batch_start.
  void read_sequences(long step, int B, int T, int first_sequence, int count, float* inputs,
                      int32_t* targets) const;

 private:
  struct Shard {
    std::string file;
    const uint16_t* tokens = nullptr;  // inside the mapping, after the header
    void* mapping = nullptr;
    size_t mapping_bytes = 0;
    size_t count = 0;
    size_t start = 0;  // position of its first token in the stream
  };
  void unmap_all() noexcept;
  // The shard that holds stream position `position` (< size()).
  size_t shard_of(size_t position) const;

  std::string spec_;
  std::vector<Shard> shards_;
  size_t size_ = 0;
  mutable std::optional<uint16_t> max_token_;
};

}  // namespace zero::models
