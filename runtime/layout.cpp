#include "zero/runtime/layout.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "zero/core/check.h"
#include "zero/core/checked_size.h"
#include "zero/core/text.h"

namespace zero {

namespace {

size_t round_up(size_t x, size_t multiple) {
  return size_sum(x, multiple - 1, "the model's padded size") / multiple * multiple;
}

class Fnv1a {
 public:
  void add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) {
      hash_ ^= p[i];
      hash_ *= 1099511628211ull;
    }
  }
  void add_u64(uint64_t v) { add(&v, sizeof(v)); }
  void add_string(const std::string& s) {
    add_u64(s.size());
    add(s.data(), s.size());
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace

Layout Layout::build(const std::vector<ParamSpec>& specs, const LayoutOptions& options) {
  ZERO_CHECK(options.world_size >= 1,
             "layout: world size must be at least 1, got " << options.world_size);
  size_t elem = dtype_size(options.dtype);
  ZERO_CHECK(options.alignment_bytes >= elem && options.alignment_bytes % elem == 0,
             "layout: alignment of " << options.alignment_bytes
                                     << " bytes is not a multiple of the element size " << elem);
  const size_t align = options.alignment_bytes / elem;

  Layout layout;
  layout.options_ = options;
  std::set<std::string> names;
  int previous_module = 0;
  int previous_chunk = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& spec = specs[i];
    ZERO_CHECK(!spec.name.empty(), "layout: parameter #" << i << " has an empty name");
    ZERO_CHECK(names.insert(spec.name).second,
               "layout: parameter name '" << spec.name << "' is registered twice");
    ZERO_CHECK(spec.module >= previous_module && spec.module >= 0,
               "layout: parameter '" << spec.name << "' belongs to module " << spec.module
                                     << " after a parameter of module " << previous_module
                                     << "; modules must be registered in order");
    previous_module = spec.module;
    ZERO_CHECK(spec.chunk >= previous_chunk, "layout: parameter '"
                                                 << spec.name << "' belongs to chunk " << spec.chunk
                                                 << " after a parameter of chunk " << previous_chunk
                                                 << "; chunks must be registered in order");
    previous_chunk = spec.chunk;
    size_t numel = 1;
    for (int64_t d : spec.shape) {
      ZERO_CHECK(d >= 0, "layout: parameter '" << spec.name << "' has negative dimension " << d);
      numel = size_product(numel, static_cast<size_t>(d), "a parameter's elements");
    }
    ParamPlacement p;
    p.name = spec.name;
    p.shape = spec.shape;
    p.numel = numel;
    p.module = spec.module;
    p.trainable = spec.trainable;
    p.split = spec.split;
    p.tied = spec.tied;
    // A unit is reduced and updated as a whole: a module's parameters are frozen or trained
    // together (FSDP's rule for a flat parameter). Its parameters are consecutive, so a mix
    // shows where the flag changes from one parameter to the next.
    if (!layout.params_.empty() && layout.params_.back().module == p.module) {
      const ParamPlacement& q = layout.params_.back();
      ZERO_CHECK(q.trainable == p.trainable,
                 "layout: module " << p.module << " has frozen and trainable parameters: '"
                                   << (p.trainable ? q.name : p.name) << "' is frozen, '"
                                   << (p.trainable ? p.name : q.name)
                                   << "' trainable; freeze all of a module's parameters or none");
    }
    layout.params_.push_back(p);
  }

  const auto is_persistent = [&](const ParamPlacement& p) {
    return p.trainable && p.numel < options.persistent_below;
  };

  // Bytes each module needs when its (not persistent) parameters are laid out aligned.
  int num_modules = specs.empty() ? 0 : specs.back().module + 1;
  std::vector<size_t> module_elems(num_modules, 0);
  std::vector<bool> module_trainable(num_modules, true);
  std::vector<int> module_chunk(num_modules, 0);
  for (size_t i = 0; i < layout.params_.size(); ++i) {
    const ParamPlacement& p = layout.params_[i];
    module_trainable[p.module] = p.trainable;
    module_chunk[p.module] = specs[i].chunk;
    if (is_persistent(p)) continue;
    module_elems[p.module] =
        size_sum(round_up(module_elems[p.module], align), p.numel, "a module's elements");
  }

  // Group modules into units: a new unit starts at a module unless the current unit and this
  // module together still fit the merge threshold.
  layout.unit_of_module_.assign(num_modules, -1);
  size_t unit_elems = 0;
  for (int m = 0; m < num_modules; ++m) {
    if (module_elems[m] == 0 &&
        std::none_of(layout.params_.begin(), layout.params_.end(),
                     [&](const ParamPlacement& p) { return p.module == m && !is_persistent(p); }))
      continue;  // a module with nothing outside the persistent unit has no unit
    size_t merged = size_sum(round_up(unit_elems, align), module_elems[m], "a unit's elements");
    bool fits = !layout.units_.empty() && merged <= options.merge_bytes / elem &&
                layout.units_.back().trainable == module_trainable[m] &&
                module_chunk[layout.units_.back().first_module] == module_chunk[m];
    if (!fits) {
      layout.units_.emplace_back();
      layout.units_.back().first_module = m;
      layout.units_.back().trainable = module_trainable[m];
      unit_elems = 0;
    }
    layout.units_.back().last_module = m;
    layout.unit_of_module_[m] = static_cast<int>(layout.units_.size()) - 1;
    unit_elems = size_sum(round_up(unit_elems, align), module_elems[m], "a unit's elements");
  }

  // The persistent unit comes after every module's, so module units keep their order.
  int persistent_unit = -1;
  if (std::any_of(layout.params_.begin(), layout.params_.end(), is_persistent)) {
    layout.units_.emplace_back();
    layout.units_.back().persistent = true;
    layout.units_.back().first_module = -1;
    layout.units_.back().last_module = -1;
    persistent_unit = static_cast<int>(layout.units_.size()) - 1;
  }

  // Place the parameters and pad each unit into world_size equal, aligned shards.
  std::vector<size_t> cursor(layout.units_.size(), 0);
  for (size_t i = 0; i < layout.params_.size(); ++i) {
    ParamPlacement& p = layout.params_[i];
    p.unit = is_persistent(p) ? persistent_unit : layout.unit_of_module_[p.module];
    Unit& u = layout.units_[p.unit];
    p.offset = round_up(cursor[p.unit], align);
    cursor[p.unit] = size_sum(p.offset, p.numel, "a unit's elements");
    u.params.push_back(static_cast<int>(i));
    u.used = cursor[p.unit];
    u.tied = u.tied || p.tied;
  }
  const size_t shard_multiple =
      size_product(align, static_cast<size_t>(options.world_size), "a shard's alignment");
  for (Unit& u : layout.units_) {
    // An empty unit (only zero-size parameters) still gets one aligned shard per rank so every
    // collective has a non-empty, uniform shape.
    u.numel = round_up(std::max<size_t>(u.used, 1), shard_multiple);
    u.shard = u.numel / options.world_size;
  }
  return layout;
}

ElementRange shard_range(size_t numel, int rank, int ranks) {
  ZERO_CHECK(ranks >= 1 && rank >= 0 && rank < ranks,
             "rank " << rank << " is not one of " << ranks << " ranks");
  const size_t n = static_cast<size_t>(ranks);
  ZERO_CHECK(numel % n == 0,
             "a unit of " << numel << " elements does not split evenly over " << ranks << " ranks");
  const size_t shard = numel / n;
  return ElementRange{static_cast<size_t>(rank) * shard, shard};
}

int Layout::unit_of_module(int module) const {
  if (module < 0 || module >= static_cast<int>(unit_of_module_.size())) return -1;
  return unit_of_module_[module];
}

size_t Layout::numel() const {
  size_t n = 0;
  for (const ParamPlacement& p : params_) n = size_sum(n, p.numel, "the model's elements");
  return n;
}

size_t Layout::padded_numel() const {
  size_t n = 0;
  for (const Unit& u : units_) n = size_sum(n, u.numel, "the model's padded elements");
  return n;
}

size_t Layout::max_unit_numel() const {
  size_t n = 0;
  for (const Unit& u : units_) n = std::max(n, u.numel);
  return n;
}

uint64_t Layout::param_fingerprint(size_t index) const {
  const ParamPlacement& p = params_.at(index);
  Fnv1a h;
  h.add_string(p.name);
  h.add_u64(p.shape.size());
  for (int64_t d : p.shape) h.add_u64(static_cast<uint64_t>(d));
  h.add_u64(static_cast<uint64_t>(options_.dtype));
  h.add_u64(static_cast<uint64_t>(p.module));
  // Only when frozen, so the prints of trained parameters stay what they always were.
  if (!p.trainable) h.add_u64(1);
  return h.value();
}

uint64_t Layout::fingerprint(uint64_t extra) const {
  Fnv1a h;
  h.add_u64(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) h.add_u64(param_fingerprint(i));
  h.add_u64(static_cast<uint64_t>(options_.world_size));
  h.add_u64(options_.alignment_bytes);
  h.add_u64(options_.merge_bytes);
  h.add_u64(options_.persistent_below);
  h.add_u64(extra);
  return h.value();
}

std::string Layout::describe_param(size_t index) const {
  const ParamPlacement& p = params_.at(index);
  std::ostringstream out;
  out << "'" << p.name << "' " << shape_text(p.shape) << " " << dtype_name(options_.dtype)
      << " (module " << p.module << (p.trainable ? "" : ", frozen") << ")";
  return out.str();
}

}  // namespace zero
