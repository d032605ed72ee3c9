// The AVX-512F kernel set (x86-64 builds; see micro_kernels_x86.hpp): the outer-product tiles and
// fma_rows on 16-lane registers, and the few-row FP8 dgrad of micro_kernels_avx512_fp8.cpp. Each
// output element gets the fused multiply-adds of the AVX2 set in the same order, so this set's F32
// results are the AVX2 set's, bit for bit; only the register tile is wider (6 rows x 4 strips of 16
// columns: 24 of the 32 zmm registers hold sums, 4 hold B, 1 the broadcast A value), and the dot
// tiles of 5-8 rows (F32 B) hold two rows' 8-lane sums per zmm register, all the rows in one
// call (each weight row read once: docs/PERFORMANCE.md, "F32 forward of 5-8 rows"). The dot tiles
// of fewer rows, bgrad's row sums and the data movement stay AVX2's: bound by memory, and 8-lane
// partial sums there keep the bits of the AVX2 set.
//
// Written for the register file and ports of Intel's AVX-512 cores (two 512-bit FMA units, two
// loads per cycle: per depth step, 24 fused multiply-adds against 4 B loads and 6 broadcasts);
// tested under emulation (tests/kernels/emulated_kernels_test.cpp) and natively where the CPU has
// AVX-512F. Measured on a Sapphire Rapids and an AMD Zen 4 (which splits each 512-bit operation
// in two, so F32 runs within a few percent of the AVX2 set there): docs/PERFORMANCE.md, also for
// 4 strips against 2 on the Zen 4's 32 KiB L1 (within noise).
//
// Only what this file defines goes into its object: no standard-library inline functions, whose
// AVX-512 instances the linker could pick for code that runs on any CPU.
#include "kernels/micro_kernels_avx512.hpp"

#include <cstddef>
#include <cstdint>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

// 16 values of B from b on: F32, or BF16 bits widened in registers; with kHalf only the first 8
// (lanes 8-15 are zero and nothing past b[7] is read).
template <bool kBf16, bool kHalf>
GROUPLIN_AVX512 inline __m512 load_b16(const void* b) {
  if constexpr (kBf16) {
    __m256i h;
    if constexpr (kHalf) {
      h = _mm256_zextsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(b)));
    } else {
      h = _mm256_loadu_si256(static_cast<const __m256i*>(b));
    }
    // The maskz forms: the unmasked ones start from _mm512_undefined_epi32, on which GCC 12 warns
    // (-Wmaybe-uninitialized) in every caller.
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xFFFF, h);
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, wide, 16));
  } else if constexpr (kHalf) {
    return _mm512_maskz_loadu_ps(0x00FF, b);
  } else {
    return _mm512_loadu_ps(b);
  }
}

// MR rows x NS strips: c (+)= A · B, one fused multiply-add chain per element in p order, from
// c's value when `accumulate`, else from +0 (outer_strips in micro_kernels.hpp). kHalf (NS = 1):
// only the first 8 columns are read and written.
template <int MR, int NS, bool kBf16, bool kHalf>
GROUPLIN_AVX512 void outer_fixed(int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                                 const void* b, int64_t ldb, int64_t b_strip, float* c, int64_t ldc,
                                 bool accumulate) {
  const __mmask16 lanes = kHalf ? 0x00FF : 0xFFFF;
  const int64_t elem = kBf16 ? 2 : 4;
  const auto* b_bytes = static_cast<const unsigned char*>(b);
  const int64_t b_row = ldb * elem, strip = b_strip * elem;
  __m512 acc[MR][NS];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) {
      acc[i][s] =
          accumulate ? _mm512_maskz_loadu_ps(lanes, c + i * ldc + 16 * s) : _mm512_setzero_ps();
    }
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[NS];
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) bv[s] = load_b16<kBf16, kHalf>(b_bytes + p * b_row + s * strip);
    const float* ap = a + p * a_step;
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(ap[i * a_row]);
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) acc[i][s] = _mm512_fmadd_ps(av, bv[s], acc[i][s]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) _mm512_mask_storeu_ps(c + i * ldc + 16 * s, lanes, acc[i][s]);
  }
}

