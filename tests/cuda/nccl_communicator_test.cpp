// The NCCL communicator on device memory, at every rank count the machine has GPUs for (one
// GPU per rank): results of every op and dtype, in place and not, groups, cross-stream order,
// and counters of what each backend sends for the same collectives.
#include <gtest/gtest.h>
#include <mpi.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "spin_kernel.h"
#include "zero/collectives/cuda_stream.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/collectives/nccl_communicator.h"

namespace zero {
namespace {

using zero::testing::DeviceBuffer;

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// Empty when every rank of this node has a GPU of its own, else why the test skips. Every rank
// of a node reaches the same answer, so all of them skip together.
std::string why_not_runnable() {
  const std::string no_device = testing::why_no_cuda_device();
  if (!no_device.empty()) return "no CUDA device: skipping (" + no_device + ")";
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_size = 1;
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < local_size) {
    return "no CUDA device for every rank: skipping (" + std::to_string(local_size) +
           " ranks on this node, " + std::to_string(devices) + " GPUs)";
  }
  return "";
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = why_not_runnable();
    if (!why.empty()) GTEST_SKIP() << why;
    comm = make_nccl_communicator();
    rank = comm->rank();
    size = comm->world_size();
  }

  // Element i of rank r's contribution: small integers, so sums are exact in every dtype.
  static float value(int r, size_t i) { return static_cast<float>((r + 1) * ((i % 13) + 1)); }

  static std::vector<uint8_t> encode(const std::vector<float>& x, DType dtype) {
    std::vector<uint8_t> out(x.size() * dtype_size(dtype));
    for (size_t i = 0; i < x.size(); ++i) store_from_float(out.data(), dtype, i, x[i]);
    return out;
  }

  std::unique_ptr<NcclCommunicator> comm;
  int rank = 0;
  int size = 1;
};

TEST_F(Nccl, AllReduceAllGatherReduceScatterBroadcastInEveryDtype) {
  const size_t count = 100003;
  for (DType dtype : kDTypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const size_t elem = dtype_size(dtype);
    // all_reduce, out of place and in place.
    std::vector<float> mine(count), sum(count, 0.0f);
    for (size_t i = 0; i < count; ++i) {
      mine[i] = value(rank, i);
      for (int r = 0; r < size; ++r) sum[i] += value(r, i);
    }
    DeviceBuffer send(count * elem), recv(count * elem);
    send.upload(encode(mine, dtype).data(), count * elem);
    comm->all_reduce_sync(send.data(), recv.data(), count, dtype);
    EXPECT_EQ(recv.download(count * elem), encode(sum, dtype));
    comm->all_reduce_sync(send.data(), send.data(), count, dtype);
    EXPECT_EQ(send.download(count * elem), encode(sum, dtype));

    // all_gather, out of place and in place (send = recv + rank * count).
    std::vector<float> gathered(count * size);
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < count; ++i) gathered[r * count + i] = value(r, i);
    }
    DeviceBuffer whole(count * size * elem);
    send.upload(encode(mine, dtype).data(), count * elem);
    comm->all_gather_sync(send.data(), whole.data(), count, dtype);
    EXPECT_EQ(whole.download(whole.bytes()), encode(gathered, dtype));
    ZERO_CUDA_CHECK(cudaMemset(whole.data(), 0, whole.bytes()));
    whole.upload(encode(mine, dtype).data(), count * elem, rank * count * elem);
    comm->all_gather_sync(whole.as<char>() + rank * count * elem, whole.data(), count, dtype);
    EXPECT_EQ(whole.download(whole.bytes()), encode(gathered, dtype));

    // reduce_scatter of everyone's copy of `gathered` (scaled by rank + 1), in place too.
    std::vector<float> contribution(count * size), shard(count);
    for (size_t i = 0; i < contribution.size(); ++i) contribution[i] = gathered[i] * (rank + 1);
    for (size_t i = 0; i < count; ++i) {
      shard[i] = 0.0f;
      for (int r = 0; r < size; ++r) shard[i] += gathered[rank * count + i] * (r + 1);
    }
    whole.upload(encode(contribution, dtype).data(), whole.bytes());
    comm->reduce_scatter_sync(whole.data(), recv.data(), count, dtype);
    EXPECT_EQ(recv.download(count * elem), encode(shard, dtype));
    comm->reduce_scatter_sync(whole.data(), whole.as<char>() + rank * count * elem, count, dtype);
    EXPECT_EQ(whole.download(count * elem, rank * count * elem), encode(shard, dtype));

    // broadcast from the last rank.
    send.upload(encode(mine, dtype).data(), count * elem);
    comm->broadcast_sync(send.data(), count, dtype, size - 1);
    std::vector<float> root(count);
    for (size_t i = 0; i < count; ++i) root[i] = value(size - 1, i);
    EXPECT_EQ(send.download(count * elem), encode(root, dtype));
  }
  comm->barrier_sync();
}

