// bf16 and fp16 training: the ZeRO paper's memory per rank, parity across stages, agreement
// with fp32, fp16's dynamic loss scaling around an injected overflow, and the non-finite
// gradient rules of fp32/bf16. Also the scheduling options that must not change the numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/runtime/forwarding_communicator.h"
#include "tests/runtime/train_util.h"
#include "zero/core/check.h"
#include "zero/core/dtype.h"

namespace zero {
namespace {

using namespace zero::testing;

std::string name_of(DType dtype, int stage) {
  return std::string(dtype_name(dtype)) + " stage " + std::to_string(stage);
}

TEST(MixedPrecision, ModelStateBytesFollowThePaper) {
  const uint64_t n = static_cast<uint64_t>(world_size());
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      RunOptions o;
      o.stage = stage;
      o.steps = 1;
      o.dtype = dtype;
      const TrainResult run = train(o);
      const uint64_t psi = run.padded_params;
      // 2-byte params, K = 12 bytes of fp32 master and Adam moments per parameter, and the
      // kept gradients in the accumulation dtype: 2 bytes for fp16, 4 for bf16 (DeepSpeed's
      // default data_types.grad_accum_dtype for bf16 is fp32). With g = 2 these are the paper's.
      const uint64_t g = dtype == DType::kBFloat16 ? 4 : 2;
      const uint64_t expected[4] = {(14 + g) * psi, (2 + g) * psi + 12 * psi / n,
                                    2 * psi + (12 + g) * psi / n, (14 + g) * psi / n};
      EXPECT_EQ(run.model_state_bytes, expected[stage]) << name_of(dtype, stage);
      EXPECT_EQ(run.plan.model_state, run.model_state_bytes) << name_of(dtype, stage);
      EXPECT_EQ(run.plan.buffers, run.buffer_bytes) << name_of(dtype, stage);
    }
  }
}

// The sums are the same at every stage with one micro-batch: the wire carries one dtype at
// every stage (the working dtype by default, fp32 with communication_data_type fp32), whatever
// the gradients accumulate in.
TEST(MixedPrecision, StagesAgreeInBf16AsInFp32) {
  const std::pair<const char*, std::function<void(EngineConfig&)>> numerics[] = {
      {"default settings", [](EngineConfig&) {}},
      {"bf16 accumulation",
       [](EngineConfig& c) { c.precision.grad_accum_dtype = DType::kBFloat16; }},
      {"fp32 accumulation and reduction",
       [](EngineConfig& c) {
         c.precision.grad_accum_dtype = DType::kFloat32;
         c.precision.reduce_in_fp32 = true;
       }},
  };
  for (const auto& [what, tweak] : numerics) {
    RunOptions o;
    o.dtype = DType::kBFloat16;
    o.tweak = tweak;
    const TrainResult reference = train(o);
    for (int stage = 1; stage <= 3; ++stage) {
      o.stage = stage;
      const TrainResult run = train(o);
      const std::string name = name_of(o.dtype, stage) + ", " + what;
      if (world_size() <= 2) {
        for (size_t i = 0; i < run.losses.size(); ++i) {
          EXPECT_EQ(run.losses[i], reference.losses[i]) << name << " step " << i;
        }
      } else {
        expect_close(run.losses, reference.losses, 1e-6, name);
      }
    }
  }
}

TEST(MixedPrecision, Bf16AndFp16TrackFp32) {
  for (int stage : {0, 3}) {
    // zero-train's example: its default model, batch and learning rate.
    RunOptions o;
    o.stage = stage;
    o.steps = 50;
    o.mlp = MlpConfig{};
    o.lr = 1e-3f;
    o.seed = 1;
    const TrainResult fp32 = train(o);
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      o.dtype = dtype;
      const TrainResult run = train(o);
      expect_close(run.losses, fp32.losses, 2e-2, name_of(dtype, stage) + " vs fp32");
      for (bool skipped : run.skipped) EXPECT_FALSE(skipped) << name_of(dtype, stage);
    }
  }
}

