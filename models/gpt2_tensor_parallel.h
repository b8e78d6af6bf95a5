// Megatron-style tensor parallelism in the GPT-2 (Shoeybi et al., 2019), over a group of t ranks:
//
//   attn.c_attn (QKV)   column-parallel: rank r holds heads [r H/t, (r+1) H/t), i.e. columns
//                       r C/t .. of each of the q, k and v thirds (and their bias)
//   attn.c_proj         row-parallel: rows r C/t ..; its output is all-reduced over the group
//   mlp.c_fc            column-parallel: columns r 4C/t .. (and their bias)
//   mlp.c_proj          row-parallel: rows r 4C/t ..; its output is all-reduced
//   wte                 vocabulary-parallel: rows r V/t ..; the embedding's lookups (and wpe,
//                       added by rank 0) are all-reduced; the tied head computes the logits of
//                       those rows only, with a parallel cross-entropy (an all-gather of each
//                       row's log-sum-exp, an all-reduce of the target's logit) and an all-reduce
//                       of its input's gradient
//
// Forward all-reduces the two row-parallel outputs of each block (Megatron's g); backward
// all-reduces the input gradient of the two column-parallel matrices (its f). LayerNorms, the
// row-parallel biases (added once, by rank 0, before the all-reduce) and wpe are replicated:
// their inputs and gradients are the same on every rank of the group.
// Weight files hold the full tensors in Hugging Face's layouts ([in, out]); these functions cut
// a rank's slice out of one. Private to models/.
#pragma once

#include <string>
#include <vector>

#include "zero/runtime/safetensors.h"
#include "zero/runtime/tensor_split.h"

namespace zero::models {

// How a parameter of the GPT-2 is split over the tensor-parallel group, by its name (with or
// without its module's prefix: "h.0.attn.c_attn.weight" or "attn.c_attn.weight"), as a
// TensorSplit of the whole tensor of shape `full_shape`: QKV along its last dimension in three
// parts (q, k, v), c_fc along its last, both c_proj and wte along their first (wte's: the
// vocabulary); the rest is whole.
TensorSplit gpt2_split_of(const std::string& name, const std::vector<int64_t>& full_shape);

// The rows of wte each of `size` ranks holds: ceil(vocab_size / size). Where size does not divide
// the vocabulary, the last rank's last rows are padding (zeros, never looked up, their logits
// left out of the cross-entropy), as Megatron pads its vocabulary.
int gpt2_vocabulary_rows(int vocab_size, int size);

// Tensor-parallel rank `rank`'s slice of `full` (a full tensor of the model, by its name), in the
// same layout; a replicated tensor whole; wte's rows padded with zeros to gpt2_vocabulary_rows.
// Throws zero::Error naming the tensor when another split dimension does not divide by `size`.
LoadedTensor gpt2_tensor_parallel_slice(const LoadedTensor& full, int size, int rank);

}  // namespace zero::models
