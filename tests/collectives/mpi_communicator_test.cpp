// The MPI communicator on 1-4 ranks: every op on every dtype, out of place and in place, at
// sizes from 0 up, whole and split into pieces; counters of the bytes the MPI calls send; the
// staging memory, the communicator's own or provided; async sequences; argument checks.
//
// Inputs are small integers, so every sum is exact in fp32, bf16 and fp16 whatever the order
// of reduction, and the expected result is known exactly.
#include "zero/collectives/mpi_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "tests/expect_error.h"
#include "zero/core/check.h"

namespace zero {
namespace {

// Element i of rank r's contribution: an integer in [-4, 4].
float value(int rank, size_t i) {
  return static_cast<float>((rank * 5 + i * 3) % 9) - 4.0f;
}

// A host buffer of `n` elements of one dtype, read and written as float through dtype.h.
class Buffer {
 public:
  Buffer(DType dtype, size_t n) : dtype_(dtype), bytes_(n * dtype_size(dtype)) {}
  void* data() { return bytes_.empty() ? nullptr : bytes_.data(); }
  void* at(size_t i) { return bytes_.data() + i * dtype_size(dtype_); }
  float get(size_t i) const { return load_as_float(bytes_.data(), dtype_, i); }
  void set(size_t i, float v) { store_from_float(bytes_.data(), dtype_, i, v); }

 private:
  DType dtype_;
  std::vector<unsigned char> bytes_;
};

// Compares n elements against expected(i); reports how many differ and the first one.
template <typename Expected>
::testing::AssertionResult matches(const Buffer& got, size_t n, Expected expected) {
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got.get(i) != expected(i)) {
      if (wrong == 0) first = i;
      ++wrong;
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong << " of " << n << " elements wrong; first at " << first << ": got "
         << got.get(first) << ", expected " << expected(first);
}

const size_t kCounts[] = {0, 1, 7, 1001, 65537};

// How a CommTest's communicator moves data: over MPI with the most elements one MPI call may
// carry (INT_MAX: whole; small: every larger collective is split into pieces), or over shared
// memory (all ranks of these tests share one node).
struct Path {
  const char* name;
  size_t max_elements_per_call;
  CpuTransport transport;
};
const Path kPaths[] = {{"mpi_whole", static_cast<size_t>(INT_MAX), CpuTransport::kMpi},
                       {"mpi_split1000", 1000, CpuTransport::kMpi},
                       {"shm", static_cast<size_t>(INT_MAX), CpuTransport::kSharedMemory}};

// Parameter: element type, and the path.
class CommTest : public ::testing::TestWithParam<std::tuple<DType, Path>> {
 protected:
  void SetUp() override {
    dtype = std::get<0>(GetParam());
    const Path& path = std::get<1>(GetParam());
    comm = make_mpi_communicator(path.max_elements_per_call, path.transport);
    rank = comm->rank();
    n = comm->world_size();
  }

  // Sum over ranks of value(r, i).
  float sum(size_t i) const {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, i);
    return s;
  }

