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
#include <vector>

#include "zero/collectives/collective_table.h"
#include "zero/collectives/stream.h"
#include "zero/core/dtype.h"

namespace zero {

// Bytes this rank sent, per op, as the backend's own calls move them: the element type on the
// wire is the backend's (the MPI backend sums 16-bit floats in fp32, so its 16-bit reductions
// count 4 bytes an element; NCCL's move them natively at 2), times the op's ring share
// (collective_table.h): all-reduce 2(N-1)/N·S, reduce-scatter and all-gather (N-1)/N·S,
// broadcast S, barrier 0, where S is the buffer as sent. Exact integers, rounded down.
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

  // How this communicator moves its collectives, for logs and metrics: "nccl", or for the CPU
  // backend "mpi", "shm" (one node's shared memory) or "hierarchical (M nodes x L ranks)".
  virtual std::string transport() const = 0;

  // recv (count * world_size elements) = concatenation over ranks of each rank's send (count).
  // send == recv + rank * count elements is allowed (in place: the rank's slot already holds
  // its contribution).
  virtual Event all_gather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // The same on raw bytes: recv (bytes * world_size) = each rank's send (bytes), in rank order;
  // in place as above. For what is not an element type (sizes, fingerprints, text, structs);
  // the backend moves them as bytes (MPI_BYTE, ncclUint8), counted and recorded as all_gather.
  virtual Event all_gather_bytes(const void* send, void* recv, size_t bytes) = 0;
  // recv (count) = sum over ranks of send[rank * count, (rank + 1) * count); send holds
  // count * world_size elements. bf16/fp16 are summed in fp32 and rounded once.
  // recv == send + rank * count elements is allowed (in place).
  virtual Event reduce_scatter(const void* send, void* recv, size_t count, DType dtype) = 0;
  // recv (count) = sum over ranks of send (count). send == recv is allowed (in place).
  virtual Event all_reduce(const void* send, void* recv, size_t count, DType dtype) = 0;
  // buffer (count) on every rank = root's buffer.
  virtual Event broadcast(void* buffer, size_t count, DType dtype, int root) = 0;
  virtual Event barrier() = 0;
  // Raw bytes from every rank to every rank: send holds world_size blocks of `bytes`, block r
  // for rank r; recv (the same size) receives in block r what rank r sent to this one. send and
  // recv must not overlap. For encodings that are not an element type (ZeRO++'s quantized
  // gradients: int8 values and their scales); moved as bytes (MPI_BYTE; ncclUint8 sends and
  // receives in one group), counted and recorded as all_to_all.
  virtual Event all_to_all_bytes(const void* send, void* recv, size_t bytes) = 0;

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

  // Staging memory: what a backend needs besides the caller's buffers. The MPI backend stages
  // in host fp32 memory the reductions MPI cannot do on the caller's buffers (MPI has no 16-bit
  // float sum; an in-place reduce-scatter's result must not land inside its input); NCCL needs
  // none. Without a provided buffer a backend allocates its own and keeps it (tests,
  // benchmarks); a runtime that accounts for all its memory provides one instead.
  //
  // The bytes one call of `op` on `count` elements of `dtype` needs (in place or not; 0 when
  // none). A pure function of its arguments, the world size and the backend's per-call limit:
  // every rank computes the same figure.
  virtual size_t staging_bytes(CollectiveOp op, size_t count, DType dtype) const = 0;

  // Uses `bytes` of the caller's memory at `data` (host memory, 4-byte aligned; null only when
  // bytes is 0) for staging from now on, and frees the backend's own. The caller keeps it valid
  // until clear_staging_buffer(), the next set_staging_buffer() or the communicator's end.
  // Waits for the collectives already enqueued first (they may be using the old buffer), so
  // call it between phases of work, not per collective; rethrows the stream's error if one
  // failed. Call it alike on every rank: a collective whose staging_bytes exceed `bytes` fails,
  // as collectives fail on the stream (its event rethrows, the report names op, count, dtype,
  // the bytes needed and provided), and since the figure is the same everywhere, it fails on
  // every rank at the same collective and none is left waiting inside MPI.
  virtual void set_staging_buffer(void* data, size_t bytes) = 0;

  // Back to the backend's own staging memory (after waiting, as set_staging_buffer does): what
  // an owner calls before it frees the memory it provided.
  virtual void clear_staging_buffer() = 0;

  // Node-shared memory. On the CPU backend's shared-memory path (one node), a collective whose
  // buffers lie in this memory on every rank runs straight on them: it reads and writes the
  // peers' buffers, with no staging copy through the shared window and two or three barriers in
  // all. Other backends and paths have none, and these do nothing.
  //
  // Collective, between phases of work like set_staging_buffer (it waits for the enqueued
  // collectives first): maps `bytes` (may differ by rank) of memory this rank's node peers can
  // address, for allocate_shared to hand out. False on every rank where there is none, also when
  // the node's shared-memory file system has no room for every rank's bytes (said once, on rank 0).
  virtual bool reserve_shared(size_t /*bytes*/) { return false; }
  // Not collective: `bytes` (> 0) of the reserved memory, zero-filled and 64-byte aligned; null
  // when no reserved range is large enough (or none was reserved).
  virtual void* allocate_shared(size_t /*bytes*/) { return nullptr; }
  // Gives back memory from allocate_shared; false, with nothing done, for any other pointer.
  virtual bool free_shared(void* /*data*/) noexcept { return false; }
  // The collectives so far that ran straight on node-shared buffers.
  virtual uint64_t direct_collectives() const { return 0; }
  // Bytes of the node peers' shared memory mapped into this process (what its collectives
  // touched there): the OS counts them in this process's resident memory as well as in their
  // owners', so a per-rank resident figure subtracts them.
  virtual uint64_t peer_memory_mapped_bytes() const { return 0; }

  // Blocking forms: enqueue, then wait.
  void all_gather_sync(const void* send, void* recv, size_t count, DType dtype) {
    all_gather(send, recv, count, dtype).wait();
  }
  void all_gather_bytes_sync(const void* send, void* recv, size_t bytes) {
    all_gather_bytes(send, recv, bytes).wait();
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

// All-gathers one 64-bit value from every rank, in rank order (a blocking byte all-gather; the
// value is host memory, so `comm` is a communicator on host memory).
std::vector<uint64_t> all_gather_u64(Communicator& comm, uint64_t value);

}  // namespace zero
