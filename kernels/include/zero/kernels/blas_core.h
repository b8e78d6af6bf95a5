// Which OpenBLAS kernels this process runs. OpenBLAS (built with DYNAMIC_ARCH, as Debian's is)
// picks its kernels once, when the library loads, from the CPU's model number. A model it does
// not know (a CPU newer than the library, or a VM that hides the model: "Intel(R) Xeon(R)
// Processor") gets its oldest x86-64 kernels, Prescott's SSE3, even on a CPU with AVX2, FMA and
// AVX-512: sgemm runs several times slower. The environment variable OPENBLAS_CORETYPE, read at
// load time, overrides the choice, so it must be set before the program starts; zerorun sets it
// for the ranks it starts on its own host (launcher/).
#pragma once

#include <string>

namespace zero::kernels {

// What OpenBLAS chose in this process: openblas_get_corename() ("Prescott", "Haswell", ...).
std::string blas_core_name();

// The OpenBLAS core type that suits a CPU with these features when OpenBLAS chose `chosen`:
// "SkylakeX" with AVX-512 (F, CD, BW, DQ and VL), else "Haswell" with AVX2 and FMA, when
// `chosen` is one of OpenBLAS's cores without AVX2 (Prescott, Nehalem, Sandybridge, ...). ""
// when the choice is fine: an AVX2 core already, a name this function does not know (a newer
// OpenBLAS's), or a CPU without AVX2 and FMA. Case does not matter.
std::string better_blas_core(const std::string& chosen, bool avx2_fma, bool avx512);

// better_blas_core() for this process's OpenBLAS and this CPU.
std::string better_blas_core();

// A line saying that OpenBLAS runs slower kernels than this CPU allows and what to set, for a
// program to print at start; "" when its choice is fine.
std::string blas_core_warning();

}  // namespace zero::kernels
