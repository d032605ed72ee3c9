// Private: which instruction sets the CPU and the OS offer, and which one the kernels use.
//
//   kernels::CpuFeatures f = kernels::detect_cpu();
//   kernels::Isa isa = kernels::kernel_isa();    // after GROUPLIN_ISA's cap
//
// The OS part matters as much as the CPU's: AVX-512 needs the ZMM and opmask state enabled in
// XCR0, AMX the tile state enabled and, on Linux, granted to the process
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); a refusal falls back cleanly.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace grouplin::kernels {

// Kernel sets from the least to the most capable; each implies the ones before it.
enum class Isa { Portable, Avx2, Avx512, Avx512Bf16, Amx };

struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA, YMM state enabled
  bool avx512f = false;      // AVX-512 F, ZMM and opmask state enabled
  bool avx512bf16 = false;   // AVX512_BF16 (vdpbf16ps), AVX512BW (word unpacks), AVX512VL (ymm)
  bool avx512vbmi = false;   // AVX512_VBMI (vpermi2b: FP8 codes to BF16 by table)
  bool amx_bf16 = false;     // AMX-BF16 and AMX-TILE, tile state enabled and granted
  bool amx_refused = false;  // the CPU has AMX but the OS refused the tile state
  bool amd = false;          // vendor AuthenticAMD (CPUID leaf 0)
  bool zmm_halves = false;   // 512-bit arithmetic runs as two 256-bit halves (AMD family 25, Zen 4)
};

// What this CPU and OS offer (CPUID, XGETBV, and on Linux the AMX permission request).
CpuFeatures detect_cpu();
// The most capable set `f` allows.
Isa best_isa(const CpuFeatures& f);
// The set the dispatch runs on `f` unless GROUPLIN_ISA says otherwise: best_isa, except that
// avx512bf16 gives way to avx512 on Intel CPUs (measured slower there on every BF16 case, and
// faster on AMD Zen 4: isa.cpp).
Isa preferred_isa(const CpuFeatures& f);
// The set for a CPU offering `f` under GROUPLIN_ISA=`cap` (unset: preferred_isa): the most
// capable one up to the cap, where avx512bf16 runs on Intel only when the cap names it.
Isa capped_isa(const CpuFeatures& f, std::optional<Isa> cap);

// "portable", "avx2", "avx512", "avx512bf16", "amx".
std::string_view isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);

// The cap GROUPLIN_ISA=`value` sets (nullptr: none, Amx). Throws Error(InvalidEnvironment)
// naming the variable, the value and the accepted names.
Isa isa_cap_from_environment(const char* value);

// The kernels' instruction set: capped_isa of what the CPU and the OS offer and GROUPLIN_ISA;
// portable in builds for other architectures than x86-64. Every level has
// its kernel set (micro_kernels.hpp): avx512 runs F32 (and BF16 widened to F32) on AVX-512F,
// avx512bf16 adds vdpbf16ps for BF16 x BF16 products, amx runs those on the AMX tiles. F32 stays
// F32 on every level. Decided once per process, at the first call: a GROUPLIN_ISA that
// isa_cap_from_environment refuses makes that call and every later one throw the same
// Error(InvalidEnvironment), without reading the variable again.
Isa kernel_isa();
// "avx2 fma avx512f ..." and any refusal: what detect_cpu found, for reports.
std::string describe(const CpuFeatures& f);

}  // namespace grouplin::kernels
