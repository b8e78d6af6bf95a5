// What the Communicator backends share beyond the interface (with ZERO_MPI_CHECK): the timeout
// from the environment, the buffer checks and CommunicatorBase (the MPI communicator, counters,
// sequence numbers, flight recorder, desync check and watchdog state), so that the MPI and NCCL
// backends validate, count, report and time out from one definition.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zero/collectives/communicator.h"
#include "zero/collectives/flight_recorder.h"
#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"

namespace zero::backend {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kDefaultTimeout{300 * 1000};
// Longer timeouts are cut to this (about 31 years), so deadlines never overflow the clock.
constexpr std::chrono::milliseconds kLongestTimeout{1000LL * 1000 * 1000 * 1000};

// ZERO_COLLECTIVE_TIMEOUT_S (seconds, may be fractional) when set, else 300 s.
inline std::chrono::milliseconds timeout_from_environment() {
  const char* text = std::getenv("ZERO_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return kDefaultTimeout;
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  ZERO_CHECK(
      end != text && *end == '\0' && errno == 0 && std::isfinite(seconds) && seconds > 0,
      "ZERO_COLLECTIVE_TIMEOUT_S must be a positive number of seconds, got '" << text << "'");
  const double ms = std::min(seconds * 1000.0, static_cast<double>(kLongestTimeout.count()));
  return std::max(std::chrono::milliseconds(1), std::chrono::milliseconds(std::llround(ms)));
}

// ZERO_DEBUG is a comma-separated list of debug modes; "collectives" turns the desync check
// on. Other words belong to other parts of the runtime and are left to them.
inline bool desync_check_from_environment() {
  const char* text = std::getenv("ZERO_DEBUG");
  if (text == nullptr) return false;
  const std::string modes(text);
  for (size_t begin = 0; begin <= modes.size();) {
    size_t end = modes.find(',', begin);
    if (end == std::string::npos) end = modes.size();
    if (modes.compare(begin, end - begin, "collectives") == 0) return true;
    begin = end + 1;
  }
  return false;
}

// True when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

// The address `offset` bytes past p, keeping p's constness.
inline const char* bytes_at(const void* p, size_t offset) {
  return static_cast<const char*>(p) + offset;
}
inline char* bytes_at(void* p, size_t offset) {
  return static_cast<char*>(p) + offset;
}

inline void check_size(size_t count, size_t elem, int ranks, const char* op) {
  ZERO_CHECK(count <= SIZE_MAX / elem / static_cast<size_t>(ranks),
             op << ": count " << count << " times " << ranks << " ranks overflows size_t");
}

inline void check_buffers(const void* send, const void* recv, size_t count, const char* op) {
  ZERO_CHECK(count == 0 || (send != nullptr && recv != nullptr),
             op << ": null buffer with count " << count);
}

// The argument checks of each collective, one definition for every backend so that bad input
// gets the same message whichever runs it. Each returns whether the call is in place.

struct NamedBuffer {
  const void* data;
  const char* name;  // as the interface calls it: "send", "recv"
};

// all_gather and reduce_scatter pair one block of `count` elements with a buffer of all ranks'
// blocks; the only overlap allowed is this rank's block of the whole (in place).
inline bool check_block_of_all(const char* op, NamedBuffer block, NamedBuffer all_blocks,
                               size_t count, DType dtype, int rank, int ranks) {
  const size_t elem = dtype_size(dtype);
  check_size(count, elem, ranks, op);
  check_buffers(block.data, all_blocks.data, count, op);
  const size_t block_bytes = count * elem;
  const bool in_place = block.data == bytes_at(all_blocks.data, rank * block_bytes);
  ZERO_CHECK(in_place || !overlap(block.data, block_bytes, all_blocks.data, block_bytes * ranks),
             op << ": " << block.name << " overlaps " << all_blocks.name
                << "; the only overlap allowed is " << block.name << " == " << all_blocks.name
                << " + rank * count (in place)");
  return in_place;
}

inline bool check_all_gather(const void* send, const void* recv, size_t count, DType dtype,
                             int rank, int ranks) {
  return check_block_of_all("all_gather", {send, "send"}, {recv, "recv"}, count, dtype, rank,
                            ranks);
}

inline bool check_reduce_scatter(const void* send, const void* recv, size_t count, DType dtype,
                                 int rank, int ranks) {
  return check_block_of_all("reduce_scatter", {recv, "recv"}, {send, "send"}, count, dtype, rank,
                            ranks);
}

inline bool check_all_reduce(const void* send, const void* recv, size_t count, DType dtype,
                             int ranks) {
  const size_t elem = dtype_size(dtype);
  check_size(count, elem, ranks, "all_reduce");
  check_buffers(send, recv, count, "all_reduce");
  const bool in_place = send == recv;
  ZERO_CHECK(
      in_place || !overlap(send, count * elem, recv, count * elem),
      "all_reduce: send and recv partially overlap; they must be disjoint or equal (in place)");
  return in_place;
}

inline void check_broadcast(const void* buffer, size_t count, DType dtype, int root, int ranks) {
  check_size(count, dtype_size(dtype), ranks, "broadcast");
  check_buffers(buffer, buffer, count, "broadcast");
  ZERO_CHECK(root >= 0 && root < ranks, "broadcast: root "
                                            << root << " is not a rank of this communicator (0 to "
                                            << ranks - 1 << ")");
}

// "has not finished after 12.3 s": what the watchdog reports of a collective past its timeout.
inline std::string not_finished_after(Clock::duration elapsed) {
  char text[64];
  std::snprintf(text, sizeof(text), "has not finished after %.1f s",
                std::chrono::duration<double>(elapsed).count());
  return text;
}

// What the desync check exchanges about one collective: fixed size, the same on every rank.
struct CollectiveDescriptor {
  uint64_t sequence;
  uint64_t op;
  uint64_t dtype;
  uint64_t count;

  bool operator==(const CollectiveDescriptor& other) const {
    return sequence == other.sequence && op == other.op && dtype == other.dtype &&
           count == other.count;
  }
  std::string text() const {
    return describe_collective(static_cast<CollectiveOp>(op), count, static_cast<DType>(dtype));
  }
};

// The part of a backend that does not depend on how it moves data: its own MPI communicator
// (a duplicate of MPI_COMM_WORLD, for the desync check and whatever else the backend sends over
// MPI), counters and sequence numbers, the flight recorder, the desync check, the reports that
// end the job, and the state its watchdog thread shares with the others. Interface is
// Communicator or a backend's extension of it.
template <typename Interface>
class CommunicatorBase : public Interface {
 public:
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const CommCounters& counters() const override { return counters_; }

  void set_timeout(std::chrono::milliseconds timeout) override {
    ZERO_CHECK(timeout.count() > 0,
               "collective timeout must be positive, got " << timeout.count() << " ms");
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      timeout_ = std::min(timeout, kLongestTimeout);
    }
    watch_changed_.notify_one();  // a shorter timeout may already have passed
  }

  void set_desync_check(bool enabled) override { desync_check_ = enabled; }
  bool desync_check() const override { return desync_check_; }

  std::string flight_record() const override { return recorder_.format(rank_); }

 protected:
  explicit CommunicatorBase(std::chrono::milliseconds timeout)
      : timeout_(timeout), desync_check_(desync_check_from_environment()) {
    int initialized = 0;
    ZERO_MPI_CHECK(MPI_Initialized(&initialized));
    ZERO_CHECK(initialized, "MPI is not initialized: create a zero::MpiSession first");
    ZERO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &mpi_comm_));
    // Errors on our communicator come back as codes, so they become zero::Error with context.
    ZERO_MPI_CHECK(MPI_Comm_set_errhandler(mpi_comm_, MPI_ERRORS_RETURN));
    ZERO_MPI_CHECK(MPI_Comm_rank(mpi_comm_, &rank_));
    ZERO_MPI_CHECK(MPI_Comm_size(mpi_comm_, &size_));
  }

  // The backend has stopped its watchdog (stop_watchdog) by now.
  ~CommunicatorBase() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && MPI_Comm_free(&mpi_comm_) != MPI_SUCCESS) {
      std::fprintf(
          stderr, "zero: rank %d: MPI_Comm_free failed while destroying the communicator\n", rank_);
    }
  }

  CommunicatorBase(const CommunicatorBase&) = delete;
  CommunicatorBase& operator=(const CommunicatorBase&) = delete;

  // Counts the op (on the enqueueing thread, so counters() needs no lock), gives it the next
  // sequence number, which it returns, and records it as enqueued. `sent_bytes` is what this
  // rank's own calls for it send (bytes_sent_per_rank of the buffer in the element type and
  // count the backend's calls use), not the requested buffer's figure.
  uint64_t record_launch(CollectiveOp op, size_t count, DType dtype, uint64_t sent_bytes) {
    const auto index = static_cast<size_t>(op);
    counters_.calls[index] += 1;
    counters_.bytes[index] += sent_bytes;
    const uint64_t sequence = next_sequence_++;
    recorder_.enqueued(sequence, op, dtype, count);
    return sequence;
  }

  // The desync check: every rank learns every rank's next collective. All ranks see the same
  // descriptors, so all of them find a mismatch together: each prints the same message and its
  // own flight record, they wait for each other (so no report is cut short), and the job aborts.
  // The message names rank 0 and the first rank whose collective differs from rank 0's.
  void agree_on_collective(uint64_t sequence, CollectiveOp op, DType dtype, size_t count) {
    const CollectiveDescriptor mine{sequence, static_cast<uint64_t>(op),
                                    static_cast<uint64_t>(dtype), count};
    std::vector<CollectiveDescriptor> all(static_cast<size_t>(size_));
    const int words = sizeof(CollectiveDescriptor) / sizeof(uint64_t);
    ZERO_MPI_CHECK(
        MPI_Allgather(&mine, words, MPI_UINT64_T, all.data(), words, MPI_UINT64_T, mpi_comm_));
    int other = 1;
    while (other < size_ && all[other] == all[0]) ++other;
    if (other == size_) return;
    const CollectiveDescriptor& first = all[0];
    const CollectiveDescriptor& differing = all[static_cast<size_t>(other)];
    std::string message = "zero: collective desync";
    if (first.sequence == differing.sequence) {
      message += " at #" + std::to_string(first.sequence) + ": rank 0 called " + first.text() +
                 ", rank " + std::to_string(other) + " called " + differing.text();
    } else {
      message += ": rank 0 called " + first.text() + " as #" + std::to_string(first.sequence) +
                 ", rank " + std::to_string(other) + " called " + differing.text() + " as #" +
                 std::to_string(differing.sequence);
    }
    recorder_.finished(sequence, false);
    print_report(message);
    // Every rank reaches this point, so the barrier cannot hang; if it fails, abort anyway.
    if (MPI_Barrier(mpi_comm_) != MPI_SUCCESS) {
      std::fprintf(stderr, "zero: rank %d: MPI_Barrier before the desync abort failed\n", rank_);
    }
    end_job();
  }

  // "zero: rank R: collective OP #N", how every report about one collective begins.
  std::string collective_label(CollectiveOp op, uint64_t sequence) const {
    return "zero: rank " + std::to_string(rank_) + ": collective " + collective_op_name(op) + " #" +
           std::to_string(sequence);
  }

  // Prints `line` and the flight record: what a rank says before the job ends or an error
  // leaves the communicator, so the ranks' records can be laid side by side.
  void print_report(const std::string& line) const {
    std::fprintf(stderr, "%s\n%s", line.c_str(), recorder_.format(rank_).c_str());
    std::fflush(stderr);
  }

  // "zero: rank R: collective OP #N (C elements of T, B bytes) WHAT; aborting the job", the
  // flight record, and the end of the job.
  [[noreturn]] void abort_collective(CollectiveOp op, uint64_t sequence, size_t count, DType dtype,
                                     const std::string& what) {
    print_report(collective_label(op, sequence) + " (" + std::to_string(count) + " elements of " +
                 dtype_name(dtype) + ", " + std::to_string(count * dtype_size(dtype)) + " bytes) " +
                 what + "; aborting the job");
    end_job();
  }

  [[noreturn]] void end_job() {
    release_before_abort();
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();  // MPI_Abort does not return; if an implementation did, still stop here
  }

  // What the backend must let go of before MPI_Abort, e.g. a rank stuck inside a library.
  virtual void release_before_abort() {}

  // Called by the backend's destructor, once its watchdog has nothing left to guard.
  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      watch_stop_ = true;
    }
    watch_changed_.notify_one();
    watchdog_.join();
  }

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;

  // Written by the enqueueing thread and the one that runs or watches collectives, read by the
  // watchdog: locks itself.
  FlightRecorder recorder_;

  // Shared with the watchdog thread, under watch_mutex_.
  std::mutex watch_mutex_;
  std::condition_variable watch_changed_;
  bool watch_stop_ = false;
  std::chrono::milliseconds timeout_;

  // The backend starts it on its own loop; stop_watchdog ends it.
  std::thread watchdog_;

 private:
  // Enqueueing thread only.
  CommCounters counters_;
  uint64_t next_sequence_ = 1;
  bool desync_check_;
};

}  // namespace zero::backend
