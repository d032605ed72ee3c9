// The AVX512-BF16 kernel set (x86-64 builds; see micro_kernels_x86.hpp): the AVX-512F set plus
// pair_tile, BF16 x BF16 products by vdpbf16ps. Each instruction multiplies, per 32-bit lane, one
// pair of BF16 values of A (broadcast: two adjacent depths of one row of x or dy, read in place)
// by the pair of B (the same two depths of one column, from a pair panel) and adds both products
// to the lane's F32 sum: the operands stay BF16 (half the bytes of widened ones through the
// registers) and one instruction does two multiply-adds per lane. The register tile is the F32
// set's: 6 rows x 4 strips of 16 columns, 24 zmm sums. dot_tile_pairs, for forward of experts
// with 1-6 rows, reads x's and the weights' rows along the depth, as they lie, one weight row at
// a time (one memory stream), and sums each element in four chains of 16 lanes: one load and one
// vdpbf16ps per 32 weights (1.4-2.8x the transposing kernel it replaced at 1-3 rows per expert,
// 2 threads of a Zen 4; tile_compute.hpp).
// dot_tile_fp8_pairs (added only where the CPU has AVX512-VBMI, add_fp8_pairs) does the same for
// FP8 weights: codes turned into BF16 by vpermi2b table lookups, each 128-depth block's sum
// scaled once; fma_rows_fp8_pairs does it for dgrad, whose pairs lie in two rows of codes.
//
// Each element's sum of pair_tile is one chain of vdpbf16ps over the pair rows in order, from c
// (accumulate) or +0; of dot_tile_pairs, four chains of 16 lanes added in a fixed tree
// (micro_kernels.hpp). The instruction rounds each of its two accumulations to nearest even and
// flushes denormal inputs and results to zero (Intel SDM, VDPBF16PS), so these results differ in
// the last bits from the F32 kernels on the widened values.
//
// Measured (docs/PERFORMANCE.md): on a Sapphire Rapids, 0.45-0.80x the AVX-512F set's widening
// kernels on BF16; on an AMD Zen 4, where vdpbf16ps does twice the multiply-adds of an F32 FMA
// in the same time, 1.2-1.9x (so isa.cpp prefers this set on AMD only). Tested under emulation
// (tests/kernels/emulated_kernels_test.cpp: SIMDe, with vdpbf16ps as the SDM's pseudo-code
// reads) and natively against the double-precision reference (on the Zen 4: passed).
//
// Only what this file defines goes into its object (see micro_kernels_avx512.cpp).
#include <algorithm>
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

// One element of dot_tile_pairs from its 16 lane sums: lanes l and l + 8 added, then l and l + 4,
// l and l + 2, l and l + 1. GCC 12's avx512fintrin.h casts and extracts 256-bit halves from an
// undefined vector, which -Wuninitialized reports at every use: silenced here only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
GROUPLIN_AVX512BF16 inline float sum_pair_lanes(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// One block of 32 depths (at a and w) of dot_pairs_fixed into its chain r: MR vdpbf16ps.
template <int MR>
GROUPLIN_AVX512BF16 inline void dot_pairs_block(const uint16_t* a, int64_t lda, const uint16_t* w,
                                                __m512 (*acc)[4], int r) {
  const __m512i wv = _mm512_loadu_si512(w);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i)
    acc[i][r] = dot_pairs(acc[i][r], _mm512_loadu_si512(a + i * lda), wv);
}

// MR rows of a against one row of w, both read along the depth, in the four chains of
// dot_tile_pairs (block g into chain g mod 4, so that four vdpbf16ps are in flight per row of
// a). The depths after the last whole block of 32 go through zero-padded copies (nothing past a
// row is read).
template <int MR>
GROUPLIN_AVX512BF16 void dot_pairs_fixed(int64_t kc, const uint16_t* a, int64_t lda,
                                         const uint16_t* w, float* c, int64_t ldc) {
  __m512 acc[MR][4];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm512_setzero_ps();
  }
  const int64_t blocks = kc / 32;
  int64_t g = 0;
  for (; g + 4 <= blocks; g += 4) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      dot_pairs_block<MR>(a + 32 * (g + r), lda, w + 32 * (g + r), acc, r);
  }
  // The last 0-3 whole blocks, then the ragged one, each into its chain g mod 4 (g mod 4 = 0 here).