TEST(MixedPrecision, Fp16OverflowSkipsTheStepAndFollowsHysteresis) {
  for (int stage : {0, 1, 2, 3}) {
    RunOptions o;
    o.stage = stage;
    o.dtype = DType::kFloat16;
    o.steps = 10;
    o.record_params = true;
    o.inf_grad_step = 5;
    o.tweak = [](EngineConfig& c) { c.precision.loss_scaler.scale_window = 4; };
    const TrainResult run = train(o);
    const std::string what = name_of(o.dtype, stage);
    for (size_t i = 0; i < run.skipped.size(); ++i) {
      EXPECT_EQ(run.skipped[i], i == 4) << what << " step " << i + 1;
      EXPECT_TRUE(std::isfinite(run.losses[i])) << what << " step " << i + 1;
    }
    // Step 5 changed nothing.
    EXPECT_EQ(run.params_after_step[4], run.params_after_step[3]) << what;
    EXPECT_NE(run.params_after_step[5], run.params_after_step[4]) << what;
    // 2^16 to start; clean steps 1-4 fill the window of 4 and double it; the overflow at step 5
    // only uses up one unit of hysteresis (2 -> 1), so the scale holds; four clean steps (6-9)
    // double it again.
    const float start = 65536.0f;
    EXPECT_EQ(run.loss_scales[2], start) << what;
    EXPECT_EQ(run.loss_scales[3], 2 * start) << what;
    EXPECT_EQ(run.loss_scales[4], 2 * start) << what;
    EXPECT_EQ(run.loss_scales[7], 2 * start) << what;
    EXPECT_EQ(run.loss_scales[8], 4 * start) << what;
  }
}

TEST(MixedPrecision, Fp16OverflowWithoutHysteresisHalvesTheScale) {
  RunOptions o;
  o.stage = 3;
  o.dtype = DType::kFloat16;
  o.steps = 6;
  o.inf_grad_step = 3;
  o.tweak = [](EngineConfig& c) { c.precision.loss_scaler.hysteresis = 1; };
  const TrainResult run = train(o);
  EXPECT_TRUE(run.skipped[2]);
  EXPECT_EQ(run.loss_scales[1], 65536.0f);
  EXPECT_EQ(run.loss_scales[2], 32768.0f);
}

TEST(MixedPrecision, OverflowAtTheMinimumScaleIsAnError) {
  RunOptions o;
  o.dtype = DType::kFloat16;
  o.steps = 3;
  o.inf_grad_step = 2;
  o.tweak = [](EngineConfig& c) {
    c.precision.loss_scaler.initial_scale_power = 0;
    c.precision.loss_scaler.hysteresis = 1;
  };
  try {
    train(o);
    FAIL() << "no error at the minimum loss scale";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss scale is already at its minimum"), std::string::npos)
        << e.what();
  }
}

TEST(MixedPrecision, NonFiniteGradientInBf16StopsWithTheUnitNamed) {
  RunOptions o;
  o.dtype = DType::kBFloat16;
  o.steps = 3;
  o.inf_grad_step = 2;
  try {
    train(o);
    FAIL() << "no error for an infinite gradient";
  } catch (const Error& e) {
    const std::string message = e.what();
    // The infinity enters at the output and spreads through backward to every unit; the first
    // in order is reported.
    EXPECT_NE(message.find("step 2: the gradient of unit 0 (starting at parameter "
                           "'layers.0.weight') is not finite on some rank"),
              std::string::npos)
        << message;
  }
  o.tweak = [](EngineConfig& c) { c.precision.skip_nonfinite_steps = true; };
  o.record_params = true;
  const TrainResult run = train(o);
  EXPECT_TRUE(run.skipped[1]);
  EXPECT_EQ(run.params_after_step[1], run.params_after_step[0]);
}

TEST(MixedPrecision, Fp32ReductionAndPredivideGiveTheSameTraining) {
  for (int stage = 0; stage <= 3; ++stage) {
    RunOptions o;
    o.stage = stage;
    o.dtype = DType::kBFloat16;
    o.steps = 10;
    const TrainResult plain = train(o);
    o.tweak = [](EngineConfig& c) {
      c.precision.reduce_in_fp32 = true;
      c.precision.gradient_predivide_factor = 2.0f;  // a power of two: exact in every dtype
    };
    const TrainResult fp32_reduce = train(o);
    expect_close(fp32_reduce.losses, plain.losses, 1e-2, name_of(o.dtype, stage));
  }
}

