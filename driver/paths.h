// Where an output path lands, for the programs that refuse an output over their own inputs
// (zero-tokenize, zero-checkpoint export, zero-train's --save-dir against --resume).
#pragma once

#include <filesystem>
#include <string>

namespace zero::driver {

// The directory entry a rename to `path` replaces: its directory resolved (links, `.` and `..`,
// as far as they exist), the name itself not followed, since a rename replaces a link, not its
// target.
std::filesystem::path replaced_entry(const std::string& path);

// Whether `path` is `dir` or lies under it, component by component ("DIR/" is DIR); both as the
// caller resolved them.
bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir);

}  // namespace zero::driver
