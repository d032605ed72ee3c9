// Instruction-set detection and the GROUPLIN_ISA cap. What this machine offers is printed, so a
// CI log shows which kernel paths ran.
#include "kernels/isa.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "grouplin/error.hpp"
#include "grouplin/runtime.hpp"
#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels {
namespace {

TEST(Isa, NamesRoundTripAndTheCapIsChecked) {
  for (Isa isa : {Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16, Isa::Amx}) {
    EXPECT_EQ(isa_from_name(isa_name(isa)), isa);
  }
  EXPECT_EQ(isa_from_name("AVX2"), std::nullopt);
  EXPECT_EQ(isa_cap_from_environment(nullptr), Isa::Amx);
  EXPECT_EQ(isa_cap_from_environment("avx512bf16"), Isa::Avx512Bf16);
  try {
    isa_cap_from_environment("sse");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidEnvironment);
    EXPECT_NE(e.message().find("GROUPLIN_ISA=\"sse\""), std::string::npos) << e.what();
  }
}

TEST(Isa, EachLevelImpliesTheOnesBelow) {
  CpuFeatures f;
  EXPECT_EQ(best_isa(f), Isa::Portable);
  f.avx2_fma = true;
  EXPECT_EQ(best_isa(f), Isa::Avx2);
  f.avx512f = true;
  EXPECT_EQ(best_isa(f), Isa::Avx512);
  f.amx_bf16 = true;  // AMX without AVX512_BF16 (for the small-row dot products) stays AVX-512
  EXPECT_EQ(best_isa(f), Isa::Avx512);
  f.avx512bf16 = true;
  EXPECT_EQ(best_isa(f), Isa::Amx);
}

// The dispatch order is the measured one: on Intel, AVX512-BF16 (slower than AVX-512F on BF16
// there) runs only when GROUPLIN_ISA names it; on AMD (faster there) it runs by default. A cap
// above the preferred set changes nothing.
TEST(Isa, Avx512Bf16RunsByDefaultOnlyWhereMeasuredFaster) {
  CpuFeatures f;
  f.avx2_fma = f.avx512f = f.avx512bf16 = true;
  EXPECT_EQ(best_isa(f), Isa::Avx512Bf16);
  EXPECT_EQ(preferred_isa(f), Isa::Avx512);
  EXPECT_EQ(capped_isa(f, std::nullopt), Isa::Avx512);
  EXPECT_EQ(capped_isa(f, Isa::Amx), Isa::Avx512);
  EXPECT_EQ(capped_isa(f, Isa::Avx512Bf16), Isa::Avx512Bf16);
  EXPECT_EQ(capped_isa(f, Isa::Avx2), Isa::Avx2);
  f.amd = f.zmm_halves = true;
  EXPECT_EQ(preferred_isa(f), Isa::Avx512Bf16);
  EXPECT_EQ(capped_isa(f, std::nullopt), Isa::Avx512Bf16);
  EXPECT_EQ(capped_isa(f, Isa::Amx), Isa::Avx512Bf16);
  EXPECT_EQ(capped_isa(f, Isa::Avx512), Isa::Avx512);
  f.amd = f.zmm_halves = false;
  f.amx_bf16 = true;
  EXPECT_EQ(preferred_isa(f), Isa::Amx);
  EXPECT_EQ(capped_isa(f, std::nullopt), Isa::Amx);
  EXPECT_EQ(capped_isa(f, Isa::Avx512Bf16), Isa::Avx512Bf16);
  EXPECT_EQ(capped_isa(f, Isa::Avx512), Isa::Avx512);
  f = CpuFeatures{};
  f.avx2_fma = true;
  EXPECT_EQ(capped_isa(f, Isa::Amx), Isa::Avx2);
  EXPECT_EQ(capped_isa(f, Isa::Portable), Isa::Portable);
}

TEST(Isa, TheKernelsRunWhatDetectionChose) {
  const CpuFeatures f = detect_cpu();
  std::printf("cpu offers: %s; kernels: %s (%s)\n", describe(f).c_str(),
              grouplin::kernel_isa().c_str(), micro_kernels().name);
  if (!f.avx512f) {
    std::printf(
        "native avx512f, avx512bf16 and amx kernels do not run on this CPU (no AVX-512F); "
        "kernels_emulated_test runs them emulated\n");
  }
  const Isa chosen = kernel_isa();
  EXPECT_EQ(grouplin::kernel_isa(), isa_name(chosen));
  EXPECT_LE(chosen, best_isa(f));
  EXPECT_LE(chosen, isa_cap_from_environment(std::getenv("GROUPLIN_ISA")));
#if defined(__x86_64__)
  if (std::getenv("GROUPLIN_ISA") == nullptr) {
    EXPECT_EQ(chosen, preferred_isa(f));
  }
#else
  EXPECT_EQ(chosen, Isa::Portable);
#endif
}

}  // namespace
}  // namespace grouplin::kernels