  DType dtype = DType::kFloat32;
  std::unique_ptr<Communicator> comm;
  int rank = 0;
  int n = 1;
};

TEST_P(CommTest, AllReduce) {
  for (size_t count : kCounts) {
    Buffer send(dtype, count), recv(dtype, count);
    for (size_t i = 0; i < count; ++i) send.set(i, value(rank, i));
    comm->all_reduce(send.data(), recv.data(), count, dtype).wait();
    EXPECT_TRUE(matches(recv, count, [&](size_t i) { return sum(i); })) << "count " << count;
    EXPECT_TRUE(matches(send, count, [&](size_t i) { return value(rank, i); }))
        << "send changed, count " << count;
  }
}

TEST_P(CommTest, AllReduceInPlace) {
  for (size_t count : kCounts) {
    Buffer buf(dtype, count);
    for (size_t i = 0; i < count; ++i) buf.set(i, value(rank, i));
    comm->all_reduce(buf.data(), buf.data(), count, dtype).wait();
    EXPECT_TRUE(matches(buf, count, [&](size_t i) { return sum(i); })) << "count " << count;
  }
}

TEST_P(CommTest, AllReduceSumsInFp32AndRoundsOnce) {
  // 2^p + 1 + 1 + ...: adding the ones one at a time in 16 bits would round each away (the
  // spacing at 2^p is 2). Summed in fp32 and rounded once, 3 ranks give 2^p + 2 and 4 ranks
  // 2^p + 4 (the tie 2^p + 3 rounds to even).
  const float big = dtype == DType::kFloat16 ? 2048.0f : 256.0f;
  Buffer buf(dtype, 3);
  for (size_t i = 0; i < 3; ++i) buf.set(i, rank == 0 ? big : 1.0f);
  comm->all_reduce_sync(buf.data(), buf.data(), 3, dtype);
  Buffer expected(dtype, 1);
  expected.set(0, big + static_cast<float>(n - 1));
  EXPECT_TRUE(matches(buf, 3, [&](size_t) { return expected.get(0); }));
}

TEST_P(CommTest, AllGather) {
  for (size_t count : kCounts) {
    Buffer send(dtype, count), recv(dtype, count * n);
    for (size_t i = 0; i < count; ++i) send.set(i, value(rank, i));
    comm->all_gather(send.data(), recv.data(), count, dtype).wait();
    EXPECT_TRUE(matches(recv, count * n,
                        [&](size_t i) { return value(static_cast<int>(i / count), i % count); }))
        << "count " << count;
  }
}

TEST_P(CommTest, AllGatherInPlace) {
  for (size_t count : kCounts) {
    // The engine's form: this rank's shard already sits in its slot of the full buffer.
    Buffer buf(dtype, count * n);
    for (size_t i = 0; i < count * n; ++i) buf.set(i, 99.0f);
    for (size_t i = 0; i < count; ++i) buf.set(rank * count + i, value(rank, i));
    const void* slot = count == 0 ? nullptr : buf.at(rank * count);
    comm->all_gather(slot, buf.data(), count, dtype).wait();
    EXPECT_TRUE(matches(buf, count * n,
                        [&](size_t i) { return value(static_cast<int>(i / count), i % count); }))
        << "count " << count;
  }
}

TEST_P(CommTest, ReduceScatter) {
  for (size_t count : kCounts) {
    Buffer send(dtype, count * n), recv(dtype, count);
    for (size_t i = 0; i < count * n; ++i) send.set(i, value(rank, i));
    comm->reduce_scatter(send.data(), recv.data(), count, dtype).wait();
    EXPECT_TRUE(matches(recv, count, [&](size_t i) { return sum(rank * count + i); }))
        << "count " << count;
    EXPECT_TRUE(matches(send, count * n, [&](size_t i) { return value(rank, i); }))
        << "send changed, count " << count;
  }
}

TEST_P(CommTest, ReduceScatterInPlace) {
  for (size_t count : kCounts) {
    Buffer buf(dtype, count * n);
    for (size_t i = 0; i < count * n; ++i) buf.set(i, value(rank, i));
    void* slot = count == 0 ? nullptr : buf.at(rank * count);
    comm->reduce_scatter(buf.data(), slot, count, dtype).wait();
    EXPECT_TRUE(matches(buf, count * n,
                        [&](size_t i) {
                          const bool mine = i / count == static_cast<size_t>(rank);
                          return mine ? sum(i)
                                      : value(rank, i);  // the rest of send is left as it was
                        }))
        << "count " << count;
  }
}

TEST_P(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < n; ++root) {
    for (size_t count : kCounts) {
      Buffer buf(dtype, count);
      for (size_t i = 0; i < count; ++i) buf.set(i, value(rank, i));
      comm->broadcast(buf.data(), count, dtype, root).wait();
      EXPECT_TRUE(matches(buf, count, [&](size_t i) { return value(root, i); }))
          << "root " << root << " count " << count;
    }
  }
}

