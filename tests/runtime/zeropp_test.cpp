// ZeRO++'s quantized weight all-gathers (qwZ, precision.quantized_weights): stage 3's gathered
// parameters are each rank's exact shard quantized blockwise and dequantized, bit for bit; the
// bytes that cross are int8 values plus 4 bytes per block; the buffers are planned; and
// training stays close to exact stage 3, whose master and optimizer state it keeps exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/memory_plan.h"
#include "tests/expect_error.h"
#include "tests/runtime/train_util.h"
#include "zero/kernels/cpu_kernels.h"
#include "zero/kernels/quantize_math.h"

namespace zero {
namespace {

using namespace zero::testing;

const MlpConfig kMlp{8, 24, 4, 3};
// Wide enough that a rank's shard holds several quantization blocks, a short last one among
// them, at every world size of the tests.
const MlpConfig kWideMlp{8, 200, 4, 3};

EngineConfig qwz_config(DType dtype) {
  EngineConfig config;
  config.stage = 3;
  config.precision.dtype = dtype;
  config.precision.quantized_weights = true;
  return config;
}

uint64_t all_gather_bytes(const Communicator& comm) {
  return comm.counters().bytes[static_cast<size_t>(CollectiveOp::kAllGather)];
}

// Each gathered unit is every rank's exact shard through the quantizer, in the working dtype,
// and each gather sends (N-1) regions of int8 values and fp32 scales.
TEST(QuantizedWeights, GatheredUnitsAreEachShardQuantizedAndCostTheFormula) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    std::unique_ptr<Communicator> comm = make_mpi_communicator();
    const int n = comm->world_size();
    ZeroModel model(*comm, models::make_mlp(kWideMlp), qwz_config(dtype));
    Engine& engine = model.engine();
    const Layout& layout = engine.layout();
    const std::vector<std::vector<float>> exact = engine.gather_full_params();
    // The staging buffer is planned: the plan is what the engine holds, and qwZ adds just it.
    EngineConfig without = qwz_config(dtype);
    without.precision.quantized_weights = false;
    EXPECT_GT(quantized_gather_bytes(layout, engine.config()), 0u);
    EXPECT_EQ(
        plan_memory(layout, engine.config()).buffers,
        plan_memory(layout, without).buffers + quantized_gather_bytes(layout, engine.config()));
    EXPECT_EQ(engine.buffer_bytes(), plan_memory(layout, engine.config()).buffers);
    size_t most_blocks = 0;
    for (size_t u = 0; u < layout.units().size(); ++u) {
      const Unit& unit = layout.units()[u];
      const std::string what = std::string(dtype_name(dtype)) + ", unit " + std::to_string(u);
      // The unit as it is sharded, padding included.
      std::vector<float> flat(unit.numel, 0.0f);
      for (size_t p = 0; p < layout.params().size(); ++p) {
        const ParamPlacement& pl = layout.params()[p];
        if (pl.unit != static_cast<int>(u)) continue;
        std::copy(exact[p].begin(), exact[p].end(), flat.begin() + pl.offset);
      }
      std::vector<char> expected(unit.numel * dtype_size(dtype));
      for (int r = 0; r < n; ++r) {
        std::vector<int8_t> values(unit.shard);
        std::vector<float> scales(int8_block_count(unit.shard, kWeightQuantizationBlock));
        kernels::quantize_int8(flat.data() + r * unit.shard, DType::kFloat32, unit.shard,
                               kWeightQuantizationBlock, values.data(), scales.data());
        kernels::dequantize_int8(values.data(), scales.data(), unit.shard, kWeightQuantizationBlock,
                                 expected.data() + r * unit.shard * dtype_size(dtype), dtype);
      }
      const uint64_t before = all_gather_bytes(*comm);
      engine.gather(static_cast<int>(u));
      const uint64_t sent = all_gather_bytes(*comm) - before;
      bool compared = false;
      for (size_t p = 0; p < layout.params().size(); ++p) {
        const ParamPlacement& pl = layout.params()[p];
        if (pl.unit != static_cast<int>(u)) continue;
        const char* got = static_cast<const char*>(engine.param(static_cast<int>(p)));
        const size_t bytes = pl.numel * dtype_size(dtype);
        EXPECT_TRUE(std::equal(got, got + bytes, expected.data() + pl.offset * dtype_size(dtype)))
            << what << ", parameter " << pl.name;
        compared = true;
      }
      engine.release(static_cast<int>(u));
      ASSERT_TRUE(compared) << what;
      if (unit.persistent || n == 1) continue;
      const QuantizedShard wire = quantized_shard(unit.shard);
      most_blocks = std::max(most_blocks, wire.scales);
      EXPECT_EQ(sent, static_cast<uint64_t>(n - 1) * (unit.shard + 4 * wire.scales))
          << what << " (shard " << unit.shard << " elements)";
    }
    if (n > 1) {
      EXPECT_GT(most_blocks, 1u) << "no shard holds several blocks and a short last one";
    }
  }
}