// NCCL sends every dtype natively, so its counters are the ring figures of the requested bytes;
// the MPI backend sends 16-bit reductions as fp32 (4 bytes an element), and its barrier moves
// no data where NCCL's is an all-reduce of one fp32 word.
// Block r of each rank's send reaches rank r (sends and receives grouped, the own block copied),
// counted as (N-1)/N of the send buffer.
TEST_F(Nccl, AllToAllBytesDeliversEachBlockToItsRank) {
  const size_t bytes = 1001;
  std::vector<uint8_t> send(bytes * size);
  for (int to = 0; to < size; ++to) {
    for (size_t i = 0; i < bytes; ++i) {
      send[to * bytes + i] = static_cast<uint8_t>(rank * 64 + to * 8 + i);
    }
  }
  DeviceBuffer d_send(send.size()), d_recv(send.size());
  d_send.upload(send.data(), send.size());
  comm->all_to_all_bytes(d_send.data(), d_recv.data(), bytes).wait();
  const std::vector<uint8_t> recv = d_recv.download(send.size());
  for (int from = 0; from < size; ++from) {
    for (size_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(recv[from * bytes + i], static_cast<uint8_t>(from * 64 + rank * 8 + i))
          << "from " << from;
    }
  }
  EXPECT_EQ(comm->counters().bytes[static_cast<size_t>(CollectiveOp::kAllToAll)],
            bytes * static_cast<uint64_t>(size - 1));
}

TEST_F(Nccl, CountersCountWhatEachBackendSends) {
  auto mpi = make_mpi_communicator();
  const size_t count = 1001;
  DeviceBuffer d(count * size * 4);
  std::vector<float> h(count * size);
  for (DType dtype : kDTypes) {
    comm->all_reduce_sync(d.data(), d.data(), count, dtype);
    mpi->all_reduce_sync(h.data(), h.data(), count, dtype);
    comm->all_gather_sync(d.as<char>() + rank * count * dtype_size(dtype), d.data(), count, dtype);
    mpi->all_gather_sync(reinterpret_cast<char*>(h.data()) + rank * count * dtype_size(dtype),
                         h.data(), count, dtype);
    comm->reduce_scatter_sync(d.data(), d.data(), count, dtype);
    mpi->reduce_scatter_sync(h.data(), h.data(), count, dtype);
    comm->broadcast_sync(d.data(), count, dtype, 0);
    mpi->broadcast_sync(h.data(), count, dtype, 0);
  }
  comm->barrier_sync();
  mpi->barrier_sync();
  const uint64_t n = static_cast<uint64_t>(size), m = n - 1;
  std::array<uint64_t, kNumCollectiveOps> nccl_bytes{}, mpi_bytes{};
  auto add = [](std::array<uint64_t, kNumCollectiveOps>& bytes, CollectiveOp op, uint64_t b) {
    bytes[static_cast<size_t>(op)] += b;
  };
  for (DType dtype : kDTypes) {
    const uint64_t elem = dtype_size(dtype);
    for (auto* bytes : {&nccl_bytes, &mpi_bytes}) {
      add(*bytes, CollectiveOp::kAllGather, count * n * elem * m / n);
      add(*bytes, CollectiveOp::kBroadcast, count * elem);
    }
    add(nccl_bytes, CollectiveOp::kAllReduce, count * elem * 2 * m / n);
    add(mpi_bytes, CollectiveOp::kAllReduce, count * 4 * 2 * m / n);
    add(nccl_bytes, CollectiveOp::kReduceScatter, count * n * elem * m / n);
    add(mpi_bytes, CollectiveOp::kReduceScatter, count * n * 4 * m / n);
  }
  add(nccl_bytes, CollectiveOp::kBarrier, 4 * 2 * m / n);
  EXPECT_EQ(comm->counters().bytes, nccl_bytes);
  EXPECT_EQ(mpi->counters().bytes, mpi_bytes);
  EXPECT_EQ(comm->counters().calls, mpi->counters().calls);
}

