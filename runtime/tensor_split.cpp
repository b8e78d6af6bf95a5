#include "zero/runtime/tensor_split.h"

#include <algorithm>
#include <cstring>

#include "zero/core/check.h"

namespace zero {

namespace {

size_t product(const std::vector<int64_t>& shape, size_t first, size_t last) {
  size_t n = 1;
  for (size_t i = first; i < last; ++i) n *= static_cast<size_t>(shape[i]);
  return n;
}

// Calls copy(full_offset, slice_offset, count) for every run of elements rank `rank` holds: one
// per index of the dimensions before `dim` and part, each a contiguous run in both tensors.
template <typename Copy>
void for_each_run(const TensorSplit& split, const std::vector<int64_t>& full_shape, int size,
                  int rank, Copy copy) {
  const size_t d = static_cast<size_t>(split.dim);
  const size_t outer = product(full_shape, 0, d);
  const size_t inner = product(full_shape, d + 1, full_shape.size());
  const size_t part = static_cast<size_t>(split.full_extent / split.parts);
  const size_t piece = static_cast<size_t>(split_extent(split, size) / split.parts);
  const size_t first = piece * static_cast<size_t>(rank);
  const size_t count = first >= part ? 0 : std::min(piece, part - first);
  const size_t parts = static_cast<size_t>(split.parts);
  for (size_t o = 0; o < outer; ++o) {
    for (size_t k = 0; k < parts; ++k) {
      copy(((o * parts + k) * part + first) * inner, ((o * parts + k) * piece) * inner,
           count * inner);
    }
  }
}

// Throws zero::Error unless `split` cuts a whole tensor of `full_shape` over `size` ranks and
// `rank` is one of them.
void check_usable(const TensorSplit& split, const std::vector<int64_t>& full_shape, int size,
                  int rank) {
  ZERO_CHECK(size >= 1 && rank >= 0 && rank < size,
             "tensor-parallel rank " << rank << " of " << size << " ranks");
  ZERO_CHECK(split.is_split() && static_cast<size_t>(split.dim) < full_shape.size() &&
                 full_shape[static_cast<size_t>(split.dim)] == split.full_extent,
             "tensor split along dimension " << split.dim << " of extent " << split.full_extent
                                             << " does not fit a tensor of " << full_shape.size()
                                             << " dimensions");
  // The slice's shape follows from these, so split_problem's other checks hold by construction.
  ZERO_CHECK(split.parts >= 1 && split.full_extent % split.parts == 0 &&
                 split.full_extent <= (int64_t{1} << 62),
             "tensor split of extent " << split.full_extent << " in " << split.parts
                                       << " part(s): the parts do not divide it");
}

}  // namespace

int64_t split_extent(const TensorSplit& split, int size) {
  // ceil(part / size) without part + size - 1, which could overflow for a manifest's extent.
  const int64_t part = split.full_extent / split.parts;
  return split.parts * (part / size + (part % size != 0 ? 1 : 0));
}

std::vector<int64_t> slice_shape(const TensorSplit& split, std::vector<int64_t> full_shape,
                                 int size) {
  if (split.is_split()) full_shape[static_cast<size_t>(split.dim)] = split_extent(split, size);
  return full_shape;
}

std::vector<int64_t> full_shape(const TensorSplit& split, std::vector<int64_t> slice_shape) {
  if (split.is_split()) slice_shape[static_cast<size_t>(split.dim)] = split.full_extent;
  return slice_shape;
}

const char* split_problem(const TensorSplit& split, const std::vector<int64_t>& shape, int size) {
  if (!split.is_split()) return split.dim == -1 ? "" : "a split dimension below -1";
  if (static_cast<size_t>(split.dim) >= shape.size()) return "a split dimension outside the shape";
  if (split.parts < 1 || split.full_extent < 0 || split.full_extent % split.parts != 0) {
    return "a split whose parts do not divide its full extent";
  }
  // A slice's extent is at most full_extent + parts: this bound keeps it inside an int64_t.
  if (split.full_extent > (int64_t{1} << 62)) return "a split whose full extent is too large";
  if (shape[static_cast<size_t>(split.dim)] != split_extent(split, size)) {
    return "a slice whose extent is not its share of the full extent";
  }
  return "";
}

std::vector<float> cut_slice(const TensorSplit& split, const std::vector<int64_t>& full_shape,
                             const float* full, int size, int rank) {
  check_usable(split, full_shape, size, rank);
  const std::vector<int64_t> shape = slice_shape(split, full_shape, size);
  std::vector<float> slice(product(shape, 0, shape.size()), 0.0f);
  for_each_run(split, full_shape, size, rank, [&](size_t from, size_t to, size_t count) {
    std::memcpy(slice.data() + to, full + from, count * sizeof(float));
  });
  return slice;
}

std::vector<float> merge_slices(const TensorSplit& split, const std::vector<int64_t>& full_shape,
                                const std::vector<const float*>& slices) {
  const int size = static_cast<int>(slices.size());
  check_usable(split, full_shape, size, 0);
  std::vector<float> full(product(full_shape, 0, full_shape.size()), 0.0f);
  for (int r = 0; r < size; ++r) {
    for_each_run(split, full_shape, size, r, [&](size_t to, size_t from, size_t count) {
      std::memcpy(full.data() + to, slices[static_cast<size_t>(r)] + from, count * sizeof(float));
    });
  }
  return full;
}

}  // namespace zero
