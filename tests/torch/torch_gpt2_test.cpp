// The LibTorch GPT-2 of examples/torch_gpt2 trained through TorchModel, against PyTorch's
// float64 run of the same weights (tests/data/gpt2/expected_fp64.json; gpt2_golden_check says
// why not its float32 one): every step's loss and gradient norm, a few logits, every
// parameter's sum and L2 norm after the last step, within 1e-5, and against the
// native GPT-2 (models/gpt2.h) trained at the same stage on the same ranks within 1e-5, at
// stages 0-3. The LM head's tie to the token embedding is TorchUnit::tied; its errors are here.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "examples/torch_gpt2/torch_gpt2.h"
#include "models/gpt2.h"
#include "models/token_data.h"
#include "models/train_step.h"
#include "tests/expect_error.h"
#include "tests/torch/torch_test_util.h"
#include "zero/collectives/mpi_communicator.h"
#include "zero/runtime/model.h"

namespace zero {
namespace {

using testing::expect_error_naming;

const std::string kData = std::string(ZERO_SOURCE_DIR) + "/tests/data/gpt2/";
constexpr int kSteps = 3;
constexpr int64_t kBatch = 4;
constexpr int64_t kSeqLen = 32;
constexpr double kTolerance = 1e-5;

nlohmann::json expected() {
  std::ifstream file(kData + "expected_fp64.json");
  return nlohmann::json::parse(file);
}

EngineConfig reference_config(int stage) {
  EngineConfig config;
  config.stage = stage;
  config.optimizer.lr = 1e-3f;
  config.optimizer.beta1 = 0.9;
  config.optimizer.beta2 = 0.95;
  config.optimizer.eps = 1e-8f;
  config.optimizer.weight_decay = 0.1f;
  return config;
}

// What one run leaves to compare: per step the loss and gradient norm, and the final fp32
// parameters in registration order with their names.
struct TrainedRun {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<std::string> names;
  std::vector<std::vector<float>> final_params;
  torch::Tensor first_logits;  // step 0, this rank's first sequences
};

void finish(TrainedRun& run, Engine& engine) {
  run.final_params = engine.gather_full_master();
  for (const ParamPlacement& p : engine.layout().params()) run.names.push_back(p.name);
}

TrainedRun train_torch(Communicator& comm, int stage, DType dtype = DType::kFloat32) {
  examples::Gpt2 model(examples::TorchGpt2Config{});
  EngineConfig config = reference_config(stage);
  config.precision.dtype = dtype;
  std::unique_ptr<TorchModel> wrapped =
      examples::wrap_gpt2(comm, model, config, kData + "model.safetensors");
  const models::TokenData data(kData + "tokens.bin");
  TrainedRun run;
  for (int step = 0; step < kSteps; ++step) {
    torch::Tensor* logits = step == 0 ? &run.first_logits : nullptr;
    const examples::Gpt2Batch batch = examples::read_gpt2_batch(data, step, kBatch, kSeqLen);
    run.losses.push_back(examples::gpt2_forward_backward(*wrapped, batch, logits));
    // Stage 3 holds no unit between backward and step: the head's hold on wte's unit ended at
    // the head's input, wte's own gather with its gradient.
    EXPECT_EQ(wrapped->engine().live_elements(), 0u) << "step " << step;
    run.grad_norms.push_back(wrapped->step().grad_norm);
  }
  finish(run, wrapped->engine());
  return run;
}

// The native GPT-2's micro-batches: token ids as floats in, its output is the mean loss.
class NativeSource : public models::MicroBatchSource {
 public:
  NativeSource(models::TokenData data, std::shared_ptr<models::Gpt2Targets> targets)
      : data_(std::move(data)), targets_(std::move(targets)) {}
  Tensor input(long step, int64_t first, int64_t count) override {
    Tensor ids({count, kSeqLen});
    targets_->ids.resize(static_cast<size_t>(count * kSeqLen));
    data_.read_sequences(step, kBatch, kSeqLen, static_cast<int>(first), static_cast<int>(count),
                         ids.data(), targets_->ids.data());
    return ids;
  }
  float loss(const Tensor& output, Tensor& grad) override {
    grad = Tensor({1}, {1.0f}, output.device());
    return output.to_host()[0];
  }