// qwZ quantizes only the wire: the same run trains close to exact stage 3 (fp32 and bf16), its
// buffers are as planned, and each step's all-gathers send int8 and scales where stage 3 sends
// the working dtype.
TEST(QuantizedWeights, TrainsCloseToExactStageThree) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    RunOptions o;
    o.stage = 3;
    o.steps = 20;
    o.micro_batches = 2;
    o.mlp = kWideMlp;
    o.dtype = dtype;
    const TrainResult exact = train(o);
    o.tweak = [](EngineConfig& c) { c.precision.quantized_weights = true; };
    const TrainResult quantized = train(o);
    const std::string what = std::string("qwZ, ") + dtype_name(dtype);
    ASSERT_EQ(quantized.losses.size(), exact.losses.size());
    for (size_t i = 0; i < exact.losses.size(); ++i) {
      ASSERT_TRUE(std::isfinite(quantized.losses[i])) << what << ", step " << i + 1;
    }
    // The first loss differs only by the gathered weights' rounding; later ones drift apart as
    // two trainings do, so they are held to DeepSpeed's criterion for ZeRO++: the mean loss of
    // the last half within 1.1x the exact run's.
    const double first = std::fabs(quantized.losses.front() / exact.losses.front() - 1.0);
    EXPECT_LT(first, 0.01) << what << ": the first step's loss";
    const size_t half = exact.losses.size() / 2;
    const auto mean_of_last_half = [half](const std::vector<float>& losses) {
      double sum = 0.0;
      for (size_t i = losses.size() - half; i < losses.size(); ++i) sum += losses[i];
      return sum / static_cast<double>(half);
    };
    const double ratio = mean_of_last_half(quantized.losses) / mean_of_last_half(exact.losses);
    EXPECT_LE(ratio, 1.1) << what << ": the mean loss of the last " << half << " steps";
    EXPECT_LT(quantized.losses.back(), 0.2 * quantized.losses.front()) << what << " learns";
    EXPECT_EQ(quantized.buffer_bytes, quantized.plan.buffers) << what;
    if (world_size() > 1) {
      EXPECT_LT(quantized.comm_bytes.back(), exact.comm_bytes.back()) << what;
    }
    RecordProperty(std::string("first_loss_difference_") + dtype_name(dtype),
                   std::to_string(first));
    RecordProperty(std::string("last_half_loss_ratio_") + dtype_name(dtype), std::to_string(ratio));
  }
}