using OuterFixed = void (*)(int64_t, const float*, int64_t, int64_t, const void*, int64_t, int64_t,
                            float*, int64_t, bool);

// One compiled register tile per row count (1-6), strip count (1-4), B dtype and width.
template <int NS, bool kBf16, bool kHalf>
constexpr OuterFixed kByRows[kOuterRows] = {
    outer_fixed<1, NS, kBf16, kHalf>, outer_fixed<2, NS, kBf16, kHalf>,
    outer_fixed<3, NS, kBf16, kHalf>, outer_fixed<4, NS, kBf16, kHalf>,
    outer_fixed<5, NS, kBf16, kHalf>, outer_fixed<6, NS, kBf16, kHalf>};

template <bool kBf16>
OuterFixed pick(int mr, int strips, bool half) {
  if (half) return kByRows<1, kBf16, true>[mr - 1];
  switch (strips) {
    case 1:
      return kByRows<1, kBf16, false>[mr - 1];
    case 2:
      return kByRows<2, kBf16, false>[mr - 1];
    case 3:
      return kByRows<3, kBf16, false>[mr - 1];
    default:
      return kByRows<4, kBf16, false>[mr - 1];
  }
}

template <bool kBf16>
void outer_tile_avx512(int mr, int nr, int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                       const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  pick<kBf16>(mr, 1, nr == 8)(kc, a, a_row, a_step, b, ldb, 0, c, ldc, accumulate);
}

template <bool kBf16>
void outer_strips_avx512(int mr, int strips, int64_t kc, const float* a, int64_t a_row,
                         int64_t a_step, const void* b, int64_t ldb, int64_t b_strip, float* c,
                         int64_t ldc, bool accumulate) {
  pick<kBf16>(mr, strips, false)(kc, a, a_row, a_step, b, ldb, b_strip, c, ldc, accumulate);
}

// The first n (< 16) values of B from b on, zero beyond: F32 by a masked load, BF16 bits widened
// through a small buffer (a masked 16-bit load would need AVX512BW).
template <bool kBf16>
GROUPLIN_AVX512 inline __m512 load_b_tail(const void* b, int64_t n, __mmask16 mask) {
  if constexpr (kBf16) {
    const auto* src = static_cast<const uint16_t*>(b);
    alignas(64) uint32_t bits[16] = {};
    for (int64_t i = 0; i < n; ++i) bits[i] = uint32_t{src[i]} << 16;
    return _mm512_load_ps(bits);
  } else {
    return _mm512_maskz_loadu_ps(mask, b);
  }
}

// NV vectors of 16 columns (the last one holding last_n of them) of `rows` rows: each row's sums
// held in registers while every depth step adds to them, c loaded and stored once per row and
// block. B's block (depth x 16 NV values) stays in L1 across the rows.
template <bool kBf16, int NV>
GROUPLIN_AVX512 inline void fma_rows_block(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                           const unsigned char* bp, int64_t row_bytes, float* c,
                                           int64_t ldc, int64_t last_n) {
  const int64_t elem = kBf16 ? 2 : 4;
  const auto last = static_cast<__mmask16>((1u << last_n) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    __m512 acc[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[v] = v + 1 < NV ? _mm512_loadu_ps(cr + 16 * v) : _mm512_maskz_loadu_ps(last, cr + 16 * v);
    }
    const float* ar = a + r * lda;
    for (int64_t p = 0; p < depth; ++p) {
      const __m512 av = _mm512_set1_ps(ar[p]);
      const unsigned char* brow = bp + p * row_bytes;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        const __m512 bv = v + 1 < NV || last_n == 16
                              ? load_b16<kBf16, false>(brow + 16 * v * elem)
                              : load_b_tail<kBf16>(brow + 16 * v * elem, last_n, last);
        acc[v] = _mm512_fmadd_ps(av, bv, acc[v]);
      }
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (v + 1 < NV) {
        _mm512_storeu_ps(cr + 16 * v, acc[v]);
      } else {
        _mm512_mask_storeu_ps(cr + 16 * v, last, acc[v]);
      }
    }
  }
}

