// The MPI backend of the Communicator (host memory) and the process's MPI session.
//
// Each collective is validated and counted on the calling thread, then enqueued on the
// communicator's stream, whose worker makes the blocking MPI call. A watchdog thread aborts
// the job when one collective runs longer than the timeout, so a rank that never joins a
// collective shows up as a message naming the op instead of a silent hang. A flight recorder
// keeps the last 64 collectives and their states; it is printed whenever the job is stopped
// here (watchdog, desync check) or a collective fails. In the desync-check mode the ranks
// compare each collective's description before running it. When every rank is on one node,
// reduce-scatter, all-gather and all-reduce run over a shared-memory window instead
// (shm_transport.h); when the job spans nodes of equal, consecutive ranks, over shared memory
// inside each node and MPI across (hierarchical_transport.h). Both run inside the same launch,
// so the watchdog, flight recorder and desync check treat them as they treat MPI calls.
#include "zero/collectives/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend_common.h"
#include "hierarchical_transport.h"
#include "node_groups.h"
#include "shm_transport.h"
#include "transport_choice.h"
#include "zero/core/check.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero {

// ---------------------------------------------------------------------------------------------
// MpiSession

namespace {

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  ZERO_MPI_CHECK(MPI_Initialized(&initialized));
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    // Someone else owns MPI (a host program that initialized it): use it, never finalize it.
    ZERO_MPI_CHECK(MPI_Query_thread(&provided));
  } else {
    ZERO_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_mpi_ = true;
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (owns_mpi_) MPI_Finalize();
    ZERO_FAIL("the MPI library provides only " << thread_level_name(provided)
                                               << "; zero needs MPI_THREAD_MULTIPLE (the "
                                                  "communication stream's worker thread calls "
                                                  "MPI while the main thread may too)");
  }
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  ZERO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node));
  ZERO_MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  ZERO_MPI_CHECK(MPI_Comm_free(&node));
}

