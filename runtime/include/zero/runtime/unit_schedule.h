// The schedule of a model's units over forward and backward: what is gathered, prefetched,
// kept and released at each point, through the engine's public primitives. ZeroModel and the
// LibTorch adapter (TorchModel) both run their modules through it, so they schedule alike.
//
// At stage 3 a unit is gathered before its first module's forward and released after its last;
// the units after it are prefetched while they fit in stage3_prefetch_bucket_size elements (at
// least the next one), each after the units its modules tie to (a tied unit's own forward is
// long past when its user needs it). Units that tie are gathered around their user's forward
// and backward. At the end of forward, the last unit and what it and the modules after it tie
// to stay gathered for backward, which starts with them, and so do the units backward
// prefetches first, or they start gathering (not in a pipeline stage, where other micro-batches
// come between); any other unit whose reuse in backward comes within stage3_max_reuse_distance
// elements stays gathered (within stage3_max_live_parameters). In backward a unit is gathered
// again only if a module of it reads its values there (or it is still gathered), and released
// once its gradients are handed to the engine. Persistent units are always gathered. At stages
// 0-2 every unit stays gathered and the calls change nothing.
#pragma once

#include <functional>
#include <set>
#include <vector>

#include "zero/runtime/engine.h"

namespace zero {

class UnitSchedule {
 public:
  // What a caller does when the schedule has gathered a unit or is about to release it (the
  // adapter points its tensors at the buffer, or away from it); either may be empty.
  struct Listener {
    std::function<void(int unit)> gathered;
    std::function<void(int unit)> releasing;
  };

  // module_tied_params[m]: the registration indices of the parameters of earlier modules that
  // module m reads too. backward_reads[m]: whether module m's backward reads its own
  // parameters' values (set_backward_reads changes it). One entry per module of the layout.
  UnitSchedule(Engine& engine, const std::vector<std::vector<int>>& module_tied_params,
               std::vector<bool> backward_reads, Listener listener = {});

  void set_backward_reads(int module, bool reads);
  // An interleaved pipeline stage's model chunks: chunk_of_module[m] for every module. A
  // chunk's forward and backward run apart from the other chunks' (other micro-batches' in
  // between), so prefetches stop at the chunk's edge, and the end of a chunk's forward neither
  // keeps units for its backward nor starts gathering them.
  void set_module_chunks(const std::vector<int>& chunk_of_module);
  // The units holding what the modules of `module`'s unit (or `module` alone, when it has no
  // unit) tie to, other than that unit.
  const std::vector<int>& tied_units(int module) const { return tied_units_[module]; }

  // Forward: around each module's forward, in order.
  void before_forward(int module);
  void after_forward(int module);
  // Backward: before_backward where the gradient reaches the module's output, after_backward
  // where it has left its input, in reverse module order. Returns whether the module's own
  // parameters hold their values (false: a unit whose backward reads none was not gathered).
  bool before_backward(int module);
  void after_backward(int module);
  // After the unit's grads_ready: releases the unit, unless a tied user's backward still reads
  // it (then the last user's after_backward does).
  void unit_backward_done(int unit);
  // Releases what a backward gathered and did not release (a frozen unit, which has no
  // gradients, or a backward that never reached a unit): before the next forward or step.
  void release_left_over();
  // After the optimizer step: starts gathering the first unit for the next forward.
  void after_step();

  // Stage 3 across several micro-batches in flight (a pipeline stage): with `hold`, a unit once
  // gathered stays gathered until release_held(), instead of being gathered again for every
  // micro-batch's forward and backward (the all-gathers would be m times as many). Memory:
  // every unit of the model gathered at once.
  void set_hold_through_step(bool hold) { hold_through_step_ = hold; }
  // Releases every unit the hold kept (before the step, which needs them sharded).
  void release_held();

 private:
  bool gathered_backward_reads(int unit) const;
  bool keep_for_backward(int unit) const;
  bool backward_prefetches(int unit) const;
  void gather(int unit);
  void release(int unit);
  void prefetch_with_tied(int unit);
  std::vector<int> prefetch_window(int unit, int direction) const;
  void prefetch_after(int unit, int direction);
  void hold(const std::vector<int>& units);
  void let_go(const std::vector<int>& units, int unit, int direction);
  int last_module() const;
  int last_module_unit() const;
  bool backward_comes_next() const;

  Engine& engine_;
  Listener listener_;
  // The configuration this schedule reads, read once at construction.
  int stage_ = 3;
  size_t prefetch_elements_ = 0;   // stage3_prefetch_bucket_size
  size_t max_live_elements_ = 0;   // stage3_max_live_parameters
  size_t max_reuse_distance_ = 0;  // stage3_max_reuse_distance

  std::vector<bool> backward_reads_;          // per module
  std::vector<std::vector<int>> tied_units_;  // per module (tied_units)
  std::vector<std::vector<int>> unit_ties_;   // per unit: tied_units of its modules
  std::vector<int> tie_holds_;                // per unit: users holding it for a tie
  std::vector<bool> gathered_for_ties_;       // per unit: gathered by the first hold
  std::vector<bool> gathered_for_backward_;   // per unit: awaiting unit_backward_done
  std::set<int> prefetched_for_ties_;         // tied units prefetch_with_tied started
  bool hold_through_step_ = false;            // set_hold_through_step
  std::set<int> carried_modules_;             // modules whose ties' holds forward passed on
  // set_module_chunks: per unit, its first module's chunk (the persistent unit's -1); empty
  // for a model of one chunk.
  std::vector<int> unit_chunks_;
};

}  // namespace zero
