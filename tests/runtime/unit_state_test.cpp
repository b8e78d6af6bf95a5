// A unit's states change only at the engine's named transitions: leaving a state a transition
// does not start from is the engine's own bug, reported with the unit and both states.
#include <gtest/gtest.h>

#include <string>

#include "runtime/unit_state.h"

namespace zero {
namespace {

TEST(UnitState, AllowedTransitionsMoveTheState) {
  ParamState params = ParamState::kSharded;
  transition(params, {ParamState::kSharded}, ParamState::kGathering, 2, "the gather's start");
  EXPECT_EQ(params, ParamState::kGathering);
  transition(params, {ParamState::kGathering}, ParamState::kGathered, 2, "the wait");
  EXPECT_EQ(params, ParamState::kGathered);
  GradState grads = GradState::kEmpty;
  transition(grads, {GradState::kEmpty, GradState::kAccumulating}, GradState::kReducing, 2,
             "grads_ready");
  EXPECT_EQ(grads, GradState::kReducing);
}

TEST(UnitState, AForbiddenTransitionIsAnInternalErrorNamingTheUnitAndBothStates) {
  ParamState params = ParamState::kGathered;
  try {
    transition(params, {ParamState::kSharded}, ParamState::kGathering, 7, "the gather's start");
    FAIL() << "a gathered unit started another gather";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("internal error: unit 7: the gather's start from state 'gathered' "
                           "to 'gathering'"),
              std::string::npos)
        << message;
  }
  EXPECT_EQ(params, ParamState::kGathered) << "a refused transition changed the state";
  GradState grads = GradState::kReduced;
  EXPECT_THROW(transition(grads, {GradState::kEmpty, GradState::kAccumulating},
                          GradState::kReducing, 0, "grads_ready"),
               Error);
}

}  // namespace
}  // namespace zero
