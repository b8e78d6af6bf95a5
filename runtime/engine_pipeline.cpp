// Pipeline ties (EngineConfig::Grid::Pipeline): parameters one stage shares with another, such as
// the GPT-2's wte on the first stage (the embedding) and the last (the head). Each stage
// accumulates and reduces its own uses over its data-parallel group; after the last micro-batch the
// two stages' reduced gradients are added over the tie group, so both step with the gradient of
// every use, as DeepSpeed's ReduceTiedGrads does. With the optimizer on the host, the summed
// shards are copied there again.
#include "engine_internal.h"

#include <algorithm>

namespace zero {

void Engine::Impl::resolve_pipeline_ties() {
  const EngineConfig::Grid::Pipeline& pipeline = config.grid.pipeline;
  if (pipeline.tied_parameters.empty()) return;
  ZERO_CHECK(pipeline.ties != nullptr,
             "EngineConfig::pipeline names tied parameters but no communicator to sum them over");
  ZERO_CHECK(pipeline.ties->world_size() == 2 * world * replicas,
             "EngineConfig::pipeline.ties has "
                 << pipeline.ties->world_size() << " ranks; a tie joins two stages of "
                 << world * replicas << " data-parallel rank(s) each");
  for (const std::string& name : pipeline.tied_parameters) {
    int found = -1;
    for (size_t p = 0; p < layout.params().size(); ++p) {
      if (layout.params()[p].name == name) found = static_cast<int>(p);
    }
    ZERO_CHECK(found >= 0,
               "EngineConfig::pipeline ties '" << name << "', which this stage does not hold");
    ZERO_CHECK(layout.params()[static_cast<size_t>(found)].trainable,
               "EngineConfig::pipeline ties the frozen parameter '" << name << "'");
    pipeline_tied_params.push_back(found);
  }
}

// Each tied parameter's reduced gradient, whole, in fp32: this rank's shard of it (a stage-0
// rank holds it all but adds only its shard), summed over the tie group, and the elements this
// rank owns taken back. The shards of a stage's ranks cover the parameter once, whatever units
// each stage cut it into, so every element is the sum of the two stages' gradients. With hybrid
// sharding every replica holds the same summed shards: the first replica's alone are added, and
// every replica takes the sum back.
void Engine::Impl::sum_pipeline_ties() {
  if (pipeline_tied_params.empty()) return;
  ScopedSpan span(trace, "pipeline tied gradients");
  const bool adds = hybrid.replica == nullptr || hybrid.replica->rank() == 0;
  for (int p : pipeline_tied_params) {
    const ParamPlacement& param = layout.params()[static_cast<size_t>(p)];
    const size_t u = static_cast<size_t>(param.unit);
    const Unit& unit = layout.units()[u];
    void* const whole = pipeline_tie_sum.data();
    device->zero(whole, param.numel * sizeof(float));
    const ElementRange shard = shard_range(unit.numel, rank, world);
    const size_t first = std::max(shard.first, param.offset);
    const size_t last = std::min(shard.end(), param.offset + param.numel);
    if (adds && first < last) {
      device->cast(byte_offset(reducer.shard(u), (first - shard.first) * accum), accum_dtype,
                   byte_offset(whole, (first - param.offset) * sizeof(float)), DType::kFloat32,
                   last - first);
    }
    // Through the timeline, so that the step's comm_wait_ms and comm_busy_ms count it.
    Communicator& ties = *config.grid.pipeline.ties;
    ties.stream().wait(device->record());
    timeline.wait(timeline.traced(ties.stream(), "all_reduce", param.numel * sizeof(float), [&] {
      return ties.all_reduce(whole, whole, param.numel, DType::kFloat32);
    }));
    const ElementRange owned = owned_range(u);
    const size_t begin = std::max(owned.first, param.offset);
    const size_t end = std::min(owned.end(), param.offset + param.numel);
    if (begin < end) {
      device->cast(byte_offset(whole, (begin - param.offset) * sizeof(float)), DType::kFloat32,
                   byte_offset(reducer.owned(u), (begin - owned.first) * accum), accum_dtype,
                   end - begin);
    }
    if (!units[u].host_grads.empty()) {
      // The optimizer steps on the host, which copied the shard right behind its last
      // reduction, before this sum: the summed shard goes over again.
      comm.stream().wait(device->record());
      timeline.wait(copy_grads_to_host(static_cast<int>(u), timeline.point(comm.stream())));
    }
    // The next tied parameter reuses the buffer: the compute stream must be past the cast.
    device->synchronize();
  }
}

}  // namespace zero
