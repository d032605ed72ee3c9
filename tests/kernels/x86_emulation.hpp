// Test-only: the intrinsics of the AVX-512 and AMX kernel files on a CPU with AVX2 and FMA, so
// that the tests run those files' logic on machines without AVX-512 or AMX
// (src/kernels/x86_intrinsics.hpp includes this with GROUPLIN_X86_EMULATED).
//
// - SIMDe 0.7.4 (Debian libsimde-dev) for the AVX-512F intrinsics. Its _mm512_fmadd_ps is exact
//   (fused) only on a native 256-bit FMA, hence the -mavx2 -mfma this file requires; everything
//   else used is data movement or exact integer arithmetic.
// - The few AVX-512F intrinsics that SIMDe 0.7.4 lacks (masked loads and stores, the masked
//   widening and shift), as exact scalar loops.
// - vdpbf16ps as the Intel SDM's pseudo-code reads (emulated_dpbf16_ps below; SIMDe's version
//   adds the even product first and keeps denormals).
// - The AMX tile intrinsics: amx_emulator.hpp.
//
// The emulation gives the instructions' documented results; it says nothing about their speed.
#pragma once

#if !defined(__AVX2__) || !defined(__FMA__)
#error "the emulated kernels need -mavx2 -mfma: SIMDe's _mm512_fmadd_ps fuses only on native FMA"
#endif

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx_emulator.hpp"
#include "bf16_dot_semantics.hpp"
#include "emulated_kernels.hpp"

namespace grouplin::kernels::emulated {

// The 16 lanes of an AVX-512 register as plain arrays, exactly.
inline void lanes_of(__m512 v, float out[16]) { _mm512_storeu_ps(out, v); }
inline void lanes_of(__m512i v, uint32_t out[16]) { _mm512_storeu_si512(out, v); }

inline __m512 emulated_maskz_loadu_ps(uint16_t k, const void* p) {
  float v[16] = {};
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1) std::memcpy(&v[i], static_cast<const float*>(p) + i, sizeof(float));
  }
  return _mm512_loadu_ps(v);
}

inline void emulated_mask_storeu_ps(void* p, uint16_t k, __m512 a) {
  float v[16];
  lanes_of(a, v);
  for (int i = 0; i < 16; ++i) {
    if ((k >> i) & 1) std::memcpy(static_cast<float*>(p) + i, &v[i], sizeof(float));
  }
}

inline __m512i emulated_maskz_cvtepu16_epi32(uint16_t k, __m256i a) {
  uint16_t in[16];
  std::memcpy(in, &a, sizeof in);
  uint32_t out[16];
  for (int i = 0; i < 16; ++i) out[i] = ((k >> i) & 1) ? in[i] : 0;
  return _mm512_loadu_si512(out);
}

inline __m512i emulated_maskz_cvtepi8_epi32(uint16_t k, __m128i a) {
  int8_t in[16];
  std::memcpy(in, &a, sizeof in);
  int32_t out[16];
  for (int i = 0; i < 16; ++i) out[i] = ((k >> i) & 1) ? in[i] : 0;
  return _mm512_loadu_si512(out);
}

inline __m512i emulated_maskz_slli_epi32(uint16_t k, __m512i a, unsigned shift) {
  uint32_t v[16];
  lanes_of(a, v);
  for (int i = 0; i < 16; ++i) v[i] = ((k >> i) & 1) && shift < 32 ? v[i] << shift : 0;
  return _mm512_loadu_si512(v);
}

inline __m512 emulated_dpbf16_ps(__m512 acc, __m512i a, __m512i b) {
  float sums[16];
  uint32_t av[16], bv[16];
  lanes_of(acc, sums);
  lanes_of(a, av);
  lanes_of(b, bv);
  for (int i = 0; i < 16; ++i) sums[i] = dpbf16_lane(sums[i], av[i], bv[i]);
  return _mm512_loadu_ps(sums);
}

inline __m256 emulated_dpbf16_ps256(__m256 acc, __m256i a, __m256i b) {
  float sums[8];
  uint32_t av[8], bv[8];
  std::memcpy(sums, &acc, sizeof sums);
  std::memcpy(av, &a, sizeof av);
  std::memcpy(bv, &b, sizeof bv);
  for (int i = 0; i < 8; ++i) sums[i] = dpbf16_lane(sums[i], av[i], bv[i]);
  return _mm256_loadu_ps(sums);
}

}  // namespace grouplin::kernels::emulated

// SIMDe has no non-temporal 512-bit store; in memory it is a plain one.
#define _mm512_stream_ps(p, a) _mm512_storeu_ps(p, a)
#define _mm512_stream_si512(p, a) _mm512_storeu_si512(p, a)
#define _mm512_maskz_loadu_ps(k, p) grouplin::kernels::emulated::emulated_maskz_loadu_ps(k, p)
#define _mm512_mask_storeu_ps(p, k, a) grouplin::kernels::emulated::emulated_mask_storeu_ps(p, k, a)
#define _mm512_maskz_cvtepu16_epi32(k, a) \
  grouplin::kernels::emulated::emulated_maskz_cvtepu16_epi32(k, a)
#define _mm512_maskz_cvtepi8_epi32(k, a) \
  grouplin::kernels::emulated::emulated_maskz_cvtepi8_epi32(k, a)
#define _mm512_maskz_slli_epi32(k, a, shift) \
  grouplin::kernels::emulated::emulated_maskz_slli_epi32(k, a, shift)
