// A file's bytes as a string, for tests that compare what a program wrote; empty when the file
// cannot be opened (the comparison then fails, naming what it expected).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace zero {

inline std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace zero
