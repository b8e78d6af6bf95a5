// ZeRO++'s hierarchical partitioning (hpZ, grid.hpz_partition_size = the ranks per node): a
// unit's first gather after a step runs over the whole group and leaves each rank its 1/k
// secondary shard; later gathers of it run over the node's k ranks and give the same values, bit
// for bit; the secondary shards are planned model state; and training is bitwise that of plain
// stage 3 (with qwZ, of qwZ alone), with the backward's parameter traffic moved into the node.
// Registered at 2 ranks (one node) and at 4 in two nodes declared by ZERO_NODE_SIZE=2.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/memory_plan.h"
#include "tests/expect_error.h"
#include "tests/runtime/train_util.h"
#include "zero/kernels/cpu_kernels.h"

namespace zero {
namespace {

using namespace zero::testing;

const MlpConfig kMlp{8, 24, 4, 3};

// The ranks per node the communicator found: hpZ's k (0 where the layout is irregular).
int node_size() {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  return ranks_per_node(*comm);
}

uint64_t all_gather_bytes(const Communicator& comm) {
  return comm.counters().bytes[static_cast<size_t>(CollectiveOp::kAllGather)];
}

EngineConfig hpz_config(DType dtype, int k) {
  EngineConfig config;
  config.stage = 3;
  config.precision.dtype = dtype;
  config.grid.hpz_partition_size = k;
  return config;
}

// Each unit's first gather costs the group's all-gather and nothing in the node; its second the
// node's all-gather of k secondary shards, (k-1) x numel/k elements, and nothing over the
// group; both give the same bytes. The secondary shards are the plan's model state.
TEST(HierarchicalPartition, SecondGatherStaysInTheNodeWithTheSameValues) {
  const int k = node_size();
  if (k < 2) GTEST_SKIP() << "one rank per node: hpZ has nothing to split";
  for (bool quantized : {false, true}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      std::unique_ptr<Communicator> comm = make_mpi_communicator();
      const int n = comm->world_size();
      EngineConfig config = hpz_config(dtype, k);
      config.precision.quantized_weights = quantized;
      ZeroModel model(*comm, models::make_mlp(kMlp), config);
      Engine& engine = model.engine();
      const Layout& layout = engine.layout();
      const size_t elem = dtype_size(dtype);
      const std::string what = std::string(dtype_name(dtype)) + (quantized ? ", qwZ" : "");
      EngineConfig without = config;
      without.grid.hpz_partition_size = 1;
      uint64_t secondary = 0;
      for (const Unit& unit : layout.units()) {
        if (!unit.persistent) secondary += unit.numel / static_cast<size_t>(k) * elem;
      }
      EXPECT_GT(secondary, 0u) << what;
      EXPECT_EQ(plan_memory(layout, config).model_state,
                plan_memory(layout, without).model_state + secondary)
          << what;
      EXPECT_EQ(engine.model_state_bytes(), plan_memory(layout, config).model_state) << what;
      // hpZ adds no buffers. (Against the plan itself they differ across declared nodes in
      // fp32: the hierarchical path stages more than the plan's MPI figure, as mpi_communicator
      // says.)
      EXPECT_EQ(plan_memory(layout, config).buffers, plan_memory(layout, without).buffers);
      {
        ZeroModel plain(*comm, models::make_mlp(kMlp), without);
        EXPECT_EQ(engine.buffer_bytes(), plain.engine().buffer_bytes()) << what;
      }
      // The post-construction prefetch of unit 0, if any, has run into unit 0's secondary.
      comm->stream().synchronize();
      for (size_t u = 0; u < layout.units().size(); ++u) {
        const Unit& unit = layout.units()[u];
        const int unit_index = static_cast<int>(u);
        std::vector<std::vector<char>> seen(2);
        for (int gather = 0; gather < 2; ++gather) {
          const uint64_t group_before = all_gather_bytes(*comm);
          const uint64_t node_before = engine.own_comm_bytes();
          engine.gather(unit_index);
          for (size_t p = 0; p < layout.params().size(); ++p) {
            const ParamPlacement& pl = layout.params()[p];
            if (pl.unit != unit_index) continue;
            const char* values = static_cast<const char*>(engine.param(static_cast<int>(p)));
            seen[gather].insert(seen[gather].end(), values, values + pl.numel * elem);
          }
          engine.release(unit_index);
          comm->stream().synchronize();
          const uint64_t group = all_gather_bytes(*comm) - group_before;
          const uint64_t node = engine.own_comm_bytes() - node_before;
          const std::string where =
              what + ", unit " + std::to_string(u) + ", gather " + std::to_string(gather + 1);
          if (unit.persistent) {
            EXPECT_EQ(group + node, 0u) << where << ": the persistent unit stays gathered";
            continue;
          }
          // The first gather of unit 0 may have been the prefetch at construction.
          if (gather == 0 && group == 0 && u == 0) continue;
          if (gather == 0) {
            const uint64_t shard_bytes =
                quantized ? unit.shard + 4 * quantized_shard(unit.shard).scales : unit.shard * elem;
            EXPECT_EQ(group, static_cast<uint64_t>(n - 1) * shard_bytes) << where;
            EXPECT_EQ(node, 0u) << where;
          } else {
            EXPECT_EQ(group, 0u) << where;
            EXPECT_EQ(node, static_cast<uint64_t>(k - 1) * (unit.numel / k) * elem) << where;
          }
        }
        EXPECT_FALSE(seen[0].empty()) << what << ", unit " << u;
        EXPECT_TRUE(seen[0] == seen[1])
            << what << ", unit " << u << ": the node's gather differs from the group's";
      }
    }
  }
}

// Training with hpZ is training without it, bit for bit (with qwZ: qwZ alone's), over several
// micro-batches and steps, so the secondary shards are remade after each step. The group's
// all-gathers per step lose the backward's share S, the node's carry it: per unit, the group
// sends (N-1)/N of it and the node (k-1)/k, so node x (N-1) x k = S x (k-1) x N. With qwZ the
// group's share is int8 and scales, and the node's the same working-dtype bytes as without.
TEST(HierarchicalPartition, TrainsBitwiseAsWithoutItAndMovesTheBackwardsGathersIntoTheNode) {
  const int k = node_size();
  if (k < 2) GTEST_SKIP() << "one rank per node: hpZ has nothing to split";
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    uint64_t exact_node = 0;
    for (bool quantized : {false, true}) {
      RunOptions o;
      o.stage = 3;
      o.steps = 4;
      o.micro_batches = 1;
      o.dtype = dtype;
      o.record_params = true;
      o.tweak = [quantized](EngineConfig& c) { c.precision.quantized_weights = quantized; };
      const TrainResult plain = train(o);
      o.tweak = [quantized, k](EngineConfig& c) {
        c.precision.quantized_weights = quantized;
        c.grid.hpz_partition_size = k;
      };
      const TrainResult hpz = train(o);
      o.micro_batches = 2;
      const TrainResult hpz_two = train(o);
      o.tweak = [quantized](EngineConfig& c) { c.precision.quantized_weights = quantized; };
      const TrainResult plain_two = train(o);
      const std::string what = std::string(dtype_name(dtype)) + (quantized ? ", qwZ" : "");
      EXPECT_EQ(hpz.losses, plain.losses) << what;
      EXPECT_EQ(hpz.params_after_step, plain.params_after_step) << what;
      EXPECT_EQ(hpz_two.losses, plain_two.losses) << what << ", 2 micro-batches";
      EXPECT_EQ(hpz_two.params_after_step, plain_two.params_after_step)
          << what << ", 2 micro-batches";
      EXPECT_EQ(hpz.model_state_bytes, hpz.plan.model_state) << what;
      EXPECT_EQ(hpz.buffer_bytes, plain.buffer_bytes) << what;
      // The last step: every unit gathered once over the group after the step before.
      const int n = world_size();
      const uint64_t saved =
          plain.group_all_gather_bytes.back() - hpz.group_all_gather_bytes.back();
      const uint64_t node = hpz.own_comm_bytes.back();
      EXPECT_EQ(plain.own_comm_bytes.back(), 0u) << what;
      EXPECT_GT(saved, 0u) << what;
      if (quantized) {
        EXPECT_EQ(node, exact_node) << what;
      } else {
        exact_node = node;
        EXPECT_EQ(node * static_cast<uint64_t>((n - 1) * k),
                  saved * static_cast<uint64_t>((k - 1) * n))
            << what << ": group " << plain.group_all_gather_bytes.back() << " -> "
            << hpz.group_all_gather_bytes.back() << ", node " << node;
      }
      const std::string key = std::string(dtype_name(dtype)) + (quantized ? "_qwz" : "");
      RecordProperty("group_all_gather_bytes_plain_" + key,
                     std::to_string(plain.group_all_gather_bytes.back()));
      RecordProperty("group_all_gather_bytes_hpz_" + key,
                     std::to_string(hpz.group_all_gather_bytes.back()));
      RecordProperty("node_all_gather_bytes_hpz_" + key, std::to_string(node));
    }
  }
}

