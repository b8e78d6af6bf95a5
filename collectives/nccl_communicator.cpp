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
#include <condition_variable>
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
#include "zero/collectives/flight_recorder.h"
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

using Clock = std::chrono::steady_clock;

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

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  NcclCommunicatorImpl(std::chrono::milliseconds timeout, int requested_device)
      : desync_check_(backend::desync_check_from_environment()), timeout_(timeout) {
    int initialized = 0;
    ZERO_MPI_CHECK(MPI_Initialized(&initialized));
    ZERO_CHECK(initialized, "MPI is not initialized: create a zero::MpiSession first");
    // Our own MPI communicator: the unique id and the desync check travel on it.
    ZERO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &mpi_comm_));
    ZERO_MPI_CHECK(MPI_Comm_set_errhandler(mpi_comm_, MPI_ERRORS_RETURN));
    ZERO_MPI_CHECK(MPI_Comm_rank(mpi_comm_, &rank_));
    ZERO_MPI_CHECK(MPI_Comm_size(mpi_comm_, &size_));

    // The GPU: the rank's place among the ranks of its node, unless the caller chose one.
    MPI_Comm node = MPI_COMM_NULL;
    ZERO_MPI_CHECK(
        MPI_Comm_split_type(mpi_comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
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
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicatorImpl() override {
    // Drain first, with the watchdog still on guard: a collective that never finishes aborts
    // the job instead of hanging the destructor.
    try {
      stream_->synchronize();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero: rank %d: draining the NCCL stream failed: %s\n", rank_, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      watch_stop_ = true;
    }
    watch_changed_.notify_one();
    watchdog_.join();
    stream_.reset();
    if (cudaFree(barrier_word_) != cudaSuccess || ncclCommDestroy(comm_) != ncclSuccess) {
      std::fprintf(stderr, "zero: rank %d: releasing the NCCL communicator failed\n", rank_);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int device() const override { return device_; }
  Stream& stream() override { return *stream_; }
  const CommCounters& counters() const override { return counters_; }

  void set_timeout(std::chrono::milliseconds timeout) override {
    ZERO_CHECK(timeout.count() > 0,
               "collective timeout must be positive, got " << timeout.count() << " ms");
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      timeout_ = std::min(timeout, backend::kLongestTimeout);
    }
    watch_changed_.notify_one();
  }

  void set_desync_check(bool enabled) override { desync_check_ = enabled; }
  bool desync_check() const override { return desync_check_; }

  std::string flight_record() const override { return recorder_.format(rank_); }

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
    backend::check_all_gather(send, recv, count, dtype, rank_, size_);
    check_device_buffers(send, recv, count, "all_gather");
    const size_t block_bytes = count * dtype_size(dtype);
    return launch(CollectiveOp::kAllGather, count, dtype, block_bytes * size_, [=] {
      ZERO_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, cuda_stream_));
    });
  }

  Event reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    backend::check_reduce_scatter(send, recv, count, dtype, rank_, size_);
    check_device_buffers(send, recv, count, "reduce_scatter");
    const size_t block_bytes = count * dtype_size(dtype);
    return launch(CollectiveOp::kReduceScatter, count, dtype, block_bytes * size_, [=] {
      ZERO_NCCL_CHECK(
          ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum, comm_, cuda_stream_));
    });
  }

  Event all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    backend::check_all_reduce(send, recv, count, dtype, size_);
    check_device_buffers(send, recv, count, "all_reduce");
    return launch(CollectiveOp::kAllReduce, count, dtype, count * dtype_size(dtype), [=] {
      ZERO_NCCL_CHECK(
          ncclAllReduce(send, recv, count, nccl_type(dtype), ncclSum, comm_, cuda_stream_));
    });
  }

  Event broadcast(void* buffer, size_t count, DType dtype, int root) override {
    backend::check_broadcast(buffer, count, dtype, root, size_);
    check_device_buffers(buffer, buffer, count, "broadcast");
    return launch(CollectiveOp::kBroadcast, count, dtype, count * dtype_size(dtype), [=] {
      ZERO_NCCL_CHECK(
          ncclBroadcast(buffer, buffer, count, nccl_type(dtype), root, comm_, cuda_stream_));
    });
  }

  // NCCL has no barrier: an all-reduce of one word does the same, and is counted as a barrier.
  Event barrier() override {
    return launch(CollectiveOp::kBarrier, 0, DType::kFloat32, 0, [this] {
      ZERO_NCCL_CHECK(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_,
                                    cuda_stream_));
    });
  }

 private:
  // A collective issued on the stream and not yet seen finished by the watchdog.
  struct Pending {
    CollectiveOp op = CollectiveOp::kBarrier;
    uint64_t sequence = 0;
    size_t count = 0;
    DType dtype = DType::kFloat32;
    std::shared_ptr<CudaEvent> start;  // complete when the collective can begin
    std::shared_ptr<CudaEvent> done;   // complete when it has finished
    bool started = false;              // watchdog only: start seen complete, at started_at
    Clock::time_point started_at;
  };

  void check_device_buffers(const void* send, const void* recv, size_t count, const char* op) {
    if (count == 0) return;
    check_device_memory(send, op);
    check_device_memory(recv, op);
  }

  // Counts the op (on the calling thread, like the MPI backend), gives it the next sequence
  // number and issues it; inside a group the events are recorded at end_group().
  template <typename Issue>
  Event launch(CollectiveOp op, size_t count, DType dtype, uint64_t buffer_bytes, Issue issue) {
    const auto index = static_cast<size_t>(op);
    counters_.calls[index] += 1;
    counters_.bytes[index] += backend::bytes_sent(op, buffer_bytes, size_);
    const uint64_t sequence = next_sequence_++;
    recorder_.enqueued(sequence, op, dtype, count);
    if (desync_check_) agree_on_collective(sequence, op, dtype, count);
    Pending p;
    p.op = op;
    p.sequence = sequence;
    p.count = count;
    p.dtype = dtype;
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

  // The desync check, as in the MPI backend: every rank learns every rank's next collective (on
  // the host, over MPI, as it is issued), and on a mismatch all of them report and abort.
  void agree_on_collective(uint64_t sequence, CollectiveOp op, DType dtype, size_t count) {
    const uint64_t mine[4] = {sequence, static_cast<uint64_t>(op), static_cast<uint64_t>(dtype),
                              count};
    std::vector<uint64_t> all(4 * static_cast<size_t>(size_));
    ZERO_MPI_CHECK(MPI_Allgather(mine, 4, MPI_UINT64_T, all.data(), 4, MPI_UINT64_T, mpi_comm_));
    auto same = [&](int r) {
      return std::equal(all.begin(), all.begin() + 4, all.begin() + 4 * r);
    };
    int other = 1;
    while (other < size_ && same(other)) ++other;
    if (other == size_) return;
    auto text = [&](int r) {
      const uint64_t* d = all.data() + 4 * r;
      return describe_collective(static_cast<CollectiveOp>(d[1]), d[3], static_cast<DType>(d[2]));
    };
    const uint64_t first_sequence = all[0], other_sequence = all[4 * static_cast<size_t>(other)];
    std::string message = "zero: collective desync";
    if (first_sequence == other_sequence) {
      message += " at #" + std::to_string(first_sequence) + ": rank 0 called " + text(0) +
                 ", rank " + std::to_string(other) + " called " + text(other);
    } else {
      message += ": rank 0 called " + text(0) + " as #" + std::to_string(first_sequence) +
                 ", rank " + std::to_string(other) + " called " + text(other) + " as #" +
                 std::to_string(other_sequence);
    }
    recorder_.finished(sequence, false);
    std::fprintf(stderr, "%s\n%s", message.c_str(), recorder_.format(rank_).c_str());
    std::fflush(stderr);
    // Every rank reaches this point, so the barrier cannot hang; if it fails, abort anyway.
    if (MPI_Barrier(mpi_comm_) != MPI_SUCCESS) {
      std::fprintf(stderr, "zero: rank %d: MPI_Barrier before the desync abort failed\n", rank_);
    }
    ncclCommAbort(comm_);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();
  }

  void track(Pending p) {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      pending_.push_back(std::move(p));
    }
    watch_changed_.notify_one();
  }

  // --- watchdog -------------------------------------------------------------------------------

  // Idle, it sleeps until a collective is tracked; otherwise it looks every kPollInterval:
  // finished collectives are dropped from the front, the oldest unfinished one is timed from
  // the moment its start event was seen complete, and NCCL's asynchronous error is checked.
  void watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!watch_stop_) {
      if (pending_.empty()) {
        watch_changed_.wait(lock, [&] { return watch_stop_ || !pending_.empty(); });
        continue;
      }
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
          const Clock::time_point now = Clock::now();
          if (!head.started && head.start->query()) {
            head.started = true;
            head.started_at = now;
            recorder_.started(head.sequence);
          }
          if (head.started && now - head.started_at >= timeout_) {
            const double seconds = std::chrono::duration<double>(now - head.started_at).count();
            char text[64];
            std::snprintf(text, sizeof(text), "has not finished after %.1f s", seconds);
            abort_job(&head, text);
          }
        }
      } catch (const std::exception& e) {
        // A CUDA error while polling (e.g. a kernel fault on this device) ends the job as well.
        abort_job(pending_.empty() ? nullptr : &pending_.front(), e.what());
      }
      watch_changed_.wait_for(lock, std::min<Clock::duration>(kPollInterval, timeout_));
    }
  }

  // The MPI backend's report ("zero: rank R: collective OP #N (C elements of T, B bytes) ...;
  // aborting the job"), then ncclCommAbort, which frees a rank stuck inside NCCL, then the job.
  [[noreturn]] void abort_job(const Pending* op, const std::string& what) {
    if (op != nullptr) {
      std::fprintf(stderr,
                   "zero: rank %d: collective %s #%llu (%zu elements of %s, %zu bytes) %s; "
                   "aborting the job\n",
                   rank_, collective_op_name(op->op), static_cast<unsigned long long>(op->sequence),
                   op->count, dtype_name(op->dtype), op->count * dtype_size(op->dtype),
                   what.c_str());
    } else {
      std::fprintf(stderr, "zero: rank %d: NCCL communicator %s; aborting the job\n", rank_,
                   what.c_str());
    }
    std::fputs(recorder_.format(rank_).c_str(), stderr);
    std::fflush(stderr);
    ncclCommAbort(comm_);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::abort();  // MPI_Abort does not return; if an implementation did, still stop here
  }

  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  FlightRecorder recorder_;  // enqueued by the calling thread, started/finished by the watchdog
  std::unique_ptr<Stream> stream_;
  cudaStream_t cuda_stream_ = nullptr;
  float* barrier_word_ = nullptr;

  // Calling thread only.
  CommCounters counters_;
  uint64_t next_sequence_ = 1;
  bool in_group_ = false;
  std::vector<Pending> group_;
  bool desync_check_;

  // Shared between the calling thread and the watchdog, under watch_mutex_.
  std::mutex watch_mutex_;
  std::condition_variable watch_changed_;
  bool watch_stop_ = false;
  std::chrono::milliseconds timeout_;
  std::deque<Pending> pending_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<NcclCommunicator> make_nccl_communicator(int device) {
  return std::make_unique<NcclCommunicatorImpl>(backend::timeout_from_environment(), device);
}

}  // namespace zero
