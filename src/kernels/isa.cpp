// CPU and OS feature detection for the kernels (see kernels/isa.hpp).
#include "kernels/isa.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "grouplin/error.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace grouplin::kernels {
namespace {

constexpr const char* kIsaEnv = "GROUPLIN_ISA";
constexpr Isa kAll[] = {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx};

#if defined(__x86_64__)
uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// Asks Linux for the AMX tile data state; false when refused (old kernel, or a policy).
bool request_amx_state() {
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

}  // namespace

CpuFeatures detect_cpu() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  const unsigned base_family = (a >> 8) & 0xF;
  const unsigned family = base_family + (base_family == 0xF ? (a >> 20) & 0xFF : 0);
  unsigned max_leaf = 0, vendor[3] = {0, 0, 0};  // "AuthenticAMD" comes as EBX, EDX, ECX
  __get_cpuid(0, &max_leaf, &vendor[0], &vendor[2], &vendor[1]);
  f.amd = std::memcmp(vendor, "AuthenticAMD", 12) == 0;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm = (xcr0 & 0x6) == 0x6;            // SSE and AVX state
  const bool zmm = ymm && (xcr0 & 0xE0) == 0xE0;   // opmask, ZMM_Hi256, Hi16_ZMM
  const bool tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG, XTILEDATA
  unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0, unused = 0;
  __get_cpuid_count(7, 0, &a, &b7, &c7, &d7);
  __get_cpuid_count(7, 1, &a71, &unused, &unused, &unused);
  f.avx2_fma = ymm && fma && ((b7 >> 5) & 1);
  f.avx512f = f.avx2_fma && zmm && ((b7 >> 16) & 1);
  // AVX512-BF16 with AVX512BW (bit 30) and AVX512VL (bit 31), which its kernels use.
  f.avx512bf16 = f.avx512f && ((b7 >> 30) & 1) && ((b7 >> 31) & 1) && ((a71 >> 5) & 1);
  f.avx512vbmi = f.avx512f && ((c7 >> 1) & 1);
  f.zmm_halves = f.avx512f && f.amd && family == 25;
  const bool amx_cpu = ((d7 >> 22) & 1) && ((d7 >> 24) & 1);  // AMX-BF16, AMX-TILE
  if (amx_cpu && f.avx512f) {
    f.amx_bf16 = tiles && request_amx_state();
    f.amx_refused = !f.amx_bf16;
  }
#endif
  return f;
}

Isa best_isa(const CpuFeatures& f) {
  if (f.amx_bf16 && f.avx512bf16) return Isa::Amx;
  if (f.avx512bf16) return Isa::Avx512Bf16;
  if (f.avx512f) return Isa::Avx512;
  if (f.avx2_fma) return Isa::Avx2;
  return Isa::Portable;
}

// Measured, each CPU with every kernel set in one session (docs/PERFORMANCE.md, measurements
// behind the code's comments): on a Sapphire Rapids the AVX512-BF16 set's vdpbf16ps pair kernels
// ran BF16 slower than the AVX-512F set's widening kernels in every BF16 case; on an AMD Zen 4,
// where one vdpbf16ps does twice the multiply-adds of an F32 FMA in the same time, faster in
// every case. F32 is the same code in both. So an Intel CPU with AVX512_BF16 but no AMX runs the
// AVX-512F set, an AMD one the AVX512-BF16 set. (AMX keeps its place: it lost at 32 rows per
// expert but won at 256.)
Isa preferred_isa(const CpuFeatures& f) {
  const Isa best = best_isa(f);
  return best == Isa::Avx512Bf16 && !f.amd ? Isa::Avx512 : best;
}

Isa capped_isa(const CpuFeatures& f, std::optional<Isa> cap) {
  if (!cap) return preferred_isa(f);
  const Isa best = best_isa(f);
  const Isa isa = *cap < best ? *cap : best;
  return isa == Isa::Avx512Bf16 && *cap != Isa::Avx512Bf16 ? preferred_isa(f) : isa;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Portable:
      return "portable";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx512Bf16:
      return "avx512bf16";
    case Isa::Amx:
      return "amx";
  }
  return "unknown";
}

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa isa : kAll) {
    if (isa_name(isa) == name) return isa;
  }
  return std::nullopt;
}

Isa isa_cap_from_environment(const char* value) {
  if (value == nullptr) return Isa::Amx;
  if (std::optional<Isa> isa = isa_from_name(value)) return *isa;
  throw Error(ErrorCode::InvalidEnvironment,
              std::string("environment variable ") + kIsaEnv + "=" + quote(value) +
                  ": expected one of portable, avx2, avx512, avx512bf16, amx");
}

Isa kernel_isa() {
  // Decided once, a refusal included: a bad GROUPLIN_ISA used to be read again (and CPUID run
  // again) at every call, each throwing anew, and a value changed after the first failure
  // changed the kernels in the middle of a run.
  struct Decision {
    Isa isa = Isa::Portable;
    std::string error;  // the InvalidEnvironment message when GROUPLIN_ISA is refused
  };
  static const Decision decision = [] {
    Decision d;
    try {
      const char* value = std::getenv(kIsaEnv);
      const Isa cap = isa_cap_from_environment(value);
      d.isa = capped_isa(detect_cpu(), value ? std::optional<Isa>(cap) : std::nullopt);
#if !defined(__x86_64__)
      d.isa = Isa::Portable;
#endif
    } catch (const Error& e) {
      d.error = e.message();
    }
    return d;
  }();
  if (!decision.error.empty()) throw Error(ErrorCode::InvalidEnvironment, decision.error);
  return decision.isa;
}

std::string describe(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';  // appends: GCC 12 warns (-Wrestrict) falsely on "" + std::string
    s += name;
  };
  add(f.avx2_fma, "avx2 fma");
  add(f.avx512f, "avx512f");
  add(f.avx512bf16, "avx512_bf16");
  add(f.avx512vbmi, "avx512_vbmi");
  add(f.amx_bf16, "amx_bf16");
  add(f.amx_refused, "(amx refused by the OS)");
  return s.empty() ? "no AVX2" : s;
}

}  // namespace grouplin::kernels
