// expect_error_naming: the check every bad-input test makes, that a call throws zero::Error and
// its message names the problem.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "zero/core/check.h"

namespace zero::testing {

// Runs fn, expects zero::Error, and checks that the message contains `needle`.
template <typename Fn>
void expect_error_naming(Fn fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not name '" << needle << "'";
  }
}

}  // namespace zero::testing
