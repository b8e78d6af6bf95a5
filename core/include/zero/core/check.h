// Error reporting shared by every layer: a failed check throws zero::Error whose message names
// the source file and line, so a user's report points at the place that noticed the problem.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace zero {

// The one exception type the runtime throws for bad input and failed system calls.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] inline void fail(const char* file, int line, const std::string& message) {
  std::ostringstream out;
  out << message << " (" << file << ":" << line << ")";
  throw Error(out.str());
}
}  // namespace detail

}  // namespace zero

// ZERO_CHECK(cond, "text" << value): throws zero::Error with the streamed message when cond fails.
#define ZERO_CHECK(cond, stream_expr)                                      \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::ostringstream zero_check_message_;                              \
      zero_check_message_ << stream_expr;                                  \
      ::zero::detail::fail(__FILE__, __LINE__, zero_check_message_.str()); \
    }                                                                      \
  } while (0)

#define ZERO_FAIL(stream_expr) ZERO_CHECK(false, stream_expr)
