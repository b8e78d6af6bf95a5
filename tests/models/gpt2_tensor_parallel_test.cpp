// The GPT-2's tensor-parallel split on one process: which tensors are split and how (a rank's
// slice of each kind of tensor, element by element), the parameter shapes and activation formula
// of one rank, and the errors of a split the model cannot make. Training over a real group is
// gpt2_tensor_parallel.sh's (zero-train at 2 and 4 ranks against --tp 1).
#include "models/gpt2_tensor_parallel.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "models/gpt2.h"
#include "tests/expect_error.h"

namespace zero::models {
namespace {

using testing::expect_error_naming;

LoadedTensor counting(const std::string& name, std::vector<int64_t> shape) {
  LoadedTensor t;
  t.name = name;
  t.shape = shape;
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  for (size_t i = 0; i < n; ++i) t.values.push_back(static_cast<float>(i));
  return t;
}

TEST(Gpt2TensorParallel, EachTensorIsSplitAlongItsDimension) {
  // C = 4: QKV's last dimension in three parts, c_fc's last, both c_proj's and wte's first.
  EXPECT_EQ(gpt2_split_of("h.0.attn.c_attn.weight", {4, 12}), (TensorSplit{1, 3, 12}));
  EXPECT_EQ(gpt2_split_of("h.3.attn.c_attn.bias", {12}), (TensorSplit{0, 3, 12}));
  EXPECT_EQ(gpt2_split_of("attn.c_attn.weight", {4, 12}), (TensorSplit{1, 3, 12}));
  EXPECT_EQ(gpt2_split_of("h.0.mlp.c_fc.weight", {4, 16}), (TensorSplit{1, 1, 16}));
  EXPECT_EQ(gpt2_split_of("h.0.mlp.c_fc.bias", {16}), (TensorSplit{0, 1, 16}));
  EXPECT_EQ(gpt2_split_of("h.1.attn.c_proj.weight", {4, 4}), (TensorSplit{0, 1, 4}));
  EXPECT_EQ(gpt2_split_of("h.1.mlp.c_proj.weight", {16, 4}), (TensorSplit{0, 1, 16}));
  EXPECT_EQ(gpt2_split_of("wte.weight", {257, 4}), (TensorSplit{0, 1, 257}));  // the vocabulary
  for (const char* whole : {"wpe.weight", "h.0.ln_1.weight", "h.0.ln_2.bias",
                            "h.0.attn.c_proj.bias", "h.0.mlp.c_proj.bias", "ln_f.weight"}) {
    EXPECT_FALSE(gpt2_split_of(whole, {4}).is_split()) << whole;
  }
}

TEST(Gpt2TensorParallel, SlicesTakeEachRanksHeadsColumnsAndRows) {
  // QKV [2, 12] (C = 4): rank 1 of 2 takes columns 2-3 of q, k and v: 2,3, 6,7, 10,11 per row.
  const LoadedTensor qkv =
      gpt2_tensor_parallel_slice(counting("h.0.attn.c_attn.weight", {2, 12}), 2, 1);
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(qkv.values, (std::vector<float>{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23}));
  const LoadedTensor qkv_bias =
      gpt2_tensor_parallel_slice(counting("h.0.attn.c_attn.bias", {12}), 2, 0);
  EXPECT_EQ(qkv_bias.values, (std::vector<float>{0, 1, 4, 5, 8, 9}));
  // c_fc [2, 8]: rank 1 of 2 takes columns 4-7.
  const LoadedTensor fc = gpt2_tensor_parallel_slice(counting("h.0.mlp.c_fc.weight", {2, 8}), 2, 1);
  EXPECT_EQ(fc.shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(fc.values, (std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15}));
  // c_proj [4, 2]: rank 1 of 2 takes rows 2-3.
  const LoadedTensor proj =
      gpt2_tensor_parallel_slice(counting("h.0.attn.c_proj.weight", {4, 2}), 2, 1);
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(proj.values, (std::vector<float>{4, 5, 6, 7}));
  // Replicated tensors and a group of one: whole.
  const LoadedTensor ln = counting("h.0.ln_1.weight", {4});
  EXPECT_EQ(gpt2_tensor_parallel_slice(ln, 2, 1).values, ln.values);
  const LoadedTensor whole = counting("h.0.mlp.c_fc.weight", {2, 8});
  EXPECT_EQ(gpt2_tensor_parallel_slice(whole, 1, 0).values, whole.values);
}

TEST(Gpt2TensorParallel, ATensorThatDoesNotSplitIsNamed) {
  expect_error_naming(
      [] {
        gpt2_tensor_parallel_slice(counting("h.0.attn.c_attn.weight", {2, 6}), 4, 0);
      },
      "tensor 'h.0.attn.c_attn.weight' [2, 6]: its 6 columns do not split into 3 part(s) over "
      "4 tensor-parallel ranks");
  expect_error_naming(
      [] {
        gpt2_tensor_parallel_slice(counting("h.0.mlp.c_proj.weight", {6, 2}), 4, 0);
      },
      "its 6 rows do not split over 4 tensor-parallel ranks");
}

TEST(Gpt2TensorParallel, ARanksParametersAreItsSlices) {
  Gpt2Config config;  // 2 layers, 4 heads, 64 wide, vocabulary 256, block 64
  config.tensor_parallel_size = 2;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, TensorSplit> splits;
  for (const ParamSpec& spec : gpt2_param_specs(config)) {
    shapes[spec.name] = spec.shape;
    splits[spec.name] = spec.split;
  }
  // Each slice says how the whole tensor is cut, for checkpoints to reshard.
  EXPECT_EQ(splits["h.0.attn.c_attn.weight"], (TensorSplit{1, 3, 192}));
  EXPECT_EQ(splits["h.1.mlp.c_proj.weight"], (TensorSplit{0, 1, 256}));
  EXPECT_EQ(splits["wte.weight"], (TensorSplit{0, 1, 256}));
  EXPECT_FALSE(splits["h.0.ln_2.weight"].is_split());
  EXPECT_EQ(shapes["h.0.attn.c_attn.weight"], (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(shapes["h.0.attn.c_attn.bias"], (std::vector<int64_t>{96}));
  EXPECT_EQ(shapes["h.0.attn.c_proj.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes["h.0.attn.c_proj.bias"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["h.1.mlp.c_fc.weight"], (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(shapes["h.1.mlp.c_fc.bias"], (std::vector<int64_t>{128}));
  EXPECT_EQ(shapes["h.1.mlp.c_proj.weight"], (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shapes["h.1.mlp.c_proj.bias"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["wte.weight"], (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shapes["wpe.weight"], (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes["h.0.ln_2.weight"], (std::vector<int64_t>{64}));
  // FLOPs count the whole model, however it is split.
  Gpt2Config whole = config;
  whole.tensor_parallel_size = 1;
  EXPECT_EQ(gpt2_flops_per_token(config, 32), gpt2_flops_per_token(whole, 32));
}

TEST(Gpt2TensorParallel, TheActivationFormulaHoldsEachRanksSlices) {
  Gpt2Config config;
  config.tensor_parallel_size = 2;
  const uint64_t N = 4 * 32, C = 64, Cl = 32, Hl = 2, f = sizeof(float);
  const Gpt2ActivationBytes none = gpt2_activation_formula(config, {}, 4, 32);
  EXPECT_EQ(none.blocks.front(), N * (4 * C + 12 * Cl + 4 + Hl) * f);
  EXPECT_EQ(none.head, N * (2 * C + 256 / 2 + 4) * f);  // half the vocabulary's logits
  const Gpt2ActivationBytes full = gpt2_activation_formula(config, {Recompute::kFull, 0}, 4, 32);
  EXPECT_EQ(full.recompute, N * (3 * C + 12 * Cl + 4 + Hl) * f);
  const Gpt2ActivationBytes selective =
      gpt2_activation_formula(config, {Recompute::kSelective, 0}, 4, 32);
  EXPECT_EQ(selective.blocks.front(), N * (C + 4 * Cl + Hl) * f);
  EXPECT_EQ(selective.recompute, N * (3 * C + 8 * Cl + 4) * f);
}

TEST(Gpt2TensorParallel, ASplitTheModelCannotMakeIsAnError) {
  Gpt2Config config;
  config.tensor_parallel_size = 3;
  expect_error_naming([&] { check_gpt2_config(config); },
                      "n_head (4) must be a multiple of the tensor-parallel size (3)");
  config.tensor_parallel_size = 4;
  config.vocab_size = 5;  // 2 rows per rank: the last rank would hold none
  expect_error_naming([&] { check_gpt2_config(config); },
                      "vocab_size (5) leaves the last of 4 tensor-parallel ranks no row of wte");
  config.vocab_size = 256;
  config.tensor_parallel_size = 2;
  expect_error_naming([&] { make_gpt2(config, 1); },
                      "a GPT-2 split over 2 tensor-parallel ranks needs the communicator");
}

TEST(Gpt2TensorParallel, AVocabularyThatDoesNotSplitIsPadded) {
  // 5 tokens over 2 ranks: 3 rows each, rank 1's last one zeros.
  EXPECT_EQ(gpt2_vocabulary_rows(5, 2), 3);
  const LoadedTensor wte = counting("wte.weight", {5, 2});
  const LoadedTensor first = gpt2_tensor_parallel_slice(wte, 2, 0);
  EXPECT_EQ(first.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(first.values, (std::vector<float>{0, 1, 2, 3, 4, 5}));
  const LoadedTensor last = gpt2_tensor_parallel_slice(wte, 2, 1);
  EXPECT_EQ(last.shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(last.values, (std::vector<float>{6, 7, 8, 9, 0, 0}));
  Gpt2Config config;
  config.vocab_size = 257;
  config.tensor_parallel_size = 2;
  for (const ParamSpec& spec : gpt2_param_specs(config)) {
    if (spec.name == "wte.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{129, 64}));
    }
  }
  EXPECT_EQ(gpt2_activation_formula(config, {}, 1, 1).head, (2 * 64 + 129 + 4) * sizeof(float));
}

}  // namespace
}  // namespace zero::models