// A communicator whose 16-bit reductions sum in the 16-bit dtype, rounding after every
// addition (rank 0's value, then rank 1's, ...), as a backend that reduces natively in bf16 or
// fp16 does (NCCL's ring); fp32 reductions and everything else are the MPI communicator's,
// which sums 16-bit values in fp32 and rounds once. It records the dtype of each reduction.
class SixteenBitSumCommunicator : public ForwardingCommunicator {
 public:
  struct Reduction {
    CollectiveOp op;
    DType dtype;
  };

  SixteenBitSumCommunicator() : ForwardingCommunicator(make_mpi_communicator()) {}

  Event reduce_scatter(const void* send, void* recv, size_t count, DType dtype) override {
    reductions_.push_back({CollectiveOp::kReduceScatter, dtype});
    if (dtype == DType::kFloat32) return inner().reduce_scatter(send, recv, count, dtype);
    const size_t offset = static_cast<size_t>(rank()) * count;
    return sum_in_16_bits(send, count * static_cast<size_t>(world_size()), offset, recv, count,
                          dtype);
  }
  Event all_reduce(const void* send, void* recv, size_t count, DType dtype) override {
    reductions_.push_back({CollectiveOp::kAllReduce, dtype});
    if (dtype == DType::kFloat32) return inner().all_reduce(send, recv, count, dtype);
    return sum_in_16_bits(send, count, 0, recv, count, dtype);
  }

  const std::vector<Reduction>& reductions() const { return reductions_; }

 private:
  // Gathers every rank's `total` elements, then (on the stream, after the gather) writes
  // elements [offset, offset + count) of the 16-bit sum over ranks to recv.
  Event sum_in_16_bits(const void* send, size_t total, size_t offset, void* recv, size_t count,
                       DType dtype) {
    const int world = world_size();
    auto all = std::make_shared<std::vector<uint16_t>>(total * static_cast<size_t>(world));
    inner().all_gather(send, all->data(), total, dtype);
    return inner().stream().enqueue([=] {
      auto* out = static_cast<uint16_t*>(recv);
      for (size_t e = 0; e < count; ++e) {
        float sum = 0.0f;
        for (int r = 0; r < world; ++r) {
          const uint16_t x = (*all)[static_cast<size_t>(r) * total + offset + e];
          sum = dtype == DType::kBFloat16 ? bf16_to_float(float_to_bf16(sum + bf16_to_float(x)))
                                          : fp16_to_float(float_to_fp16(sum + fp16_to_float(x)));
        }
        out[e] = dtype == DType::kBFloat16 ? float_to_bf16(sum) : float_to_fp16(sum);
      }
    });
  }

  std::vector<Reduction> reductions_;
};

// x rounded to nearest even with `bits` significant bits (bf16: 8, fp16: 11; normal numbers).
double round_to_bits(double x, int bits) {
  int exponent = 0;
  const double mantissa = std::frexp(x, &exponent);  // in [0.5, 1)
  return std::ldexp(std::nearbyint(std::ldexp(mantissa, bits)), exponent - bits);
}

