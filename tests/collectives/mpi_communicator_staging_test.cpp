// The MPI communicator's staging memory on 1-4 ranks: what staging_bytes promises, and a
// provided buffer, large enough or not.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "tests/collectives/comm_test_buffers.h"
#include "tests/expect_error.h"
#include "zero/collectives/mpi_communicator.h"

namespace zero {
namespace {

using comm_test::Buffer;
using comm_test::matches;
using comm_test::value;

// What staging_bytes promises: fp32 memory for the reductions MPI cannot do on the caller's
// buffers, per piece when a collective is split, and nothing for the rest.
TEST(Communicator, StagingBytesOfEachCollective) {
  auto whole = make_mpi_communicator();
  auto split = make_mpi_communicator(1000);
  const size_t n = static_cast<size_t>(whole->world_size());
  for (DType half : {DType::kBFloat16, DType::kFloat16}) {
    EXPECT_EQ(whole->staging_bytes(CollectiveOp::kReduceScatter, 65537, half), 65537 * n * 4);
    EXPECT_EQ(whole->staging_bytes(CollectiveOp::kAllReduce, 65537, half), 65537 * 4u);
    EXPECT_EQ(split->staging_bytes(CollectiveOp::kReduceScatter, 65537, half), 1000 * n * 4);
    EXPECT_EQ(split->staging_bytes(CollectiveOp::kAllReduce, 65537, half), 1000 * 4u);
  }
  // fp32: an in-place reduce-scatter reduces into staging (MPI forbids recv inside send).
  EXPECT_EQ(whole->staging_bytes(CollectiveOp::kReduceScatter, 65537, DType::kFloat32), 65537 * 4u);
  EXPECT_EQ(split->staging_bytes(CollectiveOp::kReduceScatter, 65537, DType::kFloat32),
            1000 * n * 4);
  for (Communicator* comm : {whole.get(), split.get()}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      EXPECT_EQ(comm->staging_bytes(CollectiveOp::kAllGather, 65537, dtype), 0u);
      EXPECT_EQ(comm->staging_bytes(CollectiveOp::kBroadcast, 65537, dtype), 0u);
      EXPECT_EQ(comm->staging_bytes(CollectiveOp::kReduceScatter, 0, dtype), 0u);
    }
    EXPECT_EQ(comm->staging_bytes(CollectiveOp::kAllReduce, 65537, DType::kFloat32), 0u);
    EXPECT_EQ(comm->staging_bytes(CollectiveOp::kBarrier, 0, DType::kFloat32), 0u);
  }
}

// A provided buffer is where the staging happens: after a bf16 reduction, its front holds this
// rank's fp32 sums (where MPI_IN_PLACE leaves them). After clear_staging_buffer it is no longer
// touched, and the communicator stages in its own memory again. Over MPI: shared memory stages
// in its window.
TEST(Communicator, ProvidedStagingBufferIsWhereReductionsStage) {
  auto comm = make_mpi_communicator(INT_MAX, CpuTransport::kMpi);
  const int rank = comm->rank(), n = comm->world_size();
  const size_t count = 1001;
  const DType dtype = DType::kBFloat16;
  const size_t needed = std::max(comm->staging_bytes(CollectiveOp::kReduceScatter, count, dtype),
                                 comm->staging_bytes(CollectiveOp::kAllReduce, count, dtype));
  const float untouched = -1000.0f;  // no sum of values in [-4, 4] over 4 ranks
  std::vector<float> provided(needed / sizeof(float), untouched);
  Buffer send(dtype, count * n), recv(dtype, count);
  for (size_t i = 0; i < count * n; ++i) send.set(i, value(rank, i));
  auto shard_sum = [&](size_t i) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, rank * count + i);
    return s;
  };
  auto whole_sum = [&](size_t i) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, i);
    return s;
  };
  auto staged = [&](auto expected) {
    for (size_t i = 0; i < count; ++i) {
      if (provided[i] != expected(i)) {
        return ::testing::AssertionFailure()
               << "staging element " << i << " is " << provided[i] << ", expected " << expected(i);
      }
    }
    return ::testing::AssertionSuccess();
  };

  comm->set_staging_buffer(provided.data(), needed);
  comm->reduce_scatter_sync(send.data(), recv.data(), count, dtype);
  EXPECT_TRUE(matches(recv, count, shard_sum));
  EXPECT_TRUE(staged(shard_sum));
  comm->all_reduce_sync(send.data(), recv.data(), count, dtype);
  EXPECT_TRUE(matches(recv, count, whole_sum));
  EXPECT_TRUE(staged(whole_sum));

  comm->clear_staging_buffer();
  std::fill(provided.begin(), provided.end(), untouched);
  comm->reduce_scatter_sync(send.data(), recv.data(), count, dtype);
  EXPECT_TRUE(matches(recv, count, shard_sum));
  comm->all_reduce_sync(send.data(), recv.data(), count, dtype);
  EXPECT_TRUE(matches(recv, count, whole_sum));
  EXPECT_TRUE(staged([&](size_t) { return untouched; }));
}