TEST_P(CommTest, ManyAsyncOpsThenWaitOnTheLast) {
  const size_t count = 257;
  std::vector<Buffer> sends, recvs;
  for (int k = 0; k < 40; ++k) {
    sends.emplace_back(dtype, count);
    recvs.emplace_back(dtype, count * n);
    for (size_t i = 0; i < count; ++i) sends.back().set(i, value(rank + k, i));
  }
  std::vector<Event> events;
  for (int k = 0; k < 40; ++k) {
    // Alternate ops so the stream interleaves different MPI calls in one order on all ranks.
    if (k % 2 == 0) {
      events.push_back(comm->all_reduce(sends[k].data(), recvs[k].data(), count, dtype));
    } else {
      events.push_back(comm->all_gather(sends[k].data(), recvs[k].data(), count, dtype));
    }
  }
  events.back().wait();
  for (int k = 0; k < 40; ++k) {
    EXPECT_TRUE(events[k].done()) << "op " << k;  // in order: done before the last one
    if (k % 2 == 0) {
      EXPECT_TRUE(matches(recvs[k], count,
                          [&](size_t i) {
                            float s = 0;
                            for (int r = 0; r < n; ++r) s += value(r + k, i);
                            return s;
                          }))
          << "all_reduce " << k;
    } else {
      EXPECT_TRUE(
          matches(recvs[k], count * n,
                  [&](size_t i) { return value(static_cast<int>(i / count) + k, i % count); }))
          << "all_gather " << k;
    }
  }
}

TEST_P(CommTest, WaitsForComputeStreamBeforeReading) {
  // The compute stream is slowed down: without the cross-stream wait the all-reduce would read
  // the buffer before compute filled it.
  const size_t count = 1001;
  Buffer buf(dtype, count);
  Stream compute("compute");
  compute.set_delay_for_testing(std::chrono::milliseconds(20));
  compute.enqueue([&] {
    for (size_t i = 0; i < count; ++i) buf.set(i, value(rank, i));
  });
  comm->stream().wait(compute.record());
  comm->all_reduce(buf.data(), buf.data(), count, dtype).wait();
  EXPECT_TRUE(matches(buf, count, [&](size_t i) { return sum(i); }));
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<DType, Path>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, CommTest,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16,
                                                              DType::kFloat16),
                                            ::testing::ValuesIn(kPaths)),
                         param_name);

TEST(Communicator, Barrier) {
  auto comm = make_mpi_communicator();
  for (int i = 0; i < 5; ++i) comm->barrier_sync();
  EXPECT_EQ(comm->counters().calls[static_cast<size_t>(CollectiveOp::kBarrier)], 5u);
  EXPECT_EQ(comm->counters().bytes[static_cast<size_t>(CollectiveOp::kBarrier)], 0u);
}

// Raw bytes of any length (an odd one here), through one MPI call or split into pieces, in
// place or not; counted as an all_gather of 1-byte elements and recorded as bytes.
TEST(Communicator, AllGatherBytesMovesAnyNumberOfBytes) {
  for (size_t limit : {static_cast<size_t>(INT_MAX), size_t{2}}) {
    auto comm = make_mpi_communicator(limit);
    const int n = comm->world_size();
    const int rank = comm->rank();
    const size_t bytes = 7;
    std::vector<unsigned char> mine(bytes), all(bytes * n), in_place(bytes * n);
    for (size_t i = 0; i < bytes; ++i) mine[i] = static_cast<unsigned char>(rank * 16 + i);
    std::copy(mine.begin(), mine.end(), in_place.begin() + rank * bytes);
    comm->all_gather_bytes_sync(mine.data(), all.data(), bytes);
    comm->all_gather_bytes_sync(in_place.data() + rank * bytes, in_place.data(), bytes);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < bytes; ++i) {
        EXPECT_EQ(all[r * bytes + i], r * 16 + i) << "limit " << limit;
        EXPECT_EQ(in_place[r * bytes + i], r * 16 + i) << "limit " << limit;
      }
    }
    const CommCounters& c = comm->counters();
    EXPECT_EQ(c.calls[static_cast<size_t>(CollectiveOp::kAllGather)], 2u);
    EXPECT_EQ(c.bytes[static_cast<size_t>(CollectiveOp::kAllGather)],
              2 * (bytes * n * static_cast<uint64_t>(n - 1) / n));
    EXPECT_NE(comm->flight_record().find(" byte "), std::string::npos) << comm->flight_record();
  }
}