// qgZ: the same run with quantized gradient reductions stays close to exact stage 3 and learns,
// and its scratch is planned.
TEST(QuantizedGradients, TrainCloseToExactStageThree) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    RunOptions o;
    o.stage = 3;
    o.steps = 20;
    o.mlp = kWideMlp;
    o.dtype = dtype;
    const TrainResult exact = train(o);
    o.tweak = [](EngineConfig& c) { c.precision.quantized_gradients = true; };
    const TrainResult quantized = train(o);
    const std::string what = std::string("qgZ, ") + dtype_name(dtype);
    for (size_t i = 0; i < quantized.losses.size(); ++i) {
      ASSERT_TRUE(std::isfinite(quantized.losses[i])) << what << ", step " << i + 1;
    }
    const size_t half = exact.losses.size() / 2;
    const auto mean_of_last_half = [half](const std::vector<float>& losses) {
      double sum = 0.0;
      for (size_t i = losses.size() - half; i < losses.size(); ++i) sum += losses[i];
      return sum / static_cast<double>(half);
    };
    const double ratio = mean_of_last_half(quantized.losses) / mean_of_last_half(exact.losses);
    EXPECT_LE(ratio, 1.1) << what << ": the mean loss of the last " << half << " steps";
    EXPECT_LT(quantized.losses.back(), 0.2 * quantized.losses.front()) << what << " learns";
    // What qgZ adds is planned (across declared nodes the communicator's own staging may exceed
    // the plan, with or without qgZ).
    EXPECT_GT(quantized.plan.buffers, exact.plan.buffers) << what;
    EXPECT_EQ(quantized.buffer_bytes - exact.buffer_bytes,
              quantized.plan.buffers - exact.plan.buffers)
        << what;
    RecordProperty(std::string("qgz_last_half_loss_ratio_") + dtype_name(dtype),
                   std::to_string(ratio));
  }
}

// The bytes of qgZ's two hops in one step, on the engine's own communicators: the wide layer's
// unit, the only one whose shard reaches a block, reduced once per micro-batch, sends inside
// each node (L - 1) blocks of G quantized chunks and across nodes (G - 1) chunks, where the exact
// reduce-scatter sends (N - 1) chunks in the working dtype.
TEST(QuantizedGradients, HopsSendTheFormula) {
  const int n = world_size();
  const char* declared = std::getenv("ZERO_NODE_SIZE");
  const int per_node = declared != nullptr ? std::atoi(declared) : n;
  const int nodes = n / per_node;
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config = qwz_config(DType::kFloat32);
  config.precision.quantized_weights = false;
  config.precision.quantized_gradients = true;
  config.micro_batches = 2;
  ZeroModel model(*comm, models::make_mlp(kWideMlp), config);
  const Layout& layout = model.engine().layout();
  uint64_t within = 0;
  uint64_t across = 0;
  size_t quantized_units = 0;
  for (const Unit& unit : layout.units()) {
    if (unit.shard < kWeightQuantizationBlock) continue;
    ++quantized_units;
    const uint64_t chunk = quantized_shard(unit.shard).region_bytes;
    within += static_cast<uint64_t>(per_node - 1) * static_cast<uint64_t>(nodes) * chunk;
    across += static_cast<uint64_t>(nodes - 1) * chunk;
  }
  ASSERT_EQ(quantized_units, 1u);
  models::TeacherTask task(kWideMlp, 7);
  for (int k = 0; k < config.micro_batches; ++k) {
    models::Batch batch = task.batch(1, (k * n + comm->rank()) * 3, 3);
    Tensor grad;
    models::mse_loss(model.forward(batch.inputs), batch.targets, grad);
    model.backward(grad);
  }
  model.step();
  const uint64_t micro_batches = static_cast<uint64_t>(config.micro_batches);
  EXPECT_EQ(model.engine().quantized_bytes_across_nodes(), micro_batches * across)
      << nodes << " nodes x " << per_node << " ranks";
  EXPECT_EQ(model.engine().own_comm_bytes(), micro_batches * (within + across))
      << nodes << " nodes x " << per_node << " ranks";
  RecordProperty("bytes_across_nodes_per_reduction", std::to_string(across));
  RecordProperty("bytes_within_nodes_per_reduction", std::to_string(within));
}

TEST(QuantizedGradients, NeedStageThree) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config = qwz_config(DType::kFloat32);
  config.precision.quantized_weights = false;
  config.precision.quantized_gradients = true;
  config.stage = 2;
  expect_error_naming([&] { ZeroModel model(*comm, models::make_mlp(kMlp), config); },
                      "quantized gradient reduction (zero_quantized_gradients) needs ZeRO stage "
                      "3, not stage 2");
}

TEST(QuantizedWeights, NeedsStageThree) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config = qwz_config(DType::kFloat32);
  config.stage = 2;
  expect_error_naming([&] { ZeroModel model(*comm, models::make_mlp(kMlp), config); },
                      "quantized weight all-gathers (zero_quantized_weights) need ZeRO stage 3, "
                      "not stage 2");
}

}  // namespace
}  // namespace zero
