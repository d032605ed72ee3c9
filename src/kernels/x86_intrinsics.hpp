// Private: the intrinsics of the AVX-512 and AMX kernel files, native or emulated.
//
// Native builds (the library) include <immintrin.h> and compile each kernel function for its
// instruction set with GROUPLIN_TARGET(...); the kernels live in namespace `native`. The tests
// compile the same files with GROUPLIN_X86_EMULATED defined, which includes
// tests/kernels/x86_emulation.hpp instead (SIMDe's portable AVX-512, an exact vdpbf16ps and a
// scalar AMX tile emulator) and puts the kernels in namespace `emulated`.
#pragma once

#if defined(GROUPLIN_X86_EMULATED)
#include "x86_emulation.hpp"
#define GROUPLIN_TARGET(features)
#define GROUPLIN_X86_NS emulated
#else
#include <immintrin.h>
#define GROUPLIN_TARGET(features) __attribute__((target(features)))
#define GROUPLIN_X86_NS native
#endif
