// The memory formulas of zero/runtime/estimate.h: the ZeRO paper's Figure 1, every stage in
// both precisions against the closed forms, shard rounding, and bad arguments.
#include <gtest/gtest.h>

#include <cstdint>

#include "zero/core/check.h"
#include "zero/runtime/estimate.h"

namespace zero {
namespace {

// Figure 1 of the paper: Ψ = 7.5B, N = 64, K = 12 (mixed precision Adam).
TEST(EstimateModelState, ReproducesThePapersFigure1) {
  const uint64_t psi = 7'500'000'000;
  EXPECT_EQ(estimate_model_state(psi, 64, DType::kBFloat16, 0).total(), 120'000'000'000u);
  EXPECT_EQ(estimate_model_state(psi, 64, DType::kBFloat16, 1).total(), 31'406'250'000u);
  EXPECT_EQ(estimate_model_state(psi, 64, DType::kBFloat16, 2).total(), 16'640'625'000u);
  EXPECT_EQ(estimate_model_state(psi, 64, DType::kBFloat16, 3).total(), 1'875'000'000u);
  // fp16 stores the same bytes as bf16.
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_EQ(estimate_model_state(psi, 64, DType::kFloat16, stage).total(),
              estimate_model_state(psi, 64, DType::kBFloat16, stage).total());
  }
}

// Ψ a multiple of N (as a padded layout is), so every Ψ/N is exact.
TEST(EstimateModelState, MatchesTheClosedFormsOfEveryStage) {
  for (int n : {1, 2, 3, 8, 64}) {
    const uint64_t psi = 1'234'560ull * static_cast<uint64_t>(n);
    const uint64_t per_rank = psi / static_cast<uint64_t>(n);
    auto total = [&](DType dtype, int stage) {
      return estimate_model_state(psi, n, dtype, stage).total();
    };
    EXPECT_EQ(total(DType::kBFloat16, 0), 16 * psi) << "N=" << n;
    EXPECT_EQ(total(DType::kBFloat16, 1), 4 * psi + 12 * per_rank) << "N=" << n;
    EXPECT_EQ(total(DType::kBFloat16, 2), 2 * psi + 14 * per_rank) << "N=" << n;
    EXPECT_EQ(total(DType::kBFloat16, 3), 16 * per_rank) << "N=" << n;
    EXPECT_EQ(total(DType::kFloat32, 0), 16 * psi) << "N=" << n;
    EXPECT_EQ(total(DType::kFloat32, 1), 8 * psi + 8 * per_rank) << "N=" << n;
    EXPECT_EQ(total(DType::kFloat32, 2), 4 * psi + 12 * per_rank) << "N=" << n;
    EXPECT_EQ(total(DType::kFloat32, 3), 16 * per_rank) << "N=" << n;
  }
}

TEST(EstimateModelState, SplitsBytesByKind) {
  const ModelStateBytes mixed = estimate_model_state(1000, 4, DType::kBFloat16, 2);
  EXPECT_EQ(mixed.params, 2000u);     // whole, 2 bytes each
  EXPECT_EQ(mixed.grads, 500u);       // a 250-element shard, 2 bytes each
  EXPECT_EQ(mixed.optimizer, 3000u);  // the shard's master, m and v, 4 bytes each
  const ModelStateBytes fp32 = estimate_model_state(1000, 4, DType::kFloat32, 1);
  EXPECT_EQ(fp32.params, 4000u);
  EXPECT_EQ(fp32.grads, 4000u);
  EXPECT_EQ(fp32.optimizer, 2000u);  // no master: m and v of the shard
}

// A count that does not divide by N: every rank holds the padded shard ceil(Ψ/N).
TEST(EstimateModelState, ShardsRoundUp) {
  const ModelStateBytes bytes = estimate_model_state(10, 3, DType::kFloat32, 3);
  EXPECT_EQ(bytes.params, 4u * 4);
  EXPECT_EQ(bytes.grads, 4u * 4);
  EXPECT_EQ(bytes.optimizer, 8u * 4);
  EXPECT_EQ(estimate_model_state(0, 3, DType::kFloat32, 3).total(), 0u);
}

TEST(EstimateModelState, RejectsBadRanksAndStages) {
  EXPECT_THROW(estimate_model_state(100, 0, DType::kFloat32, 0), Error);
  EXPECT_THROW(estimate_model_state(100, -2, DType::kFloat32, 0), Error);
  EXPECT_THROW(estimate_model_state(100, 2, DType::kFloat32, 4), Error);
  EXPECT_THROW(estimate_model_state(100, 2, DType::kFloat32, -1), Error);
}

}  // namespace
}  // namespace zero
