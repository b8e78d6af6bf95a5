// The layout as a pure function: alignment, padding into equal shards, unit merging, edge cases
// and the fingerprints the ranks compare at start.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "zero/core/check.h"
#include "zero/runtime/layout.h"

namespace zero {
namespace {

std::vector<ParamSpec> three_modules() {
  return {
      {"a.weight", {3, 5}, 0},                                                   // 15 elements
      {"a.bias", {3}, 0},      {"b.weight", {100}, 1}, {"c.weight", {0, 4}, 2},  // empty
      {"c.bias", {7}, 2},
  };
}

TEST(Layout, AlignsEveryParameterAndPadsUnitsIntoEqualShards) {
  for (int world : {1, 2, 3, 4, 7}) {
    Layout layout = Layout::build(three_modules(), LayoutOptions{world, DType::kFloat32, 64, 0});
    ASSERT_EQ(layout.units().size(), 3u);
    for (const ParamPlacement& p : layout.params()) {
      EXPECT_EQ(p.offset % 16, 0u) << p.name;  // 64 bytes of fp32
      EXPECT_LE(p.offset + p.numel, layout.units()[p.unit].used);
    }
    for (const Unit& u : layout.units()) {
      EXPECT_EQ(u.numel % (16 * world), 0u);
      EXPECT_EQ(u.shard * world, u.numel);
      EXPECT_GE(u.numel, u.used);
      EXPECT_LT(u.numel - u.used, 16u * world + 16u);
    }
    EXPECT_EQ(layout.params()[1].offset, 16u);  // a.bias after 15 weights, aligned
    EXPECT_EQ(layout.numel(), 15u + 3u + 100u + 0u + 7u);
  }
}

// stage3_param_persistence_threshold is per parameter: every parameter under it goes to one
// persistent unit after the module units, which keep their order; a module whose parameters
// are all small has no unit of its own.
TEST(Layout, ShardRangeIsEachRanksEqualSliceAndRefusesUnevenSplits) {
  const ElementRange first = shard_range(48, 0, 3);
  const ElementRange last = shard_range(48, 2, 3);
  EXPECT_EQ(first.first, 0u);
  EXPECT_EQ(first.count, 16u);
  EXPECT_EQ(last.first, 32u);
  EXPECT_EQ(last.end(), 48u);
  EXPECT_THROW(shard_range(48, 3, 3), Error);
  EXPECT_THROW(shard_range(48, -1, 3), Error);
  EXPECT_THROW(shard_range(49, 0, 3), Error);
}

TEST(Layout, SmallParametersGoToOnePersistentUnit) {
  LayoutOptions options{2, DType::kFloat32, 64, 0};
  options.persistent_below = 10;
  const Layout layout = Layout::build(three_modules(), options);
  ASSERT_EQ(layout.units().size(), 3u);  // a, b, and the persistent one (c has only small ones)
  EXPECT_FALSE(layout.units()[0].persistent);
  EXPECT_FALSE(layout.units()[1].persistent);
  EXPECT_TRUE(layout.units()[2].persistent);
  EXPECT_EQ(layout.unit_of_module(0), 0);
  EXPECT_EQ(layout.unit_of_module(1), 1);
  EXPECT_EQ(layout.unit_of_module(2), -1);
  const std::vector<std::string> persistent = {"a.bias", "c.weight", "c.bias"};
  for (const ParamPlacement& p : layout.params()) {
    const bool small = std::find(persistent.begin(), persistent.end(), p.name) != persistent.end();
    EXPECT_EQ(p.unit, small ? 2 : p.module) << p.name;
  }
  EXPECT_EQ(layout.units()[2].params, (std::vector<int>{1, 3, 4}));
  EXPECT_NE(layout.fingerprint(3),
            Layout::build(three_modules(), {2, DType::kFloat32, 64, 0}).fingerprint(3));
}

TEST(Layout, AlignmentFollowsTheElementSize) {
  Layout layout = Layout::build(three_modules(), LayoutOptions{2, DType::kBFloat16, 64, 0});
  EXPECT_EQ(layout.params()[1].offset, 32u);  // 64 bytes of 2-byte elements
  for (const Unit& u : layout.units()) EXPECT_EQ(u.shard % 32, 0u);
}

TEST(Layout, SmallNeighboursMergeUpToTheThreshold) {
  // Modules in fp32 elements: a = 16 + 3 = 19 (32 once the next module is aligned), b = 100,
  // c = 7 (its empty weight takes no space). a+b = 132 elements = 528 B; a+b+c = 151 = 604 B.
  Layout merged = Layout::build(three_modules(), LayoutOptions{1, DType::kFloat32, 64, 1024});
  ASSERT_EQ(merged.units().size(), 1u);
  EXPECT_EQ(merged.unit_of_module(0), 0);
  EXPECT_EQ(merged.unit_of_module(2), 0);
  EXPECT_EQ(merged.units()[0].first_module, 0);
  EXPECT_EQ(merged.units()[0].last_module, 2);

  Layout partly = Layout::build(three_modules(), LayoutOptions{1, DType::kFloat32, 64, 256});
  ASSERT_EQ(partly.units().size(), 3u);  // a+b is 528 B and b+c 476 B, both over 256

  Layout none = Layout::build(three_modules(), LayoutOptions{1, DType::kFloat32, 64, 0});
  EXPECT_EQ(none.units().size(), 3u);
}

TEST(Layout, ModulesOfDifferentChunksNeverShareAUnit) {
  // The three modules fit one unit of 1024 B (above); b starts an interleaved stage's chunk 1.
  std::vector<ParamSpec> specs = three_modules();
  for (ParamSpec& spec : specs) spec.chunk = spec.module >= 1 ? 1 : 0;
  Layout layout = Layout::build(specs, LayoutOptions{1, DType::kFloat32, 64, 1024});
  ASSERT_EQ(layout.units().size(), 2u);
  EXPECT_EQ(layout.units()[0].last_module, 0);
  EXPECT_EQ(layout.units()[1].first_module, 1);
  EXPECT_EQ(layout.units()[1].last_module, 2);
}

TEST(Layout, ParameterLargerThanTheThresholdIsAUnitOfItsOwn) {
  std::vector<ParamSpec> specs = {{"x", {4}, 0}, {"big", {1000}, 1}, {"y", {4}, 2}};
  Layout layout = Layout::build(specs, LayoutOptions{2, DType::kFloat32, 64, 256});
  ASSERT_EQ(layout.units().size(), 3u);
  EXPECT_EQ(layout.units()[1].params, std::vector<int>{1});
  EXPECT_GE(layout.units()[1].numel, 1000u);
}

TEST(Layout, UnitSmallerThanTheWorldStillSplitsEvenly) {
  std::vector<ParamSpec> specs = {{"tiny", {1}, 0}, {"empty", {0}, 1}};
  Layout layout = Layout::build(specs, LayoutOptions{4, DType::kFloat32, 64, 0});
  ASSERT_EQ(layout.units().size(), 2u);
  for (const Unit& u : layout.units()) {
    EXPECT_EQ(u.shard, 16u);
    EXPECT_EQ(u.numel, 64u);
  }
  EXPECT_EQ(layout.numel(), 1u);
  EXPECT_EQ(layout.padded_numel(), 128u);
}

TEST(Layout, IsAPureFunctionOfItsInputs) {
  LayoutOptions options{3, DType::kFloat32, 64, 128};
  Layout a = Layout::build(three_modules(), options);
  Layout b = Layout::build(three_modules(), options);
  EXPECT_EQ(a.fingerprint(2), b.fingerprint(2));
  EXPECT_NE(a.fingerprint(2), a.fingerprint(3));  // the stage is part of it

  std::vector<ParamSpec> changed = three_modules();
  changed[2].shape = {101};
  Layout c = Layout::build(changed, options);
  EXPECT_NE(a.fingerprint(2), c.fingerprint(2));
  EXPECT_EQ(a.param_fingerprint(1), c.param_fingerprint(1));
  EXPECT_NE(a.param_fingerprint(2), c.param_fingerprint(2));

  Layout other_world = Layout::build(three_modules(), LayoutOptions{4, DType::kFloat32, 64, 128});
  EXPECT_NE(a.fingerprint(2), other_world.fingerprint(2));
  EXPECT_EQ(a.describe_param(0), "'a.weight' [3, 5] fp32 (module 0)");
}

TEST(Layout, RejectsBadSpecsWithClearErrors) {
  auto message_of = [](const std::vector<ParamSpec>& specs, LayoutOptions options) {
    try {
      Layout::build(specs, options);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LayoutOptions ok{2, DType::kFloat32, 64, 0};
  EXPECT_NE(message_of({{"w", {2}, 1}, {"v", {2}, 0}}, ok).find("registered in order"),
            std::string::npos);
  EXPECT_NE(message_of({{"w", {2}, 0}, {"w", {3}, 0}}, ok).find("'w' is registered twice"),
            std::string::npos);
  EXPECT_NE(message_of({{"w", {2, -1}, 0}}, ok).find("negative dimension -1"), std::string::npos);
  EXPECT_NE(message_of({{"", {2}, 0}}, ok).find("empty name"), std::string::npos);
  std::vector<ParamSpec> chunks_backwards = {{"w", {2}, 0}, {"v", {2}, 1}};
  chunks_backwards[0].chunk = 1;
  EXPECT_NE(message_of(chunks_backwards, ok)
                .find("'v' belongs to chunk 0 after a parameter of "
                      "chunk 1; chunks must be registered in order"),
            std::string::npos);
  EXPECT_NE(message_of({{"w", {2}, 0}}, LayoutOptions{0, DType::kFloat32, 64, 0})
                .find("world size must be at least 1"),
            std::string::npos);
  EXPECT_NE(message_of({{"w", {2}, 0}}, LayoutOptions{1, DType::kFloat32, 6, 0})
                .find("not a multiple of the element size"),
            std::string::npos);
}

}  // namespace
}  // namespace zero
