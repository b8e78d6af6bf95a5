// zero-train's memory timeline over all of the engine's allocators: a run whose optimizer is
// offloaded to host memory (offload_optimizer cpu without pin_memory) records its pinned host
// tier (the gradient and parameter shards' host copies) and its pageable one (the master and
// the optimizer state) beside the engine's own; in every tier the categories sum to the tier's
// total at every event, and each tier peaks at its allocator's peak_total, the figure zero-train's
// step records report (peak_bytes, peak_pinned_host_bytes, peak_pageable_host_bytes). On the CPU
// the driver is not sampled: its columns stay empty and the plot has no driver line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "examples/memory_timeline.h"
#include "models/mlp.h"
#include "tests/examples/timeline_fields.h"
#include "tests/whole_file.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/model.h"

namespace zero::examples {
namespace {

TEST(MemoryTimeline, AHostOffloadRunRecordsTheHostTiersAndTheirPeaks) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const models::MlpConfig mlp{8, 24, 4, 3};
  EngineConfig config;
  config.stage = 2;
  config.offload.optimizer.device = OffloadDevice::kCpu;
  config.offload.optimizer.pin_memory = false;
  ZeroModel model(*comm, models::make_mlp(mlp), config);
  Engine& engine = model.engine();
  MemoryTimeline timeline(engine.allocator(), "host memory", engine.device_context());
  timeline.add(engine.pinned_host_allocator(), "pinned host memory");
  timeline.add(engine.pageable_host_allocator(), "pageable host memory");
  models::TeacherTask task(mlp, 7);
  for (long step = 1; step <= 3; ++step) {
    timeline.set_step(step);
    models::Batch batch = task.batch(step, 0, 8);
    Tensor grad;
    models::mse_loss(model.forward(batch.inputs), batch.targets, grad);
    model.backward(grad);
    model.step();
  }
  comm->stream().synchronize();

  const std::string path = std::filesystem::temp_directory_path() /
                           ("memory_timeline_test." + std::to_string(::getpid()) + ".tsv");
  timeline.write_events(path, engine.trace().spans());
  timeline.write_plot_script(path, engine.trace().spans(), 1);
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line,
            "time_ms\tstep\tcategory\ttier\tdelta_bytes\tcategory_bytes\ttotal_bytes\tphase\t"
            "driver_free_bytes\tdriver_total_bytes");
  std::map<std::string, std::map<std::string, uint64_t>> held;  // tier -> category -> bytes
  std::map<std::string, uint64_t> peak;
  std::set<std::pair<std::string, std::string>> seen;  // (tier, category)
  int events = 0;
  while (std::getline(in, line)) {
    const std::vector<std::string> f = split_tabs(line);
    ASSERT_EQ(f.size(), 10u) << line;
    const std::string& category = f[2];
    const std::string& tier = f[3];
    held[tier][category] = std::stoull(f[5]);
    const uint64_t total = std::stoull(f[6]);
    uint64_t sum = 0;
    for (const auto& [name, bytes] : held[tier]) sum += bytes;
    EXPECT_EQ(sum, total) << "the categories of " << tier << " do not sum to its total: " << line;
    peak[tier] = std::max(peak[tier], total);
    seen.emplace(tier, category);
    EXPECT_EQ(f[8], "") << "no driver on the CPU: " << line;
    EXPECT_EQ(f[9], "") << line;
    ++events;
  }
  EXPECT_GT(events, 0);
  for (const auto& expected :
       std::vector<std::pair<std::string, std::string>>{{"pinned host memory", "grads"},
                                                        {"pinned host memory", "params-shard"},
                                                        {"pageable host memory", "master"},
                                                        {"pageable host memory", "optimizer-state"},
                                                        {"host memory", "params-full"}}) {
    EXPECT_TRUE(seen.count(expected)) << expected.first << " " << expected.second;
  }
  EXPECT_EQ(peak["host memory"], engine.allocator().stats().peak_total);
  EXPECT_EQ(peak["pinned host memory"], engine.pinned_host_allocator().stats().peak_total);
  EXPECT_EQ(peak["pageable host memory"], engine.pageable_host_allocator().stats().peak_total);
  EXPECT_EQ(peak["pageable host memory"], engine.pageable_host_bytes());
  EXPECT_EQ(timeline.peak_bytes("pinned host memory"), peak["pinned host memory"]);
  EXPECT_EQ(timeline.peak_bytes("no such tier"), 0u);

  // The plot stacks the engine's categories and draws the host tiers' totals as lines.
  const std::string script = read_whole_file(path + ".gp");
  EXPECT_NE(script.find("title 'pinned host memory (total)'"), std::string::npos) << script;
  EXPECT_NE(script.find("title 'pageable host memory (total)'"), std::string::npos) << script;
  EXPECT_EQ(script.find("driver: in use"), std::string::npos) << script;
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".gp");
}

TEST(MemoryTimeline, ATierIsRecordedOnce) {
  Allocator first, second;
  MemoryTimeline timeline(first, "host memory");
  EXPECT_THROW(timeline.add(second, "host memory"), Error);
  EXPECT_THROW(timeline.add(first, "other memory"), Error);
}

}  // namespace
}  // namespace zero::examples
