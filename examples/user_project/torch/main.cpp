// A user's LibTorch model trained with zero: a small torch::nn::Sequential (linear, tanh,
// linear) that learns y = x · w_true by least squares, wrapped by zero::TorchModel at ZeRO
// stage 3. Each child of the Sequential is a unit: the engine shards its parameters, gradients
// and Adam's state over the ranks, gathers a unit around its forward and backward, and
// reduce-scatters its gradient as autograd finishes it. Each step draws one global batch and
// every rank trains on its own equal slice of it, so the mean of the ranks' losses
// (model.global_mean) is the loss over the global batch. At the end the trained weights come
// back in full (model.state_dict(), on rank 0) into a plain LibTorch copy of the network.
//
//   mpirun -np 2 ./user_torch_model
//
// Rank 0 prints the loss of every step; the program fails (exit 1) unless the loss falls and
// the plain copy's loss on the last batch is the trained model's.
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>

#include "zero/collectives/mpi_communicator.h"
#include "zero/torch/torch_model.h"

namespace {

constexpr int kFeatures = 8;
constexpr int kHidden = 16;
constexpr int kGlobalBatch = 64;  // divided evenly over the ranks
constexpr int kSteps = 60;

torch::nn::Sequential make_net() {
  return torch::nn::Sequential(torch::nn::Linear(kFeatures, kHidden), torch::nn::Tanh(),
                               torch::nn::Linear(kHidden, 1));
}

int train(zero::Communicator& comm) {
  if (kGlobalBatch % comm.world_size() != 0) {
    if (comm.rank() == 0) {
      std::fprintf(stderr, "user_torch_model: %d ranks do not divide the global batch of %d\n",
                   comm.world_size(), kGlobalBatch);
    }
    return 2;
  }
  torch::manual_seed(0);  // rank 0's initial values reach every rank at wrapping anyway
  torch::nn::Sequential net = make_net();
  zero::EngineConfig config;
  config.stage = 3;
  config.optimizer.lr = 0.02f;
  zero::TorchModel model(comm, net, config);

  const torch::Tensor w_true = torch::linspace(-1.0, 1.0, kFeatures).unsqueeze(1);
  // The same generator on every rank: the same global batch, of which each takes its slice.
  torch::Generator generator = torch::make_generator<torch::CPUGeneratorImpl>(1000);
  const int64_t rows = kGlobalBatch / comm.world_size();
  float first_loss = 0.0f;
  float last_loss = 0.0f;
  torch::Tensor last_inputs, last_targets;
  for (int step = 1; step <= kSteps; ++step) {
    last_inputs = torch::randn({kGlobalBatch, kFeatures}, generator);
    last_targets = last_inputs.matmul(w_true);
    const torch::Tensor inputs = last_inputs.narrow(0, comm.rank() * rows, rows);
    const torch::Tensor targets = last_targets.narrow(0, comm.rank() * rows, rows);
    // Mean squared error over this rank's slice; the engine averages gradients over ranks.
    const torch::Tensor loss = torch::mse_loss(model.forward(inputs), targets);
    loss.backward();
    last_loss = model.global_mean(loss).item<float>();  // before step(): this step's weights
    model.step();
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
  // The trained model's global loss on the last batch, and the trained weights in full, by
  // name, in a plain LibTorch network (torch::save(plain, path) would write them): the same loss.
  torch::NoGradGuard no_grad;
  const torch::Tensor inputs = last_inputs.narrow(0, comm.rank() * rows, rows);
  const torch::Tensor targets = last_targets.narrow(0, comm.rank() * rows, rows);
  const float trained_loss =
      model.global_mean(torch::mse_loss(model.forward(inputs), targets)).item<float>();
  const auto trained = model.state_dict(/*rank0_only=*/true);
  if (comm.rank() != 0) return 0;
  torch::nn::Sequential plain = make_net();
  for (auto& param : plain->named_parameters()) param.value().copy_(trained[param.key()]);
  const float plain_loss = torch::mse_loss(plain->forward(last_inputs), last_targets).item<float>();
  std::printf("trained loss %.6f, in a plain network %.6f\n", trained_loss, plain_loss);
  if (std::fabs(plain_loss - trained_loss) > 1e-4f * trained_loss + 1e-6f) {
    std::fprintf(stderr, "user_torch_model: the plain network's loss %g is not the model's %g\n",
                 plain_loss, trained_loss);
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
