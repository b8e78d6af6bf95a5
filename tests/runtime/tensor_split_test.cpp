// Cutting and merging tensor-parallel slices (tensor_split.h) element by element: columns in
// parts (a fused QKV), rows with the padding of a vocabulary that does not divide, the shapes,
// and the splits that cannot describe a slice.
#include "zero/runtime/tensor_split.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "zero/core/check.h"

namespace zero {
namespace {

std::vector<float> counting(size_t n) {
  std::vector<float> v;
  for (size_t i = 0; i < n; ++i) v.push_back(static_cast<float>(i));
  return v;
}

TEST(TensorSplit, ColumnsInPartsAreCutPerPartAndMergeBack) {
  // [2, 12] in 3 parts of 4 over 2 ranks: rank 1 holds columns 2-3 of each part.
  const TensorSplit qkv{1, 3, 12};
  const std::vector<float> full = counting(24);
  EXPECT_EQ(slice_shape(qkv, {2, 12}, 2), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(full_shape(qkv, {2, 6}), (std::vector<int64_t>{2, 12}));
  const std::vector<float> r0 = cut_slice(qkv, {2, 12}, full.data(), 2, 0);
  const std::vector<float> r1 = cut_slice(qkv, {2, 12}, full.data(), 2, 1);
  EXPECT_EQ(r0, (std::vector<float>{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21}));
  EXPECT_EQ(r1, (std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23}));
  EXPECT_EQ(merge_slices(qkv, {2, 12}, {r0.data(), r1.data()}), full);
  // Over 4 ranks and back, and from 4 to 2 through the whole tensor.
  std::vector<std::vector<float>> four;
  for (int r = 0; r < 4; ++r) four.push_back(cut_slice(qkv, {2, 12}, full.data(), 4, r));
  EXPECT_EQ(four[3], (std::vector<float>{3, 7, 11, 15, 19, 23}));
  const std::vector<float> merged =
      merge_slices(qkv, {2, 12}, {four[0].data(), four[1].data(), four[2].data(), four[3].data()});
  EXPECT_EQ(merged, full);
  EXPECT_EQ(cut_slice(qkv, {2, 12}, merged.data(), 2, 1), r1);
}

TEST(TensorSplit, RowsThatDoNotDivideArePaddedAndThePaddingIsDropped) {
  // A vocabulary of 5 rows of 2 over 2 ranks: 3 rows each, rank 1's last one zeros.
  const TensorSplit vocabulary{0, 1, 5};
  const std::vector<float> full = counting(10);
  EXPECT_EQ(split_extent(vocabulary, 2), 3);
  EXPECT_EQ(split_extent(vocabulary, 1), 5);
  const std::vector<float> r0 = cut_slice(vocabulary, {5, 2}, full.data(), 2, 0);
  const std::vector<float> r1 = cut_slice(vocabulary, {5, 2}, full.data(), 2, 1);
  EXPECT_EQ(r0, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r1, (std::vector<float>{6, 7, 8, 9, 0, 0}));
  std::vector<float> dirty = r1;
  dirty[4] = dirty[5] = 99.0f;  // whatever the padding holds never reaches the whole tensor
  EXPECT_EQ(merge_slices(vocabulary, {5, 2}, {r0.data(), dirty.data()}), full);
  // A group of one holds the whole tensor.
  EXPECT_EQ(cut_slice(vocabulary, {5, 2}, full.data(), 1, 0), full);
}

TEST(TensorSplit, ASplitThatCannotDescribeTheSliceIsNamed) {
  EXPECT_STREQ(split_problem({}, {4}, 2), "");
  EXPECT_STREQ(split_problem({0, 1, 5}, {3, 2}, 2), "");
  EXPECT_STREQ(split_problem({2, 1, 4}, {4, 4}, 2), "a split dimension outside the shape");
  EXPECT_STREQ(split_problem({1, 3, 10}, {2, 4}, 2),
               "a split whose parts do not divide its full extent");
  EXPECT_STREQ(split_problem({0, 1, 8}, {8, 2}, 2),
               "a slice whose extent is not its share of the full extent");
  EXPECT_STREQ(split_problem({-2, 1, 8}, {8}, 2), "a split dimension below -1");
  // Cutting and merging check theirs: no division by zero parts or ranks, no rank outside.
  const std::vector<float> full = counting(8);
  EXPECT_THROW(cut_slice({0, 0, 8}, {8}, full.data(), 2, 0), Error);
  EXPECT_THROW(cut_slice({0, 1, 8}, {8}, full.data(), 2, 2), Error);
  EXPECT_THROW(cut_slice({1, 1, 8}, {8}, full.data(), 2, 0), Error);
  EXPECT_THROW(merge_slices({0, 1, 8}, {8}, {}), Error);
}

}  // namespace
}  // namespace zero