// A provided buffer smaller than a collective needs fails that collective before any MPI call,
// on every rank alike (the need is the same everywhere), so no rank is left inside MPI: were
// one rank to go on into MPI_Reduce_scatter_block, destroying its communicator would wait for
// it, and the test would hang until the watchdog ended the job.
TEST(Communicator, TooSmallStagingBufferFailsTheCollectiveOnEveryRank) {
  const size_t count = 1001;
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    auto comm = make_mpi_communicator();
    const int n = comm->world_size();
    const size_t needed = comm->staging_bytes(CollectiveOp::kReduceScatter, count, dtype);
    std::vector<float> provided(needed / sizeof(float) - 1);
    comm->set_staging_buffer(provided.data(), needed - sizeof(float));
    Buffer send(dtype, count * n), recv(dtype, count);
    // fp32 stages only in place, but its need counts for both forms, so that which form a rank
    // calls can never make the ranks disagree.
    const Event event = comm->reduce_scatter(send.data(), recv.data(), count, dtype);
    const std::string expected = std::string("reduce_scatter of 1001 elements of ") +
                                 dtype_name(dtype) + " needs " + std::to_string(needed) +
                                 " bytes of staging memory, but the staging buffer provided "
                                 "(set_staging_buffer) holds " +
                                 std::to_string(needed - sizeof(float)) + " bytes";
    testing::expect_error_naming([&] { event.wait(); }, expected);
  }
  make_mpi_communicator()->barrier_sync();
}

TEST(Communicator, StagingBufferOfNoBytesServesCollectivesThatStageNothing) {
  auto comm = make_mpi_communicator();
  const int n = comm->world_size();
  comm->set_staging_buffer(nullptr, 0);
  std::vector<float> ones(10 * n, 1.0f), sums(10);
  comm->all_reduce_sync(ones.data(), sums.data(), 10, DType::kFloat32);
  for (float sum : sums) EXPECT_EQ(sum, static_cast<float>(n));
  Buffer shard(DType::kBFloat16, 10), gathered(DType::kBFloat16, 10 * n);
  for (size_t i = 0; i < 10; ++i) shard.set(i, value(comm->rank(), i));
  comm->all_gather_sync(shard.data(), gathered.data(), 10, DType::kBFloat16);
  EXPECT_TRUE(
      matches(gathered, 10 * n, [&](size_t i) { return value(static_cast<int>(i / 10), i % 10); }));
}

TEST(Communicator, SetStagingBufferRejectsNullAndMisalignedMemory) {
  auto comm = make_mpi_communicator();
  std::vector<float> memory(8);
  testing::expect_error_naming([&] { comm->set_staging_buffer(nullptr, 16); },
                               "set_staging_buffer: null buffer of 16 bytes");
  testing::expect_error_naming(
      [&] { comm->set_staging_buffer(reinterpret_cast<char*>(memory.data()) + 2, 16); },
      "is not aligned for fp32");
}

}  // namespace
}  // namespace zero