// c[j] += a[0] * b[0][j], then a[1] * b[1][j], ... for j < cols (S weight rows, row q at
// b + q * row_bytes): each element's S fused multiply-adds in depth order in a register, c loaded
// and stored once for them; 64 columns per step, then 16, then a masked tail (every element the
// AVX2 set's chain, 16 lanes at a time).
template <bool kBf16, int S>
GROUPLIN_AVX512 inline __m512 fma_column_steps(const __m512 (&av)[S], const unsigned char* b,
                                               int64_t row_bytes, __m512 acc) {
#pragma GCC unroll 8
  for (int q = 0; q < S; ++q) {
    const __m512 bv = load_b16<kBf16, false>(b + q * row_bytes);
    acc = _mm512_fmadd_ps(av[q], bv, acc);
  }
  return acc;
}
template <bool kBf16, int S>
GROUPLIN_AVX512 inline void fma_row_steps(const float* a, const unsigned char* b, int64_t row_bytes,
                                          float* cr, int64_t cols, __mmask16 tail) {
  const int64_t elem = kBf16 ? 2 : 4;
  __m512 av[S];
#pragma GCC unroll 8
  for (int q = 0; q < S; ++q) av[q] = _mm512_set1_ps(a[q]);
  const int64_t full = cols / 16 * 16;
  int64_t j = 0;
  for (; j + 64 <= full; j += 64) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      float* cv = cr + j + 16 * v;
      const __m512 sums =
          fma_column_steps<kBf16, S>(av, b + (j + 16 * v) * elem, row_bytes, _mm512_loadu_ps(cv));
      _mm512_storeu_ps(cv, sums);
    }
  }
  for (; j < full; j += 16) {
    const __m512 sums =
        fma_column_steps<kBf16, S>(av, b + j * elem, row_bytes, _mm512_loadu_ps(cr + j));
    _mm512_storeu_ps(cr + j, sums);
  }
  if (j < cols) {
    __m512 acc = _mm512_maskz_loadu_ps(tail, cr + j);
#pragma GCC unroll 8
    for (int q = 0; q < S; ++q) {
      const __m512 bv = load_b_tail<kBf16>(b + q * row_bytes + j * elem, cols - j, tail);
      acc = _mm512_fmadd_ps(av[q], bv, acc);
    }
    _mm512_mask_storeu_ps(cr + j, tail, acc);
  }
}

// Weight rows per pass of fma_rows_avx512's few-row dgrad, for two rows of c or more.
constexpr int kRowSteps = 8;

