// The shared-memory transport of the CPU communicator (shm_transport.h).
#include "shm_transport.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>

#include "zero/collectives/mpi_check.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero::backend {
namespace {

// The barrier's words live at the start of rank 0's part of the window; the slots start a page
// later, so that they begin on a page (and cache line) boundary.
constexpr size_t kHeaderBytes = 4096;
// Chunk pieces are whole multiples of this many elements: 64 fp32 or 16-bit elements keep every
// peer's piece on cache-line boundaries and the kernels' vector loops without tails.
constexpr size_t kPieceAlignment = 64;

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the futex needs an atomic that is a plain 32-bit word");

// Not FUTEX_PRIVATE_FLAG: the word is shared between processes, which map it at different
// addresses; the kernel then keys the futex on the page itself.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

size_t round_down(size_t n, size_t multiple) {
  return n / multiple * multiple;
}

size_t round_up(size_t n, size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

const unsigned char* at(const void* p, size_t offset) {
  return static_cast<const unsigned char*>(p) + offset;
}

unsigned char* at(void* p, size_t offset) {
  return static_cast<unsigned char*>(p) + offset;
}

}  // namespace

SharedMemoryTransport::SharedMemoryTransport(MPI_Comm comm) {
  ZERO_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  ZERO_MPI_CHECK(MPI_Comm_size(comm, &size_));
  void* base = nullptr;
  ZERO_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(kHeaderBytes + 2 * kSlotBytes), 1,
                                         MPI_INFO_NULL, comm, &base, &window_));
  ZERO_MPI_CHECK(MPI_Win_set_errhandler(window_, MPI_ERRORS_RETURN));
  slots_.resize(static_cast<size_t>(size_));
  unsigned char* header = nullptr;
  for (int r = 0; r < size_; ++r) {
    MPI_Aint bytes = 0;
    int displacement_unit = 0;
    void* part = nullptr;
    ZERO_MPI_CHECK(MPI_Win_shared_query(window_, r, &bytes, &displacement_unit, &part));
    slots_[static_cast<size_t>(r)] = at(part, kHeaderBytes);
    if (r == 0) header = static_cast<unsigned char*>(part);
  }
  if (rank_ == 0) {
    arrived_ = new (header) std::atomic<uint32_t>(0);
    generation_ = new (header + 64) std::atomic<uint32_t>(0);
  } else {
    arrived_ = reinterpret_cast<std::atomic<uint32_t>*>(header);
    generation_ = reinterpret_cast<std::atomic<uint32_t>*>(header + 64);
  }
  // No rank may use the barrier before rank 0 has set its words.
  ZERO_MPI_CHECK(MPI_Barrier(comm));
}

SharedMemoryTransport::~SharedMemoryTransport() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && MPI_Win_free(&window_) != MPI_SUCCESS) {
    std::fprintf(stderr, "zero: rank %d: MPI_Win_free of the shared-memory window failed\n", rank_);
  }
}

unsigned char* SharedMemoryTransport::slot(int rank) const {
  return slots_[static_cast<size_t>(rank)] + (chunk_ % 2) * kSlotBytes;
}

// A generation barrier: the last rank to arrive resets the count and starts the next
// generation; the others sleep until the generation they arrived in has passed. The atomics
// order the plain writes to the slots before the barrier and the reads after it, across
// processes as across threads (the window is memory every rank maps).
void SharedMemoryTransport::barrier() {
  const uint32_t generation = generation_->load(std::memory_order_acquire);
  if (arrived_->fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    arrived_->store(0, std::memory_order_relaxed);
    generation_->store(generation + 1, std::memory_order_release);
    futex_wake_all(generation_);
    return;
  }
  // futex_wait returns at once when the word has moved on, and may wake spuriously: look again.
  while (generation_->load(std::memory_order_acquire) == generation) {
    futex_wait(generation_, generation);
  }
}

void SharedMemoryTransport::reduce_scatter(const void* send, void* recv, size_t count,
                                           DType dtype) {
  bounds_.resize(static_cast<size_t>(size_) + 1);
  for (size_t r = 0; r < bounds_.size(); ++r) bounds_[r] = r * count;
  reduce_scatter_blocks(send, dtype, bounds_.data(), recv, dtype);
}

void SharedMemoryTransport::all_gather(const void* send, void* recv, size_t bytes_per_rank) {
  bounds_.resize(static_cast<size_t>(size_) + 1);
  for (size_t r = 0; r < bounds_.size(); ++r) bounds_[r] = r * bytes_per_rank;
  all_gather_blocks(send, recv, bounds_.data());
}

