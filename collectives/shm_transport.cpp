// The shared-memory transport of the CPU communicator (shm_transport.h).
#include "shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
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
// Each rank's mailboxes (two of them, for alternate calls) sit in its own first page, past the
// barrier's words that rank 0's first page holds.
constexpr size_t kMailboxOffset = 256;
constexpr size_t kMailboxStride = 64;
// What a mailbox says of a buffer outside the heap; a code is otherwise heap << 48 | offset.
constexpr uint64_t kNotShared = ~uint64_t{0};
constexpr int kOffsetBits = 48;
constexpr size_t kHeapAlignment = 64;

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

SharedMemoryTransport::SharedMemoryTransport(MPI_Comm comm) : comm_(comm) {
  ZERO_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  ZERO_MPI_CHECK(MPI_Comm_size(comm, &size_));
  void* base = nullptr;
  ZERO_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(kHeaderBytes + 2 * kSlotBytes), 1,
                                         MPI_INFO_NULL, comm, &base, &window_));
  ZERO_MPI_CHECK(MPI_Win_set_errhandler(window_, MPI_ERRORS_RETURN));
  slots_.resize(static_cast<size_t>(size_));
  headers_.resize(static_cast<size_t>(size_));
  peer_send_.resize(static_cast<size_t>(size_));
  peer_recv_.resize(static_cast<size_t>(size_));
  unsigned char* header = nullptr;
  for (int r = 0; r < size_; ++r) {
    MPI_Aint bytes = 0;
    int displacement_unit = 0;
    void* part = nullptr;
    ZERO_MPI_CHECK(MPI_Win_shared_query(window_, r, &bytes, &displacement_unit, &part));
    slots_[static_cast<size_t>(r)] = at(part, kHeaderBytes);
    headers_[static_cast<size_t>(r)] = static_cast<unsigned char*>(part);
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
  if (finalized) return;
  for (Heap& heap : heaps_) {
    if (MPI_Win_free(&heap.window) != MPI_SUCCESS) {
      std::fprintf(stderr, "zero: rank %d: MPI_Win_free of node-shared memory failed\n", rank_);
    }
  }
  if (MPI_Win_free(&window_) != MPI_SUCCESS) {
    std::fprintf(stderr, "zero: rank %d: MPI_Win_free of the shared-memory window failed\n", rank_);
  }
}

// OpenMPI backs a shared window with a file in osc_sm_backing_directory and refuses (fatally)
// one that does not fit there; the ranks check first, together, and all fall back alike.
bool SharedMemoryTransport::reserve_heap(size_t bytes) {
  // One alignment's worth more: the part may begin off a 64-byte boundary.
  const size_t rounded = round_up(std::max<size_t>(bytes, 1) + kHeapAlignment, 4096);
  ZERO_CHECK(rounded < (size_t{1} << kOffsetBits),
             "reserve_heap: " << bytes << " bytes is more than node-shared memory can address");
  // A reservation whose buffers are all given back (an earlier engine on this communicator)
  // serves again when it is large enough on every rank: windows live as long as the transport.
  int reusable = 0;
  {
    std::lock_guard<std::mutex> lock(heap_mutex_);
    for (const Heap& heap : heaps_) {
      reusable |= heap.space->empty() && heap.bytes - heap.lead >= std::max<size_t>(bytes, 1);
    }
  }
  ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &reusable, 1, MPI_INT, MPI_MIN, comm_));
  if (reusable) return true;
  release_empty_heaps();
  const char* directory = std::getenv("OMPI_MCA_osc_sm_backing_directory");
  if (directory == nullptr || *directory == '\0') directory = "/dev/shm";
  struct statvfs fs {};
  const unsigned long long room =
      statvfs(directory, &fs) == 0 ? static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize : 0;
  unsigned long long needed = rounded + kHeaderBytes;
  ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &needed, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm_));
  int fits = needed <= room ? 1 : 0;
  ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &fits, 1, MPI_INT, MPI_MIN, comm_));
  if (!fits) {
    if (rank_ == 0) {
      std::fprintf(stderr,
                   "zero: node-shared memory for the collectives' buffers needs %llu bytes in %s, "
                   "which has %llu free: collectives copy through the shared window instead\n",
                   needed, directory, room);
    }
    return false;
  }
  // Each rank's part on its own pages, so its buffers' alignment does not depend on the others'.
  MPI_Info info = MPI_INFO_NULL;
  ZERO_MPI_CHECK(MPI_Info_create(&info));
  ZERO_MPI_CHECK(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  Heap heap;
  void* base = nullptr;
  const int allocated =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(rounded), 1, info, comm_, &base, &heap.window);
  MPI_Info_free(&info);
  ZERO_MPI_CHECK(allocated);
  ZERO_MPI_CHECK(MPI_Win_set_errhandler(heap.window, MPI_ERRORS_RETURN));
  heap.parts.resize(static_cast<size_t>(size_));
  heap.part_bytes.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    MPI_Aint part_bytes = 0;
    int displacement_unit = 0;
    void* part = nullptr;
    ZERO_MPI_CHECK(MPI_Win_shared_query(heap.window, r, &part_bytes, &displacement_unit, &part));
    heap.parts[static_cast<size_t>(r)] = static_cast<unsigned char*>(part);
    heap.part_bytes[static_cast<size_t>(r)] = static_cast<size_t>(part_bytes);
  }
  // MPI does not promise where a part begins (OpenMPI puts them a few bytes past a page):
  // handing out from the first 64-byte boundary keeps every buffer aligned.
  const uintptr_t own = reinterpret_cast<uintptr_t>(heap.parts[static_cast<size_t>(rank_)]);
  heap.lead = (kHeapAlignment - own % kHeapAlignment) % kHeapAlignment;
  heap.bytes = rounded;
  heap.space = std::make_unique<HeapSpace>(rounded - heap.lead);
  std::lock_guard<std::mutex> lock(heap_mutex_);
  heaps_.push_back(std::move(heap));
  return true;
}

