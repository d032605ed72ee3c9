// The AVX2+FMA kernel set (x86-64 builds; see micro_kernels_x86.hpp): 8-lane registers, 16 ymm.
// Each function is compiled for AVX2+FMA by a target attribute, the rest of the library stays
// baseline x86-64; the set is chosen at run time (micro_kernels.cpp). Its F32 results are the
// reference the AVX-512 sets reproduce bit for bit; the ragged ends of the data-movement loops
// reuse the portable set. Its FP8 kernels are in micro_kernels_avx2_fp8.cpp.
#include "kernels/micro_kernels_avx2.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "grouplin/dtype.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/micro_kernels_x86.hpp"

namespace grouplin::kernels::native {
namespace {

// The register tile: MR x NR accumulators of 8 lanes (12 + 3 + 1 of the 16 ymm registers at
// 4 x 3). Tail lanes load as zero from both operands, so they add exact zeros.
// 8 values of B from b[k] on: F32, or BF16 bits widened in registers.
template <bool kBf16>
GROUPLIN_AVX2 inline __m256 load_b8(const void* b, int64_t k) {
  if constexpr (kBf16) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(b) + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(b) + k);
  }
}

// The first n (< 8) values of B from b[k] on, zero beyond.
template <bool kBf16>
GROUPLIN_AVX2 inline __m256 load_b_tail(const void* b, int64_t k, int64_t n, __m256i mask) {
  if constexpr (kBf16) {
    // Bit moves in line, no call: a call here (to the core's bf16_to_f32) made GCC keep the dot
    // tiles' accumulators on the stack through the whole loop, 3x slower for 1-3 rows.
    const uint16_t* src = static_cast<const uint16_t*>(b) + k;
    alignas(32) uint32_t bits[8] = {};
    for (int64_t i = 0; i < n; ++i) bits[i] = uint32_t{src[i]} << 16;
    return _mm256_load_ps(reinterpret_cast<const float*>(bits));
  } else {
    return _mm256_maskload_ps(static_cast<const float*>(b) + k, mask);
  }
}

// B is F32 or (kBf16) BF16 bits widened in registers.
template <int MR, int NR, bool kBf16>
GROUPLIN_AVX2 void dot_tile_avx2_fixed(int64_t kc, const float* a, int64_t lda, const void* b,
                                       int64_t ldb, float* c, int64_t ldc, const void* ahead) {
  const int64_t elem = kBf16 ? 2 : 4;
  const auto* bytes = static_cast<const std::byte*>(b);
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const auto* next = static_cast<const char*>(ahead);
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    if (next != nullptr && k * elem % 64 == 0) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) _mm_prefetch(next + (j * ldb + k) * elem, _MM_HINT_T0);
    }
    __m256 bv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) bv[j] = load_b8<kBf16>(bytes + j * ldb * elem, k);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_loadu_ps(a + i * lda + k);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  if (k < kc) {
    const __m256i mask = first_lanes(kc - k);
    __m256 bv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j)
      bv[j] = load_b_tail<kBf16>(bytes + j * ldb * elem, k, kc - k, mask);
    dot_tail_and_sums<MR, NR>(a, lda, k, mask, bv, acc, c, ldc);
  } else {
    dot_tail_and_sums<MR, NR>(a, lda, k, first_lanes(0), nullptr, acc, c, ldc);
  }
}

using DotFixed = void (*)(int64_t, const float*, int64_t, const void*, int64_t, float*, int64_t,
                          const void*);

template <int MR, bool kBf16>
constexpr DotFixed kDotRow[kDotCols] = {dot_tile_avx2_fixed<MR, 1, kBf16>,
                                        dot_tile_avx2_fixed<MR, 2, kBf16>,
                                        dot_tile_avx2_fixed<MR, 3, kBf16>};
template <bool kBf16>
constexpr const DotFixed* kDotTable[kDotRows] = {kDotRow<1, kBf16>, kDotRow<2, kBf16>,
                                                 kDotRow<3, kBf16>, kDotRow<4, kBf16>};

template <bool kBf16>
void dot_tile_avx2(int mr, int nr, int64_t kc, const float* a, int64_t lda, const void* b,
                   int64_t ldb, float* c, int64_t ldc, const void* ahead) {
  kDotTable<kBf16>[mr - 1][nr - 1](kc, a, lda, b, ldb, c, ldc, ahead);
}

