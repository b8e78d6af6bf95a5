// Point-to-point transfers between the ranks of one pipeline group (rank = stage), over MPI
// (OpenMPI moves them through shared memory within a node and the network across nodes by
// itself). Sends and receives are posted at once and return a PeerRequest; wait() sleeps until
// the transfer is done, because ranks often outnumber cores here: it polls MPI_Test with a
// backoff from 20 us to 250 us, never spinning hot. A transfer still unfinished after the
// collective timeout (ZERO_COLLECTIVE_TIMEOUT_S, 300 s by default; set_timeout) is a zero::Error
// naming the rank, the peer, the tag and the bytes. Transfers progress inside MPI calls (any
// wait or test of this channel), as MPI's point-to-point does without a progress thread.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace zero {

struct PeerChannelCounters {
  uint64_t bytes_sent = 0;      // posted sends
  uint64_t bytes_received = 0;  // finished receives
  double wait_ms = 0.0;         // time wait() spent before its transfer was done
};

// One posted transfer. Move-only. Destroyed while pending (an exception unwinding past it), a
// receive is cancelled and a send released for MPI to finish on its own.
class PeerRequest {
 public:
  PeerRequest() = default;
  ~PeerRequest();
  PeerRequest(PeerRequest&& other) noexcept;
  PeerRequest& operator=(PeerRequest&& other) noexcept;
  PeerRequest(const PeerRequest&) = delete;
  PeerRequest& operator=(const PeerRequest&) = delete;

  // False once wait() or test() has seen it finish (and for an empty request).
  bool pending() const { return request_ != MPI_REQUEST_NULL; }
  bool is_send() const { return send_; }
  int peer() const { return peer_; }
  int tag() const { return tag_; }
  size_t bytes() const { return bytes_; }

 private:
  friend class PeerChannel;
  void release() noexcept;

  MPI_Request request_ = MPI_REQUEST_NULL;
  bool send_ = false;
  int peer_ = -1;
  int tag_ = -1;
  size_t bytes_ = 0;
};

class PeerChannel {
 public:
  // Duplicates `comm` (collective over its ranks); its rank is the stage. The timeout comes
  // from ZERO_COLLECTIVE_TIMEOUT_S (a zero::Error when that is not a positive number).
  explicit PeerChannel(MPI_Comm comm);
  ~PeerChannel();
  PeerChannel(const PeerChannel&) = delete;
  PeerChannel& operator=(const PeerChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The largest tag a transfer may carry (MPI_TAG_UB, at least 32767).
  int max_tag() const { return max_tag_; }

  // Posts `bytes` from `data` to `peer` (itself included) under `tag`; `data` must stay
  // unchanged until the request is done. Bad peers, tags, sizes over INT_MAX or a null buffer
  // with bytes are a zero::Error naming them.
  PeerRequest send(int peer, int tag, const void* data, size_t bytes);
  // Posts the receive of exactly `bytes` from `peer` under `tag` into `data`; a message of
  // another size is a zero::Error at wait/test naming both sizes.
  PeerRequest receive(int peer, int tag, void* data, size_t bytes);

  // Returns when the transfer is done, sleeping meanwhile; at once for one not pending. Past the
  // timeout: a zero::Error "rank R: receive from peer P, tag T, N bytes has not finished after
  // S s" (the receive is cancelled; the channel should not be used for more than ending the job).
  void wait(PeerRequest& request);
  // True when the transfer is done (never blocks).
  bool test(PeerRequest& request);

  // Positive; from now on.
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const { return timeout_; }

  const PeerChannelCounters& counters() const { return counters_; }

 private:
  // A send's or receive's request, not started yet, once its peer, tag and buffer are checked.
  PeerRequest new_request(bool send, int peer, int tag, const void* data, size_t bytes) const;
  // Counts a finished transfer; checks a receive's size.
  void finished(PeerRequest& request, const MPI_Status& status);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int max_tag_ = 32767;
  std::chrono::milliseconds timeout_;
  PeerChannelCounters counters_;
};

}  // namespace zero
