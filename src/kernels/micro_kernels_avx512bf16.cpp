// The AVX512-BF16 kernel set (x86-64 builds; see micro_kernels_x86.hpp): the AVX-512F set plus
// pair_tile, BF16 x BF16 products by vdpbf16ps. Each instruction multiplies, per 32-bit lane, one
// pair of BF16 values of A (broadcast: two adjacent depths of one row of x or dy, read in place)
// by the pair of B (the same two depths of one column, from a pair panel) and adds both products
// to the lane's F32 sum: the operands stay BF16 (half the bytes of widened ones through the
// registers) and one instruction does two multiply-adds per lane. The register tile is the F32
// set's: 6 rows x 4 strips of 16 columns, 24 zmm sums. pair_tile_rows, for forward of experts
// with 1-3 rows, reads B from the weights' rows in place, transposing 16 x 16 dword blocks in
// registers instead of packing them (same chain, same bits).
//
// Each element's sum is one chain of vdpbf16ps over the pair rows in order, from c (accumulate)
// or +0. The instruction rounds each of its two accumulations to nearest even and flushes
// denormal inputs and results to zero (Intel SDM, VDPBF16PS), so these results differ in the last
// bits from the F32 kernels on the widened values.
//
// Measured (docs/PERFORMANCE.md): on a Sapphire Rapids, 0.45-0.80x the AVX-512F set's widening
// kernels on BF16; on an AMD Zen 4, where vdpbf16ps does twice the multiply-adds of an F32 FMA
// in the same time, 1.2-1.9x (so isa.cpp prefers this set on AMD only). Tested under emulation
// (tests/kernels/emulated_kernels_test.cpp: SIMDe, with vdpbf16ps as the SDM's pseudo-code
// reads) and natively against the double-precision reference (on the Zen 4: passed).
//
// Only what this file defines goes into its object (see micro_kernels_avx512.cpp).
#include <cstdint>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

#define GROUPLIN_AVX512BF16 GROUPLIN_TARGET("avx512bf16,avx512f,avx2,fma")

#if defined(GROUPLIN_X86_EMULATED)
GROUPLIN_AVX512BF16 inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return emulated_dpbf16_ps(acc, a, b);
}
#else
GROUPLIN_AVX512BF16 inline __m512 dot_pairs(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
#endif

// The dword of A's pair row q of row a: depths 2q (low half) and 2q + 1; with `last_odd`, only
// depth 2q exists (the high half is +0 and nothing past it is read).
GROUPLIN_AVX512BF16 inline __m512i broadcast_pair(const uint16_t* a, int64_t q, bool last_odd) {
  uint32_t pair = a[2 * q];
  if (!last_odd) __builtin_memcpy(&pair, a + 2 * q, sizeof pair);
  return _mm512_set1_epi32(static_cast<int>(pair));
}

// MR rows x NS strips, one vdpbf16ps chain per element over the pair rows in order.
template <int MR, int NS>
GROUPLIN_AVX512BF16 void pair_fixed(int64_t kc, const uint16_t* a, int64_t lda, const uint32_t* b,
                                    int64_t b_strip, float* c, int64_t ldc, bool accumulate) {
  __m512 acc[MR][NS];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s)
      acc[i][s] = accumulate ? _mm512_loadu_ps(c + i * ldc + 16 * s) : _mm512_setzero_ps();
  }
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t q = 0; q < pairs; ++q) {
    const bool last_odd = 2 * q + 1 == kc;
    __m512i bv[NS];
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) bv[s] = _mm512_loadu_si512(b + s * b_strip + q * 16);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512i av = broadcast_pair(a + i * lda, q, last_odd);
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) acc[i][s] = dot_pairs(acc[i][s], av, bv[s]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) _mm512_storeu_ps(c + i * ldc + 16 * s, acc[i][s]);
  }
}

using PairFixed = void (*)(int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t, float*,
                           int64_t, bool);

template <int NS>
constexpr PairFixed kByRows[kOuterRows] = {pair_fixed<1, NS>, pair_fixed<2, NS>, pair_fixed<3, NS>,
                                           pair_fixed<4, NS>, pair_fixed<5, NS>, pair_fixed<6, NS>};