// MR x NV accumulators of 8 lanes (12 at 6 x 2), NV loads of B and MR broadcasts of A per step.
// Instances for each row count, so that a ragged last panel costs only its own rows (with a
// 6-row kernel on a zero-padded copy, a 32-row tile ran 6 panels' work for 5 1/3 and copied), and
// for 8 columns, so that a panel with at most 8 valid columns costs half; packed A (a_row = 1,
// a_step = 6) gets its own instances with constant strides.
template <int MR, int NV, bool kPacked, bool kBf16>
GROUPLIN_AVX2 void outer_tile_avx2_impl(int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                                        const void* b, int64_t ldb, float* c, int64_t ldc,
                                        bool accumulate) {
  if constexpr (kPacked) {
    a_row = 1;
    a_step = kOuterRows;
  }
  const auto* b_bytes = static_cast<const std::byte*>(b);
  const int64_t b_row = ldb * (kBf16 ? 2 : 4);
  __m256 acc[MR][NV];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      acc[i][v] = accumulate ? _mm256_loadu_ps(c + i * ldc + 8 * v) : _mm256_setzero_ps();
  }
  const float* row[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) row[i] = a + i * a_row;
  for (int64_t p = 0; p < kc; ++p) {
    __m256 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) bv[v] = load_b8<kBf16>(b_bytes + p * b_row, 8 * v);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_broadcast_ss(row[i] + p * a_step);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(c + i * ldc + 8 * v, acc[i][v]);
  }
}

using OuterFixed = void (*)(int64_t, const float*, int64_t, int64_t, const void*, int64_t, float*,
                            int64_t, bool);
template <int NV, bool kPacked, bool kBf16>
constexpr OuterFixed kOuterRowsTable[kOuterRows] = {
    outer_tile_avx2_impl<1, NV, kPacked, kBf16>, outer_tile_avx2_impl<2, NV, kPacked, kBf16>,
    outer_tile_avx2_impl<3, NV, kPacked, kBf16>, outer_tile_avx2_impl<4, NV, kPacked, kBf16>,
    outer_tile_avx2_impl<5, NV, kPacked, kBf16>, outer_tile_avx2_impl<6, NV, kPacked, kBf16>};

template <bool kBf16>
const OuterFixed* outer_table(int nr, bool packed) {
  if (nr == 8) return packed ? kOuterRowsTable<1, true, kBf16> : kOuterRowsTable<1, false, kBf16>;
  return packed ? kOuterRowsTable<2, true, kBf16> : kOuterRowsTable<2, false, kBf16>;
}

template <bool kBf16>
void outer_tile_avx2(int mr, int nr, int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                     const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  const bool packed = a_row == 1 && a_step == kOuterRows;
  outer_table<kBf16>(nr, packed)[mr - 1](kc, a, a_row, a_step, b, ldb, c, ldc, accumulate);
}

// One 6 x 16 register tile at a time: 12 of the 16 ymm registers hold its sums, so wider tiles
// would spill.
template <bool kBf16>
void outer_strips_avx2(int mr, int strips, int64_t kc, const float* a, int64_t a_row,
                       int64_t a_step, const void* b, int64_t ldb, int64_t b_strip, float* c,
                       int64_t ldc, bool accumulate) {
  const int64_t elem = kBf16 ? 2 : 4;
  for (int s = 0; s < strips; ++s) {
    outer_tile_avx2<kBf16>(mr, kOuterCols, kc, a, a_row, a_step,
                           static_cast<const std::byte*>(b) + s * b_strip * elem, ldb,
                           c + s * kOuterCols, ldc, accumulate);
  }
}

// c[r] += a(r, p) * b[p] over 8-column vectors, b F32 or (kBf16) BF16 bits widened in registers;
// the ragged end uses masked loads and stores, so every element gets the same fused multiply-adds.
template <bool kBf16>
GROUPLIN_AVX2 inline void fma_row_avx2(float av_scalar, const void* bp, float* cr, int64_t full,
                                       int64_t cols, __m256i mask) {
  const __m256 av = _mm256_set1_ps(av_scalar);
  int64_t j = 0;
  for (; j + 32 <= full; j += 32) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      float* cv = cr + j + 8 * v;
      _mm256_storeu_ps(cv, _mm256_fmadd_ps(av, load_b8<kBf16>(bp, j + 8 * v), _mm256_loadu_ps(cv)));
    }
  }
  for (; j < full; j += 8) {
    _mm256_storeu_ps(cr + j, _mm256_fmadd_ps(av, load_b8<kBf16>(bp, j), _mm256_loadu_ps(cr + j)));
  }
  if (j < cols) {
    const __m256 sum = _mm256_fmadd_ps(av, load_b_tail<kBf16>(bp, j, cols - j, mask),
                                       _mm256_maskload_ps(cr + j, mask));
    _mm256_maskstore_ps(cr + j, mask, sum);
  }
}

