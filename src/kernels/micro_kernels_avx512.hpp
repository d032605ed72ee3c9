// Private to the AVX-512F kernel set, whose kernels live in two files: micro_kernels_avx512.cpp
// (the outer-product tiles, fma_rows, the set's add_avx512) and micro_kernels_avx512_fp8.cpp
// (FP8 weights). Both are compiled natively (namespace native) and, for the tests, against
// emulated intrinsics (namespace emulated); see x86_intrinsics.hpp.
#pragma once

#include <cstdint>

#include "kernels/micro_kernels.hpp"
#include "kernels/x86_intrinsics.hpp"

#define GROUPLIN_AVX512 GROUPLIN_TARGET("avx512f,avx2,fma")

namespace grouplin::kernels::GROUPLIN_X86_NS {

// fma_rows_fp8 as MicroKernels documents it, with the AVX2 set's bits.
void fma_rows_fp8_avx512(int64_t rows, int64_t depth, const float* a, int64_t lda,
                         const Fp8Operand& b, int64_t cols, float* c, int64_t ldc);

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
