// The flat layout: where every parameter lives. Parameters are registered in order, each
// belonging to a module; modules become units (small neighbours merge up to a byte threshold).
// A unit is one contiguous flat buffer in which every parameter starts aligned, padded so it
// splits into world_size equal shards; rank r owns shard r of every unit. The layout is a pure
// function of the registered shapes, the world size, the dtype and the thresholds, so every
// rank computes the same one and a checkpoint can describe it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero/core/dtype.h"
#include "zero/runtime/tensor_split.h"

namespace zero {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // may contain 0 (an empty parameter)
  int module = 0;              // index of the wrapped module; non-decreasing in registration order
  // False: a frozen parameter (the engine sets it from ParamDecl::trainable). A module's
  // parameters are all trainable or all frozen, as FSDP requires of a flat parameter.
  bool trainable = true;
  // With tensor parallelism: how the tensor this parameter is one rank's slice of is cut
  // (tensor_split.h); shape is the slice's. Not split: whole and the same on every rank of the
  // tensor-parallel group. Checkpoints record it, so they can be resharded across group sizes.
  TensorSplit split{};
  // Read by a later module too (a tie: the GPT-2's wte by its head). Backward writes its
  // gradient from that later module on, so its unit holds a gradient bucket through most of
  // backward; the engine plans one more bucket per such unit.
  bool tied = false;
  // An interleaved pipeline stage's model chunk (ZeroModel's chunks; non-decreasing in
  // registration order): modules of different chunks never merge into one unit, since each
  // chunk's forward and backward run apart.
  int chunk = 0;
};

struct LayoutOptions {
  int world_size = 1;
  DType dtype = DType::kFloat32;  // working dtype of parameters and gradients
  size_t alignment_bytes = 64;    // every parameter (and every shard) starts at this alignment
  // Neighbouring modules merge into one unit while the unit stays at or below this many bytes;
  // 0 keeps one unit per module. A module larger than the threshold is a unit of its own, and
  // frozen and trainable modules, or modules of different chunks, never share a unit.
  size_t merge_bytes = 0;
  // Parameters with fewer elements than this go to one persistent unit after the others, which
  // stage 3 keeps whole on every rank (stage3_param_persistence_threshold); 0: none. Frozen
  // parameters stay in their module's unit: the persistent unit is trained.
  size_t persistent_below = 0;
};

struct ParamPlacement {
  std::string name;
  std::vector<int64_t> shape;
  size_t numel = 0;
  int module = 0;
  int unit = 0;
  size_t offset = 0;  // element offset inside the unit's flat buffer
  bool trainable = true;
  TensorSplit split{};  // ParamSpec::split
  bool tied = false;    // ParamSpec::tied
};

struct Unit {
  std::vector<int> params;  // indices into Layout::params(), in order
  int first_module = 0;     // of a module unit; the persistent unit belongs to no one module
  int last_module = 0;
  bool persistent = false;  // the small parameters of every module (persistent_below)
  bool trainable = true;    // false: frozen modules only (no gradient, no optimizer state)
  bool tied = false;        // holds a parameter a later module reads too (ParamSpec::tied)
  size_t used = 0;          // elements up to the end of the last parameter
  size_t numel = 0;         // padded: a multiple of world_size * alignment elements
  size_t shard = 0;         // numel / world_size
};

// A run of a unit's elements: [first, first + count).
struct ElementRange {
  size_t first = 0;
  size_t count = 0;
  size_t end() const { return first + count; }
};

// Rank `rank`'s slice of a unit of `numel` elements split evenly over `ranks`: the one answer
// to "which slice is mine" (a layout pads every unit so that its world size divides it).
// Throws zero::Error when `ranks` does not divide `numel` or `rank` is not one of them.
ElementRange shard_range(size_t numel, int rank, int ranks);

class Layout {
 public:
  // Throws zero::Error for bad specs (decreasing module index, negative dimension, empty name,
  // duplicate name, a module with both frozen and trainable parameters) or options
  // (world_size < 1, alignment not a multiple of the element size).
  static Layout build(const std::vector<ParamSpec>& specs, const LayoutOptions& options);

  const std::vector<ParamPlacement>& params() const { return params_; }
  const std::vector<Unit>& units() const { return units_; }
  const LayoutOptions& options() const { return options_; }
  int world_size() const { return options_.world_size; }
  // Unit holding a module's parameters (those not in the persistent unit), or -1 for a module
  // without such parameters.
  int unit_of_module(int module) const;
  int num_modules() const { return static_cast<int>(unit_of_module_.size()); }

  size_t numel() const;         // sum of parameter sizes (Ψ unpadded)
  size_t padded_numel() const;  // sum of unit sizes (Ψ padded)
  size_t max_unit_numel() const;

  // 64-bit FNV-1a of one parameter's name, shape, dtype and module, and of the whole layout
  // (every parameter in order, the world size and the extra value, e.g. the ZeRO stage).
  uint64_t param_fingerprint(size_t index) const;
  uint64_t fingerprint(uint64_t extra) const;
  // "name [d0, d1] fp32" for messages.
  std::string describe_param(size_t index) const;

 private:
  LayoutOptions options_;
  std::vector<ParamPlacement> params_;
  std::vector<Unit> units_;
  std::vector<int> unit_of_module_;
};

}  // namespace zero