// Each element's chain runs over p in order either way; the loop order only picks what stays in
// L1: with more depth than rows (dgrad) a row of b is read once for all rows of c, with more rows
// than depth (wgrad) a row of c stays while its few products are added.
template <bool kBf16>
GROUPLIN_AVX2 void fma_rows_avx2(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                 const void* b, int64_t ldb, int64_t cols, float* c, int64_t ldc) {
  const int64_t full = cols / 8 * 8;
  const __m256i mask = first_lanes(cols - full);
  const int64_t row_bytes = ldb * (kBf16 ? 2 : 4);
  const auto* bytes = static_cast<const std::byte*>(b);
  if (depth > rows) {
    for (int64_t p = 0; p < depth; ++p) {
      for (int64_t r = 0; r < rows; ++r)
        fma_row_avx2<kBf16>(a[r * lda + p], bytes + p * row_bytes, c + r * ldc, full, cols, mask);
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t p = 0; p < depth; ++p)
        fma_row_avx2<kBf16>(a[r * lda + p], bytes + p * row_bytes, c + r * ldc, full, cols, mask);
    }
  }
}

template <bool kBf16>
constexpr F32Products kProducts = {.dot_tile = dot_tile_avx2<kBf16>,
                                   .dot_tile_wide = nullptr,
                                   .outer_tile = outer_tile_avx2<kBf16>,
                                   .outer_strips = outer_strips_avx2<kBf16>,
                                   .fma_rows = fma_rows_avx2<kBf16>,
                                   .fma_rows_steps = 1};

// Rounds the eight floats of `bits` to BF16 (nearest even) in the low halves of 32-bit lanes;
// NaN lanes only where `any_nan` (checked once per 16 values: rare, and the blend costs a third
// of the loop).
GROUPLIN_AVX2 inline __m256i round_to_bf16(__m256i bits, bool any_nan) {
  const __m256i high = _mm256_srli_epi32(bits, 16);
  const __m256i lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  if (!any_nan) return rounded;
  const __m256i nan =
      _mm256_or_si256(_mm256_and_si256(high, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, nan, is_nan);
}

// 16 floats from src rounded to BF16, in order.
GROUPLIN_AVX2 inline __m256i narrow16(const float* src) {
  const __m256 lo_f = _mm256_loadu_ps(src), hi_f = _mm256_loadu_ps(src + 8);
  // One unordered compare finds a NaN in either half (five integer steps did before, slower).
  const __m256 nan_lanes = _mm256_cmp_ps(lo_f, hi_f, _CMP_UNORD_Q);
  const bool any_nan = !_mm256_testz_ps(nan_lanes, nan_lanes);
  const __m256i lo = _mm256_castps_si256(lo_f), hi = _mm256_castps_si256(hi_f);
  // packus interleaves 128-bit halves (lo0 hi0 lo1 hi1); the permute puts them in order.
  return _mm256_permute4x64_epi64(
      _mm256_packus_epi32(round_to_bf16(lo, any_nan), round_to_bf16(hi, any_nan)), 0xd8);
}

// 16 values per step, packed with one packus and one permute: faster than 8 values per step with
// the NaN blend always done (docs/PERFORMANCE.md).
GROUPLIN_AVX2 void narrow_bf16_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), narrow16(src + i));
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

// Rounding straight into non-temporal stores, without a buffer between.
GROUPLIN_AVX2 void stream_bf16_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 32 != 0; ++i) dst[i] = f32_to_bf16(src[i]);
  for (; i + 16 <= n; i += 16)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), narrow16(src + i));
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

GROUPLIN_AVX2 void stream_f32_avx2(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 32 != 0; ++i) dst[i] = src[i];
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

GROUPLIN_AVX2 void stream_zeros_avx2(std::byte* dst, int64_t bytes) {
  int64_t i = 0;
  for (; i < bytes && reinterpret_cast<uintptr_t>(dst + i) % 32 != 0; ++i) dst[i] = std::byte{0};
  for (; i + 32 <= bytes; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_setzero_si256());
  }
  std::memset(dst + i, 0, static_cast<size_t>(bytes - i));
}

// 8 values from element (row, p) on of a row-major F32 or BF16 matrix, as F32.
GROUPLIN_AVX2 inline __m256 load8(const void* src, bool bf16, int64_t at) {
  if (bf16) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(src) + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(src) + at);
}

