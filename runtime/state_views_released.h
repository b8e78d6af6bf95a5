// On CUDA, Engine::state_view() makes host copies: a pass that only reads them lets each go
// after its unit, and this guard gives back the rest when the pass ends early with an error.
// Private to runtime/ (checkpoint_save.cpp, checkpoint_load.cpp).
#pragma once

#include "zero/runtime/engine.h"

namespace zero {

class StateViewsReleased {
 public:
  explicit StateViewsReleased(Engine& engine) : engine_(engine) {}
  ~StateViewsReleased() { engine_.release_state_views(); }
  StateViewsReleased(const StateViewsReleased&) = delete;
  StateViewsReleased& operator=(const StateViewsReleased&) = delete;

 private:
  Engine& engine_;
};

}  // namespace zero
