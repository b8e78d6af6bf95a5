// TorchModel with a 16-bit working dtype at stages 0-3, at 1 and 2 ranks: the module computes
// in bf16 or fp16 while the fp32 master weights stay in the engine's shards, and training
// matches plain fp32 LibTorch within the dtype's precision. fp16's loss scale reaches the
// gradients through forward()'s output: small gradients survive, an overflow skips the step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/torch/torch_test_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/torch/torch_model.h"

namespace zero {
namespace {

using namespace zero::testing;

// LibTorch 1.13's CPU kernels have no fp16 matrix product, so the fp16 tests train a chain of
// element-wise layers (x's first `out` columns times a weight, plus a bias), which they have.
struct AffineImpl : torch::nn::Module {
  AffineImpl(int64_t in, int64_t out) : out_features(out) {
    weight = register_parameter("weight", torch::rand({out}) + 0.5);
    bias = register_parameter("bias", torch::randn({out}) * 0.1);
    (void)in;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x.narrow(1, 0, out_features) * weight + bias;
  }
  int64_t out_features;
  torch::Tensor weight;
  torch::Tensor bias;
};
TORCH_MODULE(Affine);

torch::nn::Sequential make_affine() {
  torch::manual_seed(5);
  return torch::nn::Sequential(Affine(6, 6), Affine(6, 6), Affine(6, 3));
}

EngineConfig mixed_config(int stage, DType dtype) {
  EngineConfig config = config_at(stage);
  config.precision.dtype = dtype;
  return config;
}

// Tolerance. The first step's update is lr times the gradient's sign, in both runs alike; after
// that the updates follow gradients computed from 16-bit weights and activations (each rounded
// once per layer to 2^-8 for bf16, 2^-10 for fp16, through three layers forward and back), so
// the trained weights drift from fp32 training by a small fraction of how far training moved
// them: at most 1.6e-2 of it seen for bf16, 2e-3 for fp16. The bound is 2^-5 of the move (bf16)
// and 2^-7 (fp16). A wrong or missing gradient is off by the order of the move itself; fp16
// gradients without the loss scale lose most of their digits (subnormal), and 16-bit master
// weights lose the updates' low bits, both well past the bounds.
void expect_close_to_fp32(const std::function<torch::nn::Sequential()>& make, int stage,
                          DType dtype, float loss_factor, double tolerance) {
  const std::vector<std::vector<torch::Tensor>> plain = train_plain(make, loss_factor);
  const std::vector<torch::Tensor> initial = snapshot(*make());
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  const int rank = comm->rank();
  const int64_t rows = kGlobalRows / comm->world_size();
  TorchModel model(*comm, make(), mixed_config(stage, dtype));
  const torch::ScalarType working = dtype == DType::kBFloat16 ? torch::kBFloat16 : torch::kHalf;
  double worst = 0.0;
  for (int step = 0; step < kSteps; ++step) {
    const auto [x, y] = batch(step);
    const torch::Tensor out = model.forward(x.narrow(0, rank * rows, rows));
    EXPECT_EQ(out.scalar_type(), torch::kFloat32);
    if (stage < 3) {
      EXPECT_EQ(model.module().parameters()[0].scalar_type(), working);
    }
    (loss_factor * torch::mse_loss(out, y.narrow(0, rank * rows, rows))).backward();
    const StepStats stats = model.step();
    EXPECT_FALSE(stats.skipped) << "step " << step + 1;
    const std::vector<torch::Tensor> master =
        tensors_of(model.engine().gather_full_master(), model.engine().layout());
    for (size_t p = 0; p < master.size(); ++p) {
      const double error = (master[p] - plain[step][p]).norm().item<double>();
      const double moved = (plain[step][p] - initial[p]).norm().item<double>();
      worst = std::max(worst, error / moved);
      EXPECT_LE(error, tolerance * moved)
          << dtype_name(dtype) << " stage " << stage << ", step " << step + 1 << ", parameter " << p
          << ": error " << error << ", training moved it " << moved;
    }
  }
  std::printf("%s stage %d: largest error / move %.2g (bound %.2g)\n", dtype_name(dtype), stage,
              worst, tolerance);
}

TEST(TorchMixedPrecision, Bf16MatchesFp32) {
  for (int stage = 0; stage <= 3; ++stage) {
    expect_close_to_fp32([] { return make_mlp(1); }, stage, DType::kBFloat16, 1.0f, 0x1p-5);
  }
}

// The loss times 1e-4 makes gradients of 1e-6 to 1e-5, subnormal in fp16 (below 6.1e-5): the
// default loss scale of 2^16 lifts them into fp16's normal range.
TEST(TorchMixedPrecision, Fp16MatchesFp32) {
  for (int stage = 0; stage <= 3; ++stage) {
    expect_close_to_fp32(make_affine, stage, DType::kFloat16, 1e-4f, 0x1p-7);
  }
}

// A loss scale of 2^40 overflows fp16's gradients (the loss alone does not: its gradients are
// below 1): the step is skipped, nothing moves, and the scale halves.
TEST(TorchMixedPrecision, Fp16OverflowSkipsTheStep) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  EngineConfig config = mixed_config(3, DType::kFloat16);
  config.precision.loss_scaler.initial_scale_power = 40;
  config.precision.loss_scaler.hysteresis = 1;  // the first overflow lowers the scale
  TorchModel model(*comm, make_affine(), config);
  const std::vector<std::vector<float>> before = model.engine().gather_full_master();
  const auto [x, y] = batch(0);
  torch::mse_loss(model.forward(x), y).backward();
  const StepStats stats = model.step();
  EXPECT_TRUE(stats.skipped);
  EXPECT_EQ(stats.loss_scale, 0x1p39f);
  EXPECT_EQ(model.engine().gather_full_master(), before);
}

}  // namespace
}  // namespace zero
