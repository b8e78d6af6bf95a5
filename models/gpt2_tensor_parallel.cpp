#include "models/gpt2_tensor_parallel.h"

#include <cstdint>
#include <vector>

#include "zero/core/check.h"
#include "zero/core/text.h"

namespace zero::models {

namespace {

// Whether `name` is `local` or ends with "." + local (a module's prefix before it).
bool names(const std::string& name, const std::string& local) {
  return name == local || ends_with(name, "." + local);
}

}  // namespace

TensorSplit gpt2_split_of(const std::string& name, const std::vector<int64_t>& full_shape) {
  int dim = -1;
  int parts = 1;
  if (names(name, "attn.c_attn.weight") || names(name, "attn.c_attn.bias")) {
    dim = static_cast<int>(full_shape.size()) - 1;
    parts = 3;
  } else if (names(name, "mlp.c_fc.weight") || names(name, "mlp.c_fc.bias")) {
    dim = static_cast<int>(full_shape.size()) - 1;
  } else if (name == "wte.weight" || names(name, "attn.c_proj.weight") ||
             names(name, "mlp.c_proj.weight")) {
    dim = 0;
  }
  if (dim < 0) return {};
  ZERO_CHECK(!full_shape.empty(), "tensor '" << name << "' has no dimension to split");
  return {dim, parts, full_shape[static_cast<size_t>(dim)]};
}

int gpt2_vocabulary_rows(int vocab_size, int size) {
  return (vocab_size + size - 1) / size;
}

LoadedTensor gpt2_tensor_parallel_slice(const LoadedTensor& full, int size, int rank) {
  const TensorSplit split = gpt2_split_of(full.name, full.shape);
  if (size == 1 || !split.is_split()) return full;
  // Only the vocabulary is padded (Megatron's rule); the layers' splits must divide.
  if (full.name != "wte.weight") {
    const int64_t extent = split.full_extent;
    const bool rows = split.dim == 0 && full.shape.size() > 1;
    ZERO_CHECK(extent % (split.parts * size) == 0,
               "tensor '" << full.name << "' " << shape_text(full.shape) << ": its " << extent
                          << (rows ? " rows do not split" : " columns do not split into ")
                          << (rows ? "" : std::to_string(split.parts) + " part(s)") << " over "
                          << size << " tensor-parallel ranks");
  }
  LoadedTensor slice;
  slice.name = full.name;
  slice.shape = slice_shape(split, full.shape, size);
  slice.values = cut_slice(split, full.shape, full.values.data(), size, rank);
  return slice;
}

}  // namespace zero::models