#pragma GCC unroll 3
  for (int r = 0; r < 3; ++r) {
    if (g < blocks) {
      dot_pairs_block<MR>(a + 32 * g, lda, w + 32 * g, acc, r);
      ++g;
    }
  }
  if (32 * blocks < kc) {
    alignas(64) uint16_t at[MR][32] = {};
    alignas(64) uint16_t wt[32] = {};
    const size_t bytes = sizeof(uint16_t) * static_cast<size_t>(kc - 32 * blocks);
    for (int i = 0; i < MR; ++i) __builtin_memcpy(at[i], a + i * lda + 32 * blocks, bytes);
    __builtin_memcpy(wt, w + 32 * blocks, bytes);
    switch (blocks % 4) {
      case 0:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 0);
        break;
      case 1:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 1);
        break;
      case 2:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 2);
        break;
      default:
        dot_pairs_block<MR>(at[0], 32, wt, acc, 3);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    const __m512 sum =
        _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3]));
    c[i * ldc] = sum_pair_lanes(sum);
  }
}

// One weight row after another: each row's depth is one stream in memory (on a Zen 4 VM, two
// or four rows read side by side drew half the bandwidth of one).
void dot_tile_pairs_avx512bf16(int mr, int nr, int64_t kc, const uint16_t* a, int64_t lda,
                               const uint16_t* w, int64_t ldw, float* c, int64_t ldc) {
  using Fixed = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, float*, int64_t);
  constexpr Fixed kFixed[kPairDotRows] = {dot_pairs_fixed<1>, dot_pairs_fixed<2>,
                                          dot_pairs_fixed<3>, dot_pairs_fixed<4>,
                                          dot_pairs_fixed<5>, dot_pairs_fixed<6>};
  for (int j = 0; j < nr; ++j) kFixed[mr - 1](kc, a, lda, w + j * ldw, c + j, ldc);
}

// FP8 weights against BF16 rows (dot_tile_fp8_pairs): E4M3 codes become BF16 values by two
// byte-table lookups (vpermi2b, AVX512-VBMI), so that vdpbf16ps takes 32 weights per instruction
// where the F32 kernels decode, scale and multiply 16 at a time.
#define GROUPLIN_AVX512BF16_VBMI GROUPLIN_TARGET("avx512bf16,avx512vbmi,avx512bw,avx512f,avx2,fma")

// The BF16 bits of each E4M3 magnitude (a code's low 7 bits), high and low bytes apart: every
// E4M3 value is a BF16 value (subnormal codes become normal BF16 values), 0x7f is NaN.
struct Fp8Bf16Tables {
  alignas(64) uint8_t high[128];
  alignas(64) uint8_t low[128];
  alignas(64) uint8_t first[64];   // interleaves low and high bytes of codes 0-31 into words
  alignas(64) uint8_t second[64];  // ... and of codes 32-63
};
constexpr Fp8Bf16Tables make_fp8_bf16_tables() {
  Fp8Bf16Tables t{};
  for (int m = 0; m < 128; ++m) {
    const int e = m >> 3, f = m & 7;
    int bits = ((e + 120) << 7) | (f << 4);  // 2^(e - 7) x (1 + f / 8)
    if (m == 0x7f) {
      bits = 0x7fc0;
    } else if (e == 0) {  // f x 2^-9 = 2^(k - 9) x (f / 2^k), 2^k the top bit of f
      const int k = f >= 4 ? 2 : f >= 2 ? 1 : 0;
      bits = f == 0 ? 0 : ((118 + k) << 7) | ((f - (1 << k)) << (7 - k));
    }
    t.high[m] = static_cast<uint8_t>(bits >> 8);
    t.low[m] = static_cast<uint8_t>(bits & 0xff);
  }
  for (int i = 0; i < 32; ++i) {
    t.first[2 * i] = static_cast<uint8_t>(i);
    t.first[2 * i + 1] = static_cast<uint8_t>(64 + i);
    t.second[2 * i] = static_cast<uint8_t>(32 + i);
    t.second[2 * i + 1] = static_cast<uint8_t>(96 + i);
  }
  return t;
}
constexpr Fp8Bf16Tables kFp8Bf16 = make_fp8_bf16_tables();