// In-register 8 x 8 transpose: r[i] lane j becomes r[j] lane i.
GROUPLIN_AVX2 inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Groups of 8 source rows (missing rows read as zero) x 8 columns, transposed in registers and
// stored as 8 p-rows; for width 6 each store of 8 overlaps the next group by 2 floats, which the
// next store (or the caller's slack) absorbs.
GROUPLIN_AVX2 void pack_transposed_avx2(const void* src, bool bf16, int64_t ld, int rows,
                                        int64_t kc, float* dst, int width) {
  const int64_t full = kc / 8 * 8;
  for (int g = 0; g < width; g += 8) {
    const int group_rows = std::max(0, std::min(8, rows - g));
    for (int64_t p = 0; p < full; p += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = i < group_rows ? load8(src, bf16, (g + i) * ld + p) : _mm256_setzero_ps();
      }
      transpose8(r);
      for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + (p + q) * width + g, r[q]);
    }
  }
  for (int64_t p = full; p < kc; ++p) {
    for (int i = 0; i < width; ++i) {
      const int64_t at = i * ld + p;
      dst[p * width + i] = i >= rows ? 0.0f
                           : bf16    ? bf16_to_f32(static_cast<const uint16_t*>(src)[at])
                                     : static_cast<const float*>(src)[at];
    }
  }
}

// 8 rows x 8 pairs at a time, transposed as dwords in registers (two BF16 values travel as one
// float lane: the shuffles move bits, never compute); rows past `rows` are zero. The pairs that do
// not fill a block of 8 go through the portable loop.
GROUPLIN_AVX2 void pack_pairs_avx2(const uint16_t* src, int64_t ld, int rows, int64_t pairs,
                                   uint32_t* dst) {
  const int64_t full = pairs / 8 * 8;
  for (int g = 0; g < kOuterCols; g += 8) {
    const int group_rows = std::max(0, std::min(8, rows - g));
    for (int64_t p = 0; p < full; p += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = i < group_rows
                   ? _mm256_loadu_ps(reinterpret_cast<const float*>(src + (g + i) * ld + 2 * p))
                   : _mm256_setzero_ps();
      }
      transpose8(r);
      for (int q = 0; q < 8; ++q) {
        _mm256_storeu_ps(reinterpret_cast<float*>(dst + (p + q) * kOuterCols + g), r[q]);
      }
    }
  }
  if (full < pairs) {
    portable_kernels().pack_pairs(src + 2 * full, ld, rows, pairs - full, dst + full * kOuterCols);
  }
}

// Whole panels: 16 values of each of two rows interleaved by 16-bit unpacks (which work within
// 128-bit halves, so one lane swap puts the columns back in order), one panel row per store.
// Ragged panels (fewer than 16 columns) and a last row without its pair go through the portable
// loop's rule, scalar.
GROUPLIN_AVX2 void pack_pair_rows_avx2(const uint16_t* src, int64_t ld, int64_t depth, int64_t cols,
                                       uint32_t* dst, int64_t dst_strip) {
  const int64_t full = cols / kOuterCols;  // whole panels; the ragged last one and an odd
  int64_t r = 0;                           // last row go through the portable loop
  for (; 2 * r + 1 < depth; ++r) {
    const uint16_t* even = src + 2 * r * ld;
    for (int64_t s = 0; s < full; ++s) {
      const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + 16 * s));
      const __m256i o = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + ld + 16 * s));
      const __m256i lo = _mm256_unpacklo_epi16(e, o), hi = _mm256_unpackhi_epi16(e, o);
      auto* out = reinterpret_cast<__m256i*>(dst + s * dst_strip + r * kOuterCols);
      _mm256_storeu_si256(out, _mm256_permute2x128_si256(lo, hi, 0x20));
      _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
    }
  }
  const auto portable = portable_kernels().pack_pair_rows;
  if (full * kOuterCols < cols) {  // the last panel, every row
    portable(src + full * kOuterCols, ld, depth, cols - full * kOuterCols, dst + full * dst_strip,
             dst_strip);
  }
  if (2 * r < depth && full > 0) {  // the odd last row of the whole panels
    portable(src + 2 * r * ld, ld, depth - 2 * r, full * kOuterCols, dst + r * kOuterCols,
             dst_strip);
  }
}

