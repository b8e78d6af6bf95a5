// The MPI communicator on 1-4 ranks: every op on every dtype, out of place and in place, at
// sizes from 0 up, whole and split into pieces; raw bytes and one value per rank; async
// sequences. Its counters and staging memory: mpi_communicator_counters_test.cpp and
// mpi_communicator_staging_test.cpp; its checks: mpi_communicator_checks_test.cpp.
#include "zero/collectives/mpi_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "tests/collectives/comm_test_buffers.h"
#include "tests/expect_error.h"
#include "zero/core/check.h"

namespace zero {
namespace {

using comm_test::Buffer;
using comm_test::matches;
using comm_test::value;

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

// Block r of each rank's send reaches rank r, in the sender's place, on every transport, through
// one MPI call or split into pieces; counted as (N-1)/N of the send buffer and recorded as bytes.
TEST(Communicator, AllToAllBytesDeliversEachBlockToItsRank) {
  for (CpuTransport transport : {CpuTransport::kMpi, CpuTransport::kSharedMemory}) {
    for (size_t limit : {static_cast<size_t>(INT_MAX), size_t{3}}) {
      auto comm = make_mpi_communicator(limit, transport);
      const int n = comm->world_size();
      const int rank = comm->rank();
      const size_t bytes = 7;
      std::vector<unsigned char> send(bytes * n), recv(bytes * n, 0xEE);
      for (int to = 0; to < n; ++to) {
        for (size_t i = 0; i < bytes; ++i) {
          send[to * bytes + i] = static_cast<unsigned char>(rank * 64 + to * 8 + i);
        }
      }
      comm->all_to_all_bytes(send.data(), recv.data(), bytes).wait();
      for (int from = 0; from < n; ++from) {
        for (size_t i = 0; i < bytes; ++i) {
          ASSERT_EQ(recv[from * bytes + i], from * 64 + rank * 8 + i)
              << comm->transport() << ", limit " << limit << ", from " << from;
        }
      }
      comm->all_to_all_bytes(send.data(), recv.data(), 0).wait();
      const CommCounters& c = comm->counters();
      EXPECT_EQ(c.calls[static_cast<size_t>(CollectiveOp::kAllToAll)], 2u);
      EXPECT_EQ(c.bytes[static_cast<size_t>(CollectiveOp::kAllToAll)],
                bytes * static_cast<uint64_t>(n - 1));
      const std::string record = comm->flight_record();
      EXPECT_NE(record.find("all_to_all"), std::string::npos) << record;
      EXPECT_NE(record.find(" byte "), std::string::npos) << record;
    }
  }
}

TEST(Communicator, AllToAllBytesRefusesOverlappingBuffers) {
  auto comm = make_mpi_communicator();
  std::vector<unsigned char> buffer(8 * comm->world_size() + 1);
  testing::expect_error_naming(
      [&] { comm->all_to_all_bytes(buffer.data(), buffer.data() + 1, 8); },
      "all_to_all: send and recv overlap; an all-to-all cannot run in place");
  testing::expect_error_naming([&] { comm->all_to_all_bytes(nullptr, buffer.data(), 8); },
                               "all_to_all: null buffer with count 8");
}

// Every rank of these tests runs on one machine: one node of all ranks, unless ZERO_NODE_SIZE
// declares smaller ones.
TEST(Communicator, RanksPerNodeIsTheNodesSize) {
  auto comm = make_mpi_communicator();
  const char* declared = std::getenv("ZERO_NODE_SIZE");
  const int expected = declared != nullptr ? std::atoi(declared) : comm->world_size();
  EXPECT_EQ(ranks_per_node(*comm), expected);
}

TEST(Communicator, AllGatherU64GathersOneValuePerRank) {
  auto comm = make_mpi_communicator();
  const std::vector<uint64_t> all =
      all_gather_u64(*comm, 0x0123456789abcdefULL + static_cast<uint64_t>(comm->rank()));
  ASSERT_EQ(all.size(), static_cast<size_t>(comm->world_size()));
  for (size_t r = 0; r < all.size(); ++r) EXPECT_EQ(all[r], 0x0123456789abcdefULL + r);
}

}  // namespace
}  // namespace zero
