// One rank's NVMe file: asynchronous reads and writes of aligned ranges through io_uring with
// O_DIRECT, as DeepSpeed's aio settings ask. Each transfer is cut into
// aio.block_size requests; aio.intra_op_parallelism threads each own a ring and a contiguous
// part of every transfer, and keep at most aio.queue_depth requests in flight. The threads block
// in io_uring_wait_cqe and callers block in wait(): nothing spins (ranks outnumber cores).
//
// Every failure (open, the free-space check, fallocate, io_uring setup, a failed or short
// completion) is a zero::Error naming the file, the offset and errno, with the source line.
// ZERO_TEST_NVME_FAULT=KIND@RANK[#N] (tests only) makes the N-th (default first) read or write
// transfer of that rank fail with EIO, as a failing disk would; KIND submit makes the N-th
// io_uring submission fail with EIO, short-submit has the kernel take only its first entry;
// slow-read@RANK#MS makes each read of that rank complete no sooner than MS ms after it started,
// as a slow disk would (its bytes unchanged).
//
// The engine's optimizer and parameter offloads use it (runtime/), and so does the GPT-2's
// activation-checkpoint spill (models/gpt2_spill.h): one implementation of the I/O, its checks
// and its fault injection for every file the runtime streams to NVMe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zero/runtime/engine.h"

namespace zero {

// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block; 4096 is
// a multiple of every logical block size in use.
constexpr size_t kNvmeAlignment = 4096;

inline uint64_t nvme_align_up(uint64_t bytes) {
  return (bytes + kNvmeAlignment - 1) / kNvmeAlignment * kNvmeAlignment;
}

// What a buffer from an Allocator (64-byte aligned, memory.h) needs beyond the bytes of an
// aligned range to hold that range at a kNvmeAlignment boundary: the worst distance from a
// 64-byte boundary to the next 4096-byte one. nvme_aligned() gives the range's start.
constexpr size_t kNvmeBufferSlack = kNvmeAlignment - 64;

inline char* nvme_aligned(void* buffer) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(buffer);
  return static_cast<char*>(buffer) + (nvme_align_up(at) - at);
}

// Refuses (zero::Error) when the file system holding `dir` has fewer than `bytes` free for an
// unprivileged writer, with both numbers; `what` says whose bytes they are.
void check_free_space(const std::string& dir, uint64_t bytes, const std::string& what);

// The scratch file of `path`, opened read-write with `flags` (O_DIRECT) added and mode 0600:
// unnamed in path's directory (O_TMPFILE), or where the file system has no O_TMPFILE (or
// `allow_unnamed` is false: tests) under a fresh name beside `path` (path.XXXXXX, created with
// O_EXCL|O_NOFOLLOW) that is unlinked at once. Nothing planted in the directory is opened,
// followed or truncated, jobs sharing the directory never meet on a name, and no file outlives
// the process. Returns the descriptor, or -1 with errno set.
int create_scratch_file(const std::string& path, int flags, bool allow_unnamed = true);

// The start-up check of a directory a file of `bytes` will be made in (what: whose bytes): it
// must exist and take an O_DIRECT file (one is made as NvmeFile makes its file, and closed), and
// hold `bytes` (check_free_space). A zero::Error names the path and errno, or both numbers.
void check_nvme_directory(const std::string& dir, uint64_t bytes, const std::string& what);

class NvmeFile {
 public:
  struct Transfer;
  using Ticket = std::shared_ptr<Transfer>;

  // Creates the file in `path`'s directory (create_scratch_file: unnamed, `path` names it in
  // messages), checks the free space of the directory against `bytes` and reserves them
  // (fallocate), so the run cannot fill the disk later. The state is this run's scratch, and a
  // crashed job leaves no space taken behind.
  NvmeFile(const std::string& path, uint64_t bytes, const AioConfig& aio, int rank);
  ~NvmeFile();
  NvmeFile(const NvmeFile&) = delete;
  NvmeFile& operator=(const NvmeFile&) = delete;

  // Start a transfer of `bytes` at `offset` (all multiples of kNvmeAlignment, buffer aligned
  // too); the buffer must stay valid until wait() returned.
  Ticket read(void* buffer, uint64_t offset, size_t bytes);
  Ticket write(const void* buffer, uint64_t offset, size_t bytes);
  // Blocks until the transfer is done; throws its error. A null ticket is done.
  void wait(const Ticket& ticket);

  // The time some request of this file was outstanding (from read() or write() until its
  // completion), in ms since the file was made: how long the disk was working for it, which a
  // pass's wall time can be held to (the compute it did not hide is the difference).
  double busy_ms();

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Worker;
  Ticket start(bool write, char* buffer, uint64_t offset, size_t bytes);
  void finish(Transfer& transfer, const std::string& error);

  std::string path_;
  uint64_t bytes_ = 0;
  AioConfig aio_;
  int fd_ = -1;
  std::vector<std::unique_ptr<Worker>> workers_;
  // Transfers complete on the workers' threads; waiters sleep on this.
  std::mutex done_mutex_;
  std::condition_variable done_;
  // Requests started and not yet completed, and since when some were; under done_mutex_.
  size_t outstanding_ = 0;
  std::chrono::steady_clock::time_point busy_since_;
  double busy_ms_ = 0.0;
  // The injected fault (tests): which kind of transfer, and how many of them to let pass.
  int fault_kind_ = -1;  // 0 read, 1 write, -1 none
  long fault_countdown_ = 0;
  // The injected slow disk (tests): how long each read takes at least.
  std::chrono::milliseconds read_delay_{0};
  // The injected submission fault (tests), counted over every worker's submissions: the one it
  // hits fails with EIO (kSubmitFails) or has the kernel take only its first entry
  // (kSubmitShort). injected_submit_fault() says which for the submission about to be made.
  static constexpr int kSubmitFails = 1, kSubmitShort = 2;
  int submit_fault_ = 0;
  std::atomic<long> submit_countdown_{0};
  int injected_submit_fault();
};

}  // namespace zero