void pair_tile_avx512bf16(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                          const uint32_t* b, int64_t b_strip, float* c, int64_t ldc,
                          bool accumulate) {
  const PairFixed* by_rows = strips == 1   ? kByRows<1>
                             : strips == 2 ? kByRows<2>
                             : strips == 3 ? kByRows<3>
                                           : kByRows<4>;
  by_rows[mr - 1](kc, a, lda, b, b_strip, c, ldc, accumulate);
}

// B's pair row q from `n` rows of w read in place, one scalar dword per row: lane j the dword of
// w[j * ldw + 2q] (low half) and w[j * ldw + 2q + 1] (high; +0 with `last_odd`, and not read),
// 0 past n. For the depths after the last whole block of 32.
GROUPLIN_AVX512BF16 inline __m512i pair_row_of(const uint16_t* w, int64_t ldw, int n, int64_t q,
                                               bool last_odd) {
  alignas(64) uint32_t v[16] = {};
  for (int j = 0; j < n; ++j) {
    const uint16_t* p = w + j * ldw + 2 * q;
    if (last_odd) {
      v[j] = p[0];
    } else {
      __builtin_memcpy(&v[j], p, sizeof v[j]);
    }
  }
  return _mm512_load_si512(v);
}

// r[j] (16 dwords of row j) -> r[q] (dword q of every row): a 16 x 16 dword transpose in
// registers, by 32-bit and 64-bit unpacks within 128-bit lanes, then two rounds of lane shuffles.
// GCC 12's avx512fintrin.h passes an undefined vector as the unused merge source of these
// unpacks, which -Wmaybe-uninitialized reports at every use: silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
GROUPLIN_AVX512BF16 inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  // u[4k + c], 128-bit lane L: dword 4L + c of rows 4k..4k+3.
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// MR rows x one strip over the whole depth, B read from the weights' rows in place: blocks of 16
// pair rows (32 depths) loaded one weight row per register and transposed, then pair_fixed's
// chain, element by element, over the pair rows in order.
template <int MR>
GROUPLIN_AVX512BF16 void pair_rows_fixed(int n, int64_t kc, const uint16_t* a, int64_t lda,
                                         const uint16_t* w, int64_t ldw, float* c, int64_t ldc) {
  __m512 acc[MR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t pairs = (kc + 1) / 2, whole = kc / 32 * 16;
  for (int64_t q0 = 0; q0 < whole; q0 += 16) {
    __m512i b[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      b[j] = j < n ? _mm512_loadu_si512(w + j * ldw + 2 * q0) : _mm512_setzero_si512();
    }
    transpose16(b);
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) {
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        acc[i] = dot_pairs(acc[i], broadcast_pair(a + i * lda, q0 + q, false), b[q]);
      }
    }
  }
  for (int64_t q = whole; q < pairs; ++q) {
    const bool last_odd = 2 * q + 1 == kc;
    const __m512i bv = pair_row_of(w, ldw, n, q, last_odd);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      acc[i] = dot_pairs(acc[i], broadcast_pair(a + i * lda, q, last_odd), bv);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) _mm512_storeu_ps(c + i * ldc, acc[i]);
}

void pair_tile_rows_avx512bf16(int mr, int cols, int64_t kc, const uint16_t* a, int64_t lda,
                               const uint16_t* w, int64_t ldw, float* c, int64_t ldc) {
  using Fixed =
      void (*)(int, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);
  constexpr Fixed kFixed[4] = {pair_rows_fixed<1>, pair_rows_fixed<2>, pair_rows_fixed<3>,
                               pair_rows_fixed<4>};
  kFixed[mr - 1](cols, kc, a, lda, w, ldw, c, ldc);
}

}  // namespace

void add_avx512bf16(MicroKernels& set) {
  set.pair_tile = pair_tile_avx512bf16;
  set.pair_tile_rows = pair_tile_rows_avx512bf16;
  set.pair_rows = kOuterRows;
  set.pair_strips = kMaxStrips;
  set.name = "avx512bf16";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