struct Fp8Decoder {
  __m512i high0, high1, low0, low1, first, second, sign;
};
GROUPLIN_AVX512BF16_VBMI inline Fp8Decoder fp8_decoder() {
  return {_mm512_load_si512(kFp8Bf16.high),         _mm512_load_si512(kFp8Bf16.high + 64),
          _mm512_load_si512(kFp8Bf16.low),          _mm512_load_si512(kFp8Bf16.low + 64),
          _mm512_load_si512(kFp8Bf16.first),        _mm512_load_si512(kFp8Bf16.second),
          _mm512_set1_epi8(static_cast<char>(0x80))};
}

// The high and low bytes of the BF16 values of 64 codes, each in its code's byte.
GROUPLIN_AVX512BF16_VBMI inline void bf16_bytes(const Fp8Decoder& d, __m512i codes, __m512i& high,
                                                __m512i& low) {
  high = _mm512_permutex2var_epi8(d.high0, codes, d.high1);
  low = _mm512_permutex2var_epi8(d.low0, codes, d.low1);
  high = _mm512_ternarylogic_epi32(high, codes, d.sign, 0xf8);  // high | (codes & 0x80)
}

// 64 codes into 64 BF16 values in depth order, codes 0-31 in w0 and 32-63 in w1.
GROUPLIN_AVX512BF16_VBMI inline void decode_fp8_64(const Fp8Decoder& d, __m512i codes, __m512i& w0,
                                                   __m512i& w1) {
  __m512i high, low;
  bf16_bytes(d, codes, high, low);
  w0 = _mm512_permutex2var_epi8(low, d.first, high);
  w1 = _mm512_permutex2var_epi8(low, d.second, high);
}

// The first n bytes at p (n <= 64; none when n <= 0), zeros after: the last, partial block of
// a row without reading past it. SIMDe has no masked byte load: the emulated build copies.
#if defined(GROUPLIN_X86_EMULATED)
inline __m512i load_first_bytes(const void* p, int64_t n) {
  alignas(64) uint8_t t[64] = {};
  if (n > 0) __builtin_memcpy(t, p, static_cast<size_t>(std::min<int64_t>(n, 64)));
  return _mm512_load_si512(t);
}
#else
GROUPLIN_AVX512BF16_VBMI inline __m512i load_first_bytes(const void* p, int64_t n) {
  const __mmask64 m = n >= 64 ? ~__mmask64{0} : n <= 0 ? 0 : (__mmask64{1} << n) - 1;
  return _mm512_maskz_loadu_epi8(m, p);
}
#endif

