// The tensor-parallel x data-parallel grid on 1-4 ranks: each rank's place, the members of its
// two communicators (consecutive ranks in a tensor-parallel group, every tp_size-th in a
// data-parallel one), a reduction on each that sums exactly its group, and the errors of a
// grid the world cannot hold.
#include "zero/collectives/process_grid.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "tests/expect_error.h"

namespace zero {
namespace {

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

TEST(GridPlace, ConsecutiveRanksShareATensorParallelGroup) {
  // 8 ranks, tp 2: ranks 0,1 | 2,3 | ... ; data-parallel groups 0,2,4,6 and 1,3,5,7.
  const GridPlace place = grid_place(5, 8, 2);
  EXPECT_EQ(place.tp_size, 2);
  EXPECT_EQ(place.tp_rank, 1);
  EXPECT_EQ(place.dp_size, 4);
  EXPECT_EQ(place.dp_rank, 2);
  const GridPlace wide = grid_place(6, 8, 4);
  EXPECT_EQ(wide.tp_rank, 2);
  EXPECT_EQ(wide.dp_size, 2);
  EXPECT_EQ(wide.dp_rank, 1);
  const GridPlace none = grid_place(3, 4, 1);
  EXPECT_EQ(none.tp_rank, 0);
  EXPECT_EQ(none.dp_size, 4);
  EXPECT_EQ(none.dp_rank, 3);
}

TEST(GridPlace, PipelineStagesAreConsecutiveBlocksOfRanks) {
  // 8 ranks, tp 2, pp 2: stage 0 is ranks 0-3 (dp groups 0,2 and 1,3), stage 1 ranks 4-7.
  const GridPlace place = grid_place(5, 8, 2, 2);
  EXPECT_EQ(place.tp_rank, 1);
  EXPECT_EQ(place.dp_size, 2);
  EXPECT_EQ(place.dp_rank, 0);
  EXPECT_EQ(place.pp_size, 2);
  EXPECT_EQ(place.pp_rank, 1);
  const GridPlace no_tp = grid_place(3, 4, 1, 2);
  EXPECT_EQ(no_tp.dp_size, 2);
  EXPECT_EQ(no_tp.dp_rank, 1);
  EXPECT_EQ(no_tp.pp_rank, 1);
  const GridPlace only_pp = grid_place(2, 4, 1, 4);
  EXPECT_EQ(only_pp.dp_size, 1);
  EXPECT_EQ(only_pp.pp_rank, 2);
}

TEST(GridPlace, GridsTheWorldCannotHoldAreErrors) {
  using testing::expect_error_naming;
  expect_error_naming([] { grid_place(0, 4, 0); }, "at least 1, got 0");
  expect_error_naming([] { grid_place(0, 2, 4); }, "needs at least 4 ranks, and the job has 2");
  expect_error_naming([] { grid_place(0, 6, 4); },
                      "do not divide into tensor-parallel groups of 4");
  expect_error_naming([] { grid_place(0, 4, 1, 0); }, "pipeline-parallel size must be at least 1");
  expect_error_naming([] { grid_place(0, 6, 2, 2); },
                      "the 6 ranks do not divide into 2 pipeline stages of tensor-parallel groups "
                      "of 2");
}

TEST(ProcessGrid, PipelineCommunicatorsSpanTheirGroups) {
  const int rank = world_rank();
  const int size = world_size();
  if (size % 2 != 0) {
    GTEST_SKIP() << "a pipeline of 2 stages needs an even world";
  }
  for (int tp : {1, 2}) {
    if (size % (2 * tp) != 0) continue;
    SCOPED_TRACE("tp_size " + std::to_string(tp));
    ProcessGrid grid = make_mpi_process_grid(tp, 2);
    const int stage_ranks = size / 2;
    EXPECT_EQ(grid.place.pp_rank, rank / stage_ranks);
    ASSERT_NE(grid.pipeline, nullptr);
    ASSERT_EQ(grid.pipeline->world_size(), 2);
    EXPECT_EQ(grid.pipeline->rank(), rank / stage_ranks);
    const std::vector<uint64_t> pipeline = all_gather_u64(*grid.pipeline, rank);
    EXPECT_EQ(pipeline[0], static_cast<uint64_t>(rank % stage_ranks));
    EXPECT_EQ(pipeline[1], static_cast<uint64_t>(rank % stage_ranks + stage_ranks));
    // The data-parallel group stays inside the stage.
    for (uint64_t member : all_gather_u64(*grid.data_parallel, rank)) {
      EXPECT_EQ(static_cast<int>(member) / stage_ranks, rank / stage_ranks);
    }
    // With two stages both tie: the tie group is both stages' ranks of this tensor-parallel rank,
    // the first stage's first.
    ASSERT_NE(grid.pipeline_ties, nullptr);
    const std::vector<uint64_t> ties = all_gather_u64(*grid.pipeline_ties, rank);
    ASSERT_EQ(ties.size(), static_cast<size_t>(2 * grid.place.dp_size));
    for (size_t i = 0; i < ties.size(); ++i) {
      EXPECT_EQ(static_cast<int>(ties[i]) % tp, rank % tp);
      if (i > 0) {
        EXPECT_LT(ties[i - 1], ties[i]);
      }
    }
  }
}

TEST(ProcessGrid, EachCommunicatorSpansItsGroup) {
  const int rank = world_rank();
  const int size = world_size();
  for (int tp = 1; tp <= size; ++tp) {
    if (size % tp != 0) continue;
    SCOPED_TRACE("tp_size " + std::to_string(tp));
    ProcessGrid grid = make_mpi_process_grid(tp);
    EXPECT_EQ(grid.place.tp_rank, rank % tp);
    EXPECT_EQ(grid.place.dp_rank, rank / tp);
    ASSERT_NE(grid.data_parallel, nullptr);
    ASSERT_EQ(grid.data_parallel->world_size(), size / tp);
    EXPECT_EQ(grid.data_parallel->rank(), rank / tp);
    const std::vector<uint64_t> dp_members = all_gather_u64(*grid.data_parallel, rank);
    for (int d = 0; d < size / tp; ++d) {
      EXPECT_EQ(dp_members[static_cast<size_t>(d)], static_cast<uint64_t>(d * tp + rank % tp));
    }
    if (tp == 1) {
      EXPECT_EQ(grid.tensor_parallel, nullptr);
      continue;
    }
    ASSERT_NE(grid.tensor_parallel, nullptr);
    ASSERT_EQ(grid.tensor_parallel->world_size(), tp);
    EXPECT_EQ(grid.tensor_parallel->rank(), rank % tp);
    const std::vector<uint64_t> tp_members = all_gather_u64(*grid.tensor_parallel, rank);
    for (int t = 0; t < tp; ++t) {
      EXPECT_EQ(tp_members[static_cast<size_t>(t)], static_cast<uint64_t>(rank / tp * tp + t));
    }
    // A sum over each group adds exactly its members' world ranks.
    float mine = static_cast<float>(rank), tp_sum = 0.0f, dp_sum = 0.0f;
    grid.tensor_parallel->all_reduce_sync(&mine, &tp_sum, 1, DType::kFloat32);
    grid.data_parallel->all_reduce_sync(&mine, &dp_sum, 1, DType::kFloat32);
    const int first = rank / tp * tp;
    EXPECT_EQ(tp_sum, static_cast<float>(tp * first + tp * (tp - 1) / 2));
    float expected_dp = 0.0f;
    for (int d = 0; d < size / tp; ++d) expected_dp += static_cast<float>(d * tp + rank % tp);
    EXPECT_EQ(dp_sum, expected_dp);
  }
}

TEST(ProcessGrid, AGridTheWorldCannotHoldIsAnErrorOnEveryRank) {
  testing::expect_error_naming([] { make_mpi_process_grid(world_size() + 1); }, "needs at least");
}

}  // namespace
}  // namespace zero
