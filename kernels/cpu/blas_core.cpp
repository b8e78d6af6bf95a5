#include "zero/kernels/blas_core.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "zero/kernels/cpu_features.h"

// OpenBLAS's own extension; Debian's cblas.h declares it only when it is OpenBLAS's copy.
extern "C" char* openblas_get_corename(void);

namespace zero::kernels {

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

std::string better_blas_core(const std::string& chosen, bool avx2_fma, bool avx512) {
  // OpenBLAS 0.3's x86-64 cores without AVX2 kernels, as openblas_get_corename() names them.
  // Only these are replaced: an unknown name may be a newer, better core.
  static const std::set<std::string> kPreAvx2 = {
      "katmai",     "coppermine",    "northwood",  "prescott",   "banias",
      "core2",      "penryn",        "dunnington", "nehalem",    "atom",
      "opteron",    "opteron(sse3)", "barcelona",  "bobcat",     "bulldozer",
      "piledriver", "steamroller",   "excavator",  "sandybridge"};
  std::string lower = chosen;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (kPreAvx2.count(lower) == 0) return "";
  if (avx512) return "SkylakeX";
  return avx2_fma ? "Haswell" : "";
}

std::string better_blas_core() {
  // cpu_features() also checks that the OS saves the AVX and AVX-512 registers.
  const CpuFeatures& f = cpu_features();
  const bool avx2_fma = f.avx2 && f.fma;
  const bool avx512 = avx2_fma && f.avx512f && f.avx512cd && f.avx512bw && f.avx512dq && f.avx512vl;
  return better_blas_core(blas_core_name(), avx2_fma, avx512);
}

std::string blas_core_warning() {
  const std::string better = better_blas_core();
  if (better.empty()) return "";
  const char* set = std::getenv("OPENBLAS_CORETYPE");
  return "warning: OpenBLAS runs its " + blas_core_name() + " kernels on this CPU, which can run " +
         better + "'s (several times faster at sgemm)" +
         (set != nullptr ? "; OPENBLAS_CORETYPE=" + std::string(set) + " did not take effect"
                         : "; start the program through zerorun, or with OPENBLAS_CORETYPE=" +
                               better + " in its environment");
}

}  // namespace zero::kernels