// communication_data_type "fp32" (reduce_in_fp32): the gradient of every rank is summed in fp32
// and rounded once to the working dtype, whatever the backend does with 16-bit sums. Each
// element gets 1 from rank 0 and half a unit in the last place of 1 from every other rank:
// summed in 16 bits, every addition is a tie that rounds back to 1; in fp32, the exact sum
// 1 + (N-1)/2 ulp rounds once to 1 + 1 ulp (N = 3) or 1 + 2 ulp (N = 4). SGD with lr 1 and
// no decay turns the mean gradient into minus the master weights, element by element.
TEST(MixedPrecision, CommunicationDataTypeFp32SumsInFp32AndRoundsOnce) {
  const int world = world_size();
  if (world < 2) GTEST_SKIP() << "one rank reduces nothing";
  const size_t n = 40;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    const int bits = dtype == DType::kBFloat16 ? 8 : 11;
    const double half_ulp = std::ldexp(1.0, -bits);  // of 1.0
    for (int stage = 0; stage <= 3; ++stage) {
      for (bool in_fp32 : {false, true}) {
        const std::string what = name_of(dtype, stage) + (in_fp32 ? ", fp32" : ", 16-bit") +
                                 " reduction on " + std::to_string(world) + " ranks";
        SixteenBitSumCommunicator comm;
        EngineConfig config;
        config.stage = stage;
        config.precision.dtype = dtype;
        config.precision.reduce_in_fp32 = in_fp32;
        // Accumulated in the working dtype, so every stage reduces 16-bit gradients (bf16's
        // default accumulates in fp32 and reduces the fp32 sum at stages 0-1).
        config.precision.grad_accum_dtype = dtype;
        config.precision.loss_scaler.initial_scale_power =
            0;  // fp16: scale 1, the gradients as written
        config.optimizer.type = OptimizerType::kSgd;
        config.optimizer.lr = 1.0f;
        config.optimizer.weight_decay = 0.0f;
        Engine engine(comm,
                      {ParamDecl{ParamSpec{"g", {static_cast<int64_t>(n)}, 0},
                                 ParamInit{InitKind::kZeros, 0}}},
                      config);
        // Element e scales both parts by +-2^k, k in -2..2: the same ties at every magnitude.
        std::vector<double> scale(n), expected(n);
        std::vector<float> mine(n);
        for (size_t e = 0; e < n; ++e) {
          scale[e] = (e % 2 ? -1.0 : 1.0) * std::ldexp(1.0, static_cast<int>(e % 5) - 2);
          mine[e] = static_cast<float>(scale[e] * (comm.rank() == 0 ? 1.0 : half_ulp));
          const double exact_sum = scale[e] * (1.0 + (world - 1) * half_ulp);
          expected[e] = in_fp32 ? round_to_bits(exact_sum, bits) : scale[e];
        }
        engine.gather(0);
        void* grad = engine.grad(0);
        for (size_t e = 0; e < n; ++e) {
          const uint16_t h =
              dtype == DType::kBFloat16 ? float_to_bf16(mine[e]) : float_to_fp16(mine[e]);
          std::memcpy(static_cast<char*>(grad) + e * sizeof(uint16_t), &h, sizeof(uint16_t));
        }
        engine.grads_ready(0);
        engine.release(0);
        const StepStats stats = engine.step();
        ASSERT_FALSE(stats.skipped) << what;

        // Which dtype went over the wire: fp32 for every reduction of the gradient, or the
        // working dtype. (The engine's own fp32 reductions, e.g. of the norm, count as fp32.)
        size_t sixteen_bit = 0;
        for (const auto& r : comm.reductions()) sixteen_bit += r.dtype == dtype ? 1 : 0;
        if (in_fp32) {
          EXPECT_EQ(sixteen_bit, 0u) << what << ": a gradient was reduced in 16 bits";
        } else {
          EXPECT_GT(sixteen_bit, 0u) << what << ": no gradient was reduced in the working dtype";
        }

        // The reduced gradient, element by element (master = 0 - 1 x sum / N) and as a norm.
        const std::vector<float> master = engine.gather_full_master()[0];
        ASSERT_EQ(master.size(), n) << what;
        double squares = 0.0;
        for (size_t e = 0; e < n; ++e) {
          const double mean = expected[e] / world;
          squares += mean * mean;
          EXPECT_NEAR(master[e], -mean, 1e-6 * std::fabs(mean)) << what << ", element " << e;
        }
        EXPECT_NEAR(stats.grad_norm, std::sqrt(squares), 1e-6 * std::sqrt(squares)) << what;
        if (world >= 3) {
          // Only a sum of three or more values can round differently in 16 bits.
          for (size_t e = 0; e < n; ++e) {
            EXPECT_NE(round_to_bits(scale[e] * (1.0 + (world - 1) * half_ulp), bits), scale[e])
                << "the test's values do not tell the two sums apart";
          }
        }
      }
    }
  }
}

