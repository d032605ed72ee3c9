// Private: the x86-64 kernel sets, one file each, compiled only in x86-64 builds.
//
//   MicroKernels set = native::avx2_set();
//   native::add_avx512(set);        // set: AVX-512F outer-product and fma_rows kernels
//   native::add_avx512bf16(set);    // + vdpbf16ps pair kernels for BF16 x BF16 products
//   native::add_amx(set);           // pair kernels on AMX tiles instead
//
// Each add_* replaces the entries its instruction set speeds up and sets `name`; the rest of the
// set stays what it was. The same sources are compiled a second time for the tests, against
// portable implementations of the intrinsics (SIMDe, and a tile emulator), into namespace
// `emulated` (tests/kernels/emulated_kernels.hpp), so that their logic is tested on CPUs without
// these instruction sets.
#pragma once

#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels::native {

// The AVX2+FMA set (micro_kernels_avx2.cpp), whether or not this CPU has AVX2 (avx2_kernels()
// in micro_kernels.hpp checks).
const MicroKernels& avx2_set();

void add_avx512(MicroKernels& set);
void add_avx512bf16(MicroKernels& set);
// + dot_tile_fp8_pairs, fma_rows_fp8_pairs and decode_fp8_bf16 (FP8 codes as BF16 by vpermi2b):
// only where the CPU has AVX512-VBMI.
void add_fp8_pairs(MicroKernels& set);
void add_amx(MicroKernels& set);

}  // namespace grouplin::kernels::native