MpiSession::~MpiSession() {
  if (!owns_mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int MpiSession::world_rank() const {
  return world_rank_;
}
int MpiSession::world_size() const {
  return world_size_;
}
int MpiSession::local_rank() const {
  return local_rank_;
}

// ---------------------------------------------------------------------------------------------
// The communicator

namespace {

using backend::bytes_at;
using backend::Clock;
using backend::Payload;

// The MPI type that moves elements of `dtype` unchanged: 16-bit floats travel as 16-bit
// integers, since only the reductions need to know what they mean.
MPI_Datatype transport_type(DType dtype) {
  return dtype == DType::kFloat32 ? MPI_FLOAT : MPI_UINT16_T;
}

// The element type this backend's MPI calls carry for `op` on `dtype`: reductions are always
// MPI_FLOAT sums (MPI cannot add 16-bit floats, so those are staged in fp32 and sent as fp32);
// moves send the elements as they are (transport_type).
DType wire_dtype(CollectiveOp op, DType dtype) {
  const bool reduces = op == CollectiveOp::kReduceScatter || op == CollectiveOp::kAllReduce;
  return reduces ? DType::kFloat32 : dtype;
}

// Converts between element types; a plain copy when they are the same.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * dtype_size(src_dtype));
  } else {
    kernels::cast(src, src_dtype, dst, dst_dtype, n);
  }
}

// A derived MPI datatype, freed when it goes out of scope (also when the call using it throws).
struct OwnedDatatype {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  OwnedDatatype() = default;
  OwnedDatatype(const OwnedDatatype&) = delete;
  OwnedDatatype& operator=(const OwnedDatatype&) = delete;
  ~OwnedDatatype() {
    if (type != MPI_DATATYPE_NULL) MPI_Type_free(&type);
  }
};

class MpiCommunicator final : public backend::CommunicatorBase<Communicator> {
 public:
  MpiCommunicator(std::chrono::milliseconds timeout, size_t max_elements_per_call,
                  CpuTransport transport, MPI_Comm parent = MPI_COMM_WORLD)
      : CommunicatorBase(timeout, parent), max_elements_per_call_(max_elements_per_call) {
    const backend::NodeGroups groups = backend::find_node_groups(mpi_comm_);
    ranks_per_node_ = groups.regular() ? groups.ranks_per_node : 0;
    switch (backend::choose_cpu_path(transport, mpi_comm_, groups)) {
      case backend::CpuPath::kMpi:
        transport_name_ = "mpi";
        break;
      case backend::CpuPath::kSharedMemory:
        shm_ = std::make_unique<backend::SharedMemoryTransport>(mpi_comm_);
        transport_name_ = "shm";
        break;
      case backend::CpuPath::kHierarchical:
        hier_ = std::make_unique<backend::HierarchicalTransport>(mpi_comm_, groups,
                                                                 max_elements_per_call_);
        transport_name_ = "hierarchical (" + std::to_string(groups.nodes) + " nodes x " +
                          std::to_string(groups.ranks_per_node) + " ranks)";
        break;
    }
    stream_ = std::make_unique<Stream>("comm");
    watchdog_.start(nullptr, [this](Clock::time_point now, std::chrono::milliseconds limit) {
      return look(now, limit);
    });
  }

  ~MpiCommunicator() override {
    // Drain first, with the watchdog still on guard: a queued collective that never finishes
    // aborts the job instead of hanging the destructor.
    stream_.reset();
    watchdog_.stop();
  }

  Stream& stream() override { return *stream_; }

  std::string transport() const override { return transport_name_; }

  Event all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    const size_t elem = dtype_size(dtype);
    const bool in_place = backend::check_all_gather(send, recv, count, elem, rank_, size_);
    const MPI_Datatype type = transport_type(dtype);
    return launch(CollectiveOp::kAllGather, {count, dtype, false}, count * size_, [=] {
      if (shm_) {
        shm_->all_gather(send, recv, count * elem);
      } else if (hier_) {
        hier_->all_gather(send, recv, count * elem);
      } else {
        run_all_gather(in_place ? nullptr : send, recv, count, type, elem);
      }
    });
  }

  Event all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    const bool in_place = backend::check_all_gather(send, recv, bytes, 1, rank_, size_);
    return launch(CollectiveOp::kAllGather, {bytes, DType::kFloat32, true}, bytes * size_, [=] {
      if (shm_) {
        shm_->all_gather(send, recv, bytes);
      } else if (hier_) {
        hier_->all_gather(send, recv, bytes);
      } else {
        run_all_gather(in_place ? nullptr : send, recv, bytes, MPI_BYTE, 1);
      }
    });
  }

  Event reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    const bool in_place = backend::check_reduce_scatter(send, recv, count, dtype, rank_, size_);
    return launch(CollectiveOp::kReduceScatter, {count, dtype, false}, count * size_, [=] {
      if (shm_) {
        shm_->reduce_scatter(send, recv, count, dtype);
      } else if (hier_) {
        hier_->reduce_scatter(send, recv, count, dtype,
                              staging(CollectiveOp::kReduceScatter, count, dtype));
      } else {
        run_reduce_scatter(send, recv, count, dtype, in_place);
      }
    });
  }

  Event all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    const bool in_place = backend::check_all_reduce(send, recv, count, dtype, size_);
    return launch(CollectiveOp::kAllReduce, {count, dtype, false}, count, [=] {
      if (shm_) {
        shm_->all_reduce(send, recv, count, dtype);
      } else if (hier_) {
        hier_->all_reduce(send, recv, count, dtype,
                          staging(CollectiveOp::kAllReduce, count, dtype));
      } else {
        run_all_reduce(in_place ? nullptr : send, recv, count, dtype);
      }
    });
  }

  Event broadcast(void* buffer, size_t count, DType dtype, int root) override {
    backend::check_broadcast(buffer, count, dtype, root, size_);
    return launch(CollectiveOp::kBroadcast, {count, dtype, false}, count,
                  [=] { run_broadcast(buffer, count, dtype, root); });
  }

  Event barrier() override {
    return launch(CollectiveOp::kBarrier, {0, DType::kFloat32, false}, 0,
                  [this] { ZERO_MPI_CHECK(MPI_Barrier(mpi_comm_)); });
  }

  // MPI on every transport: the shared-memory and hierarchical paths have no all-to-all of
  // their own, and MPI's moves each block once.
  Event all_to_all_bytes(const void* send, void* recv, size_t bytes) override {
    backend::check_all_to_all(send, recv, bytes, size_);
    return launch(CollectiveOp::kAllToAll, {bytes, DType::kFloat32, true}, bytes * size_,
                  [=] { run_all_to_all(send, recv, bytes); });
  }

  // The MPI figure also with shared memory, which stages in its window instead: a plan made
  // without MPI (mpi_staging_bytes) then still matches what a run allocates on one node. The
  // hierarchical path keeps its fp32 partial sums here too, so a run across nodes may stage
  // more than that plan (fp32 reductions: up to 2 x nodes x count elements).
  size_t staging_bytes(CollectiveOp op, size_t count, DType dtype) const override {
    const size_t mpi = mpi_staging_bytes(op, count, dtype, size_, max_elements_per_call_);
    return hier_ ? std::max(mpi, hier_->staging_bytes(op, count)) : mpi;
  }

  void set_staging_buffer(void* data, size_t bytes) override {
    ZERO_CHECK(data != nullptr || bytes == 0,
               "set_staging_buffer: null buffer of " << bytes << " bytes");
    ZERO_CHECK(reinterpret_cast<uintptr_t>(data) % alignof(float) == 0,
               "set_staging_buffer: buffer " << data << " is not aligned for fp32 (4 bytes)");
    // The worker may be staging in the old buffer until the queue drains; after that it is
    // idle, and the next enqueue orders these writes before its next read.
    stream_->synchronize();
    staging_ = {true, static_cast<float*>(data), bytes};
    std::vector<float>().swap(own_staging_);
  }

  void clear_staging_buffer() override {
    stream_->synchronize();
    staging_ = {};
  }

  bool reserve_shared(size_t bytes) override {
    if (!shm_) return false;
    // The worker is idle once the queue drains: the window's collective calls cannot meet a
    // collective of its on the same communicator.
    stream_->synchronize();
    return shm_->reserve_heap(bytes);
  }

  void* allocate_shared(size_t bytes) override {
    return shm_ && bytes > 0 ? shm_->allocate(bytes) : nullptr;
  }

  bool free_shared(void* data) noexcept override {
    if (!shm_ || data == nullptr || !shm_->owns(data)) return false;
    try {
      return shm_->free(data);
    } catch (...) {
      // Ours all the same (a lock or the free list failed): it stays mapped, unused, until the
      // window's end, and must not go to any other deallocator.
      return true;
    }
  }

  uint64_t direct_collectives() const override { return shm_ ? shm_->direct_calls() : 0; }

  int ranks_per_node() const { return ranks_per_node_; }

  uint64_t peer_memory_mapped_bytes() const override {
    return shm_ ? shm_->peer_bytes_mapped() : 0;
  }

 private:
  // What the watchdog watches: the collective the worker is inside, if any.
  struct Running {
    bool active = false;
    CollectiveOp op = CollectiveOp::kBarrier;
    uint64_t sequence = 0;
    Payload payload;
    Clock::time_point start;
  };

  // Counts (`wire_elements`: the elements of the buffer its MPI calls send), numbers and
  // records the op, then enqueues `body` between the watchdog's start and stop marks, preceded
  // by the desync check when that is on (decided now, so a later set_desync_check never changes
  // a collective already queued on some ranks) and by the staging check.
  template <typename Body>
  Event launch(CollectiveOp op, Payload payload, uint64_t wire_elements, Body body) {
    // The ring lower bound of the MPI calls made, in the element type they carry; the
    // shared-memory and hierarchical paths move every element type as it is (the hierarchical
    // path's fp32 partial sums across nodes are what the step benchmark measures on the links).
    const bool own_path = (shm_ || hier_) && op != CollectiveOp::kBroadcast;
    const DType wire = own_path ? payload.dtype : wire_dtype(op, payload.dtype);
    const size_t wire_element_bytes = payload.bytes ? 1 : dtype_size(wire);
    const uint64_t sequence = record_launch(
        op, payload, bytes_sent_per_rank(op, wire_elements * wire_element_bytes, size_));
    const bool check_desync = desync_check();
    return stream_->enqueue([this, op, sequence, payload, check_desync, body] {
      recorder_.started(sequence);
      start_watch(op, sequence, payload);
      struct StopWatch {
        MpiCommunicator* self;
        ~StopWatch() { self->stop_watch(); }
      } stop_on_exit{this};
      try {
        if (check_desync) agree_on_collective(sequence, op, payload);
        check_staging(op, payload.count, payload.dtype);
        body();
      } catch (const std::exception& e) {
        recorder_.finished(sequence, false);
        report_failure(op, sequence, e.what());
        throw;
      }
      recorder_.finished(sequence, true);
    });
  }

  // The waiting thread rethrows the error; the record printed here shows what ran around it.
  void report_failure(CollectiveOp op, uint64_t sequence, const char* what) const {
    print_report(collective_label(op, sequence) + " failed: " + what);
  }

  // Largest piece of `remaining` elements one MPI call may carry (MPI counts are int).
  size_t piece(size_t remaining) const { return std::min(remaining, max_elements_per_call_); }

  // Before any MPI call of the collective: a provided buffer too small for it is an error here,
  // on every rank alike, instead of a write past its end.
  void check_staging(CollectiveOp op, size_t count, DType dtype) const {
    if (!staging_.provided) return;
    const size_t needed = staging_bytes(op, count, dtype);
    ZERO_CHECK(needed <= staging_.bytes, collective_op_name(op)
                                             << " of " << count << " elements of "
                                             << dtype_name(dtype) << " needs " << needed
                                             << " bytes of staging memory, but the staging buffer "
                                                "provided (set_staging_buffer) holds "
                                             << staging_.bytes << " bytes");
  }

  // The fp32 staging memory of one collective, staging_bytes(op, count, dtype) long: the
  // provided buffer (check_staging has compared the sizes), else the worker's own, grown to fit.
  float* staging(CollectiveOp op, size_t count, DType dtype) {
    if (staging_.provided) return staging_.data;
    const size_t n = staging_bytes(op, count, dtype) / sizeof(float);
    if (own_staging_.size() < n) own_staging_.resize(n);
    return own_staging_.data();
  }

  // `count` elements of `type`, `elem` bytes each. send == nullptr: in place (this rank's block
  // of recv already holds its contribution).
  void run_all_gather(const void* send, void* recv, size_t count, MPI_Datatype type, size_t elem) {
    if (count == 0) return;
    if (count <= max_elements_per_call_) {
      const int n = static_cast<int>(count);
      ZERO_MPI_CHECK(MPI_Allgather(send ? send : MPI_IN_PLACE, n, type, recv, n, type, mpi_comm_));
      return;
    }
    // Split: one call moves elements [offset, offset + n) of every rank's block. The receive
    // type is n elements stretched to the extent of a whole block, so rank r's piece lands at
    // recv + (r * count + offset) elements, and MPI_IN_PLACE finds this rank's piece there too.
    for (size_t offset = 0; offset < count;) {
      const size_t n = piece(count - offset);
      OwnedDatatype contiguous, block;
      ZERO_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(n), type, &contiguous.type));
      ZERO_MPI_CHECK(MPI_Type_create_resized(contiguous.type, 0,
                                             static_cast<MPI_Aint>(count * elem), &block.type));
      ZERO_MPI_CHECK(MPI_Type_commit(&block.type));
      const void* piece_send = send ? bytes_at(send, offset * elem) : MPI_IN_PLACE;
      ZERO_MPI_CHECK(MPI_Allgather(piece_send, static_cast<int>(n), type,
                                   bytes_at(recv, offset * elem), 1, block.type, mpi_comm_));
      offset += n;
    }
  }

  // Split as all_gather's: one call moves bytes [offset, offset + n) of every block, each side
  // typed as n bytes stretched to a whole block's extent.
  void run_all_to_all(const void* send, void* recv, size_t bytes) {
    if (bytes == 0) return;
    if (bytes <= max_elements_per_call_) {
      const int n = static_cast<int>(bytes);
      ZERO_MPI_CHECK(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, mpi_comm_));
      return;
    }
    for (size_t offset = 0; offset < bytes;) {
      const size_t n = piece(bytes - offset);
      OwnedDatatype contiguous, block;
      ZERO_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(n), MPI_BYTE, &contiguous.type));
      ZERO_MPI_CHECK(
          MPI_Type_create_resized(contiguous.type, 0, static_cast<MPI_Aint>(bytes), &block.type));
      ZERO_MPI_CHECK(MPI_Type_commit(&block.type));
      ZERO_MPI_CHECK(MPI_Alltoall(bytes_at(send, offset), 1, block.type, bytes_at(recv, offset), 1,
                                  block.type, mpi_comm_));
      offset += n;
    }
  }

  void run_reduce_scatter(const void* send, void* recv, size_t count, DType dtype, bool in_place) {
    if (count == 0) return;
    if (dtype == DType::kFloat32 && count <= max_elements_per_call_) {
      // In place, recv lies inside send, which MPI forbids: reduce into staging, then copy.
      float* out = in_place ? staging(CollectiveOp::kReduceScatter, count, dtype)
                            : static_cast<float*>(recv);
      ZERO_MPI_CHECK(MPI_Reduce_scatter_block(send, out, static_cast<int>(count), MPI_FLOAT,
                                              MPI_SUM, mpi_comm_));
      if (in_place) std::memcpy(recv, out, count * sizeof(float));
      return;
    }
    // Staged in fp32, because MPI cannot sum 16-bit floats and because a count above the
    // per-call limit must be split: each pass gathers elements [offset, offset + n) of every
    // rank's block into staging (converting to fp32), sums them in place, and converts this
    // rank's sum (left at the front of staging) back into recv. In place, a pass writes only the
    // range of this rank's block that it has already read.
    const size_t elem = dtype_size(dtype);
    float* staged = staging(CollectiveOp::kReduceScatter, count, dtype);
    for (size_t offset = 0; offset < count;) {
      const size_t n = piece(count - offset);
      for (int r = 0; r < size_; ++r) {
        convert(bytes_at(send, (r * count + offset) * elem), dtype, staged + r * n, DType::kFloat32,
                n);
      }
      ZERO_MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, staged, static_cast<int>(n), MPI_FLOAT,
                                              MPI_SUM, mpi_comm_));
      convert(staged, DType::kFloat32, bytes_at(recv, offset * elem), dtype, n);
      offset += n;
    }
  }

  // send == nullptr: in place.
  void run_all_reduce(const void* send, void* recv, size_t count, DType dtype) {
    const size_t elem = dtype_size(dtype);
    for (size_t offset = 0; offset < count;) {
      const size_t n = piece(count - offset);
      void* piece_recv = bytes_at(recv, offset * elem);
      const void* piece_send = send ? bytes_at(send, offset * elem) : piece_recv;
      if (dtype == DType::kFloat32) {
        ZERO_MPI_CHECK(MPI_Allreduce(send ? piece_send : MPI_IN_PLACE, piece_recv,
                                     static_cast<int>(n), MPI_FLOAT, MPI_SUM, mpi_comm_));
      } else {
        // MPI cannot sum 16-bit floats: sum in fp32 and round once, as the interface promises.
        float* staged = staging(CollectiveOp::kAllReduce, count, dtype);
        convert(piece_send, dtype, staged, DType::kFloat32, n);
        ZERO_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, staged, static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                                     mpi_comm_));
        convert(staged, DType::kFloat32, piece_recv, dtype, n);
      }
      offset += n;
    }
  }

  void run_broadcast(void* buffer, size_t count, DType dtype, int root) {
    const size_t elem = dtype_size(dtype);
    for (size_t offset = 0; offset < count;) {
      const size_t n = piece(count - offset);
      ZERO_MPI_CHECK(MPI_Bcast(bytes_at(buffer, offset * elem), static_cast<int>(n),
                               transport_type(dtype), root, mpi_comm_));
      offset += n;
    }
  }

  // --- watchdog -------------------------------------------------------------------------------

  void start_watch(CollectiveOp op, uint64_t sequence, const Payload& payload) {
    const auto lock = watchdog_.lock();
    running_ = {true, op, sequence, payload, Clock::now()};
  }

  void stop_watch() {
    const auto lock = watchdog_.lock();
    running_.active = false;
  }

  // The watchdog needs no wake-up per collective: when idle it sleeps a whole timeout (a
  // collective starting later has a later deadline), when one is running it sleeps until that
  // one's deadline, then looks again. Only stop and set_timeout wake it.
  Clock::time_point look(Clock::time_point now, std::chrono::milliseconds timeout) {
    if (running_.active && now - running_.start >= timeout) {
      abort_collective(running_.op, running_.sequence, running_.payload,
                       backend::not_finished_after(now - running_.start));
    }
    return running_.active ? running_.start + timeout : now + timeout;
  }

  const size_t max_elements_per_call_;

  // Set when reduce-scatter, all-gather and all-reduce run over shared memory; used by the
  // worker only.
  std::unique_ptr<backend::SharedMemoryTransport> shm_;
  // Set instead when a job spans nodes of equal, consecutive ranks (node_groups.h).
  std::unique_ptr<backend::HierarchicalTransport> hier_;
  std::string transport_name_;
  int ranks_per_node_ = 0;

  // Staging memory: the worker's, between collectives also the caller's (set_staging_buffer
  // drains the stream before it writes them).
  struct ProvidedStaging {
    bool provided = false;
    float* data = nullptr;
    size_t bytes = 0;
  };
  ProvidedStaging staging_;
  std::vector<float> own_staging_;

  // Shared between the worker and the watchdog, under watchdog_.lock().
  Running running_;

  std::unique_ptr<Stream> stream_;
};

}  // namespace

