// The tagged allocator: current and peak bytes per category, alignment, zero fill.
#include <gtest/gtest.h>

#include <cstdint>

#include "zero/runtime/memory.h"

namespace zero {
namespace {

TEST(Allocator, CountsCurrentAndPeakPerCategory) {
  Allocator allocator;
  {
    Buffer a = allocator.allocate(1000, MemoryCategory::kParamsFull);
    Buffer b = allocator.allocate(24, MemoryCategory::kOptimizerState);
    Buffer c = allocator.allocate(4096, MemoryCategory::kPrefetch);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(a.as<unsigned char>()[i], 0);
    const MemoryStats& s = allocator.stats();
    EXPECT_EQ(s.model_state(), 1024u);
    EXPECT_EQ(s.buffers(), 4096u);
    EXPECT_EQ(s.current_total, 5120u);
    c.reset();
    EXPECT_EQ(allocator.stats().buffers(), 0u);
    EXPECT_EQ(allocator.stats().peak[static_cast<int>(MemoryCategory::kPrefetch)], 4096u);
    Buffer moved = std::move(a);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(allocator.stats().model_state(), 1024u);
  }
  EXPECT_EQ(allocator.stats().current_total, 0u);
  EXPECT_EQ(allocator.stats().peak_total, 5120u);
  std::string summary = allocator.summary();
  EXPECT_NE(summary.find("params-full"), std::string::npos);
  EXPECT_NE(summary.find("prefetch"), std::string::npos);
  EXPECT_EQ(summary.find("grads"), std::string::npos);  // never used: not listed
}

TEST(Allocator, ZeroBytesGivesAnEmptyBuffer) {
  Allocator allocator;
  Buffer empty = allocator.allocate(0, MemoryCategory::kGrads);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(allocator.stats().current_total, 0u);
}

}  // namespace
}  // namespace zero

namespace zero {
namespace {

TEST(Allocator, LimitTurnsAnAllocationIntoANamedOutOfMemoryError) {
  Allocator allocator;
  allocator.set_limit(4096);
  Buffer a = allocator.allocate(3000, MemoryCategory::kGrads);
  try {
    allocator.allocate(2000, MemoryCategory::kOptimizerState);
    FAIL() << "no error past the limit";
  } catch (const OutOfMemoryError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("out of memory: allocating 1.95 KiB for optimizer-state would pass the "
                           "limit of 4.00 KiB (2.93 KiB in use)"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("grads"), std::string::npos) << "the summary is part of it";
  }
  EXPECT_EQ(allocator.stats().current_total, 3000u);  // nothing half-allocated
}

}  // namespace
}  // namespace zero