TEST(Communicator, AllGatherU64GathersOneValuePerRank) {
  auto comm = make_mpi_communicator();
  const std::vector<uint64_t> all =
      all_gather_u64(*comm, 0x0123456789abcdefULL + static_cast<uint64_t>(comm->rank()));
  ASSERT_EQ(all.size(), static_cast<size_t>(comm->world_size()));
  for (size_t r = 0; r < all.size(); ++r) EXPECT_EQ(all[r], 0x0123456789abcdefULL + r);
}

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

TEST(Communicator, RejectsBadArguments) {
  auto comm = make_mpi_communicator();
  const int n = comm->world_size();
  std::vector<float> a(16 * n), b(16 * n);
  EXPECT_THROW(comm->broadcast(a.data(), 4, DType::kFloat32, n), Error);
  EXPECT_THROW(comm->broadcast(a.data(), 4, DType::kFloat32, -1), Error);
  EXPECT_THROW(comm->broadcast(nullptr, 4, DType::kFloat32, 0), Error);
  EXPECT_THROW(comm->all_reduce(nullptr, b.data(), 4, DType::kFloat32), Error);
  EXPECT_THROW(comm->all_gather(a.data(), nullptr, 4, DType::kFloat32), Error);
  EXPECT_THROW(comm->reduce_scatter(nullptr, b.data(), 4, DType::kBFloat16), Error);
  // Partial overlaps that are not the in-place forms.
  EXPECT_THROW(comm->all_reduce(a.data(), a.data() + 1, 4, DType::kFloat32), Error);
  if (n > 1) {
    const int other = (comm->rank() + 1) % n;
    EXPECT_THROW(comm->all_gather(a.data() + other * 4, a.data(), 4, DType::kFloat32), Error);
    EXPECT_THROW(comm->reduce_scatter(a.data(), a.data() + other * 4, 4, DType::kFloat32), Error);
  }
  EXPECT_THROW(comm->set_timeout(std::chrono::milliseconds(0)), Error);
  try {
    comm->broadcast(a.data(), 4, DType::kFloat32, n + 3);
    ADD_FAILURE() << "accepted root " << n + 3;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("root"), std::string::npos) << e.what();
  }
  // Rejected calls were never enqueued: nothing counted, and the stream still works.
  EXPECT_EQ(comm->counters().total_bytes(), 0u);
  for (uint64_t calls : comm->counters().calls) EXPECT_EQ(calls, 0u);
  comm->all_reduce_sync(a.data(), b.data(), 4, DType::kFloat32);
}

TEST(Communicator, RejectsMalformedTimeoutVariable) {
  const char* saved = std::getenv("ZERO_COLLECTIVE_TIMEOUT_S");
  const std::string restore = saved ? saved : "";
  for (const char* bad : {"soon", "-3", "0", "5s"}) {
    setenv("ZERO_COLLECTIVE_TIMEOUT_S", bad, 1);
    try {
      make_mpi_communicator();
      ADD_FAILURE() << "accepted ZERO_COLLECTIVE_TIMEOUT_S=" << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ZERO_COLLECTIVE_TIMEOUT_S"), std::string::npos);
    }
  }
  if (saved) {
    setenv("ZERO_COLLECTIVE_TIMEOUT_S", restore.c_str(), 1);
  } else {
    unsetenv("ZERO_COLLECTIVE_TIMEOUT_S");
  }
  EXPECT_THROW(make_mpi_communicator(0), Error);
}

