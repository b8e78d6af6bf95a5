#include "models/gpt2_tensor_parallel.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "zero/core/check.h"
#include "zero/core/text.h"

namespace zero::models {

Gpt2Split gpt2_split_of(const std::string& name) {
  if (ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_attn.bias")) {
    return Gpt2Split::kQkvColumns;
  }
  if (ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_fc.bias")) {
    return Gpt2Split::kColumns;
  }
  if (name == "wte.weight" || ends_with(name, ".attn.c_proj.weight") ||
      ends_with(name, ".mlp.c_proj.weight")) {
    return Gpt2Split::kRows;
  }
  return Gpt2Split::kReplicated;
}

int gpt2_vocabulary_rows(int vocab_size, int size) {
  return (vocab_size + size - 1) / size;
}

LoadedTensor gpt2_tensor_parallel_slice(const LoadedTensor& full, int size, int rank) {
  const Gpt2Split split = gpt2_split_of(full.name);
  if (size == 1 || split == Gpt2Split::kReplicated) return full;
  ZERO_CHECK(!full.shape.empty(), "tensor '" << full.name << "' has no dimension to split");
  LoadedTensor slice;
  slice.name = full.name;
  slice.shape = full.shape;
  if (full.name == "wte.weight") {
    // The vocabulary: this rank's rows, then zero rows up to the padded count.
    const int64_t vocab = full.shape.front();
    const int64_t rows = gpt2_vocabulary_rows(static_cast<int>(vocab), size);
    const size_t row = full.values.size() / static_cast<size_t>(vocab);
    const int64_t first = std::min(vocab, rows * rank);
    const int64_t last = std::min(vocab, first + rows);
    slice.values.assign(full.values.begin() + static_cast<std::ptrdiff_t>(first * row),
                        full.values.begin() + static_cast<std::ptrdiff_t>(last * row));
    slice.values.resize(static_cast<size_t>(rows) * row, 0.0f);
    slice.shape.front() = rows;
    return slice;
  }
  if (split == Gpt2Split::kRows) {
    const int64_t rows = full.shape.front();
    ZERO_CHECK(rows % size == 0, "tensor '" << full.name << "' " << shape_text(full.shape)
                                            << ": its " << rows << " rows do not split over "
                                            << size << " tensor-parallel ranks");
    const size_t row = full.values.size() / static_cast<size_t>(rows);
    const size_t count = static_cast<size_t>(rows / size) * row;
    const auto first = full.values.begin() + static_cast<std::ptrdiff_t>(count * rank);
    slice.values.assign(first, first + static_cast<std::ptrdiff_t>(count));
    slice.shape.front() = rows / size;
    return slice;
  }
  // Columns: of the whole last dimension, or of each of its three (q, k, v) parts.
  const int64_t columns = full.shape.back();
  const int64_t parts = split == Gpt2Split::kQkvColumns ? 3 : 1;
  ZERO_CHECK(columns % (parts * size) == 0,
             "tensor '" << full.name << "' " << shape_text(full.shape) << ": its " << columns
                        << " columns do not split into " << parts << " part(s) over " << size
                        << " tensor-parallel ranks");
  const size_t part = static_cast<size_t>(columns / parts);
  const size_t width = part / static_cast<size_t>(size);
  const size_t rows = full.values.size() / static_cast<size_t>(columns);
  slice.shape.back() = columns / size;
  slice.values.reserve(rows * width * static_cast<size_t>(parts));
  for (size_t r = 0; r < rows; ++r) {
    for (size_t p = 0; p < static_cast<size_t>(parts); ++p) {
      const auto first = full.values.begin() +
                         static_cast<std::ptrdiff_t>(r * static_cast<size_t>(columns) + p * part +
                                                     static_cast<size_t>(rank) * width);
      slice.values.insert(slice.values.end(), first, first + static_cast<std::ptrdiff_t>(width));
    }
  }
  return slice;
}

}  // namespace zero::models
