// The GPT-2's forward and backward against PyTorch (tests/data/gpt2: the reference model, batch
// and what PyTorch computed for them, made by gen_gpt2_golden.py). The modules run here without
// the engine, on parameters held by the test (gpt2_harness.h), so the model's math is checked on
// its own: the loss, the listed logits and every parameter's gradient (the tied wte's being the
// sum of the embedding's and the head's) at step 0. tests/models/gpt2_golden.sh checks the same
// model trained through zero-train at every stage and world size; the gpt2_*checkpoint*_test.cpp
// files the activation checkpointing.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_common.h"
#include "tests/expect_error.h"
#include "tests/models/gpt2_harness.h"

namespace zero::models {
namespace {

using gpt2_test::Harness;
using gpt2_test::kData;
using gpt2_test::l2;
using gpt2_test::read_json;
using gpt2_test::reference_batch;

TEST(Gpt2, ForwardAndBackwardMatchPyTorch) {
  const nlohmann::json config = read_json(kData + "config.json");
  const nlohmann::json step0 = read_json(kData + "expected.json")["steps"][0];
  Harness h;
  const int B = config["batch"], T = config["seq_len"];
  const Tensor tokens = reference_batch(h, B, T);

  // PyTorch's float32 run is within 1e-7 of float64 on these; ours sums in other orders.
  const float loss = h.forward(tokens);
  EXPECT_NEAR(loss, step0["loss"].get<double>(), 1e-5 * step0["loss"].get<double>());
  const std::vector<float> logits = gpt2_logits(h.model).to_host();
  const int V = h.config.vocab_size;
  const std::vector<double> first = step0["logits_first8"]["b0_t0"];
  const std::vector<double> last = step0["logits_first8"]["blast_tlast"];
  for (int v = 0; v < 8; ++v) {
    EXPECT_NEAR(logits[v], first[v], 1e-5) << "b0_t0 logit " << v;
    EXPECT_NEAR(logits[static_cast<size_t>(B * T - 1) * V + v], last[v], 1e-5)
        << "blast_tlast logit " << v;
  }

  h.backward();
  // wte.weight's gradient is the embedding's share plus the head's: without the tie it would
  // miss the larger part of PyTorch's.
  double sum_squares = 0.0;
  for (const auto& [name, expected] : step0["grad_l2"].items()) {
    const double norm = l2(h.grads.at(name));
    EXPECT_NEAR(norm, expected.get<double>(), 1e-5 * expected.get<double>()) << name;
    sum_squares += norm * norm;
  }
  EXPECT_EQ(step0["grad_l2"].size(), h.grads.size());
  const double grad_norm = step0["grad_norm"];
  EXPECT_NEAR(std::sqrt(sum_squares), grad_norm, 1e-5 * grad_norm);
}

// Weight decay: GPT-2 recipes (and the PyTorch reference) leave 1-D tensors, LayerNorm gains and
// biases, undecayed; decay_matrices_only false (zero-train --decay-all) decays every tensor.
TEST(Gpt2, WeightDecayOnMatricesOnlyUnlessEveryTensor) {
  Gpt2Config config = gpt2_test::reference_config();
  for (bool matrices_only : {true, false}) {
    config.decay_matrices_only = matrices_only;
    const Gpt2 model = make_gpt2(config, 1);
    int undecayed = 0, decayed = 0;
    for (const NamedModule& named : model.modules) {
      for (const ParamDecl& decl : named.module->parameters()) {
        const bool none = decl.weight_decay && *decl.weight_decay == 0.0f;
        EXPECT_EQ(none, matrices_only && decl.spec.shape.size() < 2) << decl.spec.name;
        (none ? undecayed : decayed) += 1;
      }
    }
    EXPECT_GT(decayed, 0);
    EXPECT_EQ(undecayed > 0, matrices_only);
  }
}

// A module's weight matrix for the products (ParamSlots::matrix): in a bf16 run whose products
// take bf16 weights, its working copy as it is, with no fp32 copy made; otherwise its fp32 values
// (the working copy widened into the slot).
TEST(Gpt2, Bf16WeightMatricesGoToTheProductsWithoutAnFp32Copy) {
  const std::vector<int64_t> shape = {2, 3};
  std::vector<uint16_t> bits(6);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(0.5f * static_cast<float>(i));
  const std::vector<ParamRef> params = {ParamRef{bits.data(), DType::kBFloat16, &shape, bits.size(),
                                                 DeviceContext::create(Device::cpu())}};
  const std::unique_ptr<Gpt2Ops> ops = make_cpu_gpt2_ops(1);
  for (bool bf16_products : {true, false}) {
    ops->set_bf16_products(bf16_products);
    gpt2_detail::ParamSlots slots(1);
    const kernels::MatrixWeight weight = slots.matrix(params, 0, *ops);
    if (ops->takes_bf16_weights()) {
      EXPECT_EQ(weight.bf16_bits, bits.data());
      EXPECT_EQ(weight.values, nullptr);
      EXPECT_EQ(slots.values[0].numel(), 0u) << "an fp32 copy was made";
    } else {
      ASSERT_NE(weight.values, nullptr);
      EXPECT_EQ(weight.bf16_bits, nullptr);
      EXPECT_EQ(slots.values[0].numel(), bits.size());
      for (size_t i = 0; i < bits.size(); ++i)
        EXPECT_EQ(weight.values[i], 0.5f * static_cast<float>(i));
    }
    // Without bf16 products the weight is never taken as bf16; with them, where the CPU has the
    // arithmetic (bf16_products_in_bf16).
    EXPECT_EQ(ops->takes_bf16_weights(), bf16_products && kernels::bf16_products_in_bf16());
  }
}

// In a bf16 run whose products run in bf16 the head makes the loss's gradient during forward,
// in the logits' memory: the loss is PyTorch's to bf16 precision, the logits are then refused by
// name, and backward's gradients follow PyTorch's to bf16 precision (the head's wte share is
// the largest). With fp32 products (a CPU without bf16 arithmetic) the logits stay readable.
TEST(Gpt2, Bf16HeadMakesTheLossGradientInTheLogitsMemory) {
  const nlohmann::json config = read_json(kData + "config.json");
  const nlohmann::json step0 = read_json(kData + "expected.json")["steps"][0];
  Harness h;
  const int B = config["batch"], T = config["seq_len"];
  const Tensor tokens = reference_batch(h, B, T);
  gpt2_test::Bf16Params bf16(h);
  const double loss = bf16.forward(h, tokens);
  EXPECT_NEAR(loss, step0["loss"].get<double>(), 1e-2 * step0["loss"].get<double>());
  if (kernels::bf16_products_in_bf16()) {
    testing::expect_error_naming([&] { (void)gpt2_logits(h.model); },
                                 "made the loss's gradient in the logits' memory");
  } else {
    EXPECT_EQ(gpt2_logits(h.model).numel(), static_cast<size_t>(B * T) * h.config.vocab_size);
  }
  Tensor current({1}, {1.0f});
  for (size_t m = h.model.modules.size(); m-- > 0;) {
    Tensor grad_in;
    h.model.modules[m].module->backward(current, grad_in, bf16.refs(h, m, bf16.values),
                                        bf16.refs(h, m, bf16.grads));
    current = std::move(grad_in);
  }
  for (const auto& [name, expected] : step0["grad_l2"].items()) {
    std::vector<float> grad;
    for (uint16_t bits : bf16.grads.at(name)) grad.push_back(bf16_to_float(bits));
    EXPECT_NEAR(l2(grad), expected.get<double>(), 2e-2 * expected.get<double>()) << name;
  }
  // The fp32 copies the modules made are what zero-train's budget and zero-estimate count.
  EXPECT_EQ(gpt2_held_module_copies(h.model),
            gpt2_module_copy_bytes(h.config, DType::kBFloat16, /*on_gpu=*/false));
}

// An fp32 run's modules add into the engine's storage and read it as it is: no copies, as
// counted.
TEST(Gpt2, Fp32ModulesMakeNoCopies) {
  Harness h;
  const nlohmann::json config = read_json(kData + "config.json");
  h.forward(reference_batch(h, config["batch"], config["seq_len"]));
  h.backward();
  EXPECT_EQ(gpt2_held_module_copies(h.model), 0u);
  EXPECT_EQ(gpt2_module_copy_bytes(h.config, DType::kFloat32, /*on_gpu=*/false), 0u);
}

TEST(Gpt2, PresetsAndConfigChecks) {
  Gpt2Config c;
  ASSERT_TRUE(gpt2_preset("gpt2-124M", &c));
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.n_embd, 768);
  EXPECT_EQ(c.vocab_size, 50257);
  size_t params = 0;
  for (const ParamSpec& s : gpt2_param_specs(c)) {
    size_t n = 1;
    for (int64_t d : s.shape) n *= static_cast<size_t>(d);
    params += n;
  }
  EXPECT_EQ(params, 124439808u);  // GPT-2 small, as Hugging Face counts it (tied head)
  EXPECT_FALSE(gpt2_preset("gpt2-7B", &c));
  c.n_head = 5;
  try {
    check_gpt2_config(c);
    FAIL() << "n_embd 768 with 5 heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of n_head"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero::models