// A load replaces the parameters the secondary shards copied: the next gather runs over the
// group again and gives the loaded values (the master plus one, rounded to bf16).
TEST(HierarchicalPartition, LoadMakesTheSecondaryShardsStale) {
  const int k = node_size();
  if (k < 2) GTEST_SKIP() << "one rank per node: hpZ has nothing to split";
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int n = comm->world_size();
  ZeroModel model(*comm, models::make_mlp(kMlp), hpz_config(DType::kBFloat16, k));
  Engine& engine = model.engine();
  const Layout& layout = engine.layout();
  const int unit = 1;
  ASSERT_FALSE(layout.units()[unit].persistent);
  const std::vector<std::vector<float>> master = engine.gather_full_master();
  // The unit's first gather: it keeps a secondary shard of the values before the load.
  engine.gather(unit);
  engine.release(unit);
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const Engine::StateView view = engine.state_view(static_cast<int>(u));
    for (size_t e = 0; e < view.end - view.begin; ++e) view.master[e] += 1.0f;
  }
  engine.state_loaded();
  comm->stream().synchronize();
  const uint64_t group_before = all_gather_bytes(*comm);
  const uint64_t node_before = engine.own_comm_bytes();
  engine.gather(unit);
  for (size_t p = 0; p < layout.params().size(); ++p) {
    const ParamPlacement& pl = layout.params()[p];
    if (pl.unit != unit) continue;
    std::vector<float> got(pl.numel);
    kernels::cast(engine.param(static_cast<int>(p)), DType::kBFloat16, got.data(), DType::kFloat32,
                  pl.numel);
    for (size_t e = 0; e < pl.numel; ++e) {
      uint16_t rounded = 0;
      float expected = master[p][e] + 1.0f;
      kernels::cast(&expected, DType::kFloat32, &rounded, DType::kBFloat16, 1);
      kernels::cast(&rounded, DType::kBFloat16, &expected, DType::kFloat32, 1);
      ASSERT_EQ(got[e], expected) << pl.name << "[" << e << "]";
    }
  }
  engine.release(unit);
  comm->stream().synchronize();
  EXPECT_EQ(all_gather_bytes(*comm) - group_before,
            static_cast<uint64_t>(n - 1) * layout.units()[unit].shard * 2);
  EXPECT_EQ(engine.own_comm_bytes() - node_before, 0u);
}

TEST(HierarchicalPartition, RefusesWhatItCannotSplit) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int n = comm->world_size();
  const int per_node = ranks_per_node(*comm);
  const auto refused = [&](EngineConfig config, const std::string& message) {
    expect_error_naming([&] { ZeroModel model(*comm, models::make_mlp(kMlp), config); }, message);
  };
  refused(hpz_config(DType::kFloat32, n + 1), "zero_hpz_partition_size " + std::to_string(n + 1) +
                                                  " must be 1 (off) or divide the " +
                                                  std::to_string(n) + " data-parallel rank(s)");
  if (per_node >= 1 && n % (2 * per_node) == 0) {
    refused(hpz_config(DType::kFloat32, 2 * per_node),
            "zero_hpz_partition_size " + std::to_string(2 * per_node) +
                " must equal the ranks per node of the " + std::to_string(n) +
                " data-parallel rank(s), " + std::to_string(per_node));
  }
  EngineConfig stage2 = hpz_config(DType::kFloat32, 2);
  stage2.stage = 2;
  refused(stage2, "zero_hpz_partition_size 2 (hpZ) needs ZeRO stage 3, not stage 2");
}

}  // namespace
}  // namespace zero
