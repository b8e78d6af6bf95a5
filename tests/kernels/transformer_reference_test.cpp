// The references of the transformer kernels' tests (transformer_test_reference.h) are the true
// gradients: each backward reference against central finite differences of its forward, in
// double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "transformer_test_reference.h"
#include "zero/kernels/transformer_kernels.h"

namespace zero::kernels::testing {
namespace {

// --- The references' backward passes are the true gradients -----------------------------------

// For every reference below, the loss is sum(forward output * g) for a fixed random g, whose
// gradient the backward reference computes with dout = g.

TEST(TransformerReference, EmbeddingBackwardIsTheGradient) {
  std::mt19937 rng(1);
  const int B = 2, T = 3, C = 4, V = 3;
  Floats tokens = {0, 2, 2, 1, 0, 2};
  Doubles wte = to_doubles(random_floats(V * C, rng, -1, 1));
  Doubles wpe = to_doubles(random_floats(T * C, rng, -1, 1));
  Doubles g = to_doubles(random_floats(B * T * C, rng, -1, 1));
  Doubles dwte(wte.size(), 0.0), dwpe(wpe.size(), 0.0);
  embedding_backward_reference(dwte, dwpe, g, tokens, B, T, C);
  auto loss_wte = [&](const Doubles& x) {
    return dot(embedding_reference(tokens, x, wpe, B, T, C), g);
  };
  auto loss_wpe = [&](const Doubles& x) {
    return dot(embedding_reference(tokens, wte, x, B, T, C), g);
  };
  EXPECT_TRUE(close(dwte, numeric_gradient(loss_wte, wte), kGradientTolerance));
  EXPECT_TRUE(close(dwpe, numeric_gradient(loss_wpe, wpe), kGradientTolerance));
}

TEST(TransformerReference, LayerNormBackwardIsTheGradient) {
  std::mt19937 rng(2);
  const int N = 3, C = 5;
  const double eps = 1e-5;
  Doubles x = to_doubles(random_floats(N * C, rng, -2, 2));
  Doubles w = to_doubles(random_floats(C, rng, 0.5f, 1.5f));
  Doubles b = to_doubles(random_floats(C, rng, -1, 1));
  Doubles g = to_doubles(random_floats(N * C, rng, -1, 1));
  Doubles dx, dw, db;
  layernorm_backward_reference(dx, dw, db, g, x, w, N, C, eps);
  auto loss = [&](const Doubles& xi, const Doubles& wi, const Doubles& bi) {
    return dot(layernorm_reference(xi, wi, bi, N, C, eps).out, g);
  };
  EXPECT_TRUE(close(dx, numeric_gradient([&](const Doubles& v) { return loss(v, w, b); }, x),
                    kGradientTolerance));
  EXPECT_TRUE(close(dw, numeric_gradient([&](const Doubles& v) { return loss(x, v, b); }, w),
                    kGradientTolerance));
  EXPECT_TRUE(close(db, numeric_gradient([&](const Doubles& v) { return loss(x, w, v); }, b),
                    kGradientTolerance));
}

TEST(TransformerReference, MatmulBackwardIsTheGradient) {
  std::mt19937 rng(3);
  const int N = 2, C = 3, OC = 4;
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    Doubles x = to_doubles(random_floats(N * C, rng, -1, 1));
    Doubles w = to_doubles(random_floats(C * OC, rng, -1, 1));
    Doubles bias = to_doubles(random_floats(OC, rng, -1, 1));
    Doubles g = to_doubles(random_floats(N * OC, rng, -1, 1));
    Doubles dx, dw, db;
    matmul_backward_reference(dx, dw, db, g, x, w, N, C, OC, layout);
    auto loss = [&](const Doubles& xi, const Doubles& wi, const Doubles& bi) {
      return dot(matmul_reference(xi, wi, &bi, N, C, OC, layout), g);
    };
    EXPECT_TRUE(close(dx, numeric_gradient([&](const Doubles& v) { return loss(v, w, bias); }, x),
                      kGradientTolerance));
    EXPECT_TRUE(close(dw, numeric_gradient([&](const Doubles& v) { return loss(x, v, bias); }, w),
                      kGradientTolerance));
    EXPECT_TRUE(close(db, numeric_gradient([&](const Doubles& v) { return loss(x, w, v); }, bias),
                      kGradientTolerance));
  }
}

TEST(TransformerReference, GeluDerivativeIsTheGradient) {
  Doubles x = {-6.0, -3.1, -1.0, -0.2, 0.0, 0.3, 1.7, 4.4}, derivative;
  for (double v : x) derivative.push_back(gelu_derivative_reference(v));
  auto loss = [](const Doubles& v) {
    double sum = 0.0;
    for (double value : v) sum += gelu_reference(value);
    return sum;
  };
  EXPECT_TRUE(close(derivative, numeric_gradient(loss, x), kGradientTolerance));
}

TEST(TransformerReference, AttentionBackwardIsTheGradient) {
  std::mt19937 rng(4);
  const int B = 2, T = 4, C = 6, NH = 2;
  Doubles qkv = to_doubles(random_floats(B * T * 3 * C, rng, -1, 1));
  Doubles g = to_doubles(random_floats(B * T * C, rng, -1, 1));
  auto loss = [&](const Doubles& x) { return dot(attention_reference(x, B, T, C, NH).out, g); };
  EXPECT_TRUE(close(attention_backward_reference(g, qkv, B, T, C, NH), numeric_gradient(loss, qkv),
                    kGradientTolerance));
}

TEST(TransformerReference, CrossEntropyBackwardIsTheGradient) {
  std::mt19937 rng(5);
  const int N = 3, V = 5, Vp = 7;
  const double dloss = 0.25;
  Doubles logits = to_doubles(random_floats(N * Vp, rng, -3, 3));
  std::vector<int32_t> targets = {4, 0, 2};
  auto loss = [&](const Doubles& x) {
    Doubles losses = cross_entropy_reference(x, targets, N, V, Vp);
    return dloss * (losses[0] + losses[1] + losses[2]);
  };
  EXPECT_TRUE(close(cross_entropy_backward_reference(logits, targets, dloss, N, V, Vp),
                    numeric_gradient(loss, logits), kGradientTolerance));
}
}  // namespace
}  // namespace zero::kernels::testing
