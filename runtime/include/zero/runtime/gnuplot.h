// gnuplot, which draws the pictures some outputs come with (zero-train's memory timeline, the
// pipeline timeline). Debian's gnuplot-nox; scripts/setup.sh installs it.
#pragma once

#include <string>

namespace zero {

// Whether an executable `gnuplot` is on PATH.
bool gnuplot_on_path();

// Runs gnuplot on the script file `script` and waits for it; throws zero::Error naming the
// script and the exit status when it cannot start or fails.
void run_gnuplot(const std::string& script);

}  // namespace zero
