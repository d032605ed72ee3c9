// The FP8 pair kernels of the AVX512-BF16 set (add_fp8_pairs, only where the CPU also has
// AVX512-VBMI; see micro_kernels_x86.hpp): FP8 weights beside BF16 activations, each E4M3 code
// turned into its BF16 value (exact) by vpermi2b table lookups, so that vdpbf16ps takes 32
// weights per instruction, and each 128 x 128 block's sums scaled once, as block-scaled FP8 GEMMs
// do. dot_tile_fp8_pairs (forward of experts of a few rows) reads code rows along the depth;
// fma_rows_fp8_pairs (dgrad of a few rows) reads them down the columns, two rows interleaved;
// decode_fp8_bf16 turns codes into BF16 rows for the pair panels of pair_tile_scaled (more rows).
// Their orders are micro_kernels.hpp's, modelled bit for bit in the tests (emulated and native).
//
// Only what this file defines goes into its object (see micro_kernels_avx512.cpp).
#include <algorithm>
#include <cstdint>

#include "kernels/micro_kernels_avx512bf16.hpp"
#include "kernels/micro_kernels_x86.hpp"
#include "kernels/rows_ahead.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

// FP8 weights against BF16 rows (dot_tile_fp8_pairs): E4M3 codes become BF16 values by two
// byte-table lookups (vpermi2b, AVX512-VBMI), so that vdpbf16ps takes 32 weights per instruction
// where the F32 kernels decode, scale and multiply 16 at a time.

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
                                              int64_t ldc, RowsAhead& ahead) {
  const Fp8Decoder d = fp8_decoder();
  __m512 acc[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t blocks = kc / kFp8Block;
  for (int64_t q = 0; q < blocks; ++q) {
    if constexpr (MR >= kDotAheadMinRows) {
      ahead.step();
      ahead.step();
    }
    fp8_pairs_block<MR, false>(d, a + kFp8Block * q, lda, codes + kFp8Block * q, kFp8Block,
                               scales[q], acc);
  }
  if (kFp8Block * blocks < kc) {
    if constexpr (MR >= kDotAheadMinRows) {
      ahead.step();
      if (kc - kFp8Block * blocks > 64) ahead.step();
    }
    fp8_pairs_block<MR, true>(d, a + kFp8Block * blocks, lda, codes + kFp8Block * blocks,
                              kc - kFp8Block * blocks, scales[blocks], acc);
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) c[i * ldc] = sum_pair_lanes(acc[i]);
}

// One weight row after another (one memory stream), all rows of a at once (each code decoded
// once), the rows ahead prefetched (rows_ahead.hpp).
void dot_tile_fp8_pairs_avx512bf16(int mr, int nr, int64_t kc, const uint16_t* a, int64_t lda,
                                   const Fp8Operand& b, float* c, int64_t ldc) {
  using Fixed = void (*)(int64_t, const uint16_t*, int64_t, const uint8_t*, const float*, float*,
                         int64_t, RowsAhead&);
  constexpr Fixed kFixed[kPairDotRows] = {fp8_pairs_fixed<1>, fp8_pairs_fixed<2>,
                                          fp8_pairs_fixed<3>, fp8_pairs_fixed<4>,
                                          fp8_pairs_fixed<5>, fp8_pairs_fixed<6>};
  RowsAhead ahead(b.codes, b.ld, kc, nr, kDotAheadBytes);
  for (int j = 0; j < nr; ++j) {
    const float* scales = b.scales + (b.row0 + j) / kFp8Block * b.scale_ld + b.col0 / kFp8Block;
    kFixed[mr - 1](kc, a, lda, b.codes + j * b.ld, scales, c + j, ldc, ahead);
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

// fma_rows_fp8_pairs walks the lines of the next block of code rows (its rows x the call's
// columns, RowsAhead from the block's start) a line per step: while a block is read down its
// columns, 64 at a time (the chains stay in registers), the next one is prefetched along its rows,
// as one stream: faster than prefetching only the same rows' next 64 columns (128 rows in flight
// at once) and than keeping the chains in memory to read along the rows (two loads and a store
// per vdpbf16ps); docs/PERFORMANCE.md.

// Depths p0..p1 (one block) of the group of 64 columns from column j of b (kPartial: its first
// n, zero codes after, nothing past them read or written) of fma_rows_fp8_pairs for MR rows of
// a: the chains over the block's pairs from +0, turned back into column order, scaled into c.
template <int MR, bool kPartial>
GROUPLIN_AVX512BF16_VBMI void fp8_row_pairs_group(const Fp8Decoder& d, int64_t p0, int64_t p1,
                                                  int64_t depth, const uint16_t* a, int64_t lda,
                                                  const Fp8Operand& b, int64_t j, int64_t n,
                                                  float* c, int64_t ldc, RowsAhead& ahead) {
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
    const uint8_t* next = p1 < depth ? b.codes + p1 * b.ld : b.ahead;
    RowsAhead ahead(next, b.ld, cols,
                    next == nullptr ? 0 : std::min(kFp8Block, p1 < depth ? depth - p1 : depth), 0);
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

// 64 codes per step (two lookups and two interleaves); the last, partial step through a copy.
GROUPLIN_AVX512BF16_VBMI void decode_fp8_bf16_avx512bf16(const uint8_t* src, uint16_t* dst,
                                                         int64_t n) {
  const Fp8Decoder d = fp8_decoder();
  __m512i w0, w1;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    decode_fp8_64(d, _mm512_loadu_si512(src + i), w0, w1);
    _mm512_storeu_si512(dst + i, w0);
    _mm512_storeu_si512(dst + i + 32, w1);
  }
  if (i < n) {
    alignas(64) uint16_t t[64];
    decode_fp8_64(d, load_first_bytes(src + i, n - i), w0, w1);
    _mm512_store_si512(t, w0);
    _mm512_store_si512(t + 32, w1);
    __builtin_memcpy(dst + i, t, sizeof(uint16_t) * static_cast<size_t>(n - i));
  }
}

}  // namespace

void add_fp8_pairs(MicroKernels& set) {
  set.dot_tile_fp8_pairs = dot_tile_fp8_pairs_avx512bf16;
  set.fma_rows_fp8_pairs = fma_rows_fp8_pairs_avx512bf16;
  set.decode_fp8_bf16 = decode_fp8_bf16_avx512bf16;
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
