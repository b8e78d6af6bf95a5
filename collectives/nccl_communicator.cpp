// The NCCL backend of the Communicator (device memory).
//
// Each collective is validated and counted on the calling thread, as in the MPI backend, then
// issued at once on the communicator's CUDA stream between two CUDA events: one that completes
// when the collective can start (everything before it on the stream has run) and one when it
// has finished. A watchdog thread polls the oldest unfinished collective's events and
// ncclCommGetAsyncError; a collective that has run longer than the timeout, or an error inside
// NCCL, is reported in the MPI backend's format, and the communicator and the job are aborted.
#include "zero/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend_common.h"
#include "cuda_event.h"
#include "zero/collectives/cuda_stream.h"
#include "zero/kernels/cuda_check.h"

// ZERO_NCCL_CHECK(ncclXxx(...)): throws zero::Error naming the call and NCCL's error text.
#define ZERO_NCCL_CHECK(call)                                                     \
  do {                                                                            \
    const ncclResult_t zero_nccl_rc_ = (call);                                    \
    if (zero_nccl_rc_ != ncclSuccess) {                                           \
      ZERO_FAIL(#call << " failed: " << ncclGetErrorString(zero_nccl_rc_) << " (" \
                      << ncclGetLastError(nullptr) << ")");                       \
    }                                                                             \
  } while (0)

namespace zero {
namespace {

using backend::Clock;
using backend::Payload;

// How often the watchdog looks at a running collective. Polling (not a blocking wait) is what
// CUDA offers; ten looks a second cost nothing beside a collective and keep the report prompt.
constexpr std::chrono::milliseconds kPollInterval{100};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
  }
  ZERO_FAIL("unknown dtype " << static_cast<int>(dtype));
}

// NCCL reads and writes device memory only; a host pointer would fault inside a kernel, far
// from the call that passed it.
void check_device_memory(const void* p, const char* op) {
  if (p == nullptr) return;
  cudaPointerAttributes attributes{};
  ZERO_CUDA_CHECK(cudaPointerGetAttributes(&attributes, p));
  ZERO_CHECK(attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged,
             op << ": buffer " << p
                << " is not device memory (the NCCL communicator works on device memory)");
}