// Every rank holds the same heaps (reserve_heap is collective), so all free the same windows, in
// the same order, and those windows' pages leave the shared-memory file system.
void SharedMemoryTransport::release_empty_heaps() {
  std::vector<int> empty(heaps_.size());
  {
    std::lock_guard<std::mutex> lock(heap_mutex_);
    for (size_t h = 0; h < heaps_.size(); ++h) empty[h] = heaps_[h].space->empty() ? 1 : 0;
  }
  if (empty.empty()) return;
  ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, empty.data(), static_cast<int>(empty.size()), MPI_INT,
                               MPI_MIN, comm_));
  std::vector<Heap> kept;
  for (size_t h = 0; h < heaps_.size(); ++h) {
    if (!empty[h]) {
      kept.push_back(std::move(heaps_[h]));
      continue;
    }
    ZERO_MPI_CHECK(MPI_Win_free(&heaps_[h].window));
  }
  std::lock_guard<std::mutex> lock(heap_mutex_);
  heaps_ = std::move(kept);
}

void* SharedMemoryTransport::allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  for (Heap& heap : heaps_) {
    unsigned char* base = heap.parts[static_cast<size_t>(rank_)] + heap.lead;
    const std::optional<size_t> offset = heap.space->take(bytes, kHeapAlignment);
    if (!offset) continue;
    std::memset(base + *offset, 0, bytes);
    return base + *offset;
  }
  return nullptr;
}

// The range check needs no lock: heaps_ changes only in reserve_heap, between calls. So a
// pointer into a heap is known to be one before anything here can throw.
bool SharedMemoryTransport::free(void* data) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (Heap& heap : heaps_) {
    const unsigned char* base = heap.parts[static_cast<size_t>(rank_)] + heap.lead;
    if (p >= base && p < base + (heap.bytes - heap.lead)) {
      std::lock_guard<std::mutex> lock(heap_mutex_);
      return heap.space->give_back(static_cast<size_t>(p - base));
    }
  }
  return false;
}

bool SharedMemoryTransport::owns(const void* data) const {
  const auto* p = static_cast<const unsigned char*>(data);
  for (const Heap& heap : heaps_) {
    const unsigned char* base = heap.parts[static_cast<size_t>(rank_)];
    if (p >= base && p < base + heap.bytes) return true;
  }
  return false;
}

uint64_t SharedMemoryTransport::peer_bytes_mapped() const {
  if (heaps_.empty()) return 0;
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  // One 64-bit entry per virtual page; bit 63 says the page is present in this process.
  std::vector<uint64_t> entries(4096);
  uint64_t present = 0;
  for (const Heap& heap : heaps_) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      // Whole pages of the part only: the page it starts in also holds MPI's own data.
      const uintptr_t begin = reinterpret_cast<uintptr_t>(heap.parts[static_cast<size_t>(r)]);
      const uintptr_t first = (begin + page - 1) / page;
      const uintptr_t end = (begin + heap.part_bytes[static_cast<size_t>(r)]) / page;
      const uintptr_t pages = end > first ? end - first : 0;
      for (uintptr_t done = 0; done < pages;) {
        const size_t n = std::min<size_t>(entries.size(), pages - done);
        const ssize_t got = pread(fd, entries.data(), n * sizeof(uint64_t),
                                  static_cast<off_t>((first + done) * sizeof(uint64_t)));
        if (got <= 0) break;
        const size_t read = static_cast<size_t>(got) / sizeof(uint64_t);
        for (size_t i = 0; i < read; ++i) present += entries[i] >> 63;
        done += read;
      }
    }
  }
  close(fd);
  return present * page;
}