 private:
  models::TokenData data_;
  std::shared_ptr<models::Gpt2Targets> targets_;
};

TrainedRun train_native(Communicator& comm, int stage) {
  models::Gpt2 gpt2 = models::make_gpt2(models::Gpt2Config{}, 1);
  NativeSource source(models::TokenData(kData + "tokens.bin"), gpt2.targets);
  ZeroModel model(comm, std::move(gpt2.modules), reference_config(stage));
  models::load_gpt2_weights(model.engine(), kData + "model.safetensors");
  TrainedRun run;
  for (int step = 0; step < kSteps; ++step) {
    float loss =
        models::forward_backward(model, source, step, kBatch, 1, comm.rank(), comm.world_size());
    comm.all_reduce(&loss, &loss, 1, DType::kFloat32).wait();
    run.losses.push_back(loss / static_cast<float>(comm.world_size()));
    run.grad_norms.push_back(model.step().grad_norm);
  }
  finish(run, model.engine());
  return run;
}

void expect_relative(double got, double want, const std::string& what,
                     double tolerance = kTolerance) {
  EXPECT_LE(std::fabs(got - want), tolerance * std::fabs(want))
      << what << ": " << got << ", expected " << want;
}

// Within `tolerance` relative (logits: absolute; sums: 10 tolerance times the L2 norm), as
// gpt2_golden_check holds a run to the reference.
bool is_attention_bias(const std::string& name) {
  const std::string suffix = "attn.c_attn.bias";
  return name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void expect_matches_reference(const TrainedRun& run, int rank, int world,
                              double tolerance = kTolerance, bool skip_attention_bias = false) {
  const nlohmann::json reference = expected();
  for (int s = 0; s < kSteps; ++s) {
    const std::string step = "step " + std::to_string(s);
    expect_relative(run.losses[s], reference["steps"][s]["loss"], step + " loss", tolerance);
    expect_relative(run.grad_norms[s], reference["steps"][s]["grad_norm"], step + " grad_norm",
                    tolerance);
  }
  // Rank 0 holds the first sequence's logits, the last rank the last sequence's.
  const nlohmann::json& logits = reference["steps"][0]["logits_first8"];
  const auto expect_logits = [&](const torch::Tensor& row, const nlohmann::json& want,
                                 const std::string& where) {
    for (int i = 0; i < 8; ++i) {
      EXPECT_NEAR(row[i].item<double>(), want[i].get<double>(), tolerance)
          << "logit " << i << " at " << where;
    }
  };
  if (rank == 0) expect_logits(run.first_logits[0][0], logits["b0_t0"], "b0_t0");
  if (rank == world - 1) expect_logits(run.first_logits[-1][-1], logits["blast_tlast"], "last");
  ASSERT_EQ(run.names.size(), reference["final_params"].size());
  for (size_t p = 0; p < run.names.size(); ++p) {
    if (skip_attention_bias && is_attention_bias(run.names[p])) continue;
    const nlohmann::json& want = reference["final_params"][run.names[p]];
    double sum = 0.0, squares = 0.0;
    for (float v : run.final_params[p]) {
      sum += v;
      squares += static_cast<double>(v) * v;
    }
    const double l2 = want["l2"];
    expect_relative(std::sqrt(squares), l2, run.names[p] + " L2", tolerance);
    EXPECT_LE(std::fabs(sum - want["sum"].get<double>()), 10 * tolerance * l2)
        << run.names[p] << " sum " << sum << ", expected " << want["sum"];
  }
}

void expect_same_as_native(const TrainedRun& run, const TrainedRun& native) {
  ASSERT_EQ(run.names, native.names);
  for (int s = 0; s < kSteps; ++s) {
    expect_relative(run.losses[s], native.losses[s], "step " + std::to_string(s) + " loss");
    expect_relative(run.grad_norms[s], native.grad_norms[s],
                    "step " + std::to_string(s) + " grad_norm");
  }
  for (size_t p = 0; p < run.names.size(); ++p) {
    double difference = 0.0, norm = 0.0;
    const size_t third = run.final_params[p].size() / 3;
    const bool key_bias = is_attention_bias(run.names[p]);
    for (size_t i = 0; i < run.final_params[p].size(); ++i) {
      // The key third of c_attn.bias has a zero gradient in exact arithmetic (adding b to every
      // key adds q.b to every score of a row, which the softmax ignores): it gets rounding
      // noise, which Adam turns into updates of ~1e-5 that differ between any two
      // implementations (measured on 1 rank: the whole tensor 3e-5 relative apart, without the
      // key third 7e-8; every other tensor within 2e-6). gpt2_golden_check leaves it out alike;
      // the reference checks above keep it.
      if (key_bias && i >= third && i < 2 * third) continue;
      const double d = run.final_params[p][i] - native.final_params[p][i];
      difference += d * d;
      norm += static_cast<double>(native.final_params[p][i]) * native.final_params[p][i];
    }
    EXPECT_LE(std::sqrt(difference), kTolerance * std::sqrt(norm))
        << run.names[p] << " differs from the native GPT-2's";
  }
}

TEST(TorchGpt2, MatchesTheReferenceAndTheNativeGpt2AtEveryStage) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const TrainedRun run = train_torch(*comm, stage);
    expect_matches_reference(run, comm->rank(), comm->world_size());
    expect_same_as_native(run, train_native(*comm, stage));
  }
}

// bf16: the module computes on bf16 views of the fp32 master weights; held to PyTorch's float64
// run within 4e-3, as the native GPT-2's bf16 run is (gpt2_golden_bf16_np2). Except the
// attention's bias: its key third has a zero gradient in exact arithmetic, and LibTorch's bf16
// kernels leave rounding noise there far above Adam's eps, which turns it into updates of the
// full learning rate (measured: its sum 0.012-0.025 off where 0.011 is allowed); fp32 noise
// stays below eps. The query and value thirds are held to the fp32 run of the adapter instead.
TEST(TorchGpt2, Bf16MatchesTheReferenceToItsPrecision) {
  constexpr double kBf16 = 4e-3;
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  for (int stage : {0, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const TrainedRun run = train_torch(*comm, stage, DType::kBFloat16);
    expect_matches_reference(run, comm->rank(), comm->world_size(), kBf16,
                             /*skip_attention_bias=*/true);
    const TrainedRun fp32 = train_torch(*comm, stage);
    for (size_t p = 0; p < run.names.size(); ++p) {
      if (!is_attention_bias(run.names[p])) continue;
      const size_t third = run.final_params[p].size() / 3;
      double difference = 0.0, norm = 0.0;
      for (size_t i = 0; i < run.final_params[p].size(); ++i) {
        if (i >= third && i < 2 * third) continue;  // the key third
        const double d = run.final_params[p][i] - fp32.final_params[p][i];
        difference += d * d;
        norm += static_cast<double>(fp32.final_params[p][i]) * fp32.final_params[p][i];
      }
      EXPECT_LE(std::sqrt(difference), kBf16 * std::sqrt(norm)) << run.names[p];
    }
  }
}

// A root whose head is the embedding module itself, registered a second time: its weight is
// the head's own parameter too, accepted only where the head declares the tie.
struct SharedHeadImpl : torch::nn::Module {
  SharedHeadImpl()
      : embed(register_module("embed", torch::nn::Embedding(16, 8))),
        mix(register_module("mix", torch::nn::Linear(8, 8))),
        head(register_module("head", embed)) {}
  torch::nn::Embedding embed;
  torch::nn::Linear mix;
  torch::nn::Embedding head;
};
TORCH_MODULE(SharedHead);

std::vector<TorchUnit> shared_head_units(const SharedHead& net, std::vector<std::string> tied) {
  const std::shared_ptr<torch::nn::EmbeddingImpl> embed = net->embed.ptr(), head = net->head.ptr();
  const std::shared_ptr<torch::nn::LinearImpl> mix = net->mix.ptr();
  return {{"embed", [embed](const torch::Tensor& ids) { return embed->forward(ids); }},
          {"mix", [mix](const torch::Tensor& x) { return torch::tanh(mix->forward(x)); }},
          {"head", [head](const torch::Tensor& x) { return x.matmul(head->weight.t()); }, tied}};
}

// The tied model trained through the adapter equals plain LibTorch on the whole batch: the
// embedding's gradient is the sum of both uses, and stage 3 gathers it for the head.
TEST(TorchGpt2, DeclaredTieOfASharedChildTrainsAsLibTorch) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  torch::manual_seed(2);  // the same batch on every rank
  const torch::Tensor ids = torch::randint(16, {6, 6}, torch::TensorOptions().dtype(torch::kLong));
  const torch::Tensor targets = (ids * 5 + 3) % 16;
  const auto loss_of = [](const torch::Tensor& logits, const torch::Tensor& want) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, 16}), want.reshape({-1}));
  };
  torch::manual_seed(3);
  SharedHead plain;
  // The shared weight is listed under both names: the optimizer must step it once.
  std::vector<torch::Tensor> distinct;
  for (const torch::Tensor& p : plain->parameters()) {
    const bool seen = std::any_of(distinct.begin(), distinct.end(),
                                  [&](const torch::Tensor& d) { return d.is_same(p); });
    if (!seen) distinct.push_back(p);
  }
  torch::optim::AdamW adamw(
      distinct, torch::optim::AdamWOptions(testing::kLr).weight_decay(testing::kWeightDecay));
  for (int step = 0; step < 3; ++step) {
    adamw.zero_grad();
    torch::Tensor x = ids;
    for (const TorchUnit& unit : shared_head_units(plain, {})) x = unit.forward(x);
    loss_of(x, targets).backward();
    adamw.step();
  }
  const int rank = comm->rank(), world = comm->world_size();
  const int64_t rows = ids.size(0) / world;
  ASSERT_EQ(ids.size(0) % world, 0) << "run on 1, 2, 3 or 6 ranks";
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    torch::manual_seed(3);
    SharedHead net;
    {
      TorchModel model(*comm, net.ptr(), shared_head_units(net, {"embed.weight"}),
                       testing::config_at(stage));
      for (int step = 0; step < 3; ++step) {
        const torch::Tensor mine = model.forward(ids.narrow(0, rank * rows, rows));
        loss_of(mine, targets.narrow(0, rank * rows, rows)).backward();
        model.step();
      }
    }
    const auto trained = net->named_parameters();
    const auto want = plain->named_parameters();
    ASSERT_EQ(trained.size(), want.size());
    for (const auto& p : want) {
      EXPECT_TRUE(torch::allclose(trained[p.key()], p.value(), 1e-5, 1e-6)) << p.key();
    }
  }
}

