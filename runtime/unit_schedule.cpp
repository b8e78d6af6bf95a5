#include "zero/runtime/unit_schedule.h"

#include <algorithm>
#include <utility>

#include "zero/core/check.h"

namespace zero {

UnitSchedule::UnitSchedule(Engine& engine, const std::vector<std::vector<int>>& module_tied_params,
                           std::vector<bool> backward_reads, Listener listener)
    : engine_(engine), listener_(std::move(listener)), backward_reads_(std::move(backward_reads)) {
  const EngineConfig& config = engine_.config();
  stage_ = config.stage;
  prefetch_elements_ = config.schedule.prefetch_elements;
  max_live_elements_ = config.schedule.max_live_elements;
  max_reuse_distance_ = config.schedule.max_reuse_distance;

  const Layout& layout = engine_.layout();
  const int num_modules = static_cast<int>(module_tied_params.size());
  ZERO_CHECK(static_cast<int>(backward_reads_.size()) == num_modules,
             "UnitSchedule: " << backward_reads_.size() << " backward_reads for " << num_modules
                              << " modules");
  tied_units_.resize(module_tied_params.size());
  for (int m = 0; m < num_modules; ++m) {
    const int u = layout.unit_of_module(m);
    const int first = u >= 0 ? layout.units()[u].first_module : m;
    const int last = u >= 0 ? layout.units()[u].last_module : m;
    std::vector<int>& owners = tied_units_[m];
    for (int other = first; other <= last; ++other) {
      if (u >= 0 && layout.unit_of_module(other) != u) continue;
      for (int p : module_tied_params[other]) {
        const int owner = layout.params()[p].unit;
        if (owner != u && std::find(owners.begin(), owners.end(), owner) == owners.end()) {
          owners.push_back(owner);
        }
      }
    }
  }
  const size_t num_units = layout.units().size();
  unit_ties_.resize(num_units);
  for (size_t u = 0; u < num_units; ++u) {
    const Unit& unit = layout.units()[u];
    // The persistent unit belongs to no one module; it is always gathered.
    if (!unit.persistent) unit_ties_[u] = tied_units_[unit.first_module];
  }
  tie_holds_.assign(num_units, 0);
  gathered_for_ties_.assign(num_units, false);
  gathered_for_backward_.assign(num_units, false);
}

void UnitSchedule::set_backward_reads(int module, bool reads) {
  backward_reads_[module] = reads;
}

void UnitSchedule::set_module_chunks(const std::vector<int>& chunk_of_module) {
  const Layout& layout = engine_.layout();
  ZERO_CHECK(chunk_of_module.size() == backward_reads_.size(),
             "UnitSchedule: " << chunk_of_module.size() << " module chunks for "
                              << backward_reads_.size() << " modules");
  unit_chunks_.clear();
  if (std::all_of(chunk_of_module.begin(), chunk_of_module.end(), [](int c) { return c == 0; })) {
    return;
  }
  for (const Unit& unit : layout.units()) {
    unit_chunks_.push_back(unit.persistent ? -1 : chunk_of_module[unit.first_module]);
  }
}

bool UnitSchedule::gathered_backward_reads(int unit) const {
  const Layout& layout = engine_.layout();
  const Unit& u = layout.units()[unit];
  for (int m = u.first_module; m <= u.last_module; ++m) {
    if (layout.unit_of_module(m) == unit && backward_reads_[m]) return true;
  }
  return false;
}

void UnitSchedule::gather(int unit) {
  engine_.gather(unit);
  if (listener_.gathered) listener_.gathered(unit);
}

// Only what stage 3 gathered goes back; stages 0-2 keep every unit whole.
void UnitSchedule::release(int unit) {
  if (stage_ != 3 || hold_through_step_ || engine_.layout().units()[unit].persistent ||
      !engine_.is_gathered(unit)) {
    return;
  }
  if (listener_.releasing) listener_.releasing(unit);
  engine_.release(unit);
}

int UnitSchedule::last_module() const {
  return static_cast<int>(backward_reads_.size()) - 1;
}

int UnitSchedule::last_module_unit() const {
  const Layout& layout = engine_.layout();
  const int n = static_cast<int>(layout.units().size());
  return n > 0 && layout.units()[n - 1].persistent ? n - 2 : n - 1;
}

// A unit's gather, and first those of the units its modules tie to (a tied unit's own forward
// is long past when the tying unit needs it, and it is the large one: the GPT-2's wte for its
// head, whose unit is only ln_f). Prefetches stay within the planned buffers, so when only one
// fits, it is the tied unit's. A tied unit this starts is the tying unit's to give back (hold).
void UnitSchedule::prefetch_with_tied(int unit) {
  for (int owner : unit_ties_[unit]) {
    if (engine_.is_gathered(owner)) continue;
    engine_.prefetch(owner);
    if (engine_.is_gathered(owner)) prefetched_for_ties_.insert(owner);
  }
  engine_.prefetch(unit);
}

// The units prefetched after `unit` in `direction`: at least the next one, and more while they
// fit in stage3_prefetch_bucket_size elements, within `unit`'s chunk. Backward skips the units
// it will not gather.
std::vector<int> UnitSchedule::prefetch_window(int unit, int direction) const {
  const Layout& layout = engine_.layout();
  const int num_units = static_cast<int>(layout.units().size());
  std::vector<int> window;
  size_t ahead = 0;
  for (int v = unit + direction; v >= 0 && v < num_units; v += direction) {
    // Another chunk's units wait for that chunk's own forward or backward.
    if (!unit_chunks_.empty() && unit_chunks_[v] != unit_chunks_[unit]) break;
    if (direction < 0 && !gathered_backward_reads(v)) continue;
    ahead += layout.units()[v].numel;
    for (int owner : unit_ties_[v]) ahead += layout.units()[owner].numel;
    if (v != unit + direction && ahead > prefetch_elements_) break;
    window.push_back(v);
  }
  return window;
}

// Starts the all-gathers of prefetch_window (the engine also holds them to the live budget).
void UnitSchedule::prefetch_after(int unit, int direction) {
  for (int v : prefetch_window(unit, direction)) prefetch_with_tied(v);
}

// stage3_max_reuse_distance: at the end of forward, backward needs the last units again first;
// a unit whose reuse comes within that many gathered elements stays gathered (within the live
// budget) instead of being released and gathered again.
bool UnitSchedule::keep_for_backward(int unit) const {
  const Layout& layout = engine_.layout();
  // With model chunks this chunk's backward is not what comes next.
  if (stage_ != 3 || max_reuse_distance_ == 0 || !unit_chunks_.empty()) return false;
  size_t distance = 0;
  for (size_t v = static_cast<size_t>(unit) + 1; v < layout.units().size(); ++v) {
    distance += layout.units()[v].numel;
  }
  const bool in_budget = max_live_elements_ == 0 || engine_.live_elements() <= max_live_elements_;
  return distance < max_reuse_distance_ && in_budget;
}

// Whether backward, coming right after this forward, starts by prefetching `unit` (it is in
// the prefetch window behind the unit backward starts with) while every unit after it in
// forward is gathered already: then holding it on costs no buffer the plan does not have at
// backward's start, and releasing it would only gather it again.
bool UnitSchedule::backward_prefetches(int unit) const {
  const int last = last_module_unit();
  if (stage_ != 3 || !backward_comes_next() || unit >= last) return false;
  for (int v = unit + 1; v <= last; ++v) {
    if (!engine_.is_gathered(v)) return false;
    for (int owner : unit_ties_[v]) {
      if (!engine_.is_gathered(owner)) return false;
    }
  }
  const std::vector<int> window = prefetch_window(last, -1);
  return std::find(window.begin(), window.end(), unit) != window.end();
}

// The tied units are gathered for the whole of their user: before its prefetches take the
// planned buffers. The first hold of one that was not gathered for its own use (prefetched
// for it, or not gathered at all) makes it the ties' to release; one gathered already for its
// own use (kept, prefetched, the persistent unit) stays so.
void UnitSchedule::hold(const std::vector<int>& units) {
  for (int owner : units) {
    const bool prefetched_for_the_tie = prefetched_for_ties_.erase(owner) > 0;
    const bool first_hold = tie_holds_[owner]++ == 0;
    if (first_hold && (prefetched_for_the_tie || !engine_.is_gathered(owner))) {
      gathered_for_ties_[owner] = true;
    }
    gather(owner);
  }
}

// The last user of a tied unit the ties gathered releases it (unless its own backward is
// reading it), then refills the prefetch the tied units held back.
void UnitSchedule::let_go(const std::vector<int>& units, int unit, int direction) {
  bool released = false;
  for (int owner : units) {
    if (tie_holds_[owner] == 0 || --tie_holds_[owner] > 0 || !gathered_for_ties_[owner]) {
      continue;
    }
    gathered_for_ties_[owner] = false;
    if (gathered_for_backward_[owner]) continue;
    release(owner);
    released = true;
  }
  if (released && unit >= 0) prefetch_after(unit, direction);
}

void UnitSchedule::before_forward(int module) {
  const Layout& layout = engine_.layout();
  const int u = layout.unit_of_module(module);
  const bool first_of_unit = u >= 0 && layout.units()[u].first_module == module;
  if (first_of_unit) gather(u);
  // A module without a unit of its own (all its parameters tied or persistent) may sit inside
  // a merged unit: its tied units are its own business.
  if (first_of_unit || u < 0) hold(tied_units_[module]);
  if (first_of_unit) prefetch_after(u, +1);
}

bool UnitSchedule::backward_comes_next() const {
  return unit_chunks_.empty() && engine_.config().grid.pipeline.stages == nullptr;
}

void UnitSchedule::after_forward(int module) {
  const Layout& layout = engine_.layout();
  const int u = layout.unit_of_module(module);
  if (u >= 0 && layout.units()[u].last_module != module) return;
  // Backward starts with the last module and the last unit (only modules without a unit of
  // their own may come after it), reading them and what they tie to: they stay gathered, where
  // releasing them would only gather them again (FSDP keeps its root unsharded after forward for
  // the same reason), and their ties' holds carry over to their backward. After the last
  // module, the unit backward needs next starts gathering behind the rest of forward.
  if (backward_comes_next() && (module == last_module() || u == last_module_unit())) {
    carried_modules_.insert(module);
    if (u >= 0) {
      gathered_for_backward_[u] = true;
      if (module == last_module()) prefetch_after(u, -1);
    }
    return;
  }
  let_go(tied_units_[module], u, +1);
  if (u < 0) return;
  if (backward_prefetches(u)) {
    gathered_for_backward_[u] = true;
  } else if (!keep_for_backward(u)) {
    release(u);
  }
}

// Stage 3 gathers a unit again for backward only if a module of it reads its values there;
// one still gathered (kept from forward, persistent) is read as it is.
bool UnitSchedule::before_backward(int module) {
  const Layout& layout = engine_.layout();
  const int u = layout.unit_of_module(module);
  const bool last_of_unit = u >= 0 && layout.units()[u].last_module == module;
  if (last_of_unit && (engine_.is_gathered(u) || gathered_backward_reads(u))) {
    gather(u);
    gathered_for_backward_[u] = true;
  }
  if (carried_modules_.erase(module) == 0 && (last_of_unit || u < 0)) {
    hold(tied_units_[module]);
  }
  if (last_of_unit) prefetch_after(u, -1);
  return u < 0 || engine_.is_gathered(u);
}

void UnitSchedule::after_backward(int module) {
  const Layout& layout = engine_.layout();
  const int u = layout.unit_of_module(module);
  if (u < 0 || layout.units()[u].first_module == module) let_go(tied_units_[module], u, -1);
}

void UnitSchedule::unit_backward_done(int unit) {
  gathered_for_backward_[unit] = false;
  // A tied user's backward still reads it: its last let_go releases it.
  if (tie_holds_[unit] > 0) {
    gathered_for_ties_[unit] = engine_.is_gathered(unit);
    return;
  }
  release(unit);
}

void UnitSchedule::release_left_over() {
  carried_modules_.clear();
  for (size_t u = 0; u < gathered_for_backward_.size(); ++u) {
    if (!gathered_for_backward_[u] && tie_holds_[u] == 0 && !gathered_for_ties_[u]) continue;
    gathered_for_backward_[u] = false;
    tie_holds_[u] = 0;
    gathered_for_ties_[u] = false;
    release(static_cast<int>(u));
  }
}

void UnitSchedule::release_held() {
  if (!hold_through_step_) return;
  hold_through_step_ = false;
  release_left_over();
  for (size_t u = 0; u < engine_.layout().units().size(); ++u) release(static_cast<int>(u));
  prefetched_for_ties_.clear();
  hold_through_step_ = true;
}

void UnitSchedule::after_step() {
  if (!engine_.layout().units().empty()) engine_.prefetch(0);
}

}  // namespace zero
