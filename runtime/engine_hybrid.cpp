// Hybrid sharding (DeepSpeed MiCS's mics_shard_size): the engine's collectives run on a shard
// group of k consecutive ranks, and each reduced gradient shard is summed across the replica
// group (the ranks at the same position in every shard group) before anyone reads it. And
// hpZ's node group, over which the secondary shards are all-gathered.
#include <cstdint>
#include <string>

#include "engine_internal.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/core/check.h"
#include "zero/runtime/config.h"

namespace zero {

int sharding_group_size(const EngineConfig& config, int world_size) {
  const int k = config.grid.mics_shard_size;
  if (k == -1 || k == world_size) return world_size;
  ZERO_CHECK(k >= 1 && k < world_size && world_size % k == 0,
             "mics_shard_size must be -1 (off) or a shard group size from 1 to the "
                 << world_size << " ranks that divides them, got " << k);
  ZERO_CHECK(config.stage == 3, "mics_shard_size " << k
                                                   << " (hybrid sharding) needs ZeRO stage 3, "
                                                      "not stage "
                                                   << config.stage);
  ZERO_CHECK(!config.device.is_cuda(), "mics_shard_size " << k
                                                          << " (hybrid sharding) runs on the CPU "
                                                             "path only for now, not on "
                                                          << device_name(config.device));
  ZERO_CHECK(config.offload.optimizer.device == OffloadDevice::kNone,
             "mics_shard_size " << k << " (hybrid sharding) with optimizer offload to "
                                << offload_device_name(config.offload.optimizer.device)
                                << " is not supported yet");
  ZERO_CHECK(config.offload.param.device != OffloadDevice::kNvme,
             "mics_shard_size " << k << " (hybrid sharding) with parameter offload to nvme is "
                                << "not supported yet");
  return k;
}

HybridGroups HybridGroups::split(Communicator& world, const EngineConfig& config) {
  const int n = world.world_size();
  const int k = sharding_group_size(config, n);
  HybridGroups groups;
  if (k == n) return groups;
  // The splits are of MPI_COMM_WORLD and collective over it: every rank of the world builds its
  // engine at once, in the same order (with tensor parallelism, each data-parallel group its
  // own). A group is named by the world rank of its first member, which no other group of
  // another data-parallel group can share.
  const std::vector<uint64_t> members =
      all_gather_u64(world, static_cast<uint64_t>(mpi_world_rank()));
  const int rank = world.rank();
  const auto color = [&](int first) {
    return static_cast<int>(members[static_cast<size_t>(first)]);
  };
  groups.shard = make_mpi_communicator_split(color(rank / k * k), rank);
  groups.replica = make_mpi_communicator_split(color(rank % k), rank);
  ZERO_CHECK(groups.shard->world_size() == k && groups.replica->world_size() == n / k,
             "the hybrid split gave shard groups of "
                 << groups.shard->world_size() << " and replica groups of "
                 << groups.replica->world_size() << " ranks, not " << k << " and " << n / k);
  return groups;
}

std::unique_ptr<Communicator> split_node_group(Communicator& group, const EngineConfig& config) {
  const int k = config.grid.hpz_partition_size;
  if (k == 1) return nullptr;
  const int n = group.world_size();
  // Every rank knows the same ranks and nodes, so every rank refuses at once: a ConfigError,
  // which zero-train reports once and exits 2 for.
  if (k < 1 || n % k != 0) {
    throw ConfigError("zero_hpz_partition_size " + std::to_string(k) +
                      " must be 1 (off) or divide the " + std::to_string(n) +
                      " data-parallel rank(s)");
  }
  const int per_node = ranks_per_node(group);
  if (per_node != k) {
    throw ConfigError("zero_hpz_partition_size " + std::to_string(k) +
                      " must equal the ranks per node of the " + std::to_string(n) +
                      " data-parallel rank(s), " + std::to_string(per_node) +
                      (per_node == 0 ? " (nodes of unequal or unknown size)" : ""));
  }
  // As HybridGroups::split: a node group is named by the world rank of its first member.
  const std::vector<uint64_t> members =
      all_gather_u64(group, static_cast<uint64_t>(mpi_world_rank()));
  const int rank = group.rank();
  std::unique_ptr<Communicator> node = make_mpi_communicator_split(
      static_cast<int>(members[static_cast<size_t>(rank / k * k)]), rank);
  ZERO_CHECK(node->world_size() == k,
             "the hpZ split gave node groups of " << node->world_size() << " ranks, not " << k);
  return node;
}

uint64_t Engine::own_comm_bytes() const {
  const HybridGroups& groups = impl_->hybrid;
  uint64_t bytes =
      impl_->reducer.quantized_bytes_within_nodes() + impl_->reducer.quantized_bytes_across_nodes();
  if (impl_->hpz_node) bytes += impl_->hpz_node->counters().total_bytes();
  if (!groups.shard) return bytes;
  return bytes + groups.shard->counters().total_bytes() + groups.replica->counters().total_bytes();
}

uint64_t Engine::quantized_bytes_across_nodes() const {
  return impl_->reducer.quantized_bytes_across_nodes();
}

}  // namespace zero
