// The states a unit's parameters and gradient pass through (private to runtime/). Each changes
// only at a named transition that checks the state it leaves, as FSDP2's ShardedState and
// TrainingState do: leaving any other state is the engine's own bug, reported as an internal
// error that names the unit, the transition and both states.
#pragma once

#include <initializer_list>

#include "zero/core/check.h"

namespace zero {

enum class ParamState {
  kSharded,    // only this rank's slice is current (stage 3: no full buffer at all)
  kGathering,  // an all-gather into the full buffer is in flight
  kGathered,   // the full buffer holds the current values
};

enum class GradState {
  kEmpty,         // no micro-batch of this step reduced yet
  kAccumulating,  // some micro-batches reduced and accumulated, more to come
  kReducing,      // the step's last reduction issued
  kReduced,       // waited for: the step reads it
};

inline const char* state_name(ParamState state) {
  switch (state) {
    case ParamState::kSharded:
      return "sharded";
    case ParamState::kGathering:
      return "gathering";
    case ParamState::kGathered:
      return "gathered";
  }
  return "?";
}

inline const char* state_name(GradState state) {
  switch (state) {
    case GradState::kEmpty:
      return "empty";
    case GradState::kAccumulating:
      return "accumulating";
    case GradState::kReducing:
      return "reducing";
    case GradState::kReduced:
      return "reduced";
  }
  return "?";
}

// Moves unit `unit`'s `state` to `next` at `transition`, which may leave only the states `from`.
template <typename State>
void transition(State& state, std::initializer_list<State> from, State next, int unit,
                const char* transition) {
  bool allowed = false;
  for (State s : from) allowed = allowed || s == state;
  ZERO_CHECK(allowed, "internal error: unit " << unit << ": " << transition << " from state '"
                                              << state_name(state) << "' to '" << state_name(next)
                                              << "' is not one of the engine's transitions");
  state = next;
}

}  // namespace zero
