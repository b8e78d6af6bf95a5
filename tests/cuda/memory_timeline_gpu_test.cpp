// The memory timeline on a GPU: the device context reports the driver's free and total memory
// (cudaMemGetInfo), which an allocation through the engine's allocator lowers by at least its
// size; the timeline samples it at every allocation and release and at every step start, writes
// it in its file's last two columns, as counter tracks and as a line of the plot. Prints what
// one query of the driver costs, since the timeline makes one per event.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "examples/memory_timeline.h"
#include "tests/examples/timeline_fields.h"
#include "zero/runtime/device.h"
#include "zero/runtime/gnuplot.h"

namespace zero::examples {
namespace {

class MemoryTimelineOnGpu : public ::testing::Test {
 protected:
  void SetUp() override { ZERO_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_F(MemoryTimelineOnGpu, TheDriverCountsAnAllocationOfTheEngine) {
  std::shared_ptr<DeviceContext> device = DeviceContext::create(Device::cuda(0));
  Allocator allocator(*device);
  const std::optional<DriverMemory> before = device->driver_memory();
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(before->total_bytes, 0u);
  EXPECT_LE(before->free_bytes, before->total_bytes);
  const size_t bytes = size_t{256} << 20;
  Buffer buffer = allocator.allocate(bytes, MemoryCategory::kActivation);
  device->synchronize();
  const std::optional<DriverMemory> after = device->driver_memory();
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->total_bytes, before->total_bytes);
  EXPECT_LE(after->free_bytes + bytes, before->free_bytes)
      << "256 MiB allocated, the driver's free memory went from " << before->free_bytes << " to "
      << after->free_bytes;

  const int queries = 1000;
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < queries; ++k) device->driver_memory();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::printf("driver_memory(): %.2f us per query (%d queries)\n", us / queries, queries);
}

TEST_F(MemoryTimelineOnGpu, EveryEventAndStepStartSamplesTheDriver) {
  std::shared_ptr<DeviceContext> device = DeviceContext::create(Device::cuda(0));
  Allocator allocator(*device);
  Allocator pinned(device->pinned_memory());
  Buffer kept = allocator.allocate(size_t{8} << 20, MemoryCategory::kParamsShard);
  MemoryTimeline timeline(allocator, device->memory_name(), device);
  timeline.add(pinned, "pinned host memory");
  timeline.set_step(1);
  {
    Buffer activations = allocator.allocate(size_t{64} << 20, MemoryCategory::kActivation);
    Buffer staging = pinned.allocate(size_t{4} << 20, MemoryCategory::kNvmeStaging);
  }
  timeline.set_step(2);
  Buffer late = allocator.allocate(size_t{1} << 20, MemoryCategory::kOther);
  device->synchronize();

  const std::string path = std::filesystem::temp_directory_path() /
                           ("memory_timeline_gpu_test." + std::to_string(::getpid()) + ".tsv");
  const std::vector<TraceSpan> no_spans;
  timeline.write_events(path, no_spans);
  timeline.write_plot_script(path, no_spans, 1);
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  int events = 0;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = split_tabs(line);
    ASSERT_EQ(f.size(), 10u) << line;
    ASSERT_FALSE(f[8].empty()) << "no driver sample: " << line;
    ASSERT_FALSE(f[9].empty()) << "no driver sample: " << line;
    EXPECT_LE(std::stoull(f[8]), std::stoull(f[9])) << line;
    ++events;
  }
  EXPECT_EQ(events, 6);  // the kept buffer at the start, two allocations and their releases, late

  Trace trace(/*enabled=*/true);
  timeline.add_counters(trace);
  int free_samples = 0, total_samples = 0;
  for (const TraceCounter& c : trace.counters()) {
    free_samples += c.name == "device free (driver)";
    total_samples += c.name == "device total (driver)";
  }
  EXPECT_EQ(free_samples, events + 2);  // and the two step starts
  EXPECT_EQ(total_samples, events + 2);

  std::ifstream script_file(path + ".gp");
  std::stringstream script;
  script << script_file.rdbuf();
  EXPECT_NE(script.str().find("title 'driver: in use of "), std::string::npos) << script.str();
  EXPECT_NE(script.str().find("title 'pinned host memory (total)'"), std::string::npos);
  if (gnuplot_on_path()) {
    run_gnuplot(path + ".gp");
    EXPECT_TRUE(std::filesystem::exists(path + ".png"));
    std::filesystem::remove(path + ".png");
  } else {
    std::printf("gnuplot is not on PATH here: the plot's script is checked, not drawn\n");
  }
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".gp");
}

}  // namespace
}  // namespace zero::examples
