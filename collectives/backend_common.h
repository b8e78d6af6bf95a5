// What the Communicator backends share beyond the interface (with ZERO_MPI_CHECK): the timeout
// from the environment, the buffer checks (backend_common.cpp), and CommunicatorBase (the MPI
// communicator, counters, sequence numbers, flight recorder, desync check and the watchdog of
// watchdog.h), so that the MPI and NCCL backends validate, count, report and time out from one
// definition.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "watchdog.h"

#include "zero/collectives/communicator.h"
#include "zero/collectives/flight_recorder.h"
#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"

namespace zero::backend {

// ZERO_COLLECTIVE_TIMEOUT_S (seconds, may be fractional) when set, else 300 s.
std::chrono::milliseconds timeout_from_environment();

// ZERO_DEBUG is a comma-separated list of debug modes; "collectives" turns the desync check
// on. Other words belong to other parts of the runtime and are left to them.
bool desync_check_from_environment();

// The address `offset` bytes past p, keeping p's constness.
inline const char* bytes_at(const void* p, size_t offset) {
  return static_cast<const char*>(p) + offset;
}
inline char* bytes_at(void* p, size_t offset) {
  return static_cast<char*>(p) + offset;
}

// The argument checks of each collective, one definition for every backend so that bad input
// gets the same message whichever runs it. Each returns whether the call is in place.
// all_gather_bytes is checked as an all_gather of `bytes` one-byte elements.
bool check_all_gather(const void* send, const void* recv, size_t count, size_t element_bytes,
                      int rank, int ranks);
bool check_reduce_scatter(const void* send, const void* recv, size_t count, DType dtype, int rank,
                          int ranks);
bool check_all_reduce(const void* send, const void* recv, size_t count, DType dtype, int ranks);
void check_broadcast(const void* buffer, size_t count, DType dtype, int root, int ranks);
void check_all_to_all(const void* send, const void* recv, size_t bytes, int ranks);

// "has not finished after 12.3 s": what the watchdog reports of a collective past its timeout.
std::string not_finished_after(Clock::duration elapsed);

// What one collective carries, as the backends record, check and report it: `count` elements
// of `dtype`, or `count` raw bytes (all_gather_bytes; dtype then unused).
struct Payload {
  size_t count = 0;
  DType dtype = DType::kFloat32;
  bool bytes = false;

  size_t element_bytes() const { return bytes ? 1 : dtype_size(dtype); }
  // "fp32", "bf16", "fp16" or "byte".
  const char* element_name() const { return element_type_name(dtype, bytes); }
};

// What the desync check exchanges about one collective: fixed size, the same on every rank.
// `dtype` is the DType's value, or kBytes for a byte all-gather.
struct CollectiveDescriptor {
  static constexpr uint64_t kBytes = 0x100;
  uint64_t sequence;
  uint64_t op;
  uint64_t dtype;
  uint64_t count;

  CollectiveDescriptor(uint64_t sequence, CollectiveOp op, const Payload& payload);
  bool operator==(const CollectiveDescriptor& other) const {
    return sequence == other.sequence && op == other.op && dtype == other.dtype &&
           count == other.count;
  }
  std::string text() const;
};

// The desync check's verdict on every rank's descriptor (the same on every rank): empty when all
// agree, else the message, naming rank 0 and the first rank whose collective differs from rank
// 0's.
std::string desync_message(const std::vector<CollectiveDescriptor>& all);

// The part of a backend that does not depend on how it moves data: its own MPI communicator
// (a duplicate of MPI_COMM_WORLD or of the sub-group it was split for, for the desync check and
// whatever else the backend sends over MPI), counters and sequence numbers, the flight recorder,
// the desync check, the reports that end the job, and its watchdog. Interface is Communicator or a
// backend's extension of it.
template <typename Interface>
class CommunicatorBase : public Interface {
 public:
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  const CommCounters& counters() const override { return counters_; }

  void set_timeout(std::chrono::milliseconds timeout) override { watchdog_.set_timeout(timeout); }

  void set_desync_check(bool enabled) override { desync_check_ = enabled; }
  bool desync_check() const override { return desync_check_; }

  std::string flight_record() const override { return recorder_.format(rank_); }

 protected:
  explicit CommunicatorBase(std::chrono::milliseconds timeout, MPI_Comm parent = MPI_COMM_WORLD)
      : watchdog_(timeout), desync_check_(desync_check_from_environment()) {
    int initialized = 0;
    ZERO_MPI_CHECK(MPI_Initialized(&initialized));
    ZERO_CHECK(initialized, "MPI is not initialized: create a zero::MpiSession first");
    ZERO_MPI_CHECK(MPI_Comm_dup(parent, &mpi_comm_));
    // Errors on our communicator come back as codes, so they become zero::Error with context.
    ZERO_MPI_CHECK(MPI_Comm_set_errhandler(mpi_comm_, MPI_ERRORS_RETURN));
    ZERO_MPI_CHECK(MPI_Comm_rank(mpi_comm_, &rank_));
    ZERO_MPI_CHECK(MPI_Comm_size(mpi_comm_, &size_));
  }

  // The backend has stopped its watchdog (watchdog_.stop()) by now.
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
  uint64_t record_launch(CollectiveOp op, const Payload& payload, uint64_t sent_bytes) {
    const auto index = static_cast<size_t>(op);
    counters_.calls[index] += 1;
    counters_.bytes[index] += sent_bytes;
    const uint64_t sequence = next_sequence_++;
    recorder_.enqueued(sequence, op, payload.dtype, payload.count, payload.bytes);
    return sequence;
  }

  // The desync check: every rank learns every rank's next collective. All ranks see the same
  // descriptors, so all of them find a mismatch together: each prints the same message and its
  // own flight record, they wait for each other (so no report is cut short), and the job aborts.
  void agree_on_collective(uint64_t sequence, CollectiveOp op, const Payload& payload) {
    const CollectiveDescriptor mine(sequence, op, payload);
    std::vector<CollectiveDescriptor> all(static_cast<size_t>(size_), mine);
    const int words = sizeof(CollectiveDescriptor) / sizeof(uint64_t);
    ZERO_MPI_CHECK(
        MPI_Allgather(&mine, words, MPI_UINT64_T, all.data(), words, MPI_UINT64_T, mpi_comm_));
    const std::string message = desync_message(all);
    if (message.empty()) return;
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
  [[noreturn]] void abort_collective(CollectiveOp op, uint64_t sequence, const Payload& payload,
                                     const std::string& what) {
    print_report(collective_label(op, sequence) + " (" + std::to_string(payload.count) +
                 " elements of " + payload.element_name() + ", " +
                 std::to_string(payload.count * payload.element_bytes()) + " bytes) " + what +
                 "; aborting the job");
    end_job();
  }

  [[noreturn]] void end_job() {
    release_before_abort();
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();  // MPI_Abort does not return; if an implementation did, still stop here
  }

  // What the backend must let go of before MPI_Abort, e.g. a rank stuck inside a library.
  virtual void release_before_abort() {}

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;

  // Written by the enqueueing thread and the one that runs or watches collectives, read by the
  // watchdog: locks itself.
  FlightRecorder recorder_;

  // The backend starts it with what it watches, and stops it in its destructor once nothing is
  // left to guard; the state the two share is under watchdog_.lock().
  Watchdog watchdog_;

 private:
  // Enqueueing thread only.
  CommCounters counters_;
  uint64_t next_sequence_ = 1;
  bool desync_check_;
};

}  // namespace zero::backend
