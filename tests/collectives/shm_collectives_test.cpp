// The shared-memory path of the CPU communicator (collectives/shm_transport.h) on 1-4 ranks:
// its results against a scalar reference that adds the ranks in order 0, 1, ..., N-1 in fp32
// and rounds once, bit for bit, for every reduction and dtype, in place or not, at odd sizes
// and at sizes that span several of its chunks; at 2 ranks also against the MPI path (a + b
// commutes, so MPI's order cannot differ). And how the path is chosen.
//
// The inputs (collective_inputs.h) show the order of the additions in the bits.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "tests/collectives/collective_inputs.h"
#include "tests/expect_error.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"

namespace zero {
namespace {

using testing::Bytes;
using testing::contribution;

// The fixed-order sum of elements [first, first + n) over `ranks` ranks: each rank's element as
// rounded to dtype, added in rank order in fp32, rounded once.
Bytes reference_sum(int ranks, size_t first, size_t n, DType dtype) {
  Bytes out(n * dtype_size(dtype));
  std::vector<Bytes> all;
  for (int r = 0; r < ranks; ++r) all.push_back(contribution(r, first, n, dtype));
  for (size_t i = 0; i < n; ++i) {
    float sum = load_as_float(all[0].data(), dtype, i);
    for (int r = 1; r < ranks; ++r)
      sum += load_as_float(all[static_cast<size_t>(r)].data(), dtype, i);
    store_from_float(out.data(), dtype, i, sum);
  }
  return out;
}

// Odd sizes, and sizes past one chunk (a 256 KiB slot holds 32768 fp32 elements of an
// all-reduce, or of each of 2 ranks' reduce-scatter blocks) that end inside a later one.
const size_t kCounts[] = {1, 7, 63, 65, 1001, 131073, 300007};

class ShmTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    dtype = GetParam();
    comm = make_mpi_communicator(INT_MAX, CpuTransport::kSharedMemory);
    mpi = make_mpi_communicator(INT_MAX, CpuTransport::kMpi);
    rank = comm->rank();
    n = comm->world_size();
  }
  size_t elem() const { return dtype_size(dtype); }

  DType dtype = DType::kFloat32;
  std::unique_ptr<Communicator> comm, mpi;
  int rank = 0;
  int n = 1;
};

TEST_P(ShmTest, ReduceScatterAddsRanksInOrder) {
  for (size_t count : kCounts) {
    const Bytes recv = testing::expect_exact_reduce_scatter(
        *comm, count, dtype, reference_sum(n, rank * count, count, dtype));
    if (n <= 2) {
      const Bytes send = contribution(rank, 0, count * n, dtype);
      Bytes over_mpi(count * elem());
      mpi->reduce_scatter_sync(send.data(), over_mpi.data(), count, dtype);
      EXPECT_TRUE(recv == over_mpi) << "against MPI, count " << count;
    }
  }
}

TEST_P(ShmTest, AllReduceAddsRanksInOrder) {
  for (size_t count : kCounts) {
    const Bytes recv =
        testing::expect_exact_all_reduce(*comm, count, dtype, reference_sum(n, 0, count, dtype));
    if (n <= 2) {
      const Bytes send = contribution(rank, 0, count, dtype);
      Bytes over_mpi(count * elem());
      mpi->all_reduce_sync(send.data(), over_mpi.data(), count, dtype);
      EXPECT_TRUE(recv == over_mpi) << "against MPI, count " << count;
    }
  }
}

TEST_P(ShmTest, AllGatherCopiesEveryRankExactly) {
  for (size_t count : kCounts) testing::expect_exact_all_gather(*comm, count, dtype);
}

// Memory from Communicator::allocate_shared, given back at the end of its scope.
class SharedBuffer {
 public:
  SharedBuffer(Communicator& comm, size_t bytes)
      : comm_(comm), data_(static_cast<unsigned char*>(comm.allocate_shared(bytes))) {}
  ~SharedBuffer() { EXPECT_TRUE(data_ == nullptr || comm_.free_shared(data_)); }
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  unsigned char* data() const { return data_; }

 private:
  Communicator& comm_;
  unsigned char* data_;
};