// c[r][j] += the sum over p of a[r][p] * b[p][j], one fused multiply-add per element and depth
// step in p order, starting from c (the AVX2 set's chains, 16 lanes at a time). A depth longer
// than the rows (dgrad of a few rows, streaming the weights): B's rows in order, kRowSteps at a
// time into each row of c, whose sums pass through memory once per kRowSteps rows of B instead
// of once per row; a single row of c takes B one row at a time (one stream of weights: see
// docs/PERFORMANCE.md, "F32 dgrad of 2-4 rows"). Otherwise (wgrad of a few rows' depth): by
// blocks of 64 columns, then 16, then a masked tail, each row's sums in registers across the
// depth (wgrad ran slower loading and storing c at every depth step; dgrad ran slower with its
// sums in registers across the whole depth: docs/PERFORMANCE.md).
template <bool kBf16>
GROUPLIN_AVX512 void fma_rows_avx512(int64_t rows, int64_t depth, const float* a, int64_t lda,
                                     const void* b, int64_t ldb, int64_t cols, float* c,
                                     int64_t ldc) {
  const int64_t elem = kBf16 ? 2 : 4;
  const int64_t row_bytes = ldb * elem;
  const auto* bytes = static_cast<const unsigned char*>(b);
  if (depth > rows) {
    const auto tail = static_cast<__mmask16>((1u << (cols % 16)) - 1);
    int64_t p = 0;
    for (; rows > 1 && p + kRowSteps <= depth; p += kRowSteps) {
      for (int64_t r = 0; r < rows; ++r) {
        fma_row_steps<kBf16, kRowSteps>(a + r * lda + p, bytes + p * row_bytes, row_bytes,
                                        c + r * ldc, cols, tail);
      }
    }
    for (; p < depth; ++p) {
      for (int64_t r = 0; r < rows; ++r)
        fma_row_steps<kBf16, 1>(a + r * lda + p, bytes + p * row_bytes, row_bytes, c + r * ldc,
                                cols, tail);
    }
    return;
  }
  int64_t j = 0;
  for (; j + 64 <= cols; j += 64) {
    fma_rows_block<kBf16, 4>(rows, depth, a, lda, bytes + j * elem, row_bytes, c + j, ldc, 16);
  }
  for (; j + 16 <= cols; j += 16) {
    fma_rows_block<kBf16, 1>(rows, depth, a, lda, bytes + j * elem, row_bytes, c + j, ldc, 16);
  }
  if (j < cols) {
    fma_rows_block<kBf16, 1>(rows, depth, a, lda, bytes + j * elem, row_bytes, c + j, ldc,
                             cols - j);
  }
}

// Whole 64-byte lines per store: a quarter of the baseline's stores for the same gradient rows
// (docs/PERFORMANCE.md, "Wider wgrad tiles").
GROUPLIN_AVX512 void stream_f32_avx512(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % 64 != 0; ++i) dst[i] = src[i];
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// Whole 64-byte lines of zeros per store, which the VM measured faster than the portable set's
// 16-byte stores (docs/PERFORMANCE.md, "Zeroing the gradients of experts without rows").
GROUPLIN_AVX512 void stream_zeros_avx512(std::byte* dst, int64_t bytes) {
  int64_t i = 0;
  for (; i < bytes && reinterpret_cast<uintptr_t>(dst + i) % 64 != 0; ++i) dst[i] = std::byte{0};
  for (; i + 64 <= bytes; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_setzero_si512());
  }
  for (; i < bytes; ++i) dst[i] = std::byte{0};
}

// dot_tile_wide: MP pairs of x's rows x NR rows of B, each pair's two 8-lane sums in one
// register (B's 8 values in both halves), the chains of the AVX2 set's dot tile lane for lane:
// one fused multiply-add per step of 8 depths, the last step's lanes past kc adding zeros (x is
// zero there, and so is B, as the AVX2 tile's masked loads give), then each half summed in the
// AVX2 set's tree (sum_lanes) and added to c once.

// The 8 lanes at `lanes` summed as sum_lanes does: (l0 + l4) + (l2 + l6) + ((l1 + l5) + (l3 + l7)).
GROUPLIN_AVX512 inline float sum_lanes8(const float* lanes) {
  const __m256 h = _mm256_load_ps(lanes);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));  // l_i + l_i+4
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                         // + l_i+2
  s = _mm_add_ss(s, _mm_movehdup_ps(s));                                          // + l_i+1
  return _mm_cvtss_f32(s);
}

// 8 values of B from b on, in both halves (the maskz form: the unmasked one starts from an
// undefined vector, on which GCC 12 warns, as load_b16 says); the first n of them, zeros after,
// nothing past them read.
GROUPLIN_AVX512 inline __m512 broadcast_b8(const float* b) {
  return _mm512_castpd_ps(
      _mm512_maskz_broadcast_f64x4(0xFF, _mm256_loadu_pd(reinterpret_cast<const double*>(b))));
}
GROUPLIN_AVX512 inline __m512 broadcast_b_first(const float* b, int64_t n) {
  alignas(32) float first[8] = {};
  __builtin_memcpy(first, b, static_cast<size_t>(n) * sizeof(float));
  return broadcast_b8(first);
}