// One block of kFp8Block depths (128 codes at `codes`, MR rows of a; with kPartial, only the
// first n depths, zeros after): per row, one vdpbf16ps chain over the block's four groups of 32
// depths from +0, then one fused multiply-add by the block's scale into the row's sums.
template <int MR, bool kPartial>
GROUPLIN_AVX512BF16_VBMI inline void fp8_pairs_block(const Fp8Decoder& d, const uint16_t* a,
                                                     int64_t lda, const uint8_t* codes, int64_t n,
                                                     float scale, __m512* acc) {
  __m512i w[4];
  decode_fp8_64(d, kPartial ? load_first_bytes(codes, n) : _mm512_loadu_si512(codes), w[0], w[1]);
  decode_fp8_64(d, kPartial ? load_first_bytes(codes + 64, n - 64) : _mm512_loadu_si512(codes + 64),
                w[2], w[3]);
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    __m512 t = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const uint16_t* ak = a + i * lda + 32 * k;
      t = dot_pairs(t, kPartial ? load_first_bytes(ak, 2 * (n - 32 * k)) : _mm512_loadu_si512(ak),
                    w[k]);
    }
    acc[i] = _mm512_fmadd_ps(t, s, acc[i]);
  }
}

// MR rows of a against one row of codes (its block scales at `scales`, one per kFp8Block
// depths).
template <int MR>
GROUPLIN_AVX512BF16_VBMI void fp8_pairs_fixed(int64_t kc, const uint16_t* a, int64_t lda,
                                              const uint8_t* codes, const float* scales, float* c,
                                              int64_t ldc) {
  const Fp8Decoder d = fp8_decoder();
  __m512 acc[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t blocks = kc / kFp8Block;
  for (int64_t q = 0; q < blocks; ++q) {
    fp8_pairs_block<MR, false>(d, a + kFp8Block * q, lda, codes + kFp8Block * q, kFp8Block,
                               scales[q], acc);
  }
  if (kFp8Block * blocks < kc) {
    fp8_pairs_block<MR, true>(d, a + kFp8Block * blocks, lda, codes + kFp8Block * blocks,
                              kc - kFp8Block * blocks, scales[blocks], acc);
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) c[i * ldc] = sum_pair_lanes(acc[i]);
}

// One weight row after another (one memory stream), all rows of a at once (each code decoded
// once).
void dot_tile_fp8_pairs_avx512bf16(int mr, int nr, int64_t kc, const uint16_t* a, int64_t lda,
                                   const Fp8Operand& b, float* c, int64_t ldc) {
  using Fixed =
      void (*)(int64_t, const uint16_t*, int64_t, const uint8_t*, const float*, float*, int64_t);
  constexpr Fixed kFixed[kPairDotRows] = {fp8_pairs_fixed<1>, fp8_pairs_fixed<2>,
                                          fp8_pairs_fixed<3>, fp8_pairs_fixed<4>,
                                          fp8_pairs_fixed<5>, fp8_pairs_fixed<6>};
  for (int j = 0; j < nr; ++j) {
    const float* scales = b.scales + (b.row0 + j) / kFp8Block * b.scale_ld + b.col0 / kFp8Block;
    kFixed[mr - 1](kc, a, lda, b.codes + j * b.ld, scales, c + j, ldc);
  }
}

// dgrad on FP8 weights (fma_rows_fp8_pairs): the pairs vdpbf16ps takes run down the weights'
// columns (depths p and p + 1 of one column are in two rows), so two code rows are interleaved
// byte by byte before the table lookups, and the lookups' low and high bytes interleaved again
// into dwords. Unpacking works within 128-bit lanes, so the columns come out turned: dword
// 4k + i of register m holds column 16k + 4m + i of the 64 (unturn_columns puts them back).
GROUPLIN_AVX512BF16_VBMI inline void decode_fp8_row_pairs(const Fp8Decoder& d, __m512i p, __m512i q,
                                                          __m512i (&w)[4]) {
  const __m512i x[2] = {_mm512_unpacklo_epi8(p, q), _mm512_unpackhi_epi8(p, q)};
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m512i high, low;
    bf16_bytes(d, x[h], high, low);
    w[2 * h] = _mm512_unpacklo_epi8(low, high);
    w[2 * h + 1] = _mm512_unpackhi_epi8(low, high);
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The four registers of decode_fp8_row_pairs' column order back in column order (a transpose of
// 4 x 4 blocks of 128 bits): o[k] holds columns 16k..16k + 15. By shuffle_i32x4, which SIMDe
// emulates (it lacks the f32x4 form); GCC 12's merges into an undefined vector, which
// -Wmaybe-uninitialized reports (as at sum_pair_lanes).
GROUPLIN_AVX512BF16_VBMI inline void unturn_columns(const __m512 (&t)[4], __m512 (&o)[4]) {
  const __m512i t0 = _mm512_castps_si512(t[0]), t1 = _mm512_castps_si512(t[1]);
  const __m512i t2 = _mm512_castps_si512(t[2]), t3 = _mm512_castps_si512(t[3]);
  const __m512i u0 = _mm512_shuffle_i32x4(t0, t1, 0x44), u1 = _mm512_shuffle_i32x4(t0, t1, 0xee);
  const __m512i u2 = _mm512_shuffle_i32x4(t2, t3, 0x44), u3 = _mm512_shuffle_i32x4(t2, t3, 0xee);
  o[0] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(u0, u2, 0x88));
  o[1] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(u0, u2, 0xdd));
  o[2] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(u1, u3, 0x88));
  o[3] = _mm512_castsi512_ps(_mm512_shuffle_i32x4(u1, u3, 0xdd));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// c[0, n) = fma(t, scale, c[0, n)) (first: fma(t, scale, +0)), n <= 16; a partial strip through a
