// The MPI communicator's counters on 1-4 ranks: the bytes its MPI calls send, by op.
#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "zero/collectives/mpi_communicator.h"

namespace zero {
namespace {

// Over MPI, whose 16-bit reductions send fp32 (see the next test for shared memory).
TEST(Communicator, CountersFollowTheRingFormulas) {
  auto comm = make_mpi_communicator(INT_MAX, CpuTransport::kMpi);
  const int n = comm->world_size();
  const uint64_t m = static_cast<uint64_t>(n - 1);  // ring steps
  std::vector<float> a(1000 * n), b(1000 * n);
  std::vector<uint16_t> h(64 * n), g(64 * n);

  comm->all_reduce(a.data(), b.data(), 1000, DType::kFloat32);   // S = 4000
  comm->all_reduce(h.data(), h.data(), 1, DType::kFloat16);      // S = 4 (fp32): rounds down
  comm->all_gather(h.data(), g.data(), 10, DType::kBFloat16);    // S = 20 n
  comm->reduce_scatter(a.data(), b.data(), 6, DType::kFloat32);  // S = 24 n
  comm->broadcast(a.data(), 7, DType::kFloat32, 0);              // S = 28
  comm->broadcast(a.data(), 0, DType::kFloat32, 0);              // S = 0
  comm->barrier().wait();

  const CommCounters& c = comm->counters();
  auto at = [](CollectiveOp op) { return static_cast<size_t>(op); };
  // 2 * 4 * (n - 1) / n rounded down for the one-element fp16 all-reduce: 0, 4, 5, 6.
  const uint64_t tiny_all_reduce[] = {0, 4, 5, 6};
  EXPECT_EQ(c.bytes[at(CollectiveOp::kAllReduce)], 8000 * m / n + tiny_all_reduce[n - 1]);
  EXPECT_EQ(c.bytes[at(CollectiveOp::kAllGather)], 20 * m);
  EXPECT_EQ(c.bytes[at(CollectiveOp::kReduceScatter)], 24 * m);
  EXPECT_EQ(c.bytes[at(CollectiveOp::kBroadcast)], 28u);
  EXPECT_EQ(c.bytes[at(CollectiveOp::kBarrier)], 0u);
  EXPECT_EQ(c.calls[at(CollectiveOp::kAllReduce)], 2u);
  EXPECT_EQ(c.calls[at(CollectiveOp::kAllGather)], 1u);
  EXPECT_EQ(c.calls[at(CollectiveOp::kReduceScatter)], 1u);
  EXPECT_EQ(c.calls[at(CollectiveOp::kBroadcast)], 2u);
  EXPECT_EQ(c.calls[at(CollectiveOp::kBarrier)], 1u);
  EXPECT_EQ(c.total_bytes(), 8000 * m / n + tiny_all_reduce[n - 1] + 44 * m + 28);
}

// The MPI backend sums 16-bit floats in fp32, so its 16-bit reductions send 4 bytes an element;
// moves send 16-bit floats as they are. The counters must say what went over MPI, not what was
// asked for: at 2 or more ranks a bf16 or fp16 reduction counts twice the requested bytes.
// Shared memory moves every element type as it is.
TEST(Communicator, CountersCountTheBytesTheCallsSend) {
  for (CpuTransport transport : {CpuTransport::kMpi, CpuTransport::kSharedMemory}) {
    auto comm = make_mpi_communicator(INT_MAX, transport);
    const uint64_t n = static_cast<uint64_t>(comm->world_size()), m = n - 1;
    std::vector<float> a(1000 * n), b(1000 * n);
    auto at = [](CollectiveOp op) { return static_cast<size_t>(op); };
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      const bool mpi = transport == CpuTransport::kMpi;
      const std::string what = std::string(dtype_name(dtype)) + (mpi ? " mpi" : " shm");
      const uint64_t reduced = mpi ? 4 : dtype_size(dtype);
      const CommCounters before = comm->counters();
      comm->reduce_scatter(a.data(), b.data(), 10, dtype);  // 10 n elements
      comm->all_reduce(a.data(), b.data(), 100, dtype);     // 100 elements
      comm->all_gather(a.data(), b.data(), 10, dtype);      // 10 n elements, sent as they are
      comm->broadcast(a.data(), 7, dtype, 0);               // 7 elements, sent as they are
      comm->barrier_sync();
      const CommCounters& after = comm->counters();
      auto sent = [&](CollectiveOp op) { return after.bytes[at(op)] - before.bytes[at(op)]; };
      const uint64_t elem = dtype_size(dtype);
      EXPECT_EQ(sent(CollectiveOp::kReduceScatter), 10 * n * reduced * m / n) << what;
      EXPECT_EQ(sent(CollectiveOp::kAllReduce), 100 * reduced * 2 * m / n) << what;
      EXPECT_EQ(sent(CollectiveOp::kAllGather), 10 * n * elem * m / n) << what;
      EXPECT_EQ(sent(CollectiveOp::kBroadcast), 7 * elem) << what;
    }
  }
}

}  // namespace
}  // namespace zero
