// The node-local path of the CPU communicator: the ranks of one node map one MPI-3 shared window
// (MPI_Win_allocate_shared) and run reduce-scatter, all-gather and all-reduce as passes over
// each other's memory, instead of messages through MPI.
//
// Each rank owns two slots of the window. A collective runs in chunks: a rank copies its part of
// a chunk into its slot (the one staging copy: the caller's buffers are private memory), all
// ranks meet at a barrier, then each reads what it needs straight from its peers' slots. Chunks
// are small enough to stay in cache between the copy and the peers' reads. Reductions add the
// ranks' contributions in rank order 0, 1, ..., N-1 (kernels::sum_in_order: fp32 sums, 16-bit
// results rounded once), so results never depend on timing, and at 2 ranks they equal MPI's.
//
// Ranks wait for each other by sleeping on a futex in the window, never by spinning: ranks may
// outnumber cores, and a spinning rank takes the core its peer needs to arrive. A rank that
// never arrives leaves its peers asleep until the communicator's watchdog ends the job.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero/core/dtype.h"

namespace zero::backend {

class SharedMemoryTransport {
 public:
  // Collective over `comm`, whose ranks must all share one node (MPI_Comm_split_type shared
  // gives the same group): allocates the window and maps every peer's slots.
  explicit SharedMemoryTransport(MPI_Comm comm);
  // Collective too (MPI_Win_free); skipped once MPI is finalized.
  ~SharedMemoryTransport();
  SharedMemoryTransport(const SharedMemoryTransport&) = delete;
  SharedMemoryTransport& operator=(const SharedMemoryTransport&) = delete;

  // The Communicator's operations, with its conventions (in place allowed as it describes).
  // Called by one thread at a time, in the same order on every rank.
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype);
  void all_gather(const void* send, void* recv, size_t bytes_per_rank);
  void all_reduce(const void* send, void* recv, size_t count, DType dtype);

  // The forms with blocks of any size, which the hierarchical path builds on: `bounds` holds
  // size + 1 ascending offsets (elements, or bytes for all_gather_blocks), rank r's block being
  // [bounds[r], bounds[r + 1]). reduce_scatter_blocks sums block `rank` of every rank's send in
  // rank order into recv as `recv_dtype`: dtype, or fp32 to keep a 16-bit sum unrounded for a
  // later stage. all_gather_blocks: send is this rank's block (or recv + bounds[rank]: in
  // place), recv the whole.
  void reduce_scatter_blocks(const void* send, DType dtype, const size_t* bounds, void* recv,
                             DType recv_dtype);
  void all_gather_blocks(const void* send, void* recv, const size_t* bounds);

  // Bytes of one slot: the most a rank publishes per chunk. Small enough that a chunk is still
  // in cache when the peers read it, large enough that barriers stay few: of 128 KiB to 16 MiB,
  // 256 KiB was fastest at 2 ranks (zero-bench-collectives, 64 MiB fp32, on a loaded 2-core
  // machine where each barrier waits for the scheduler).
  static constexpr size_t kSlotBytes = size_t{256} << 10;

 private:
  // The slot of `rank` that the current chunk uses (chunks alternate between the two).
  unsigned char* slot(int rank) const;
  // Every rank has published the current chunk. Also what makes the other slot free again: a
  // rank reads a chunk's slots only before it arrives at the next chunk's first barrier, so
  // once all have arrived there, the slot of two chunks back is nobody's.
  void barrier();
  // The next chunk uses the other slot.
  void next_chunk() { ++chunk_; }

  MPI_Win window_ = MPI_WIN_NULL;
  int rank_ = 0;
  int size_ = 1;
  // Rank 0's window begins with the barrier's two words, shared by all ranks.
  std::atomic<uint32_t>* arrived_ = nullptr;
  std::atomic<uint32_t>* generation_ = nullptr;
  std::vector<unsigned char*> slots_;  // per rank: its two slots, back to back
  uint64_t chunk_ = 0;
  // Offsets of the equal blocks of reduce_scatter and all_gather, and the fp32 copy of one
  // source that a 16-bit reduce-scatter with an fp32 result adds at a time.
  std::vector<size_t> bounds_;
  std::vector<float> widened_;
};

}  // namespace zero::backend