// The MPI communicator of CommunicatorBase carries the unique id and the desync check.
class NcclCommunicatorImpl final : public backend::CommunicatorBase<NcclCommunicator> {
 public:
  NcclCommunicatorImpl(std::chrono::milliseconds timeout, int requested_device,
                       MPI_Comm parent = MPI_COMM_WORLD)
      : CommunicatorBase(timeout, parent) {
    // The GPU: the rank's place among the ranks of its node, unless the caller chose one. Over
    // the world, so a group's communicator uses the GPU its rank's world communicator does.
    int world_rank = 0;
    ZERO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    MPI_Comm node = MPI_COMM_NULL;
    ZERO_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank,
                                       MPI_INFO_NULL, &node));
    struct FreeComm {
      MPI_Comm* comm;
      ~FreeComm() { MPI_Comm_free(comm); }
    } free_node{&node};
    int local_rank = 0, local_size = 1;
    ZERO_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
    ZERO_MPI_CHECK(MPI_Comm_size(node, &local_size));
    int devices = 0;
    ZERO_CUDA_CHECK(cudaGetDeviceCount(&devices));
    device_ = requested_device >= 0 ? requested_device : local_rank;
    ZERO_CHECK(device_ < devices, "rank " << rank_ << " would use CUDA device " << device_
                                          << " (local rank " << local_rank << " of " << local_size
                                          << " on its node), but the node has " << devices
                                          << " devices: start at most one rank per GPU");
    ZERO_CUDA_CHECK(cudaSetDevice(device_));

    ncclUniqueId id{};
    if (rank_ == 0) ZERO_NCCL_CHECK(ncclGetUniqueId(&id));
    ZERO_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, mpi_comm_));
    ZERO_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));

    stream_ = make_cuda_stream("comm", device_);
    cuda_stream_ = cuda_stream_handle(*stream_);
    ZERO_CUDA_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
    ZERO_CUDA_CHECK(cudaMemsetAsync(barrier_word_, 0, sizeof(float), cuda_stream_));
    watchdog_.start([this] { cudaSetDevice(device_); },
                    [this](Clock::time_point now, std::chrono::milliseconds limit) {
                      return look(now, limit);
                    });
  }

  ~NcclCommunicatorImpl() override {
    // Drain first, with the watchdog still on guard: a collective that never finishes aborts
    // the job instead of hanging the destructor.
    try {
      stream_->synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero: rank %d: draining the NCCL stream failed: %s\n", rank_, e.what());
    }
    watchdog_.stop();
    stream_.reset();
    if (cudaFree(barrier_word_) != cudaSuccess || ncclCommDestroy(comm_) != ncclSuccess) {
      std::fprintf(stderr, "zero: rank %d: releasing the NCCL communicator failed\n", rank_);
    }
  }

  int device() const override { return device_; }
  Stream& stream() override { return *stream_; }
  std::string transport() const override { return "nccl"; }

  // NCCL reduces 16-bit floats natively, on the caller's device buffers (in place included):
  // nothing is staged, so no collective needs the memory a caller provides.
  size_t staging_bytes(CollectiveOp, size_t, DType) const override { return 0; }
  void set_staging_buffer(void*, size_t) override {}
  void clear_staging_buffer() override {}

  void begin_group() override {
    ZERO_CHECK(!in_group_, "begin_group: a group is already open (groups do not nest)");
    ZERO_NCCL_CHECK(ncclGroupStart());
    in_group_ = true;
  }

  void end_group() override {
    ZERO_CHECK(in_group_, "end_group without begin_group");
    in_group_ = false;
    std::vector<Pending> group = std::move(group_);
    group_.clear();
    // The start event goes before ncclGroupEnd, which is where the group's work is enqueued.
    auto start = std::make_shared<CudaEvent>(device_);
    start->record(cuda_stream_);
    ZERO_NCCL_CHECK(ncclGroupEnd());
    for (Pending& p : group) {
      p.done->record(cuda_stream_);
      p.start = start;
      track(std::move(p));
    }
  }

  Event all_gather(const void* send, void* recv, size_t count, DType dtype) override {
    return gather({count, dtype, false}, send, recv, nccl_type(dtype));
  }

  Event all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    return gather({bytes, DType::kFloat32, true}, send, recv, ncclUint8);
  }

  // One send and one receive per peer in one NCCL group (NCCL has no all-to-all call); this
  // rank's own block is a device copy on the same stream.
  Event all_to_all_bytes(const void* send, void* recv, size_t bytes) override {
    backend::check_all_to_all(send, recv, bytes, size_);
    check_device_buffers(send, recv, bytes, "all_to_all");
    return launch(CollectiveOp::kAllToAll, {bytes, DType::kFloat32, true},
                  sent(CollectiveOp::kAllToAll, bytes * size_), [=] {
                    const char* from = static_cast<const char*>(send);
                    char* to = static_cast<char*>(recv);
                    ZERO_CUDA_CHECK(cudaMemcpyAsync(to + rank_ * bytes, from + rank_ * bytes, bytes,
                                                    cudaMemcpyDeviceToDevice, cuda_stream_));
                    ZERO_NCCL_CHECK(ncclGroupStart());
                    for (int peer = 0; peer < size_; ++peer) {
                      if (peer == rank_) continue;
                      ZERO_NCCL_CHECK(ncclSend(from + peer * bytes, bytes, ncclUint8, peer, comm_,
                                               cuda_stream_));
                      ZERO_NCCL_CHECK(
                          ncclRecv(to + peer * bytes, bytes, ncclUint8, peer, comm_, cuda_stream_));
                    }
                    ZERO_NCCL_CHECK(ncclGroupEnd());
                  });
  }

  Event reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    backend::check_reduce_scatter(send, recv, count, dtype, rank_, size_);
    check_device_buffers(send, recv, count, "reduce_scatter");
    const size_t block_bytes = count * dtype_size(dtype);
    return launch(CollectiveOp::kReduceScatter, {count, dtype, false},
                  sent(CollectiveOp::kReduceScatter, block_bytes * size_), [=] {
                    ZERO_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum,
                                                      comm_, cuda_stream_));
                  });
  }

  Event all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    backend::check_all_reduce(send, recv, count, dtype, size_);
    check_device_buffers(send, recv, count, "all_reduce");
    return launch(CollectiveOp::kAllReduce, {count, dtype, false},
                  sent(CollectiveOp::kAllReduce, count * dtype_size(dtype)), [=] {
                    ZERO_NCCL_CHECK(ncclAllReduce(send, recv, count, nccl_type(dtype), ncclSum,
                                                  comm_, cuda_stream_));
                  });
  }

  Event broadcast(void* buffer, size_t count, DType dtype, int root) override {
    backend::check_broadcast(buffer, count, dtype, root, size_);
    check_device_buffers(buffer, buffer, count, "broadcast");
    return launch(CollectiveOp::kBroadcast, {count, dtype, false},
                  sent(CollectiveOp::kBroadcast, count * dtype_size(dtype)), [=] {
                    ZERO_NCCL_CHECK(ncclBroadcast(buffer, buffer, count, nccl_type(dtype), root,
                                                  comm_, cuda_stream_));
                  });
  }

  // NCCL has no barrier: an all-reduce of one word does the same. It is counted as a barrier,
  // with the bytes that all-reduce sends.
  Event barrier() override {
    return launch(CollectiveOp::kBarrier, {0, DType::kFloat32, false},
                  bytes_sent_per_rank(CollectiveOp::kAllReduce, sizeof(float), size_), [this] {
                    ZERO_NCCL_CHECK(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32,
                                                  ncclSum, comm_, cuda_stream_));
                  });
  }

 private:
  // A collective issued on the stream and not yet seen finished by the watchdog.
  struct Pending {
    CollectiveOp op = CollectiveOp::kBarrier;
    uint64_t sequence = 0;
    Payload payload;
    std::shared_ptr<CudaEvent> start;  // complete when the collective can begin
    std::shared_ptr<CudaEvent> done;   // complete when it has finished
    bool started = false;              // watchdog only: start seen complete, at started_at
    Clock::time_point started_at;
  };

  // all_gather and all_gather_bytes: `payload.count` elements of `type` from every rank.
  Event gather(const Payload& payload, const void* send, void* recv, ncclDataType_t type) {
    const size_t count = payload.count;
    backend::check_all_gather(send, recv, count, payload.element_bytes(), rank_, size_);
    check_device_buffers(send, recv, count, "all_gather");
    // NCCL sends every type natively: the requested bytes are the bytes on the wire.
    const size_t block_bytes = count * payload.element_bytes();
    return launch(
        CollectiveOp::kAllGather, payload, sent(CollectiveOp::kAllGather, block_bytes * size_),
        [=] { ZERO_NCCL_CHECK(ncclAllGather(send, recv, count, type, comm_, cuda_stream_)); });
  }

  void check_device_buffers(const void* send, const void* recv, size_t count, const char* op) {
    if (count == 0) return;
    check_device_memory(send, op);
    check_device_memory(recv, op);
  }

  // The bytes this rank sends for a buffer of `buffer_bytes` (as NCCL sends it) under `op`.
  uint64_t sent(CollectiveOp op, uint64_t buffer_bytes) const {
    return bytes_sent_per_rank(op, buffer_bytes, size_);
  }

  // Counts (`sent_bytes`: what this rank's NCCL call sends), numbers and records the op (on the
  // calling thread, like the MPI backend), runs the desync check when that is on (over MPI, as
  // the op is issued), and issues it; inside a group the events are recorded at end_group().
  template <typename Issue>
  Event launch(CollectiveOp op, const Payload& payload, uint64_t sent_bytes, Issue issue) {
    const size_t count = payload.count;
    const uint64_t sequence = record_launch(op, payload, sent_bytes);
    if (desync_check()) agree_on_collective(sequence, op, payload);
    Pending p;
    p.op = op;
    p.sequence = sequence;
    p.payload = payload;
    p.done = std::make_shared<CudaEvent>(device_);
    Event event(std::shared_ptr<const DeviceEvent>(p.done));
    ScopedDevice on(device_);
    if (in_group_) {
      if (count > 0 || op == CollectiveOp::kBarrier) issue();
      group_.push_back(std::move(p));
      return event;
    }
    p.start = std::make_shared<CudaEvent>(device_);
    p.start->record(cuda_stream_);
    if (count > 0 || op == CollectiveOp::kBarrier) issue();
    p.done->record(cuda_stream_);
    track(std::move(p));
    return event;
  }

  void track(Pending p) {
    {
      const auto lock = watchdog_.lock();
      pending_.push_back(std::move(p));
    }
    watchdog_.notify();
  }

  // --- watchdog -------------------------------------------------------------------------------

  // Idle, it sleeps until a collective is tracked; otherwise it looks every kPollInterval:
  // finished collectives are dropped from the front, the oldest unfinished one is timed from
  // the moment its start event was seen complete, and NCCL's asynchronous error is checked.
  Clock::time_point look(Clock::time_point now, std::chrono::milliseconds timeout) {
    if (pending_.empty()) return backend::Watchdog::kUntilNotified;
    try {
      while (!pending_.empty() && pending_.front().done->query()) {
        if (!pending_.front().started) recorder_.started(pending_.front().sequence);
        recorder_.finished(pending_.front().sequence, true);
        pending_.pop_front();
      }
      ncclResult_t async = ncclSuccess;
      ZERO_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_job(pending_.empty() ? nullptr : &pending_.front(),
                  std::string("failed inside NCCL: ") + ncclGetErrorString(async));
      }
      if (!pending_.empty()) {
        Pending& head = pending_.front();
        if (!head.started && head.start->query()) {
          head.started = true;
          head.started_at = now;
          recorder_.started(head.sequence);
        }
        if (head.started && now - head.started_at >= timeout) {
          abort_job(&head, backend::not_finished_after(now - head.started_at));
        }
      }
    } catch (const std::exception& e) {
      // A CUDA error while polling (e.g. a kernel fault on this device) ends the job as well.
      abort_job(pending_.empty() ? nullptr : &pending_.front(), e.what());
    }
    return Clock::now() + std::min<Clock::duration>(kPollInterval, timeout);
  }

  // The MPI backend's report, naming the oldest unfinished collective when there is one.
  [[noreturn]] void abort_job(const Pending* op, const std::string& what) {
    if (op != nullptr) abort_collective(op->op, op->sequence, op->payload, what);
    print_report("zero: rank " + std::to_string(rank_) + ": NCCL communicator " + what +
                 "; aborting the job");
    end_job();
  }

  // Frees a rank stuck inside NCCL, so that MPI_Abort can end it.
  void release_before_abort() override { ncclCommAbort(comm_); }

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<Stream> stream_;
  cudaStream_t cuda_stream_ = nullptr;
  float* barrier_word_ = nullptr;

  // Calling thread only.
  bool in_group_ = false;
  std::vector<Pending> group_;

  // Shared between the calling thread and the watchdog, under watchdog_.lock().
  std::deque<Pending> pending_;
};

}  // namespace

std::unique_ptr<NcclCommunicator> make_nccl_communicator(int device) {
  return std::make_unique<NcclCommunicatorImpl>(backend::timeout_from_environment(), device);
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator_split(int color, int key, int device) {
  ZERO_CHECK(color >= 0, "a communicator's color must be >= 0, got " << color);
  MPI_Comm group = MPI_COMM_NULL;
  ZERO_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &group));
  // The communicator keeps a duplicate of the split group, so the split is freed here, also
  // when the construction throws.
  std::unique_ptr<NcclCommunicator> comm;
  try {
    comm =
        std::make_unique<NcclCommunicatorImpl>(backend::timeout_from_environment(), device, group);
  } catch (...) {
    MPI_Comm_free(&group);  // unchecked: the error being thrown is the one to report
    throw;
  }
  ZERO_MPI_CHECK(MPI_Comm_free(&group));
  return comm;
}

}  // namespace zero