TEST(Communicator, DesyncCheckFollowsTheEnvironmentAndTheSetter) {
  const char* saved = std::getenv("ZERO_DEBUG");
  const std::string restore = saved ? saved : "";
  unsetenv("ZERO_DEBUG");
  EXPECT_FALSE(make_mpi_communicator()->desync_check());
  for (const char* on : {"collectives", "engine,collectives", "collectives,memory"}) {
    setenv("ZERO_DEBUG", on, 1);
    EXPECT_TRUE(make_mpi_communicator()->desync_check()) << "ZERO_DEBUG=" << on;
  }
  for (const char* off : {"", "engine", "collective", "collectives2"}) {
    setenv("ZERO_DEBUG", off, 1);
    EXPECT_FALSE(make_mpi_communicator()->desync_check()) << "ZERO_DEBUG=" << off;
  }
  if (saved) {
    setenv("ZERO_DEBUG", restore.c_str(), 1);
  } else {
    unsetenv("ZERO_DEBUG");
  }
  auto comm = make_mpi_communicator();
  comm->set_desync_check(true);
  EXPECT_TRUE(comm->desync_check());
  comm->set_desync_check(false);
  EXPECT_FALSE(comm->desync_check());
}

TEST(Communicator, DesyncCheckPassesMatchingCollectives) {
  // With the check on, matching collectives run as before, and the descriptor exchange is not
  // counted as communication of the op.
  auto comm = make_mpi_communicator();
  comm->set_desync_check(true);
  const int n = comm->world_size();
  std::vector<float> a(10 * n), b(10 * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = value(comm->rank(), i);
  comm->all_reduce(a.data(), b.data(), 10, DType::kFloat32);
  comm->all_gather(a.data(), b.data(), 10, DType::kFloat32);
  comm->barrier();
  comm->all_reduce_sync(a.data(), a.data(), 10 * n, DType::kFloat32);
  for (size_t i = 0; i < a.size(); ++i) {
    float expected = 0;
    for (int r = 0; r < n; ++r) expected += value(r, i);
    ASSERT_EQ(a[i], expected) << "element " << i;
  }
  EXPECT_EQ(comm->counters().calls[static_cast<size_t>(CollectiveOp::kAllReduce)], 2u);
  EXPECT_EQ(comm->counters().bytes[static_cast<size_t>(CollectiveOp::kBarrier)], 0u);
  // The ring formulas for all_reduce of 40 bytes, all_gather of 40n, all_reduce of 40n.
  const uint64_t un = static_cast<uint64_t>(n), m = un - 1;
  EXPECT_EQ(comm->counters().total_bytes(), 80 * m / un + 40 * m + 80 * m);
}

TEST(Communicator, FlightRecordListsTheCollectivesDone) {
  auto comm = make_mpi_communicator();
  std::vector<float> a(4 * comm->world_size());
  comm->barrier_sync();
  comm->all_reduce_sync(a.data(), a.data(), 4, DType::kFloat32);
  comm->broadcast_sync(a.data(), 3, DType::kBFloat16, 0);
  const std::string record = comm->flight_record();
  const std::string prefix = "[rank " + std::to_string(comm->rank()) + "]";
  EXPECT_NE(record.find(prefix + " flight record: the last 3 of 3 collectives"), std::string::npos)
      << record;
  // One row per collective, in order, each done.
  const size_t barrier = record.find(" barrier ");
  const size_t all_reduce = record.find(" all_reduce ");
  const size_t broadcast = record.find(" broadcast ");
  ASSERT_NE(barrier, std::string::npos) << record;
  ASSERT_NE(all_reduce, std::string::npos) << record;
  ASSERT_NE(broadcast, std::string::npos) << record;
  EXPECT_LT(barrier, all_reduce);
  EXPECT_LT(all_reduce, broadcast);
  size_t done = 0;
  for (size_t at = record.find(" done "); at != std::string::npos;
       at = record.find(" done ", at + 1)) {
    ++done;
  }
  EXPECT_EQ(done, 3u) << record;
  EXPECT_EQ(record.find("running"), std::string::npos) << record;
}

}  // namespace
}  // namespace zero
