// Instruction-set detection and the GROUPLIN_ISA cap. What this machine offers is printed, so a
// CI log shows which kernel paths ran.
#include "kernels/isa.hpp"

#include <gtest/gtest.h>

#include <cstdio>

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

TEST(Isa, TheKernelsRunWhatDetectionChose) {
  const CpuFeatures f = detect_cpu();
  std::printf("cpu offers: %s; kernels: %s (portable and avx2 kernels are implemented)\n",
              describe(f).c_str(), grouplin::kernel_isa().c_str());
  if (f.avx512f || f.amx_bf16) {
    std::printf("note: AVX-512 / AMX detected; no kernels for them yet, so they do not run\n");
  } else {
    std::printf("skipped: AVX-512 and AMX paths (this CPU offers neither)\n");
  }
  const Isa chosen = kernel_isa();
  EXPECT_EQ(grouplin::kernel_isa(), isa_name(chosen));
  EXPECT_LE(chosen, best_isa(f));
  EXPECT_LE(chosen, Isa::Avx2);
  EXPECT_STREQ(micro_kernels().name, chosen == Isa::Avx2 ? "avx2+fma" : "portable");
}

}  // namespace
}  // namespace grouplin::kernels