uint64_t SharedMemoryTransport::code_of(const void* data, size_t bytes) const {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t h = 0; h < heaps_.size(); ++h) {
    const unsigned char* base = heaps_[h].parts[static_cast<size_t>(rank_)];
    if (p >= base && bytes <= heaps_[h].bytes &&
        p - base <= static_cast<std::ptrdiff_t>(heaps_[h].bytes - bytes)) {
      return (static_cast<uint64_t>(h) << kOffsetBits) | static_cast<uint64_t>(p - base);
    }
  }
  return kNotShared;
}

unsigned char* SharedMemoryTransport::pointer_of(int rank, uint64_t code) const {
  if (code == kNotShared) return nullptr;
  const size_t h = static_cast<size_t>(code >> kOffsetBits);
  const size_t offset = static_cast<size_t>(code & ((uint64_t{1} << kOffsetBits) - 1));
  return heaps_[h].parts[static_cast<size_t>(rank)] + offset;
}

uint64_t* SharedMemoryTransport::mailbox(int rank) const {
  return reinterpret_cast<uint64_t*>(headers_[static_cast<size_t>(rank)] + kMailboxOffset +
                                     (calls_ % 2) * kMailboxStride);
}

SharedMemoryTransport::Placement SharedMemoryTransport::exchange_placement(const void* send,
                                                                           size_t send_bytes,
                                                                           const void* recv,
                                                                           size_t recv_bytes) {
  if (heaps_.empty()) return {};
  uint64_t* mine = mailbox(rank_);
  mine[0] = code_of(send, send_bytes);
  mine[1] = code_of(recv, recv_bytes);
  barrier();
  Placement all{true, true};
  for (int p = 0; p < size_; ++p) {
    const uint64_t* theirs = mailbox(p);
    peer_send_[static_cast<size_t>(p)] = pointer_of(p, theirs[0]);
    peer_recv_[static_cast<size_t>(p)] = pointer_of(p, theirs[1]);
    all.sends = all.sends && theirs[0] != kNotShared;
    all.recvs = all.recvs && theirs[1] != kNotShared;
  }
  ++calls_;
  return all;
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

// recv = sources[0] + sources[1] + ... in that order: sum_in_order, or when recv_dtype is fp32
// for 16-bit sources, the same fp32 additions without the rounding, a piece at a time.
void SharedMemoryTransport::sum_sources(void* recv, DType recv_dtype, const void* const* sources,
                                        DType dtype, size_t n) {
  const size_t ranks = static_cast<size_t>(size_);
  if (recv_dtype == dtype) {
    kernels::sum_in_order(recv, sources, ranks, dtype, n);
    return;
  }
  const size_t elem = dtype_size(dtype);
  const size_t piece = round_down(kSlotBytes / (ranks * elem), kPieceAlignment);
  if (widened_.size() < piece) widened_.resize(piece);
  for (size_t offset = 0; offset < n; offset += piece) {
    const size_t m = std::min(piece, n - offset);
    float* sum = reinterpret_cast<float*>(at(recv, offset * sizeof(float)));
    kernels::cast(at(sources[0], offset * elem), dtype, sum, DType::kFloat32, m);
    for (size_t p = 1; p < ranks; ++p) {
      kernels::cast(at(sources[p], offset * elem), dtype, widened_.data(), DType::kFloat32, m);
      kernels::accumulate(sum, widened_.data(), m);
    }
  }
}

// Straight from the heap: this rank sums its block of every rank's send, then waits until the
// peers have read its own send too (the caller may reuse it once the call returns).
// Staged: per chunk, `piece` elements of every rank's block: rank r publishes its pieces of the
// other ranks' blocks (its own never leaves it), then sums piece r of every rank, in rank order,
// into recv. Every rank runs as many chunks as the longest block needs, so the barriers match.
// In place, recv is this rank's block of send, which only this rank reads.
void SharedMemoryTransport::reduce_scatter_blocks(const void* send, DType dtype,
                                                  const size_t* bounds, void* recv,
                                                  DType recv_dtype) {
  ZERO_CHECK(recv_dtype == dtype || recv_dtype == DType::kFloat32,
             "reduce_scatter_blocks: the result must be " << dtype_name(dtype) << " or fp32, got "
                                                          << dtype_name(recv_dtype));
  const size_t elem = dtype_size(dtype);
  auto block_size = [&](int r) { return bounds[r + 1] - bounds[r]; };
  std::vector<const void*> sources(static_cast<size_t>(size_));
  const Placement placed = exchange_placement(send, bounds[size_] * elem, recv,
                                              block_size(rank_) * dtype_size(recv_dtype));
  if (placed.sends) {
    const size_t n = block_size(rank_);
    if (n > 0) {
      for (int p = 0; p < size_; ++p) {
        sources[static_cast<size_t>(p)] = peer_send_[static_cast<size_t>(p)] + bounds[rank_] * elem;
      }
      sum_sources(recv, recv_dtype, sources.data(), dtype, n);
    }
    barrier();
    direct_calls_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const size_t piece =
      round_down(kSlotBytes / (static_cast<size_t>(size_) * elem), kPieceAlignment);
  size_t longest = 0;
  for (int r = 0; r < size_; ++r) longest = std::max(longest, block_size(r));
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
      sum_sources(at(recv, offset * dtype_size(recv_dtype)), recv_dtype, sources.data(), dtype, n);
    }
    next_chunk();
  }
}