// With every rank's buffers in node-shared memory, each collective runs straight on them
// (direct_collectives counts one per call) and gives the same bits as the staged path, out of
// place and in place; a single rank's private buffer sends every rank back to staging, still
// exact.
TEST_P(ShmTest, BuffersInNodeSharedMemoryRunWithoutStaging) {
  const size_t most = kCounts[std::size(kCounts) - 1];
  // Room for the two buffers below (the transport adds its own alignment slack).
  ASSERT_TRUE(comm->reserve_shared(2 * most * n * elem() + 4096));
  SharedBuffer send(*comm, most * n * elem()), recv(*comm, most * n * elem());
  ASSERT_NE(send.data(), nullptr);
  ASSERT_NE(recv.data(), nullptr);
  EXPECT_EQ(comm->allocate_shared(4 * most * n * elem()), nullptr) << "past what was reserved";
  Bytes private_memory(16);
  EXPECT_FALSE(comm->free_shared(private_memory.data()));
  auto fill = [&](unsigned char* to, size_t count) {
    const Bytes mine = contribution(rank, 0, count, dtype);
    std::memcpy(to, mine.data(), mine.size());
  };
  for (size_t count : kCounts) {
    const uint64_t before = comm->direct_collectives();
    const Bytes scattered = reference_sum(n, rank * count, count, dtype);
    fill(send.data(), count * n);
    comm->reduce_scatter_sync(send.data(), recv.data(), count, dtype);
    EXPECT_EQ(0, std::memcmp(recv.data(), scattered.data(), scattered.size())) << count;
    comm->reduce_scatter_sync(send.data(), send.data() + rank * count * elem(), count, dtype);
    EXPECT_EQ(0,
              std::memcmp(send.data() + rank * count * elem(), scattered.data(), scattered.size()))
        << "in place, count " << count;

    const Bytes summed = reference_sum(n, 0, count, dtype);
    fill(send.data(), count);
    comm->all_reduce_sync(send.data(), recv.data(), count, dtype);
    EXPECT_EQ(0, std::memcmp(recv.data(), summed.data(), summed.size())) << count;
    comm->all_reduce_sync(send.data(), send.data(), count, dtype);
    EXPECT_EQ(0, std::memcmp(send.data(), summed.data(), summed.size())) << "in place, " << count;

    Bytes gathered;
    for (int r = 0; r < n; ++r) {
      const Bytes part = contribution(r, 0, count, dtype);
      gathered.insert(gathered.end(), part.begin(), part.end());
    }
    fill(send.data(), count);
    comm->all_gather_sync(send.data(), recv.data(), count, dtype);
    EXPECT_EQ(0, std::memcmp(recv.data(), gathered.data(), gathered.size())) << count;
    std::memset(recv.data(), 0xab, gathered.size());
    fill(recv.data() + rank * count * elem(), count);
    comm->all_gather_sync(recv.data() + rank * count * elem(), recv.data(), count, dtype);
    EXPECT_EQ(0, std::memcmp(recv.data(), gathered.data(), gathered.size())) << "in place";
    EXPECT_EQ(comm->direct_collectives() - before, 6u) << "count " << count;

    // Rank 0's input from private memory: nobody can read it straight, so all stage.
    const Bytes own = contribution(rank, 0, count * n, dtype);
    const void* input = rank == 0 ? static_cast<const void*>(own.data()) : send.data();
    if (rank != 0) fill(send.data(), count * n);
    comm->reduce_scatter_sync(input, recv.data(), count, dtype);
    EXPECT_EQ(0, std::memcmp(recv.data(), scattered.data(), scattered.size())) << "mixed";
    EXPECT_EQ(comm->direct_collectives() - before, 6u) << "mixed, " << count;
  }
}

// A reservation larger than any empty one frees those first (every rank gave their memory
// back): the peer pages an all-gather mapped leave this process with them.
TEST_P(ShmTest, AReservationFreesTheEmptyOnes) {
  const size_t count = 65536;
  const size_t bytes = count * n * elem();
  ASSERT_TRUE(comm->reserve_shared(bytes + 4096));
  {
    SharedBuffer recv(*comm, bytes);
    ASSERT_NE(recv.data(), nullptr);
    const Bytes mine = contribution(rank, 0, count, dtype);
    comm->all_gather_sync(mine.data(), recv.data(), count, dtype);
  }
  const uint64_t mapped = comm->peer_memory_mapped_bytes();
  if (n > 1) {
    EXPECT_GE(mapped, (n - 1) * count * elem() / 2) << "the all-gather wrote the peers' memory";
  }
  ASSERT_TRUE(comm->reserve_shared(4 * bytes));
  EXPECT_EQ(comm->peer_memory_mapped_bytes(), 0u) << "the first window is still mapped";
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, ShmTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& param) {
                           return std::string(dtype_name(param.param));
                         });

// Elements of the reductions' wire type in the counters of a bf16 reduce-scatter of 10 elements
// per rank: 4 bytes each over MPI (fp32), 2 over shared memory (bf16 as it is).
uint64_t bf16_reduce_scatter_element_bytes(Communicator& comm) {
  const uint64_t n = static_cast<uint64_t>(comm.world_size());
  if (n == 1) return 0;  // a single rank sends nothing either way
  std::vector<uint16_t> a(10 * n), b(10);
  const uint64_t before = comm.counters().total_bytes();
  comm.reduce_scatter_sync(a.data(), b.data(), 10, DType::kBFloat16);
  return (comm.counters().total_bytes() - before) / (10 * (n - 1));
}

// Every rank of these tests is on one node, so the communicator picks shared memory by itself;
// ZERO_COLLECTIVES=mpi forces MPI, =shm asks for shared memory, anything else is an error. The
// path shows in the counters (bf16 reductions: 4 bytes an element over MPI, 2 over shm).
TEST(Communicator, TransportFollowsTheEnvironment) {
  const char* saved = std::getenv("ZERO_COLLECTIVES");
  const std::string restore = saved ? saved : "";
  const uint64_t one_rank = 0;
  const bool alone = make_mpi_communicator()->world_size() == 1;
  unsetenv("ZERO_COLLECTIVES");
  EXPECT_EQ(bf16_reduce_scatter_element_bytes(*make_mpi_communicator()), alone ? one_rank : 2);
  const std::pair<const char*, uint64_t> settings[] = {
      {"auto", 2}, {"", 2}, {"shm", 2}, {"mpi", 4}};
  for (const auto& [setting, bytes] : settings) {
    setenv("ZERO_COLLECTIVES", setting, 1);
    EXPECT_EQ(bf16_reduce_scatter_element_bytes(*make_mpi_communicator()), alone ? one_rank : bytes)
        << "ZERO_COLLECTIVES=" << setting;
  }
  // An explicit transport wins over the environment.
  EXPECT_EQ(bf16_reduce_scatter_element_bytes(
                *make_mpi_communicator(INT_MAX, CpuTransport::kSharedMemory)),
            alone ? one_rank : 2);
  setenv("ZERO_COLLECTIVES", "nccl", 1);
  testing::expect_error_naming([] { make_mpi_communicator(); }, "ZERO_COLLECTIVES must be");
  if (saved) {
    setenv("ZERO_COLLECTIVES", restore.c_str(), 1);
  } else {
    unsetenv("ZERO_COLLECTIVES");
  }
}

}  // namespace
}  // namespace zero
