// Which OpenBLAS core replaces the one it chose: only its cores without AVX2, and only with
// one this CPU can run.
#include "zero/kernels/blas_core.h"

#include <gtest/gtest.h>

namespace {

using zero::kernels::better_blas_core;

TEST(BetterBlasCore, ReplacesPreAvx2CoresByWhatTheCpuRuns) {
  EXPECT_EQ(better_blas_core("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(better_blas_core("Prescott", true, false), "Haswell");
  EXPECT_EQ(better_blas_core("Sandybridge", true, false), "Haswell");
  EXPECT_EQ(better_blas_core("NEHALEM", true, true), "SkylakeX");
  EXPECT_EQ(better_blas_core("Opteron(SSE3)", true, false), "Haswell");
}

TEST(BetterBlasCore, KeepsAvx2CoresUnknownNamesAndOldCpus) {
  for (const char* good : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(better_blas_core(good, true, true), "") << good;
  }
  EXPECT_EQ(better_blas_core("SomeFutureLake", true, true), "");
  EXPECT_EQ(better_blas_core("Prescott", false, false), "");
}

// This process's OpenBLAS answers with a name, and the advice agrees with the warning.
TEST(BetterBlasCore, ThisProcess) {
  EXPECT_FALSE(zero::kernels::blas_core_name().empty());
  EXPECT_EQ(zero::kernels::better_blas_core().empty(), zero::kernels::blas_core_warning().empty());
}

}  // namespace