// copy (SIMDe has no masked loads and stores of floats).
template <bool kPartial>
GROUPLIN_AVX512BF16_VBMI inline void scale_into(float* c, int64_t n, __m512 t, float scale,
                                                bool first) {
  if (!kPartial) {
    const __m512 old = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c);
    _mm512_storeu_ps(c, _mm512_fmadd_ps(t, _mm512_set1_ps(scale), old));
    return;
  }
  alignas(64) float buf[16] = {};
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  if (!first) __builtin_memcpy(buf, c, bytes);
  _mm512_store_ps(buf, _mm512_fmadd_ps(t, _mm512_set1_ps(scale), _mm512_load_ps(buf)));
  __builtin_memcpy(c, buf, bytes);
}

// The lines of one block of code rows (its rows x the call's columns) in address order, a line
// per step: while a block is read down its columns, 64 at a time (the chains stay in registers),
// the next one is prefetched along its rows, as one stream. On a Zen 4 (2 threads) reading down
// the columns with only the same rows' next 64 columns prefetched ran 0.7-1.3x the dequantizing
// kernel on weights from memory (128 rows in flight at once); the chains kept in memory
// instead, to read along the rows, 0.5-0.9x (two loads and a store per vdpbf16ps); this
// stream, 1.3-2.6x (docs/PERFORMANCE.md).
struct BlockPrefetch {
  const uint8_t* row;
  int64_t ld, bytes, rows;
  int64_t at = 0;
  GROUPLIN_AVX512BF16_VBMI inline void step() {
    if (rows <= 0) return;
    __builtin_prefetch(row + at);
    at += 64;
    if (at >= bytes) {
      at = 0;
      row += ld;
      --rows;
    }
  }
};

