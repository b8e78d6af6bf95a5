// The tagged allocator: current and peak bytes per category, alignment, zero fill, peak
// windows; tensors counted in it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "zero/runtime/device.h"
#include "zero/runtime/memory.h"
#include "zero/runtime/model.h"

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

// A memory timeline sees every allocation and release, with the bytes held after it.
TEST(Allocator, ObserverSeesEveryAllocationAndRelease) {
  Allocator allocator;
  std::vector<AllocationEvent> seen;
  allocator.set_observer([&](const AllocationEvent& e) { seen.push_back(e); });
  Buffer a = allocator.allocate(1024, MemoryCategory::kGrads);
  Buffer b = allocator.allocate(256, MemoryCategory::kActivation);
  a.reset();
  allocator.set_observer(nullptr);
  b.reset();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].category, MemoryCategory::kGrads);
  EXPECT_EQ(seen[0].delta_bytes, 1024);
  EXPECT_EQ(seen[1].category_bytes, 256u);
  EXPECT_EQ(seen[1].total_bytes, 1280u);
  EXPECT_EQ(seen[2].delta_bytes, -1024);
  EXPECT_EQ(seen[2].category_bytes, 0u);
  EXPECT_EQ(seen[2].total_bytes, 256u);
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

size_t at(MemoryCategory c) {
  return static_cast<size_t>(c);
}

// A window's peaks start from what is held when it starts; activations and checkpoints also
// peak together (the step records' peak_activation_bytes).
TEST(Allocator, WindowsPeakActivationsAndCheckpointsTogether) {
  Allocator allocator;
  Buffer model = allocator.allocate(640, MemoryCategory::kParamsFull);
  Buffer checkpoint = allocator.allocate(128, MemoryCategory::kCheckpoint);
  {
    Buffer first = allocator.allocate(256, MemoryCategory::kActivation);
    Buffer second = allocator.allocate(64, MemoryCategory::kActivation);
  }
  const MemoryStats& s = allocator.stats();
  EXPECT_EQ(s.window_peak_activations, 128u + 256u + 64u);
  EXPECT_EQ(s.window_peak[at(MemoryCategory::kActivation)], 320u);
  EXPECT_EQ(s.window_peak[at(MemoryCategory::kCheckpoint)], 128u);
  EXPECT_EQ(s.activations(), 128u);
  EXPECT_EQ(s.allocations[at(MemoryCategory::kActivation)], 2u);
  allocator.start_window();
  EXPECT_EQ(s.window_peak_activations, 128u);
  EXPECT_EQ(s.window_peak[at(MemoryCategory::kActivation)], 0u);
  EXPECT_EQ(s.window_peak[at(MemoryCategory::kParamsFull)], 640u);
  Buffer third = allocator.allocate(64, MemoryCategory::kActivation);
  EXPECT_EQ(s.window_peak_activations, 192u);
  EXPECT_EQ(s.peak[at(MemoryCategory::kActivation)], 320u);  // the run's peak stays
  EXPECT_NE(allocator.summary().find("checkpoints"), std::string::npos) << allocator.summary();
}

// A tensor made from an allocator is counted there until it goes; so are its copies, in the
// same category; a move keeps the one allocation.
TEST(Allocator, CountsTensorsMadeFromIt) {
  Allocator allocator;
  {
    Tensor t({4, 8}, nullptr, allocator, MemoryCategory::kCheckpoint);
    EXPECT_EQ(t.allocator(), &allocator);
    EXPECT_EQ(t.category(), MemoryCategory::kCheckpoint);
    EXPECT_EQ(allocator.stats().current[at(MemoryCategory::kCheckpoint)], 128u);
    t.data()[5] = 2.5f;
    const Tensor copy = t;
    EXPECT_EQ(copy.to_host()[5], 2.5f);
    EXPECT_EQ(copy.category(), MemoryCategory::kCheckpoint);
    EXPECT_EQ(allocator.stats().current[at(MemoryCategory::kCheckpoint)], 256u);
    Tensor moved = std::move(t);
    EXPECT_EQ(allocator.stats().current[at(MemoryCategory::kCheckpoint)], 256u);
    EXPECT_EQ(moved.to_host()[5], 2.5f);
    const Tensor plain({4, 8});
    EXPECT_EQ(plain.allocator(), nullptr);
  }
  EXPECT_EQ(allocator.stats().current_total, 0u);
  // The engine's allocator on the CPU allocates from a CPU context: host memory too.
  std::shared_ptr<DeviceContext> cpu = DeviceContext::create(Device::cpu());
  Allocator on_cpu(*cpu);
  const Tensor t({2}, cpu, on_cpu, MemoryCategory::kActivation);
  EXPECT_EQ(on_cpu.stats().current[at(MemoryCategory::kActivation)], 8u);
}

}  // namespace
}  // namespace zero
