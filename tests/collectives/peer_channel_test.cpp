// PeerChannel on 1-4 ranks: a ring of transfers and their counters, receives matched by tag in
// any order, a wait that sleeps instead of spinning, the timeout's message, a message of the
// wrong size, and bad arguments.
#include "zero/collectives/peer_channel.h"

#include <gtest/gtest.h>

#include <mpi.h>
#include <time.h>
#include <climits>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "tests/expect_error.h"

namespace zero {
namespace {

using testing::expect_error_naming;

double thread_cpu_ms() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

TEST(PeerChannel, RingOfTransfersArrivesAndIsCounted) {
  PeerChannel channel(MPI_COMM_WORLD);
  const int rank = channel.rank();
  const int size = channel.size();
  const int next = (rank + 1) % size;
  const int previous = (rank + size - 1) % size;
  std::vector<float> out(1000);
  std::iota(out.begin(), out.end(), static_cast<float>(rank * 1000));
  std::vector<float> in(1000, -1.0f);
  PeerRequest received = channel.receive(previous, 7, in.data(), in.size() * sizeof(float));
  PeerRequest sent = channel.send(next, 7, out.data(), out.size() * sizeof(float));
  EXPECT_TRUE(received.pending());
  channel.wait(received);
  channel.wait(sent);
  EXPECT_FALSE(received.pending());
  EXPECT_FALSE(sent.pending());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(in[i], static_cast<float>(previous * 1000 + static_cast<int>(i))) << i;
  }
  EXPECT_EQ(channel.counters().bytes_sent, 4000u);
  EXPECT_EQ(channel.counters().bytes_received, 4000u);
  channel.wait(received);  // done: returns at once
}

TEST(PeerChannel, ReceivesMatchByTagInAnyOrder) {
  PeerChannel channel(MPI_COMM_WORLD);
  const int rank = channel.rank();
  const int size = channel.size();
  const int next = (rank + 1) % size;
  const int previous = (rank + size - 1) % size;
  int64_t first = -1;
  int64_t second = -1;
  PeerRequest late = channel.receive(previous, 2, &second, sizeof(second));
  PeerRequest early = channel.receive(previous, 1, &first, sizeof(first));
  const int64_t values[2] = {10 + rank, 20 + rank};
  PeerRequest a = channel.send(next, 1, &values[0], sizeof(int64_t));
  PeerRequest b = channel.send(next, 2, &values[1], sizeof(int64_t));
  channel.wait(late);
  channel.wait(early);
  channel.wait(a);
  channel.wait(b);
  EXPECT_EQ(first, 10 + previous);
  EXPECT_EQ(second, 20 + previous);
}

TEST(PeerChannel, WaitSleepsInsteadOfSpinning) {
  PeerChannel channel(MPI_COMM_WORLD);
  if (channel.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr auto kLate = std::chrono::milliseconds(300);
  int value = 0;
  if (channel.rank() == 1) {
    std::this_thread::sleep_for(kLate);
    const int sent_value = 42;
    PeerRequest sent = channel.send(0, 3, &sent_value, sizeof(int));
    channel.wait(sent);
  } else if (channel.rank() == 0) {
    PeerRequest received = channel.receive(1, 3, &value, sizeof(int));
    const double cpu_before = thread_cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    channel.wait(received);
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const double cpu_ms = thread_cpu_ms() - cpu_before;
    EXPECT_EQ(value, 42);
    EXPECT_GT(wall_ms, 200.0);
    EXPECT_GT(channel.counters().wait_ms, 200.0);
    // A hot spin would burn about the whole wait; polling with sleeps costs a few percent.
    EXPECT_LT(cpu_ms, 0.25 * wall_ms) << "cpu " << cpu_ms << " ms over a " << wall_ms << " ms wait";
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(PeerChannel, TimeoutNamesRankPeerTagAndBytes) {
  PeerChannel channel(MPI_COMM_WORLD);
  channel.set_timeout(std::chrono::milliseconds(200));
  const int rank = channel.rank();
  const int peer = (rank + 1) % channel.size();
  std::vector<char> buffer(16);
  PeerRequest never = channel.receive(peer, 99, buffer.data(), buffer.size());
  expect_error_naming([&] { channel.wait(never); },
                      "rank " + std::to_string(rank) + ": receive from peer " +
                          std::to_string(peer) + ", tag 99, 16 bytes has not finished after");
  EXPECT_FALSE(never.pending());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(PeerChannel, MessageOfAnotherSizeIsAnError) {
  PeerChannel channel(MPI_COMM_WORLD);
  const int rank = channel.rank();
  std::vector<char> buffer(16);
  const std::vector<char> shorter(8, 'x');
  PeerRequest received = channel.receive(rank, 5, buffer.data(), buffer.size());
  PeerRequest sent = channel.send(rank, 5, shorter.data(), shorter.size());
  expect_error_naming(
      [&] { channel.wait(received); },
      "receive from peer " + std::to_string(rank) + ", tag 5, 16 bytes: the peer sent 8 bytes");
  channel.wait(sent);
}

TEST(PeerChannel, BadArgumentsAreNamed) {
  PeerChannel channel(MPI_COMM_WORLD);
  const int size = channel.size();
  char byte = 0;
  expect_error_naming([&] { channel.send(size, 0, &byte, 1); },
                      "send: peer " + std::to_string(size) + " is outside the channel's ranks");
  expect_error_naming([&] { channel.receive(0, -1, &byte, 1); },
                      "receive to/from peer 0: tag -1 is outside 0..");
  // OpenMPI's MPI_TAG_UB is INT_MAX, past which no int tag goes; other MPIs stop lower.
  if (channel.max_tag() < INT_MAX) {
    expect_error_naming([&] { channel.send(0, channel.max_tag() + 1, &byte, 1); }, "(MPI_TAG_UB)");
  }
  expect_error_naming([&] { channel.receive(0, 0, nullptr, 4); }, "null buffer with 4 bytes");
  expect_error_naming([&] { channel.set_timeout(std::chrono::milliseconds(0)); },
                      "timeout must be positive, got 0 ms");
  EXPECT_GE(channel.max_tag(), 32767);
}

}  // namespace
}  // namespace zero
