// Test-only: the AVX-512, AVX512-BF16 and AMX kernel files compiled against emulated intrinsics
// (tests/kernels/CMakeLists.txt: kernels_emulated), in namespace `emulated`. Each add_* does what
// its native twin in kernels/micro_kernels_x86.hpp does. They run only on CPUs with AVX2 and FMA
// (the emulation's own instructions).
#pragma once

#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels::emulated {

void add_avx512(MicroKernels& set);
void add_avx512bf16(MicroKernels& set);
// + dot_tile_fp8_pairs, fma_rows_fp8_pairs and decode_fp8_bf16 (the native ones only where the
// CPU has AVX512-VBMI).
void add_fp8_pairs(MicroKernels& set);
void add_amx(MicroKernels& set);

}  // namespace grouplin::kernels::emulated
