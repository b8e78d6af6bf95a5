// The node-local path of the CPU communicator: the ranks of one node map one MPI-3 shared window
// (MPI_Win_allocate_shared) and run reduce-scatter, all-gather and all-reduce as passes over
// each other's memory, instead of messages through MPI.
//
// Each rank owns two slots of the window. A collective on private buffers runs in chunks: a rank
// copies its part of a chunk into its slot (the one staging copy), all ranks meet at a barrier,
// then each reads what it needs straight from its peers' slots. Chunks are small enough to stay
// in cache between the copy and the peers' reads.
//
// Buffers can also live in node-shared memory themselves (reserve_heap, allocate): a second
// window, which the engine puts its gradient buckets and gathered parameters in. A call then
// starts with every rank posting where its buffers lie and a barrier; when every rank's are in
// the heap, it runs straight on them, with no staging copy and two or three barriers in all
// instead of one per chunk: a reduce-scatter sums its block from the peers' inputs, an
// all-gather writes its block into every peer's output, an all-reduce does both. Reductions add the
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
#include <memory>
#include <mutex>
#include <vector>

#include "shm_heap.h"
#include "zero/core/dtype.h"

namespace zero::backend {

class SharedMemoryTransport {
 public:
  // Collective over `comm`, whose ranks must all share one node (MPI_Comm_split_type shared
  // gives the same group): allocates the window and maps every peer's slots. `comm` must
  // outlive the transport (reserve_heap uses it).
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

  // Collective, between calls: maps `bytes` (may differ by rank) of memory that this node's ranks
  // can all address, for allocate() to hand out. False on every rank when the node's
  // shared-memory file system (OpenMPI's osc_sm_backing_directory) has no room for all ranks'
  // bytes: calls then stage as before.
  bool reserve_heap(size_t bytes);
  // Not collective: `bytes` (> 0) of reserved memory, zero-filled and 64-byte aligned, or null
  // when no reserved range is large enough. Thread-safe, as free() is.
  void* allocate(size_t bytes);
  // Gives back memory from allocate(); false (nothing done) for any other pointer.
  bool free(void* data);
  // Whether `data` is in this rank's part of a heap (what free() would take).
  bool owns(const void* data) const;
  // Bytes of the peers' heap parts mapped into this process (pages its reads and writes
  // touched, from /proc/self/pagemap): the OS counts them in this process's resident memory
  // as well as in their owners'. 0 without a heap or when pagemap cannot be read.
  uint64_t peer_bytes_mapped() const;
  // Calls so far that ran straight on the callers' buffers (every rank's were in the heap).
  uint64_t direct_calls() const { return direct_calls_.load(std::memory_order_relaxed); }

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
  // Collective: frees the heaps whose memory every rank has given back.
  void release_empty_heaps();

  // Where every rank's buffers of this call lie: posts this rank's, meets the peers, reads
  // theirs into peer_send_ and peer_recv_ (null: not in the heap). Says whether all sends and
  // all receives are in the heap. Without a heap there is nothing to post, and no barrier.
  struct Placement {
    bool sends = false;
    bool recvs = false;
  };
  Placement exchange_placement(const void* send, size_t send_bytes, const void* recv,
                               size_t recv_bytes);
  // A buffer's place as posted: heap index and offset, or kNotShared.
  uint64_t code_of(const void* data, size_t bytes) const;
  unsigned char* pointer_of(int rank, uint64_t code) const;
  // Rank `rank`'s posted codes (send, recv) for the current call; the two alternate, so a rank
  // that runs ahead into the next call never overwrites what a peer has still to read.
  uint64_t* mailbox(int rank) const;
  // recv (recv_dtype: dtype or fp32) = sum over `sources` in order, of n elements of dtype.
  void sum_sources(void* recv, DType recv_dtype, const void* const* sources, DType dtype, size_t n);

  MPI_Comm comm_;  // the caller's, which outlives this
  MPI_Win window_ = MPI_WIN_NULL;
  int rank_ = 0;
  int size_ = 1;
  // Rank 0's window begins with the barrier's two words, shared by all ranks.
  std::atomic<uint32_t>* arrived_ = nullptr;
  std::atomic<uint32_t>* generation_ = nullptr;
  std::vector<unsigned char*> slots_;    // per rank: its two slots, back to back
  std::vector<unsigned char*> headers_;  // per rank: its part's first page (mailboxes)
  uint64_t chunk_ = 0;
  // Node-shared memory: per reservation, its window, every rank's part and this rank's
  // bookkeeping.
  struct Heap {
    MPI_Win window = MPI_WIN_NULL;
    std::vector<unsigned char*> parts;
    std::vector<size_t> part_bytes;
    size_t bytes = 0;  // of this rank's part
    size_t lead = 0;   // bytes of this rank's part before its first 64-byte boundary
    std::unique_ptr<HeapSpace> space;  // offsets from parts[rank] + lead
  };
  std::vector<Heap> heaps_;
  std::mutex heap_mutex_;  // allocate() and free() against each other
  uint64_t calls_ = 0;     // calls that exchanged placements: the mailbox parity
  std::vector<unsigned char*> peer_send_, peer_recv_;
  std::atomic<uint64_t> direct_calls_{0};
  // Offsets of the equal blocks of reduce_scatter and all_gather, and the fp32 copy of one
  // source that a 16-bit reduce-scatter with an fp32 result adds at a time.
  std::vector<size_t> bounds_;
  std::vector<float> widened_;
};

}  // namespace zero::backend
