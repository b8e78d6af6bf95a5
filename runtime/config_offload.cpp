// The offload keys of the config -> EngineConfig: zero_optimization.offload.optimizer and
// offload_param, and the aio section, with DeepSpeed's meanings and defaults (config.h).
#include <string>

#include "config_parse.h"

namespace zero::config_internal {
namespace {

OffloadDevice read_device(const std::string& key, const std::string& value, const Checker& check) {
  if (value == "none") return OffloadDevice::kNone;
  if (value == "cpu") return OffloadDevice::kCpu;
  if (value == "nvme") return OffloadDevice::kNvme;
  check.fail(key, "\"none\", \"cpu\" or \"nvme\"", in_quotes(value));
}

std::string read_path(const std::string& key, const std::string& value, const Checker& check) {
  if (value.empty()) check.fail(key, "a directory", "an empty string");
  return value;
}

// The keys offload_optimizer and offload_param share, with the same meanings.
template <typename Section, typename Offload>
void read_shared_keys(const Section& o, const std::string& key, const Checker& check, Offload* e) {
  if (o.has_device()) e->device = read_device(key + ".device", o.device(), check);
  if (o.has_nvme_path()) e->nvme_path = read_path(key + ".nvme_path", o.nvme_path(), check);
  if (o.has_pin_memory()) e->pin_memory = o.pin_memory();
  if (o.has_buffer_count()) {
    e->buffer_count =
        static_cast<int>(check.integer(key + ".buffer_count", o.buffer_count(), 1, 1024));
  }
}

void read_optimizer_offload(const config::OffloadOptimizer& o, int stage, bool cuda,
                            const Checker& check, TrainingConfig* out) {
  OptimizerOffload& e = out->engine.offload.optimizer;
  const std::string key = "zero_optimization.offload_optimizer";
  read_shared_keys(o, key, check, &e);
  if (o.has_pipeline_read()) e.pipeline_read = o.pipeline_read();
  if (o.has_pipeline_write()) e.pipeline_write = o.pipeline_write();
  if (o.has_fast_init()) e.fast_init = o.fast_init();
  if (e.device == OffloadDevice::kNone) return;
  // DeepSpeed offloads the optimizer of ZeRO stages 1-3 only: stage 0 has no partitioned
  // optimizer to move.
  if (stage == 0) {
    config_error("\"" + key + ".device\" in " + check.origin() + " is " +
                 in_quotes(offload_device_name(e.device)) +
                 ", which needs zero_optimization.stage 1, 2 or 3 (it is 0)");
  }
  if (e.device == OffloadDevice::kCpu && !cuda) {
    // The engine would run ZeRO-Offload's copies inside host memory for nothing.
    e.device = OffloadDevice::kNone;
    out->ignored_keys.push_back(
        key +
        ".device \"cpu\" has no effect here: on the CPU path the fp32 master and "
        "optimizer state already live in host memory");
  }
  // Stepping one sub-group while the next is read and the last written takes one staging
  // buffer for each.
  const int needed = 1 + (e.pipeline_read ? 1 : 0) + (e.pipeline_write ? 1 : 0);
  if (e.device == OffloadDevice::kNvme && e.buffer_count < needed) {
    check.fail(key + ".buffer_count",
               "at least " + std::to_string(needed) + " with pipeline_read " +
                   (e.pipeline_read ? "true" : "false") + " and pipeline_write " +
                   (e.pipeline_write ? "true" : "false"),
               std::to_string(e.buffer_count));
  }
}

void read_param_offload(const config::OffloadParam& o, int stage, bool cuda, const Checker& check,
                        TrainingConfig* out) {
  ParamOffload& e = out->engine.offload.param;
  const std::string key = "zero_optimization.offload_param";
  read_shared_keys(o, key, check, &e);
  if (o.has_buffer_size()) {
    e.buffer_size =
        static_cast<size_t>(check.integer(key + ".buffer_size", o.buffer_size(), 1, kMaxInt64));
  }
  if (o.has_max_in_cpu()) {
    e.max_in_cpu =
        static_cast<size_t>(check.integer(key + ".max_in_cpu", o.max_in_cpu(), 0, kMaxInt64));
  }
  if (e.device == OffloadDevice::kNone) return;
  if (stage != 3) {
    config_error("\"" + key + ".device\" in " + check.origin() + " is " +
                 in_quotes(offload_device_name(e.device)) +
                 ", which needs zero_optimization.stage 3 (it is " + std::to_string(stage) +
                 "): only stage 3 partitions the parameters");
  }
  if (e.device == OffloadDevice::kNvme) {
    if (o.has_max_in_cpu()) {
      out->ignored_keys.push_back(key +
                                  ".max_in_cpu has no effect here: every parameter shard but the "
                                  "persistent unit's lives on NVMe, and memory holds only the "
                                  "buffer_count buffers");
    }
    return;
  }
  e.device = OffloadDevice::kNone;
  out->ignored_keys.push_back(
      key + (cuda ? ".device \"cpu\" is not built for CUDA yet: the parameter shards stay in the "
                    "GPU's memory (offload_optimizer \"cpu\" moves the optimizer state)"
                  : ".device \"cpu\" has no effect here: on the CPU path the parameter shards "
                    "already live in host memory"));
}

void read_aio(const config::Aio& a, const Checker& check, AioConfig* e) {
  if (a.has_block_size()) {
    e->block_size =
        static_cast<size_t>(check.integer("aio.block_size", a.block_size(), 4096, 1 << 30));
    // O_DIRECT transfers are whole sectors at aligned offsets; 4096 covers every sector size.
    if (e->block_size % 4096 != 0) {
      check.fail("aio.block_size", "a multiple of 4096", std::to_string(a.block_size()));
    }
  }
  if (a.has_queue_depth()) {
    e->queue_depth = static_cast<int>(check.integer("aio.queue_depth", a.queue_depth(), 1, 4096));
  }
  if (a.has_intra_op_parallelism() && a.has_thread_count() &&
      a.intra_op_parallelism() != a.thread_count()) {
    config_error("\"aio.intra_op_parallelism\" (" + std::to_string(a.intra_op_parallelism()) +
                 ") and \"aio.thread_count\" (" + std::to_string(a.thread_count()) + ") in " +
                 check.origin() + " name the same setting with different values");
  }
  if (a.has_intra_op_parallelism()) {
    e->intra_op_parallelism = static_cast<int>(
        check.integer("aio.intra_op_parallelism", a.intra_op_parallelism(), 1, 64));
  } else if (a.has_thread_count()) {
    e->intra_op_parallelism =
        static_cast<int>(check.integer("aio.thread_count", a.thread_count(), 1, 64));
  }
  if (a.has_single_submit()) e->single_submit = a.single_submit();
  if (a.has_overlap_events()) e->overlap_events = a.overlap_events();
}

}  // namespace

void read_offload(const config::TrainingConfig& c, bool cuda, const Checker& check,
                  TrainingConfig* out) {
  const int stage = out->engine.stage;
  read_optimizer_offload(c.zero_optimization().offload_optimizer(), stage, cuda, check, out);
  read_param_offload(c.zero_optimization().offload_param(), stage, cuda, check, out);
  read_aio(c.aio(), check, &out->engine.offload.aio);
}

}  // namespace zero::config_internal
