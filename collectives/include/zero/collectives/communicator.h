// The Communicator: collectives on typed buffers, enqueued on the communicator's own
// communication stream and returning an event. Every backend (MPI on host memory now, NCCL on
// device memory later) implements this interface; the engine uses nothing else.
//
// Buffers given to an enqueued collective must stay valid and untouched by the caller until
// its event completes. Sizes are element counts.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "zero/collectives/stream.h"
#include "zero/kernels/dtype.h"

namespace zero {

enum class CollectiveOp : uint8_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
constexpr int kNumCollectiveOps = 5;

// all_gather, reduce_scatter, all_reduce, broadcast, barrier.
const char* collective_op_name(CollectiveOp op);

// Bytes this rank sent, per op, counted as the ring algorithm moves them for a buffer of S
// bytes over N ranks: all-reduce 2(N-1)/N·S, reduce-scatter and all-gather (N-1)/N·S,
// broadcast S (pipelined), barrier 0. Exact integers: S·k·(N-1)/N rounded down.
struct CommCounters {
  std::array<uint64_t, kNumCollectiveOps> bytes{};
  std::array<uint64_t, kNumCollectiveOps> calls{};
  uint64_t total_bytes() const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // recv (count * world_size elements) = concatenation over ranks of each rank's send (count).
  // send == recv + rank * count elements is allowed (in place: the rank's slot already holds
  // its contribution).
  virtual Event all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv (count) = sum over ranks of send[rank * count, (rank + 1) * count); send holds
  // count * world_size elements. bf16/fp16 are summed in fp32 and rounded once.
  // recv == send + rank * count elements is allowed (in place).
  virtual Event reduce_scatter(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv (count) = sum over ranks of send (count). send == recv is allowed (in place).
  virtual Event all_reduce(const void* send, void* recv, size_t count, DType dtype) = 0;
  // buffer (count) on every rank = root's buffer.
  virtual Event broadcast(void* buffer, size_t count, DType dtype, int root) = 0;
  virtual Event barrier() = 0;

  // The communication stream the collectives run on; the engine makes it wait for compute
  // events (stream().wait(e)) before enqueuing a collective that reads what compute wrote.
  virtual Stream& stream() = 0;

  // Counted when a collective is enqueued, by the thread that enqueues it: read them from that
  // thread (the engine's), never from the stream's worker.
  virtual const CommCounters& counters() const = 0;

  // A collective running longer than this prints rank, op, sequence number and size, and
  // aborts the whole job. Default 300 s. Sequence numbers count the collectives enqueued on
  // this communicator (1, 2, ...), so the reports of different ranks can be matched up.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;

  // Desync check (a debug mode, off by default; on when the environment has
  // ZERO_DEBUG=collectives): before each collective the ranks exchange its sequence number, op,
  // element type and count, and a rank whose collective differs stops the job with a message
  // naming both ranks and both ops. Costs one small extra collective per collective. Set it
  // alike on every rank, between collectives: the exchange is itself a collective.
  virtual void set_desync_check(bool enabled) = 0;
  virtual bool desync_check() const = 0;

  // The flight record: a table of the last collectives (see flight_recorder.h), most recent
  // last, with their states and times. Callable from any thread, e.g. to print before exiting
  // on a fatal error. The communicator prints it itself when its watchdog or desync check
  // aborts the job, or when a collective fails.
  virtual std::string flight_record() const = 0;

  // Blocking forms: enqueue, then wait.
  void all_gather_sync(const void* send, void* recv, size_t count, DType dtype) {
    all_gather(send, recv, count, dtype).wait();
  }
  void reduce_scatter_sync(const void* send, void* recv, size_t count, DType dtype) {
    reduce_scatter(send, recv, count, dtype).wait();
  }
  void all_reduce_sync(const void* send, void* recv, size_t count, DType dtype) {
    all_reduce(send, recv, count, dtype).wait();
  }
  void broadcast_sync(void* buffer, size_t count, DType dtype, int root) {
    broadcast(buffer, count, dtype, root).wait();
  }
  void barrier_sync() { barrier().wait(); }
};

}  // namespace zero