// fp32 elements one collective stages at a time (the most, in place or not; see run_*): a
// reduce-scatter of 16-bit floats, or one split into pieces, stages every rank's piece; an fp32
// reduce-scatter in place its result (MPI forbids recv inside send); an all-reduce of 16-bit
// floats one piece. A function of op, count, dtype, world size and per-call limit only, so that
// every rank finds the same need and check_staging fails on all ranks or on none.
size_t mpi_staging_bytes(CollectiveOp op, size_t count, DType dtype, int world_size,
                         size_t max_elements_per_call) {
  const size_t piece = std::min(count, max_elements_per_call);
  size_t elements = 0;
  switch (op) {
    case CollectiveOp::kReduceScatter:
      elements = dtype == DType::kFloat32 && count <= max_elements_per_call
                     ? count
                     : piece * static_cast<size_t>(world_size);
      break;
    case CollectiveOp::kAllReduce:
      elements = dtype == DType::kFloat32 ? 0 : piece;
      break;
    case CollectiveOp::kAllGather:
    case CollectiveOp::kBroadcast:
    case CollectiveOp::kBarrier:
    case CollectiveOp::kAllToAll:
      break;
  }
  return elements * sizeof(float);
}

std::unique_ptr<Communicator> make_mpi_communicator() {
  return make_mpi_communicator(static_cast<size_t>(INT_MAX));
}