// One step of 8 depths: the MP pairs of x at xi against bv.
template <int MP, int NR>
GROUPLIN_AVX512 inline void wide_step(const float* xi, const __m512 (&bv)[NR],
                                      __m512 (&acc)[MP][NR]) {
#pragma GCC unroll 4
  for (int i = 0; i < MP; ++i) {
    const __m512 av = _mm512_load_ps(xi + 16 * i);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
  }
}

template <int MP, int NR>
GROUPLIN_AVX512 void dot_wide_fixed(int mr, int64_t kc, const float* xi, const float* b,
                                    int64_t ldb, float* c, int64_t ldc, const char* next) {
  __m512 acc[MP][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MP; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  __m512 bv[NR];
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8, xi += 16 * MP) {
    // A line of each row of B per 64 bytes read, as the AVX2 dot tile prefetches.
    if (next != nullptr && k % 16 == 0) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) _mm_prefetch(next + (j * ldb + k) * 4, _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) bv[j] = broadcast_b8(b + j * ldb + k);
    wide_step<MP, NR>(xi, bv, acc);
  }
  if (k < kc) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) bv[j] = broadcast_b_first(b + j * ldb + k, kc - k);
    wide_step<MP, NR>(xi, bv, acc);
  }
  alignas(64) float lanes[16];
#pragma GCC unroll 4
  for (int i = 0; i < MP; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      _mm512_store_ps(lanes, acc[i][j]);
      c[2 * i * ldc + j] += sum_lanes8(lanes);
      if (2 * i + 1 < mr) c[(2 * i + 1) * ldc + j] += sum_lanes8(lanes + 8);
    }
  }
}

using DotWide = void (*)(int, int64_t, const float*, const float*, int64_t, float*, int64_t,
                         const char*);
template <int MP>
constexpr DotWide kDotWideRow[kDotCols] = {dot_wide_fixed<MP, 1>, dot_wide_fixed<MP, 2>,
                                           dot_wide_fixed<MP, 3>};
// By pairs of rows: 5-6 rows take 3, 7-8 take 4.
constexpr const DotWide* kDotWide[2] = {kDotWideRow<3>, kDotWideRow<4>};
static_assert(kDotWideMinRows == 5 && kDotWideRows == 8);

void dot_tile_wide_avx512(int mr, int nr, int64_t kc, const float* xi, const void* b, int64_t ldb,
                          float* c, int64_t ldc, const void* ahead) {
  kDotWide[(mr + 1) / 2 - 3][nr - 1](mr, kc, xi, static_cast<const float*>(b), ldb, c, ldc,
                                     static_cast<const char*>(ahead));
}

// The arithmetic the wider registers speed up; the dot tiles of 1-4 rows stay the AVX2 set's
// (above: at 3-4 rows a wide tile holds too few sums to cover the latency of its fused
// multiply-adds), and so do those of BF16 B (5-8 rows of BF16 weights run other paths).
template <bool kBf16>
void add_products(F32Products& products) {
  products.outer_tile = outer_tile_avx512<kBf16>;
  products.outer_strips = outer_strips_avx512<kBf16>;
  products.fma_rows = fma_rows_avx512<kBf16>;
  products.fma_rows_steps = kRowSteps;
  if constexpr (!kBf16) products.dot_tile_wide = dot_tile_wide_avx512;
}

}  // namespace

void add_avx512(MicroKernels& set) {
  add_products<false>(set.f32);
  add_products<true>(set.bf16);
  set.max_strips = kMaxStrips;
  set.fma_rows_fp8 = fma_rows_fp8_avx512;
  set.stream_f32 = stream_f32_avx512;
  set.stream_zeros = stream_zeros_avx512;
  set.name = "avx512f";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