// Depths p0..p1 (one block) of the group of 64 columns from column j of b (kPartial: its first
// n, zero codes after, nothing past them read or written) of fma_rows_fp8_pairs for MR rows of
// a: the chains over the block's pairs from +0, turned back into column order, scaled into c.
template <int MR, bool kPartial>
GROUPLIN_AVX512BF16_VBMI void fp8_row_pairs_group(const Fp8Decoder& d, int64_t p0, int64_t p1,
                                                  int64_t depth, const uint16_t* a, int64_t lda,
                                                  const Fp8Operand& b, int64_t j, int64_t n,
                                                  float* c, int64_t ldc, BlockPrefetch& ahead) {
  const uint8_t* codes = b.codes + p0 * b.ld + j;
  __m512 t[MR][4];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int m = 0; m < 4; ++m) t[i][m] = _mm512_setzero_ps();
  }
  for (int64_t p = p0; p < p1; p += 2) {
    const bool last_odd = p + 1 == depth;
    const uint8_t* row = codes + (p - p0) * b.ld;
    const __m512i cp = kPartial ? load_first_bytes(row, n) : _mm512_loadu_si512(row);
    const __m512i cq = last_odd   ? _mm512_setzero_si512()
                       : kPartial ? load_first_bytes(row + b.ld, n)
                                  : _mm512_loadu_si512(row + b.ld);
    ahead.step();
    ahead.step();
    __m512i w[4];
    decode_fp8_row_pairs(d, cp, cq, w);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512i av = broadcast_pair(a + i * lda, p / 2, last_odd);
#pragma GCC unroll 4
      for (int m = 0; m < 4; ++m) t[i][m] = dot_pairs(t[i][m], av, w[m]);
    }
  }
  const float* scales = b.scales + (b.row0 + p0) / kFp8Block * b.scale_ld;
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    __m512 o[4];
    unturn_columns(t[i], o);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      if (kPartial && 16 * k >= n) break;
      const float scale = scales[(b.col0 + j + 16 * k) / kFp8Block];
      const int64_t width = kPartial ? std::min<int64_t>(16, n - 16 * k) : 16;
      scale_into<kPartial>(c + i * ldc + j + 16 * k, width, o[k], scale, p0 == 0);
    }
  }
}

template <int MR>
GROUPLIN_AVX512BF16_VBMI void fp8_row_pairs_fixed(int64_t depth, const uint16_t* a, int64_t lda,
                                                  const Fp8Operand& b, int64_t cols, float* c,
                                                  int64_t ldc) {
  const Fp8Decoder d = fp8_decoder();
  for (int64_t p0 = 0; p0 < depth; p0 += kFp8Block) {
    const int64_t p1 = std::min(depth, p0 + kFp8Block);
    BlockPrefetch ahead{b.codes + p1 * b.ld, b.ld, cols, std::min(kFp8Block, depth - p1)};
    if (p1 == depth && b.ahead != nullptr)
      ahead = {b.ahead, b.ld, cols, std::min(kFp8Block, depth)};
    int64_t j = 0;
    for (; j + 64 <= cols; j += 64)
      fp8_row_pairs_group<MR, false>(d, p0, p1, depth, a, lda, b, j, 64, c, ldc, ahead);
    if (j < cols)
      fp8_row_pairs_group<MR, true>(d, p0, p1, depth, a, lda, b, j, cols - j, c, ldc, ahead);
  }
}

// A depth block at a time, its columns in groups of 64 (every code decoded once).
void fma_rows_fp8_pairs_avx512bf16(int rows, int64_t depth, const uint16_t* a, int64_t lda,
                                   const Fp8Operand& b, int64_t cols, float* c, int64_t ldc) {
  using Fixed =
      void (*)(int64_t, const uint16_t*, int64_t, const Fp8Operand&, int64_t, float*, int64_t);
  constexpr Fixed kFixed[kFp8PairRows] = {fp8_row_pairs_fixed<1>, fp8_row_pairs_fixed<2>,
                                          fp8_row_pairs_fixed<3>, fp8_row_pairs_fixed<4>};
  kFixed[rows - 1](depth, a, lda, b, cols, c, ldc);
}

}  // namespace

void add_avx512bf16(MicroKernels& set) {
  set.pair_tile = pair_tile_avx512bf16;
  set.dot_tile_pairs = dot_tile_pairs_avx512bf16;
  set.pair_rows = kOuterRows;
  set.pair_strips = kMaxStrips;
  set.name = "avx512bf16";
}

void add_fp8_pairs(MicroKernels& set) {
  set.dot_tile_fp8_pairs = dot_tile_fp8_pairs_avx512bf16;
  set.fma_rows_fp8_pairs = fma_rows_fp8_pairs_avx512bf16;
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