// The variants run with a slow communication stream that nothing drains after the step (the
// loss is summed over another communicator): whatever the next forward reads must wait for its
// own all-gather, the persistent unit's post-step one included.
TEST(Scheduling, OptionsThatMustNotChangeTheNumbers) {
  RunOptions o;
  o.stage = 3;
  o.steps = 6;
  o.mlp = MlpConfig{8, 24, 4, 5};
  const TrainResult reference = train(o);
  o.drain_after_step = false;
  o.comm_delay_us = 1000;
  const std::vector<std::pair<std::string, std::function<void(EngineConfig&)>>> variants = {
      {"no overlap", [](EngineConfig& c) { c.schedule.overlap_comm = false; }},
      {"all-reduce instead of reduce-scatter",
       [](EngineConfig& c) { c.schedule.reduce_scatter = false; }},
      {"prefetch everything", [](EngineConfig& c) { c.schedule.prefetch_elements = 1u << 30; }},
      {"live budget of one unit", [](EngineConfig& c) { c.schedule.max_live_elements = 1; }},
      {"everything persistent",
       [](EngineConfig& c) { c.schedule.persistence_threshold = 1u << 30; }},
      {"persistent biases", [](EngineConfig& c) { c.schedule.persistence_threshold = 50; }},
      {"reuse at the end of forward",
       [](EngineConfig& c) { c.schedule.max_reuse_distance = 1u << 30; }},
  };
  for (const auto& [name, tweak] : variants) {
    o.tweak = tweak;
    const TrainResult run = train(o);
    if (world_size() <= 2) {
      EXPECT_EQ(run.losses, reference.losses) << name;
    } else {
      expect_close(run.losses, reference.losses, 1e-6, name);
    }
  }
}

// DeepSpeed's bucket keys group collectives: reduce_bucket_size packs the gradients of
// consecutive units into one reduction, allgather_bucket_size the post-step all-gathers of
// stages 1-2. Fewer collectives, the same sums (bitwise where MPI sums in the same order).
// The persistent unit's gradient accumulates over micro-batches in grad_accum_dtype, as every
// other unit's: stage 3 with everything persistent sums bf16 micro-batches in fp32 exactly as
// stage 3 without persistence and stage 2 do.
TEST(Scheduling, PersistentGradientsAccumulateInTheAccumulationDtype) {
  RunOptions o;
  o.stage = 2;
  o.steps = 6;
  o.micro_batches = 4;
  o.global_batch = 48;
  o.dtype = DType::kBFloat16;
  o.mlp = MlpConfig{8, 24, 4, 5};
  const TrainResult reference = train(o);
  o.stage = 3;
  for (size_t threshold : {size_t{0}, size_t{50}, size_t{1} << 30}) {
    o.tweak = [threshold](EngineConfig& c) { c.schedule.persistence_threshold = threshold; };
    const TrainResult run = train(o);
    const std::string name = "stage 3, persistence threshold " + std::to_string(threshold);
    if (world_size() <= 2) {
      EXPECT_EQ(run.losses, reference.losses) << name;
    } else {
      expect_close(run.losses, reference.losses, 1e-6, name);
    }
  }
}

TEST(Scheduling, BucketsPackCollectivesWithoutChangingTheNumbers) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int stage = 0; stage <= 3; ++stage) {
      RunOptions o;
      o.stage = stage;
      o.dtype = dtype;
      o.steps = 4;
      o.micro_batches = 2;
      o.mlp = MlpConfig{8, 24, 4, 6};
      const TrainResult reference = train(o);
      for (size_t bucket : {size_t{1300}, size_t{1} << 30}) {
        o.tweak = [bucket](EngineConfig& c) {
          c.schedule.reduce_bucket_elements = bucket;
          c.schedule.allgather_bucket_elements = bucket;
        };
        const TrainResult run = train(o);
        const std::string name =
            name_of(dtype, stage) + ", buckets of " + std::to_string(bucket) + " elements";
        if (world_size() <= 2) {
          EXPECT_EQ(run.losses, reference.losses) << name;
        } else {
          expect_close(run.losses, reference.losses, 1e-6, name);
        }
        EXPECT_LT(run.collectives.back(), reference.collectives.back()) << name;
      }
    }
  }
}

