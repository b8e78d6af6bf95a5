// Text for messages: a list joined with a separator, a tensor shape; and a suffix test. Every
// layer prints lists and shapes the same way through these.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace zero {

// The items of `range` as `operator<<` prints them, with `separator` between two:
// join(std::vector<int>{0, 2, 3}, ", ") is "0, 2, 3"; an empty range gives "".
template <typename Range>
std::string join(const Range& range, const std::string& separator) {
  std::ostringstream out;
  bool first = true;
  for (const auto& item : range) {
    if (!first) out << separator;
    out << item;
    first = false;
  }
  return out.str();
}

// True when `text` ends with `suffix`.
inline bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A tensor shape as "[4, 8]" ("[]" for a scalar).
inline std::string shape_text(const std::vector<int64_t>& shape) {
  return "[" + join(shape, ", ") + "]";
}

}  // namespace zero
