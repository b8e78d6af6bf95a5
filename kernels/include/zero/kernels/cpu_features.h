// What this CPU offers the kernels, read once from cpuid (and xgetbv, for whether the OS saves
// the registers an extension needs), and which body each family of kernels runs on it.
#pragma once

#include <string>

namespace zero::kernels {

struct CpuFeatures {
  std::string model;  // the brand string, e.g. "Intel(R) Xeon(R) Platinum 8480+"
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  // The AVX-512 subsets the AVX-512 bodies use (F, BW, VL, DQ), with the OS saving ZMM state.
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512cd = false;
  // bf16 arithmetic: vdpbf16ps (AVX512_BF16) and the AMX tiles (AMX-BF16 with AMX-TILE, the OS
  // saving tile state).
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;

  // AVX2, FMA and F16C: what the AVX2 bodies need.
  bool has_avx2_set() const { return avx2 && fma && f16c; }
  // The AVX2 set and AVX-512 F, BW, VL and DQ: what the AVX-512 bodies need.
  bool has_avx512_set() const {
    return has_avx2_set() && avx512f && avx512bw && avx512vl && avx512dq;
  }
  // bf16 products at bf16 speed: bf16 dot products in the vector units or the AMX tiles.
  bool has_bf16_arithmetic() const { return avx512_bf16 || (amx_tile && amx_bf16); }
  // The flags above that are set, space-separated in /proc/cpuinfo's spelling.
  std::string flags() const;
};

// This CPU's, read at the first call.
const CpuFeatures& cpu_features();

// The bodies of the element-wise and optimizer kernels, from slowest to fastest.
enum class KernelIsa { kScalar, kAvx2, kAvx512 };

const char* kernel_isa_name(KernelIsa isa);

// The best body this CPU runs, capped by ZERO_KERNELS_ISA (scalar, avx2 or avx512; read once)
// and by ZERO_KERNELS_SCALAR=1 (the same as ZERO_KERNELS_ISA=scalar).
KernelIsa best_kernel_isa();

// The body in use: best_kernel_isa(), or lower while a test forces one
// (force_kernel_isa_for_testing).
KernelIsa kernel_isa();

// Tests only: run `isa`'s bodies from now on, when this CPU (and the environment) allows it;
// returns whether it does (the choice is unchanged otherwise). Not for use while kernels run on
// other threads.
bool force_kernel_isa_for_testing(KernelIsa isa);
// Tests only: back to best_kernel_isa().
void reset_kernel_isa_for_testing();

// One line for a program to print at start: the CPU's model and flags, the kernels' body, and
// what the matrix products run on (OpenBLAS's core for fp32, and for bf16 products either
// oneDNN's bf16 or fp32 where the CPU has no bf16 arithmetic).
std::string kernel_summary();

}  // namespace zero::kernels
