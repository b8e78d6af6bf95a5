// A user's model trained with zero: one module with one parameter, a weight vector w, that
// learns y = x · w_true by least squares. Every rank draws its own samples; ZeRO stage 3 shards
// w, its gradient and Adam's state over the ranks, and the engine gathers w for the forward and
// backward and reduce-scatters the gradient.
//
//   mpirun -np 2 ./user_model
//
// Rank 0 prints the loss of every step; the program fails (exit 1) unless the loss falls.
#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

#include <mpi.h>

#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/model.h"

namespace {

constexpr int kFeatures = 8;
constexpr int kSamplesPerRank = 16;
constexpr int kSteps = 40;

// out[s] = sum_i in[s][i] * w[i]: a linear model without bias.
class DotProduct : public zero::Module {
 public:
  std::vector<zero::ParamDecl> parameters() const override {
    zero::ParamDecl weight;
    weight.spec.name = "weight";
    weight.spec.shape = {kFeatures};
    weight.init.kind = zero::InitKind::kZeros;
    return {weight};
  }

  void forward(const zero::Tensor& in, zero::Tensor& out,
               const std::vector<zero::ParamRef>& params) override {
    input_ = in;  // backward needs it for the weight gradient
    const float* w = params[0].as_f32(weight_f32_);
    const int64_t samples = in.shape()[0];
    out = zero::Tensor({samples, 1});
    for (int64_t s = 0; s < samples; ++s) {
      for (int i = 0; i < kFeatures; ++i) out.data()[s] += in.data()[s * kFeatures + i] * w[i];
    }
  }

  void backward(const zero::Tensor& grad_out, zero::Tensor& grad_in,
                const std::vector<zero::ParamRef>& params,
                const std::vector<zero::ParamRef>& grads) override {
    const float* w = params[0].as_f32(weight_f32_);
    const int64_t samples = input_.shape()[0];
    grad_in = zero::Tensor(input_.shape());
    std::vector<float> grad_w(kFeatures, 0.0f);
    for (int64_t s = 0; s < samples; ++s) {
      for (int i = 0; i < kFeatures; ++i) {
        grad_in.data()[s * kFeatures + i] = grad_out.data()[s] * w[i];
        grad_w[i] += grad_out.data()[s] * input_.data()[s * kFeatures + i];
      }
    }
    grads[0].add_f32(grad_w.data());  // adds to what earlier micro-batches left, as .grad does
  }

 private:
  zero::Tensor input_;
  zero::Tensor weight_f32_;  // scratch for a weight stored in bf16 or fp16
};

// The samples of one rank at one step, from a small deterministic generator, and their targets.
void make_batch(int rank, int step, zero::Tensor& inputs, zero::Tensor& targets) {
  inputs = zero::Tensor({kSamplesPerRank, kFeatures});
  targets = zero::Tensor({kSamplesPerRank, 1});
  unsigned state =
      12345u + 7919u * static_cast<unsigned>(rank) + 104729u * static_cast<unsigned>(step);
  for (int s = 0; s < kSamplesPerRank; ++s) {
    for (int i = 0; i < kFeatures; ++i) {
      state = state * 1664525u + 1013904223u;
      const float x = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
      inputs.data()[s * kFeatures + i] = x;
      targets.data()[s] += x * (static_cast<float>(i) - 3.5f) / 4.0f;  // w_true[i] = (i - 3.5) / 4
    }
  }
}

int train(zero::Communicator& comm) {
  std::vector<zero::NamedModule> modules;
  modules.push_back({"linear", std::make_unique<DotProduct>()});
  zero::EngineConfig config;
  config.stage = 3;
  config.optimizer.lr = 0.1f;
  zero::ZeroModel model(comm, std::move(modules), config);

  float first_loss = 0.0f;
  float last_loss = 0.0f;
  for (int step = 1; step <= kSteps; ++step) {
    zero::Tensor inputs;
    zero::Tensor targets;
    make_batch(comm.rank(), step, inputs, targets);
    const zero::Tensor prediction = model.forward(inputs);
    // Mean squared error over this rank's samples; the engine averages gradients over ranks.
    zero::Tensor grad({kSamplesPerRank, 1});
    float loss = 0.0f;
    for (int s = 0; s < kSamplesPerRank; ++s) {
      const float error = prediction.data()[s] - targets.data()[s];
      loss += error * error / kSamplesPerRank;
      grad.data()[s] = 2.0f * error / kSamplesPerRank;
    }
    model.backward(grad);
    model.step();
    float loss_sum = 0.0f;
    comm.all_reduce_sync(&loss, &loss_sum, 1, zero::DType::kFloat32);
    last_loss = loss_sum / static_cast<float>(comm.world_size());
    if (step == 1) first_loss = last_loss;
    if (comm.rank() == 0) std::printf("step %2d  loss %.6f\n", step, last_loss);
  }
  if (last_loss >= 0.1f * first_loss) {
    if (comm.rank() == 0) {
      std::fprintf(stderr, "user_model: the loss did not fall: %g -> %g\n", first_loss, last_loss);
    }
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  try {
    std::unique_ptr<zero::Communicator> comm = zero::make_mpi_communicator();
    return train(*comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "user_model: rank %d: %s\n", mpi.world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}
