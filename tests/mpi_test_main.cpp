// GoogleTest main for tests that run on several ranks. Every rank runs every test; the job's
// exit code is non-zero when any rank failed. Rank 0 prints the normal report; the other ranks
// print only their failures, each line prefixed with the rank, so a failure on rank 2 is seen
// without drowning the output in four copies of every passing test.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "zero/collectives/mpi_communicator.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n", rank_,
                 result.file_name() ? result.file_name() : "unknown file", result.line_number());
    // Prefix every line of the (often multi-line) assertion text.
    const char* text = result.message();
    while (*text != '\0') {
      const char* end = text;
      while (*end != '\0' && *end != '\n') ++end;
      std::fprintf(stderr, "[rank %d] %.*s\n", rank_, static_cast<int>(end - text), text);
      text = *end == '\n' ? end + 1 : end;
    }
    std::fflush(stderr);
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                 info.name());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(mpi.world_rank()));
  }
  int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (local_failed) {
    std::fprintf(stderr, "rank %d of %d: tests failed\n", mpi.world_rank(), mpi.world_size());
  }
  return any_failed;
}