TEST_F(Nccl, GroupIssuesSeveralCollectivesAtItsEnd) {
  const size_t count = 4097;
  DeviceBuffer a(count * 4), b(count * 2), c(count * 4);
  std::vector<float> ones(count, 1.0f);
  a.upload(ones.data(), count * 4);
  b.upload(encode(ones, DType::kBFloat16).data(), count * 2);
  c.upload(ones.data(), count * 4);
  comm->begin_group();
  EXPECT_THROW(comm->begin_group(), Error);  // groups do not nest
  const Event ea = comm->all_reduce(a.data(), a.data(), count, DType::kFloat32);
  const Event eb = comm->all_reduce(b.data(), b.data(), count, DType::kBFloat16);
  const Event ec = comm->broadcast(c.data(), count, DType::kFloat32, 0);
  EXPECT_FALSE(ea.done());
  EXPECT_THROW(ea.wait(), Error);  // not issued until end_group
  comm->end_group();
  ea.wait();
  eb.wait();
  ec.wait();
  const std::vector<float> sums(count, static_cast<float>(size));
  EXPECT_EQ(a.download(count * 4), encode(sums, DType::kFloat32));
  EXPECT_EQ(b.download(count * 2), encode(sums, DType::kBFloat16));
  EXPECT_EQ(c.download(count * 4), encode(ones, DType::kFloat32));
  EXPECT_THROW(comm->end_group(), Error);
}

TEST_F(Nccl, CommunicationStreamWaitsForTheComputeStream) {
  auto compute = make_cuda_stream("compute", comm->device());
  const size_t count = 1 << 20;
  DeviceBuffer x(count * 4);
  ZERO_CUDA_CHECK(cudaMemset(x.data(), 0, count * 4));
  compute->enqueue([&] {
    testing::launch_spin(cuda_stream_handle(*compute), 50'000'000);
    std::vector<float> twos(count, 2.0f);
    ZERO_CUDA_CHECK(cudaMemcpyAsync(x.data(), twos.data(), count * 4, cudaMemcpyHostToDevice,
                                    cuda_stream_handle(*compute)));
    ZERO_CUDA_CHECK(cudaStreamSynchronize(cuda_stream_handle(*compute)));  // twos is local
  });
  comm->stream().wait(compute->record());
  comm->all_reduce_sync(x.data(), x.data(), count, DType::kFloat32);
  EXPECT_EQ(x.download(count * 4), encode(std::vector<float>(count, 2.0f * size), DType::kFloat32));
}

TEST_F(Nccl, HostMemoryAndBadArgumentsAreErrors) {
  std::vector<float> host(16);
  EXPECT_THROW(comm->all_reduce(host.data(), host.data(), 16, DType::kFloat32), Error);
  DeviceBuffer d(64);
  EXPECT_THROW(comm->broadcast(d.data(), 16, DType::kFloat32, size), Error);
  EXPECT_THROW(comm->all_reduce(d.data(), nullptr, 16, DType::kFloat32), Error);
  EXPECT_THROW(comm->set_timeout(std::chrono::milliseconds(0)), Error);
  EXPECT_NE(comm->stream().native_handle(), nullptr);
}

}  // namespace
}  // namespace zero
