// PeerChannel (peer_channel.h): nonblocking MPI sends and receives on a duplicate of the pipeline
// group's communicator, and a wait that sleeps between tests instead of blocking in MPI_Wait
// (which spins on a core in OpenMPI) and gives up after the collective timeout.
#include "zero/collectives/peer_channel.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <string>
#include <thread>

#include "backend_common.h"
#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"

namespace zero {

namespace {

// wait()'s sleeps between tests: short at first (a transfer that is nearly done costs little
// latency), doubling to a ceiling that keeps a long wait cheap (a few thousand MPI_Tests a
// second) while a pipeline stage notices its input within a quarter millisecond: at 1 ms the
// late notices showed as a few percent more bubble in zero-bench-pipeline.
constexpr std::chrono::microseconds kFirstSleep{20};
constexpr std::chrono::microseconds kLongestSleep{250};

std::string describe(int rank, const PeerRequest& request) {
  return "rank " + std::to_string(rank) + ": " + (request.is_send() ? "send to" : "receive from") +
         " peer " + std::to_string(request.peer()) + ", tag " + std::to_string(request.tag()) +
         ", " + std::to_string(request.bytes()) + " bytes";
}

}  // namespace

PeerRequest::~PeerRequest() {
  release();
}

PeerRequest::PeerRequest(PeerRequest&& other) noexcept
    : request_(other.request_),
      send_(other.send_),
      peer_(other.peer_),
      tag_(other.tag_),
      bytes_(other.bytes_) {
  other.request_ = MPI_REQUEST_NULL;
}

PeerRequest& PeerRequest::operator=(PeerRequest&& other) noexcept {
  if (this != &other) {
    release();
    request_ = other.request_;
    send_ = other.send_;
    peer_ = other.peer_;
    tag_ = other.tag_;
    bytes_ = other.bytes_;
    other.request_ = MPI_REQUEST_NULL;
  }
  return *this;
}

void PeerRequest::release() noexcept {
  if (request_ == MPI_REQUEST_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Unchecked: this runs while an error unwinds, and that error is the one to report. A receive
  // is cancelled (its buffer may be going away); a send is left to MPI to complete.
  if (!send_) {
    MPI_Cancel(&request_);
    MPI_Wait(&request_, MPI_STATUS_IGNORE);
  } else {
    MPI_Request_free(&request_);
  }
  request_ = MPI_REQUEST_NULL;
}

PeerChannel::PeerChannel(MPI_Comm comm) : timeout_(backend::timeout_from_environment()) {
  int initialized = 0;
  ZERO_MPI_CHECK(MPI_Initialized(&initialized));
  ZERO_CHECK(initialized, "MPI is not initialized: create a zero::MpiSession first");
  ZERO_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  // Errors on our communicator come back as codes, so they become zero::Error with context.
  ZERO_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  ZERO_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  ZERO_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  void* tag_bound = nullptr;
  int has_bound = 0;
  ZERO_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_bound, &has_bound));
  if (has_bound) max_tag_ = *static_cast<int*>(tag_bound);
}

PeerChannel::~PeerChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && MPI_Comm_free(&comm_) != MPI_SUCCESS) {
    std::fprintf(stderr, "zero: rank %d: MPI_Comm_free failed while destroying a peer channel\n",
                 rank_);
  }
}

PeerRequest PeerChannel::new_request(bool send, int peer, int tag, const void* data,
                                     size_t bytes) const {
  const char* what = send ? "send" : "receive";
  ZERO_CHECK(peer >= 0 && peer < size_,
             what << ": peer " << peer << " is outside the channel's ranks 0.." << size_ - 1);
  ZERO_CHECK(tag >= 0 && tag <= max_tag_, what << " to/from peer " << peer << ": tag " << tag
                                               << " is outside 0.." << max_tag_ << " (MPI_TAG_UB)");
  ZERO_CHECK(bytes <= static_cast<size_t>(INT_MAX),
             what << " to/from peer " << peer << ", tag " << tag << ": " << bytes
                  << " bytes is more than one MPI message carries (" << INT_MAX << ")");
  ZERO_CHECK(data != nullptr || bytes == 0, what << " to/from peer " << peer << ", tag " << tag
                                                 << ": null buffer with " << bytes << " bytes");
  PeerRequest request;
  request.send_ = send;
  request.peer_ = peer;
  request.tag_ = tag;
  request.bytes_ = bytes;
  return request;
}

PeerRequest PeerChannel::send(int peer, int tag, const void* data, size_t bytes) {
  PeerRequest request = new_request(true, peer, tag, data, bytes);
  ZERO_MPI_CHECK(
      MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &request.request_));
  counters_.bytes_sent += bytes;
  return request;
}

PeerRequest PeerChannel::receive(int peer, int tag, void* data, size_t bytes) {
  PeerRequest request = new_request(false, peer, tag, data, bytes);
  ZERO_MPI_CHECK(
      MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &request.request_));
  return request;
}

void PeerChannel::finished(PeerRequest& request, const MPI_Status& status) {
  if (request.send_) return;
  int count = 0;
  ZERO_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
  ZERO_CHECK(static_cast<size_t>(count) == request.bytes_,
             describe(rank_, request) << ": the peer sent " << count << " bytes");
  counters_.bytes_received += request.bytes_;
}

bool PeerChannel::test(PeerRequest& request) {
  if (!request.pending()) return true;
  int done = 0;
  MPI_Status status;
  const int rc = MPI_Test(&request.request_, &done, &status);
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    ZERO_FAIL(describe(rank_, request) << " failed: " << std::string(text, length));
  }
  if (done) finished(request, status);
  return done != 0;
}

void PeerChannel::wait(PeerRequest& request) {
  if (test(request)) return;
  const auto start = backend::Clock::now();
  auto sleep = kFirstSleep;
  while (!test(request)) {
    const auto waited = backend::Clock::now() - start;
    if (waited >= timeout_) {
      const std::string what = describe(rank_, request);
      const bool was_send = request.is_send();
      request.release();
      ZERO_FAIL(what << " " << backend::not_finished_after(waited)
                     << (was_send ? "" : " (cancelled)")
                     << ": the peer never posted its side (ZERO_COLLECTIVE_TIMEOUT_S)");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
  counters_.wait_ms +=
      std::chrono::duration<double, std::milli>(backend::Clock::now() - start).count();
}

void PeerChannel::set_timeout(std::chrono::milliseconds timeout) {
  ZERO_CHECK(timeout.count() > 0,
             "a peer channel's timeout must be positive, got " << timeout.count() << " ms");
  timeout_ = std::min(timeout, backend::kLongestTimeout);
}

}  // namespace zero
