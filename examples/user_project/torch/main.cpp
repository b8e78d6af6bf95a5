// A user's LibTorch model trained with zero: a small torch::nn::Sequential (linear, tanh,
// linear) that learns y = x · w_true by least squares, wrapped by zero::TorchModel at ZeRO
// stage 3. Each child of the Sequential is a unit: the engine shards its parameters, gradients
// and Adam's state over the ranks, gathers a unit around its forward and backward, and
// reduce-scatters its gradient as autograd finishes it. Every rank draws its own samples.
//
//   mpirun -np 2 ./user_torch_model
//
// Rank 0 prints the loss of every step; the program fails (exit 1) unless the loss falls.
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <memory>

#include "zero/collectives/mpi_communicator.h"
#include "zero/torch/torch_model.h"

namespace {

constexpr int kFeatures = 8;
constexpr int kHidden = 16;
constexpr int kSamplesPerRank = 32;
constexpr int kSteps = 60;

int train(zero::Communicator& comm) {
  torch::manual_seed(0);  // rank 0's initial values reach every rank at wrapping anyway
  torch::nn::Sequential net(torch::nn::Linear(kFeatures, kHidden), torch::nn::Tanh(),
                            torch::nn::Linear(kHidden, 1));
  zero::EngineConfig config;
  config.stage = 3;
  config.optimizer.lr = 0.02f;
  zero::TorchModel model(comm, net, config);

  const torch::Tensor w_true = torch::linspace(-1.0, 1.0, kFeatures).unsqueeze(1);
  torch::Generator generator =
      torch::make_generator<torch::CPUGeneratorImpl>(1000 + static_cast<uint64_t>(comm.rank()));
  float first_loss = 0.0f;
  float last_loss = 0.0f;
  for (int step = 1; step <= kSteps; ++step) {
    const torch::Tensor inputs = torch::randn({kSamplesPerRank, kFeatures}, generator);
    const torch::Tensor targets = inputs.matmul(w_true);
    // Mean squared error over this rank's samples; the engine averages gradients over ranks.
    const torch::Tensor loss = torch::mse_loss(model.forward(inputs), targets);
    loss.backward();
    model.step();
    float local = loss.item<float>();
    float sum = 0.0f;
    comm.all_reduce_sync(&local, &sum, 1, zero::DType::kFloat32);
    last_loss = sum / static_cast<float>(comm.world_size());
    if (step == 1) first_loss = last_loss;
    if (comm.rank() == 0) std::printf("step %2d  loss %.6f\n", step, last_loss);
  }
  if (last_loss >= 0.1f * first_loss) {
    if (comm.rank() == 0) {
      std::fprintf(stderr, "user_torch_model: the loss did not fall: %g -> %g\n", first_loss,
                   last_loss);
    }
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  zero::MpiSession mpi(&argc, &argv);
  try {
    torch::set_num_threads(1);  // ranks share the cores
    std::unique_ptr<zero::Communicator> comm = zero::make_mpi_communicator();
    return train(*comm);
  } catch (const c10::Error& e) {  // LibTorch's own message, without its stack trace
    std::fprintf(stderr, "user_torch_model: rank %d: %s\n", mpi.world_rank(),
                 e.what_without_backtrace());
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "user_torch_model: rank %d: %s\n", mpi.world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}
