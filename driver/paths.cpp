#include "driver/paths.h"

#include <system_error>

namespace zero::driver {

std::filesystem::path replaced_entry(const std::string& path) {
  const std::filesystem::path given = std::filesystem::absolute(path);
  std::error_code error;
  const std::filesystem::path parent =
      std::filesystem::weakly_canonical(given.parent_path(), error);
  return (error ? given.parent_path() : parent) / given.filename();
}

bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir) {
  auto p = path.begin();
  for (auto d = dir.begin(); d != dir.end(); ++d, ++p) {
    // A trailing separator is an empty last element: "DIR/" is DIR.
    if (d->empty()) return true;
    if (p == path.end() || *p != *d) return false;
  }
  return true;
}

}  // namespace zero::driver