// Straight from the heap: this rank writes its block into every rank's recv, then waits until
// every block is everywhere. Staged: per chunk, `kSlotBytes` of every rank's block: each rank
// publishes its piece, then copies every peer's into place. In place (send is this rank's block
// of recv) its own piece is there.
void SharedMemoryTransport::all_gather_blocks(const void* send, void* recv, const size_t* bounds) {
  const bool in_place = send == at(recv, bounds[rank_]);
  auto block_size = [&](int r) { return bounds[r + 1] - bounds[r]; };
  const Placement placed = exchange_placement(send, block_size(rank_), recv, bounds[size_]);
  if (placed.recvs) {
    // One fused pass: send is read once for every destination (copy_to_all).
    std::vector<void*> destinations;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ || !in_place)
        destinations.push_back(peer_recv_[static_cast<size_t>(p)] + bounds[rank_]);
    }
    kernels::copy_to_all(destinations.data(), destinations.size(), send, block_size(rank_));
    barrier();
    direct_calls_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
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

// Straight from the heap (every send and recv there): rank r sums part r of every rank's send,
// in rank order, into part r of its own recv; after a barrier each copies the other parts from
// their owners' recv, and a last barrier says every rank's recv has been read. In place, part r
// of rank r's send is read only by rank r, elementwise as it is overwritten.
// Staged: per chunk of `piece` elements, a reduce-scatter then an all-gather through the slots:
// each rank publishes its chunk in the first half of its slot; rank r sums part r of the chunk
// over all ranks, in rank order, into the second half of its own slot; after a second barrier
// every rank copies all parts of the sum into recv. In place, this rank's send is read (its part
// of the sum) before the second barrier and overwritten only after it.
void SharedMemoryTransport::all_reduce(const void* send, void* recv, size_t count, DType dtype) {
  const size_t elem = dtype_size(dtype);
  const size_t ranks = static_cast<size_t>(size_);
  std::vector<const void*> sources(ranks);
  const Placement placed = exchange_placement(send, count * elem, recv, count * elem);
  if (placed.sends && placed.recvs) {
    const size_t part = round_up((count + ranks - 1) / ranks, kPieceAlignment);
    auto part_begin = [&](int r) { return std::min(static_cast<size_t>(r) * part, count); };
    auto part_size = [&](int r) { return std::min(part, count - part_begin(r)); };
    const size_t begin = part_begin(rank_);
    if (part_size(rank_) > 0) {
      for (int p = 0; p < size_; ++p) {
        sources[static_cast<size_t>(p)] = peer_send_[static_cast<size_t>(p)] + begin * elem;
      }
      kernels::sum_in_order(at(recv, begin * elem), sources.data(), ranks, dtype, part_size(rank_));
    }
    barrier();
    for (int i = 1; i < size_; ++i) {
      const int p = (rank_ + i) % size_;
      std::memcpy(at(recv, part_begin(p) * elem),
                  peer_recv_[static_cast<size_t>(p)] + part_begin(p) * elem, part_size(p) * elem);
    }
    barrier();
    direct_calls_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const size_t piece = round_down(kSlotBytes / (2 * elem), kPieceAlignment);
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