// DeepSpeed's usual bucket sizes (5e8 elements) once merged a whole model into one unit, so
// stage 3 gathered all of it at once: more memory than stage 0. The buckets group collectives
// only: the units stay the 8 layers, and the peak is 1/N of the model state plus a few layers'
// buffers: two gathered, two gradient buckets, a reduction bucket of at most two layers (the
// cap of a pack) and the communicator's fp32 staging of that bucket's shard.
TEST(Scheduling, DeepSpeedBucketSizesKeepStage3Sharded) {
  const uint64_t n = static_cast<uint64_t>(world_size());
  RunOptions o;
  o.stage = 3;
  o.steps = 2;
  o.mlp = MlpConfig{32, 128, 16, 8};
  o.tweak = [](EngineConfig& c) {
    c.schedule.reduce_bucket_elements = 500000000;
    c.schedule.allgather_bucket_elements = 500000000;
  };
  const TrainResult run = train(o);
  EXPECT_EQ(run.units, 8u);
  const uint64_t psi = run.padded_params;
  const uint64_t layer = (128 * 128 + 128 + 64 * n) * sizeof(float);  // plus padding
  const uint64_t buffers = (2 + 2 + 2) * layer + 2 * layer / n;
  EXPECT_EQ(run.model_state_bytes, 16 * psi / n);
  EXPECT_LE(run.peak_bytes, 16 * psi / n + buffers)
      << "peak " << run.peak_bytes << " bytes for " << psi << " parameters on " << n << " rank(s)";
  if (n < 2) return;  // one rank shards nothing: stage 3 cannot hold less than stage 0
  o.stage = 0;
  o.tweak = nullptr;
  const TrainResult stage0 = train(o);
  EXPECT_LT(run.peak_bytes, stage0.peak_bytes) << "stage 0 peak " << stage0.peak_bytes;
}

// Per parameter, as DeepSpeed: with a threshold between the MLP's biases (24 and 4 elements)
// and weights (96 and more), stage 3 keeps the biases whole on every rank and still shards and
// gathers every weight: one more unit, a little more model state, fewer bytes on the wire.
TEST(Scheduling, PersistenceThresholdIsPerParameter) {
  const uint64_t n = static_cast<uint64_t>(world_size());
  RunOptions o;
  o.stage = 3;
  o.steps = 2;
  o.mlp = MlpConfig{8, 24, 4, 5};
  const TrainResult plain = train(o);
  o.tweak = [](EngineConfig& c) { c.schedule.persistence_threshold = 50; };
  const TrainResult biases = train(o);
  EXPECT_EQ(biases.units, plain.units + 1);
  EXPECT_EQ(biases.losses, plain.losses);
  if (n < 2) return;
  EXPECT_GT(biases.model_state_bytes, plain.model_state_bytes);
  EXPECT_LT(biases.model_state_bytes, plain.model_state_bytes * 5 / 4);
  EXPECT_LT(biases.comm_bytes[1], plain.comm_bytes[1]);
}

// stage3_prefetch_bucket_size larger than the model (DeepSpeed's default 5e7 on a small one)
// prefetches every unit, and the pool holds one buffer per unit, not prefetch_elements' worth
// (it once reserved 4 GiB for 1 << 30).
TEST(Scheduling, PrefetchBucketLargerThanTheModelHoldsOneBufferPerUnit) {
  RunOptions o;
  o.stage = 3;
  o.steps = 1;
  o.mlp = MlpConfig{32, 128, 16, 8};
  o.tweak = [](EngineConfig& c) { c.schedule.prefetch_elements = size_t{1} << 30; };
  const TrainResult run = train(o);
  const uint64_t n = static_cast<uint64_t>(world_size());
  const uint64_t layer = (128 * 128 + 128 + 64 * n) * sizeof(float);
  EXPECT_LE(run.buffer_bytes, (8 + 2) * layer + 2 * layer / n) << run.buffer_bytes;
}

TEST(Scheduling, ReuseAndPersistenceSaveCommunication) {
  if (world_size() < 2) GTEST_SKIP() << "one rank communicates nothing";
  RunOptions o;
  o.stage = 3;
  o.steps = 2;
  const TrainResult plain = train(o);
  o.tweak = [](EngineConfig& c) { c.schedule.max_reuse_distance = 1u << 30; };
  const TrainResult reuse = train(o);
  EXPECT_LT(reuse.comm_bytes[1], plain.comm_bytes[1]);
  o.tweak = [](EngineConfig& c) { c.schedule.persistence_threshold = 1u << 30; };
  const TrainResult persistent = train(o);
  EXPECT_LT(persistent.comm_bytes[1], plain.comm_bytes[1]);
  EXPECT_GT(persistent.model_state_bytes, plain.model_state_bytes);
}

}  // namespace
}  // namespace zero