// Per chunk, `piece` elements of every rank's block: rank r publishes its pieces of the other
// ranks' blocks (its own never leaves it), then sums piece r of every rank, in rank order, into
// recv. Every rank runs as many chunks as the longest block needs, so the barriers match. In
// place, recv is this rank's block of send, which only this rank reads.
void SharedMemoryTransport::reduce_scatter_blocks(const void* send, DType dtype,
                                                  const size_t* bounds, void* recv,
                                                  DType recv_dtype) {
  ZERO_CHECK(recv_dtype == dtype || recv_dtype == DType::kFloat32,
             "reduce_scatter_blocks: the result must be " << dtype_name(dtype) << " or fp32, got "
                                                          << dtype_name(recv_dtype));
  const size_t elem = dtype_size(dtype);
  const size_t piece =
      round_down(kSlotBytes / (static_cast<size_t>(size_) * elem), kPieceAlignment);
  auto block_size = [&](int r) { return bounds[r + 1] - bounds[r]; };
  size_t longest = 0;
  for (int r = 0; r < size_; ++r) longest = std::max(longest, block_size(r));
  const bool widen = recv_dtype != dtype;
  if (widen && widened_.size() < piece) widened_.resize(piece);
  std::vector<const void*> sources(static_cast<size_t>(size_));
  for (size_t offset = 0; offset < longest; offset += piece) {
    unsigned char* mine = slot(rank_);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || offset >= block_size(p)) continue;
      const size_t n = std::min(piece, block_size(p) - offset);
      std::memcpy(mine + p * piece * elem, at(send, (bounds[p] + offset) * elem), n * elem);
    }
    barrier();
    if (offset < block_size(rank_)) {
      const size_t n = std::min(piece, block_size(rank_) - offset);
      for (int p = 0; p < size_; ++p) {
        sources[static_cast<size_t>(p)] =
            p == rank_ ? at(send, (bounds[rank_] + offset) * elem) : slot(p) + rank_ * piece * elem;
      }
      if (widen) {
        // The same fp32 additions in the same order as sum_in_order, without the rounding.
        float* sum = reinterpret_cast<float*>(at(recv, offset * sizeof(float)));
        kernels::cast(sources[0], dtype, sum, DType::kFloat32, n);
        for (size_t p = 1; p < sources.size(); ++p) {
          kernels::cast(sources[p], dtype, widened_.data(), DType::kFloat32, n);
          kernels::accumulate(sum, widened_.data(), n);
        }
      } else {
        kernels::sum_in_order(at(recv, offset * elem), sources.data(), sources.size(), dtype, n);
      }
    }
    next_chunk();
  }
}

// Per chunk, `kSlotBytes` of every rank's block: each rank publishes its piece, then copies
// every peer's into place. In place (send is this rank's block of recv) its own piece is there.
void SharedMemoryTransport::all_gather_blocks(const void* send, void* recv, const size_t* bounds) {
  const bool in_place = send == at(recv, bounds[rank_]);
  auto block_size = [&](int r) { return bounds[r + 1] - bounds[r]; };
  size_t longest = 0;
  for (int r = 0; r < size_; ++r) longest = std::max(longest, block_size(r));
  for (size_t offset = 0; offset < longest; offset += kSlotBytes) {
    if (offset < block_size(rank_)) {
      const size_t n = std::min(kSlotBytes, block_size(rank_) - offset);
      std::memcpy(slot(rank_), at(send, offset), n);
      // Before the barrier: work done while peers may still be copying.
      if (!in_place) std::memcpy(at(recv, bounds[rank_] + offset), at(send, offset), n);
    }
    barrier();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || offset >= block_size(p)) continue;
      const size_t n = std::min(kSlotBytes, block_size(p) - offset);
      std::memcpy(at(recv, bounds[p] + offset), slot(p), n);
    }
    next_chunk();
  }
}

// Per chunk of `piece` elements, a reduce-scatter then an all-gather through the slots: each
// rank publishes its chunk in the first half of its slot; rank r sums part r of the chunk over
// all ranks, in rank order, into the second half of its own slot; after a second barrier every
// rank copies all parts of the sum into recv. In place, this rank's send is read (its part of
// the sum) before the second barrier and overwritten only after it.
void SharedMemoryTransport::all_reduce(const void* send, void* recv, size_t count, DType dtype) {
  const size_t elem = dtype_size(dtype);
  const size_t piece = round_down(kSlotBytes / (2 * elem), kPieceAlignment);
  const size_t ranks = static_cast<size_t>(size_);
  std::vector<const void*> sources(ranks);
  for (size_t offset = 0; offset < count; offset += piece) {
    const size_t n = std::min(piece, count - offset);
    const size_t part = round_up((n + ranks - 1) / ranks, kPieceAlignment);
    auto part_begin = [&](int r) { return std::min(static_cast<size_t>(r) * part, n); };
    auto part_size = [&](int r) { return std::min(part, n - part_begin(r)); };
    std::memcpy(slot(rank_), at(send, offset * elem), n * elem);
    barrier();
    const size_t begin = part_begin(rank_);
    for (int p = 0; p < size_; ++p) {
      sources[static_cast<size_t>(p)] =
          p == rank_ ? at(send, (offset + begin) * elem) : slot(p) + begin * elem;
    }
    kernels::sum_in_order(slot(rank_) + (piece + begin) * elem, sources.data(), ranks, dtype,
                          part_size(rank_));
    barrier();
    for (int p = 0; p < size_; ++p) {
      std::memcpy(at(recv, (offset + part_begin(p)) * elem),
                  slot(p) + (piece + part_begin(p)) * elem, part_size(p) * elem);
    }
    next_chunk();
  }
}

}  // namespace zero::backend
