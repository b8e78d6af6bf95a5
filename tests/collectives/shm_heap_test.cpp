// The bookkeeping of node-shared memory (collectives/shm_heap.h): first fit, alignment, and
// ranges merged back on release so that a heap given back whole can hold its largest range again.
#include "collectives/shm_heap.h"

#include <gtest/gtest.h>

namespace zero::backend {
namespace {

TEST(HeapSpace, TakesAlignedRangesFirstFit) {
  HeapSpace heap(1024);
  EXPECT_EQ(heap.take(10, 64), 0u);
  EXPECT_EQ(heap.take(64, 64), 64u);   // the first 10 bytes were rounded up to 64
  EXPECT_EQ(heap.take(1, 256), 256u);  // aligned past the free bytes at 128
  EXPECT_EQ(heap.take(64, 64), 128u);  // which the next fit fills
  EXPECT_EQ(heap.take(1024, 64), std::nullopt);
  EXPECT_FALSE(heap.empty());
}

TEST(HeapSpace, GivenBackRangesMergeWithTheirNeighbours) {
  HeapSpace heap(192);
  const size_t a = *heap.take(64, 64);
  const size_t b = *heap.take(64, 64);
  const size_t c = *heap.take(64, 64);
  EXPECT_EQ(heap.take(128, 64), std::nullopt);
  EXPECT_TRUE(heap.give_back(a));
  EXPECT_TRUE(heap.give_back(c));
  EXPECT_EQ(heap.take(128, 64), std::nullopt) << "a and c are free but not adjacent";
  EXPECT_TRUE(heap.give_back(b));
  EXPECT_TRUE(heap.empty());
  EXPECT_EQ(heap.take(192, 64), 0u) << "all three merged into one range";
}

TEST(HeapSpace, RefusesWhatItDidNotHandOut) {
  HeapSpace heap(256);
  const size_t a = *heap.take(64, 64);
  EXPECT_FALSE(heap.give_back(a + 1));
  EXPECT_TRUE(heap.give_back(a));
  EXPECT_FALSE(heap.give_back(a)) << "twice";
}

}  // namespace
}  // namespace zero::backend
