// The MPI communicator's checks on 1-4 ranks: bad arguments, a malformed timeout variable,
// the desync check, and the flight record of the collectives done.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/collectives/comm_test_buffers.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"

namespace zero {
namespace {

using comm_test::value;

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