TEST(TorchGpt2, TiesMustBeDeclaredAndNameAnEarlierUnitsParameter) {
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  SharedHead net;
  const auto wrap = [&](std::vector<std::string> tied) {
    return [&comm, net, tied] {
      TorchModel(*comm, net.ptr(), shared_head_units(net, tied), testing::config_at(3));
    };
  };
  // The head uses the embedding's weight without declaring it: a child used twice.
  expect_error_naming(wrap({}),
                      "'embed.weight' belongs to unit 'embed' and to unit 'head'; a parameter (or "
                      "a child) is used by one unit only, unless the later unit declares the tie");
  expect_error_naming(wrap({"embed.weigth"}),
                      "unit 'head' ties to 'embed.weigth', which no "
                      "earlier unit has");
  expect_error_naming(wrap({"embed.weight", "embed.weight"}), "ties to 'embed.weight' twice");
  // A tie names a parameter of an earlier unit: the embedding cannot tie to the head's mix.
  std::vector<TorchUnit> backwards = shared_head_units(net, {"embed.weight"});
  backwards[0].tied = {"mix.weight"};
  expect_error_naming([&] { TorchModel(*comm, net.ptr(), backwards, testing::config_at(3)); },
                      "unit 'embed' ties to 'mix.weight', which no earlier unit has");
  // A unit reading another unit's parameter in its forward alone, undeclared: at stage 3 that
  // parameter is empty while the unit runs, and the error says what to declare.
  const std::shared_ptr<torch::nn::EmbeddingImpl> embed = net->embed.ptr();
  const std::shared_ptr<torch::nn::LinearImpl> mix = net->mix.ptr();
  std::vector<TorchUnit> hidden = {
      {"embed", [embed](const torch::Tensor& ids) { return embed->forward(ids); }},
      {"mix",
       [mix, embed](const torch::Tensor& x) { return mix->forward(x).matmul(embed->weight.t()); }}};
  TorchModel model(*comm, net.ptr(), hidden, testing::config_at(3));
  expect_error_naming(
      [&] {
        model.forward(torch::zeros({2, 3}, torch::kLong));
      },
      "unit 'mix' failed at stage 3: ");
  expect_error_naming(
      [&] {
        model.forward(torch::zeros({2, 3}, torch::kLong));
      },
      "declare those it uses in TorchUnit::tied");
}

}  // namespace
}  // namespace zero
