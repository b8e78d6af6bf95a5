// The fields of one line of a memory timeline file (examples/memory_timeline.h), which is
// tab-separated: a trailing tab ends an empty last field. The CPU and the GPU timeline tests
// read the files the same way.
#pragma once

#include <sstream>
#include <string>
#include <vector>

namespace zero::examples {

inline std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  std::string field;
  while (std::getline(in, field, '\t')) fields.push_back(field);
  if (!line.empty() && line.back() == '\t') fields.emplace_back();
  return fields;
}

}  // namespace zero::examples
