// How a parameter is cut over a tensor-parallel group, described so that code which knows
// nothing of the model (a checkpoint load at another tensor-parallel size, an export of the
// whole model) can cut and merge its slices. Megatron records the same per parameter
// (partition_dim, partition_stride), and DeepSpeed's universal checkpoints keep it beside each
// parameter's fragments for the same reason.
//
// A split parameter's dimension `dim` has extent `full_extent` in the whole tensor and holds
// `parts` equal parts (a fused QKV matrix's q, k and v: 3), each of E = full_extent / parts.
// Over t ranks each part is cut into pieces of P = ceil(E / t): rank r holds indices
// [r P, min((r + 1) P, E)) of every part, then zeros up to P (the padding Megatron gives a
// vocabulary that does not divide by t), so its slice has extent parts * P along `dim` and
// every other dimension whole.
#pragma once

#include <cstdint>
#include <vector>

namespace zero {

struct TensorSplit {
  int dim = -1;             // the dimension cut; -1: the parameter is whole on every rank
  int parts = 1;            // equal parts of that dimension, each cut on its own
  int64_t full_extent = 0;  // the dimension's extent in the whole tensor

  bool is_split() const { return dim >= 0; }
};

inline bool operator==(const TensorSplit& a, const TensorSplit& b) {
  return a.dim == b.dim && a.parts == b.parts && a.full_extent == b.full_extent;
}
inline bool operator!=(const TensorSplit& a, const TensorSplit& b) {
  return !(a == b);
}

// The extent of `dim` in one rank's slice over `size` ranks: parts * ceil(full_extent / parts /
// size); full_extent itself for a size of 1.
int64_t split_extent(const TensorSplit& split, int size);

// The shape of one rank's slice over `size` ranks, and of the whole tensor, from the other.
std::vector<int64_t> slice_shape(const TensorSplit& split, std::vector<int64_t> full_shape,
                                 int size);
std::vector<int64_t> full_shape(const TensorSplit& split, std::vector<int64_t> slice_shape);

// "" when `split` can describe a slice of shape `shape` over `size` ranks, else what is wrong:
// a dim outside the shape, parts below 1 or not dividing full_extent, a slice extent other than
// split_extent(split, size).
const char* split_problem(const TensorSplit& split, const std::vector<int64_t>& shape, int size);

// Rank `rank`'s slice of `full` (shape full_shape, row-major), padding zero.
std::vector<float> cut_slice(const TensorSplit& split, const std::vector<int64_t>& full_shape,
                             const float* full, int size, int rank);

// The whole tensor (shape full_shape) from the slices of all `slices.size()` ranks, in rank
// order; the padding is left out.
std::vector<float> merge_slices(const TensorSplit& split, const std::vector<int64_t>& full_shape,
                                const std::vector<const float*>& slices);

}  // namespace zero
