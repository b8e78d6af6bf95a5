// cpuid and xgetbv, read once; the kernel bodies they allow and the environment's cap on them.
#include "zero/kernels/cpu_features.h"

#include <cpuid.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "zero/core/check.h"
#include "zero/kernels/blas_core.h"
#include "zero/kernels/transformer_kernels.h"

namespace zero::kernels {
namespace {

struct Registers {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Registers cpuid(unsigned leaf, unsigned subleaf) {
  Registers r;
  if (static_cast<unsigned>(__get_cpuid_max(leaf & 0x80000000u, nullptr)) < leaf) return r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

bool bit(unsigned value, int position) {
  return ((value >> position) & 1u) != 0;
}

// XCR0: which register states the OS saves on a context switch. Only valid with OSXSAVE.
uint64_t xcr0() {
  uint32_t low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (static_cast<uint64_t>(high) << 32) | low;
}

std::string brand_string() {
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000u, nullptr)) < 0x80000004u) return "unknown";
  char brand[49] = {};
  for (unsigned leaf = 0; leaf < 3; ++leaf) {
    Registers r = cpuid(0x80000002u + leaf, 0);
    std::memcpy(brand + 16 * leaf, &r, 16);
  }
  std::string name(brand);
  const size_t first = name.find_first_not_of(' ');
  const size_t last = name.find_last_not_of(' ');
  return first == std::string::npos ? "unknown" : name.substr(first, last - first + 1);
}

CpuFeatures read_cpu_features() {
  CpuFeatures f;
  f.model = brand_string();
  const Registers leaf1 = cpuid(1, 0);
  const bool osxsave = bit(leaf1.ecx, 27);
  const uint64_t saved = osxsave ? xcr0() : 0;
  const bool ymm_saved = (saved & 0x6) == 0x6;                 // SSE and AVX state
  const bool zmm_saved = ymm_saved && (saved & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles_saved = (saved & 0x60000) == 0x60000;       // XTILECFG, XTILEDATA
  const bool avx = ymm_saved && bit(leaf1.ecx, 28);
  const Registers leaf7 = cpuid(7, 0);
  const Registers leaf7_1 = cpuid(7, 1);
  f.fma = avx && bit(leaf1.ecx, 12);
  f.f16c = avx && bit(leaf1.ecx, 29);
  f.avx2 = avx && bit(leaf7.ebx, 5);
  f.avx512f = zmm_saved && bit(leaf7.ebx, 16);
  f.avx512dq = f.avx512f && bit(leaf7.ebx, 17);
  f.avx512cd = f.avx512f && bit(leaf7.ebx, 28);
  f.avx512bw = f.avx512f && bit(leaf7.ebx, 30);
  f.avx512vl = f.avx512f && bit(leaf7.ebx, 31);
  f.avx512_bf16 = f.avx512f && bit(leaf7_1.eax, 5);
  f.avx512_fp16 = f.avx512f && bit(leaf7.edx, 23);
  f.amx_tile = tiles_saved && bit(leaf7.edx, 24);
  f.amx_bf16 = f.amx_tile && bit(leaf7.edx, 22);
  return f;
}

KernelIsa parse_isa_cap() {
  const char* scalar = std::getenv("ZERO_KERNELS_SCALAR");
  if (scalar != nullptr && scalar[0] != '\0' && std::strcmp(scalar, "0") != 0) {
    return KernelIsa::kScalar;
  }
  const char* value = std::getenv("ZERO_KERNELS_ISA");
  if (value == nullptr || value[0] == '\0') return KernelIsa::kAvx512;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (std::strcmp(value, kernel_isa_name(isa)) == 0) return isa;
  }
  ZERO_FAIL("ZERO_KERNELS_ISA='" << value << "' is none of scalar, avx2, avx512");
}

KernelIsa supported_isa() {
  const CpuFeatures& f = cpu_features();
  if (f.has_avx512_set()) return KernelIsa::kAvx512;
  return f.has_avx2_set() ? KernelIsa::kAvx2 : KernelIsa::kScalar;
}

// -1: no test forces a body; else the forced KernelIsa.
std::atomic<int> forced_isa{-1};

}  // namespace

std::string CpuFeatures::flags() const {
  std::string out;
  for (const auto& [set, name] :
       std::initializer_list<std::pair<bool, const char*>>{{avx2, "avx2"},
                                                           {fma, "fma"},
                                                           {f16c, "f16c"},
                                                           {avx512f, "avx512f"},
                                                           {avx512bw, "avx512bw"},
                                                           {avx512vl, "avx512vl"},
                                                           {avx512dq, "avx512dq"},
                                                           {avx512cd, "avx512cd"},
                                                           {avx512_bf16, "avx512_bf16"},
                                                           {avx512_fp16, "avx512_fp16"},
                                                           {amx_tile, "amx_tile"},
                                                           {amx_bf16, "amx_bf16"}}) {
    if (!set) continue;
    if (!out.empty()) out += ' ';
    out += name;
  }
  return out.empty() ? "none of avx2 fma f16c avx512" : out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_cpu_features();
  return features;
}

const char* kernel_isa_name(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      return "scalar";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

KernelIsa best_kernel_isa() {
  static const KernelIsa best = [] {
    const KernelIsa cap = parse_isa_cap();
    const KernelIsa supported = supported_isa();
    return static_cast<int>(cap) < static_cast<int>(supported) ? cap : supported;
  }();
  return best;
}

KernelIsa kernel_isa() {
  const int forced = forced_isa.load(std::memory_order_relaxed);
  return forced >= 0 ? static_cast<KernelIsa>(forced) : best_kernel_isa();
}

bool force_kernel_isa_for_testing(KernelIsa isa) {
  if (static_cast<int>(isa) > static_cast<int>(best_kernel_isa())) return false;
  forced_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

void reset_kernel_isa_for_testing() {
  forced_isa.store(-1, std::memory_order_relaxed);
}

std::string kernel_summary() {
  const CpuFeatures& f = cpu_features();
  return "CPU " + f.model + " [" + f.flags() + "]; kernels " + kernel_isa_name(kernel_isa()) +
         "; fp32 products OpenBLAS " + blas_core_name() + "; bf16 products " +
         bf16_products_description();
}

}  // namespace zero::kernels