std::unique_ptr<Communicator> make_mpi_communicator(size_t max_elements_per_call,
                                                    CpuTransport transport) {
  ZERO_CHECK(max_elements_per_call >= 1 && max_elements_per_call <= static_cast<size_t>(INT_MAX),
             "max_elements_per_call must be 1 to INT_MAX, got " << max_elements_per_call);
  return std::make_unique<MpiCommunicator>(backend::timeout_from_environment(),
                                           max_elements_per_call, transport);
}

int ranks_per_node(const Communicator& comm) {
  const auto* mpi = dynamic_cast<const MpiCommunicator*>(&comm);
  return mpi == nullptr ? 0 : mpi->ranks_per_node();
}

std::unique_ptr<Communicator> make_mpi_communicator_split(int color, int key) {
  ZERO_CHECK(color >= 0, "a communicator's color must be >= 0, got " << color);
  MPI_Comm group = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &group));
  // The communicator keeps a duplicate of the split group (as it does of the world), so the
  // split itself is freed here, also when the construction throws.
  std::unique_ptr<Communicator> comm;
  try {
    comm = std::make_unique<MpiCommunicator>(backend::timeout_from_environment(),
                                             static_cast<size_t>(INT_MAX),
                                             CpuTransport::kFromEnvironment, group);
  } catch (...) {
    // Unchecked: the error being thrown is the one to report.
    MPI_Comm_free(&group);
    throw;
  }
  ZERO_MPI_CHECK(MPI_Comm_free(&group));
  return comm;
}

int mpi_world_rank() {
  int rank = 0;
  ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

}  // namespace zero