// 8 x 8 blocks through registers (the forward broadcast path's result, [cols][rows], into rows of
// y: the scalar gather took 7% of the forward time at 32 rows per expert); ragged edges scalar.
GROUPLIN_AVX2 void transpose_avx2(const float* src, int64_t lds, int64_t rows, int64_t cols,
                                  float* dst, int64_t ldd) {
  const int64_t full_cols = cols / 8 * 8;
  for (int64_t i0 = 0; i0 < rows; i0 += 8) {
    const int64_t h = std::min<int64_t>(8, rows - i0);
    for (int64_t j0 = 0; j0 < full_cols; j0 += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(src + (j0 + j) * lds + i0);
      transpose8(r);
      for (int64_t i = 0; i < h; ++i) _mm256_storeu_ps(dst + (i0 + i) * ldd + j0, r[i]);
    }
    for (int64_t i = i0; i < i0 + h; ++i) {
      for (int64_t j = full_cols; j < cols; ++j) dst[i * ldd + j] = src[j * lds + i];
    }
  }
}

// Columns in blocks of 64 held in eight registers while all `count` rows are added, so that each
// block of sums is loaded and stored once per call instead of once per row (blocks of 32 were
// slower on F32 rows; docs/PERFORMANCE.md).
template <bool kBf16>
GROUPLIN_AVX2 void add_rows_avx2_impl(const void* rows, int64_t row_bytes, int64_t count, int64_t n,
                                      float* sums, bool zero) {
  const auto* base = static_cast<const std::byte*>(rows);
  int64_t j = 0;
  constexpr int kVecs = 8;
  constexpr int64_t kBlock = 8 * kVecs;
  for (; j + kBlock <= n; j += kBlock) {
    __m256 acc[kVecs];
    for (int v = 0; v < kVecs; ++v)
      acc[v] = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(sums + j + 8 * v);
    for (int64_t i = 0; i < count; ++i) {
      const std::byte* row = base + i * row_bytes;
      for (int v = 0; v < kVecs; ++v)
        acc[v] = _mm256_add_ps(acc[v], load_b8<kBf16>(row, j + 8 * v));
    }
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(sums + j + 8 * v, acc[v]);
  }
  for (; j + 8 <= n; j += 8) {
    __m256 acc = zero ? _mm256_setzero_ps() : _mm256_loadu_ps(sums + j);
    for (int64_t i = 0; i < count; ++i)
      acc = _mm256_add_ps(acc, load_b8<kBf16>(base + i * row_bytes, j));
    _mm256_storeu_ps(sums + j, acc);
  }
  if (j < n)
    portable_kernels().add_rows(base + j * (kBf16 ? 2 : 4), row_bytes, count, kBf16, n - j,
                                sums + j, zero);
}

// Faster than one row per call and than the portable loop, in cache and from memory
// (docs/PERFORMANCE.md).
void add_rows_avx2(const void* rows, int64_t row_bytes, int64_t count, bool bf16, int64_t n,
                   float* sums, bool zero) {
  if (bf16) {
    add_rows_avx2_impl<true>(rows, row_bytes, count, n, sums, zero);
  } else {
    add_rows_avx2_impl<false>(rows, row_bytes, count, n, sums, zero);
  }
}

GROUPLIN_AVX2 void widen_bf16_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace

constexpr MicroKernels kAvx2 = {.f32 = kProducts<false>,
                                .bf16 = kProducts<true>,
                                .dot_tile_fp8 = dot_tile_fp8_avx2,
                                .max_strips = 1,
                                .pair_tile = nullptr,
                                .pair_tile_half = nullptr,
                                .dot_tile_pairs = nullptr,
                                .dot_tile_fp8_pairs = nullptr,
                                .pair_tile_scaled = nullptr,
                                .pair_rows = 0,
                                .pair_strips = 0,
                                .pair_block = nullptr,
                                .pair_release = nullptr,
                                .fma_rows_fp8 = fma_rows_fp8_avx2,
                                .decode_fp8_bf16 = nullptr,
                                .fma_rows_fp8_pairs = nullptr,
                                .fma_rows_pairs = nullptr,
                                .add_rows = add_rows_avx2,
                                .pack_transposed = pack_transposed_avx2,
                                .pack_pairs = pack_pairs_avx2,
                                .pack_pair_rows = pack_pair_rows_avx2,
                                .transpose = transpose_avx2,
                                .widen_bf16 = widen_bf16_avx2,
                                .narrow_bf16 = narrow_bf16_avx2,
                                .stream_bf16 = stream_bf16_avx2,
                                .stream_f32 = stream_f32_avx2,
                                .stream_zeros = stream_zeros_avx2,
                                .decode_e4m3 = decode_e4m3_avx2,
                                .name = "avx2+fma"};

const MicroKernels& avx2_set() { return kAvx2; }

}  // namespace grouplin::kernels::native
