#include "kernels/packing.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels {
namespace {

// Rows of W or x are often a page apart, where hardware prefetchers stop: pack_b_rows fetches
// this many rows ahead.
constexpr int64_t kPrefetchRows = 16;
// FP8 rows are decoded in pieces of at most this many values (on the stack) where a pack
// transposes them.
constexpr int64_t kDecodeChunk = 256;

// Row r, columns [c, c + n) of an FP8 matrix decoded, one scale block at a time.
void decode_fp8(const MatrixRef& m, int64_t r, int64_t c, int64_t n, float* dst) {
  const MicroKernels& mk = micro_kernels();
  const float* scale_row = m.scales + (r / kFp8Block) * m.scale_ld;
  const auto* codes = reinterpret_cast<const uint8_t*>(element(m, r, 0));
  for (int64_t at = c; at < c + n;) {
    const int64_t end = std::min(c + n, (at / kFp8Block + 1) * kFp8Block);
    mk.decode_e4m3(codes + at, scale_row[at / kFp8Block], dst + (at - c), end - at);
    at = end;
  }
}

}  // namespace

void load_f32(const MatrixRef& m, int64_t r, int64_t c, int64_t n, float* dst) {
  const std::byte* src = element(m, r, c);
  if (m.dtype == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (m.dtype == DType::F8_E4M3) {
    decode_fp8(m, r, c, n, dst);
  } else {
    micro_kernels().widen_bf16(reinterpret_cast<const uint16_t*>(src), dst, n);
  }
}

void store_f32(const float* src, int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c) {
  std::byte* dst = element(m, r, c);
  if (m.dtype == DType::F32) {
    if (reinterpret_cast<const std::byte*>(src) != dst) {
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    }
  } else {
    micro_kernels().narrow_bf16(src, reinterpret_cast<uint16_t*>(dst), n);
  }
}

void store_zeros(int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c) {
  std::memset(element(m, r, c), 0, static_cast<size_t>(n) * dtype_size(m.dtype));
}

void stream_f32(const float* src, int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c) {
  if (m.dtype == DType::F32) {
    micro_kernels().stream_f32(src, reinterpret_cast<float*>(element(m, r, c)), n);
    return;
  }
  micro_kernels().stream_bf16(src, reinterpret_cast<uint16_t*>(element(m, r, c)), n);
}

void stream_zeros(int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c) {
  micro_kernels().stream_zeros(element(m, r, c), n * static_cast<int64_t>(dtype_size(m.dtype)));
}

// Off x86-64 the stores above are plain ones, which the thread pool's release/acquire hand-over
// already orders.
void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void interleave_dot_rows(const float* x, int64_t ldx, int rows, int64_t kc, float* xi) {
  const int64_t pairs = (rows + 1) / 2;
  for (int64_t k = 0; k < kc; k += 8, xi += 16 * pairs) {
    const int64_t n = std::min<int64_t>(8, kc - k);
    for (int64_t r = 0; r < 2 * pairs; ++r) {
      float* to = xi + 8 * r;
      if (r < rows) std::memcpy(to, x + r * ldx + k, static_cast<size_t>(n) * sizeof(float));
      std::fill(to + (r < rows ? n : 0), to + 8, 0.0f);
    }
  }
}

// Panel by panel, each written in one sequential run: writing each source row's 16-column pieces
// into all panels at once (16 store streams 16 KiB apart, one L1 set) packed 3-10% slower
// (dgrad of 128 experts of 1024 x 384 with 32-128 rows each, same-run A/B).
void pack_b_rows(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t cols, float* bp) {
  const MicroKernels& mk = micro_kernels();
  if (m.dtype == DType::F8_E4M3) {
    // Row by row: each row decoded in long runs, then dealt to the panels (decoding 16 values per
    // call, panel by panel, made the packed FP8 dgrad 2x slower than BF16's).
    float row[kDecodeChunk];
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t j0 = 0; j0 < cols; j0 += kDecodeChunk) {
        const int64_t n = std::min(kDecodeChunk, cols - j0);
        load_f32(m, r0 + p, c0 + j0, n, row);
        for (int64_t j = j0; j < j0 + n; j += kOuterCols) {
          float* dst = bp + (j / kOuterCols) * kc * kOuterCols + p * kOuterCols;
          const int64_t width = std::min<int64_t>(kOuterCols, j0 + n - j);
          std::memcpy(dst, row + (j - j0), static_cast<size_t>(width) * sizeof(float));
          std::fill(dst + width, dst + kOuterCols, 0.0f);
        }
      }
    }
    return;
  }
  const int64_t full = cols / kOuterCols;
  const int64_t rest = cols - full * kOuterCols;
  const int64_t row_bytes = cols * operand_size(m.dtype);
  for (int64_t q = 0; q <= full; ++q) {
    const int64_t width = q < full ? kOuterCols : rest;
    if (width == 0) break;
    float* panel = bp + q * kc * kOuterCols;
    for (int64_t p = 0; p < kc; ++p) {
      if (q == 0 && p + kPrefetchRows < kc) {
        const std::byte* ahead = element(m, r0 + p + kPrefetchRows, c0);
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b);
      }
      const std::byte* src = element(m, r0 + p, c0 + q * kOuterCols);
      float* dst = panel + p * kOuterCols;
      if (width < kOuterCols) {
        load_f32(m, r0 + p, c0 + q * kOuterCols, width, dst);
        std::fill(dst + width, dst + kOuterCols, 0.0f);
      } else if (m.dtype == DType::F32) {
        std::memcpy(dst, src, kOuterCols * sizeof(float));
      } else {
        mk.widen_bf16(reinterpret_cast<const uint16_t*>(src), dst, kOuterCols);
      }
    }
  }
}

void pack_b_transposed(const MatrixRef& m, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                       float* bp) {
  const MicroKernels& mk = micro_kernels();
  if (m.dtype == DType::F8_E4M3) {  // each row decoded in pieces, then spread over its panel
    float row[kDecodeChunk];
    for (int64_t q = 0; q * kOuterCols < cols; ++q) {
      float* panel = bp + q * kc * kOuterCols;
      const int64_t width = std::min<int64_t>(kOuterCols, cols - q * kOuterCols);
      for (int64_t j = 0; j < kOuterCols; ++j) {
        for (int64_t p0 = 0; p0 < kc; p0 += kDecodeChunk) {
          const int64_t n = std::min(kDecodeChunk, kc - p0);
          if (j < width) load_f32(m, c0 + q * kOuterCols + j, k0 + p0, n, row);
          for (int64_t p = 0; p < n; ++p) panel[(p0 + p) * kOuterCols + j] = j < width ? row[p] : 0;
        }
      }
    }
    return;
  }
  for (int64_t q = 0; q * kOuterCols < cols; ++q) {
    const int width = static_cast<int>(std::min<int64_t>(kOuterCols, cols - q * kOuterCols));
    mk.pack_transposed(element(m, c0 + q * kOuterCols, k0), m.dtype == DType::BF16, m.ld, width, kc,
                       bp + q * kc * kOuterCols, kOuterCols);
  }
}

void pack_a_rows_of(const MatrixRef& m, int64_t r0, int64_t rows, int64_t c0, int64_t kc,
                    float* ap) {
  const MicroKernels& mk = micro_kernels();
  for (int64_t q = 0; q * kOuterRows < rows; ++q) {
    const int h = static_cast<int>(std::min<int64_t>(kOuterRows, rows - q * kOuterRows));
    mk.pack_transposed(element(m, r0 + q * kOuterRows, c0), m.dtype == DType::BF16, m.ld, h, kc,
                       ap + q * kc * kOuterRows, kOuterRows);
  }
}

void pack_a_cols_of(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t rows,
                    float* ap) {
  const int64_t row_bytes = m.ld * operand_size(m.dtype);
  for (int64_t q = 0; q * kOuterRows < rows; ++q) {
    const int64_t h = std::min<int64_t>(kOuterRows, rows - q * kOuterRows);
    float* dst = ap + q * kc * kOuterRows;
    const std::byte* src = element(m, r0, c0 + q * kOuterRows);
    for (int64_t p = 0; p < kc; ++p, src += row_bytes, dst += kOuterRows) {
      if (m.dtype == DType::F32 && h == kOuterRows) {
        // One 24-byte copy instead of six scalar moves: packing A was 7.5% of a large wgrad.
        std::memcpy(dst, src, kOuterRows * sizeof(float));
        continue;
      }
      if (m.dtype == DType::F32) {
        const auto* f = reinterpret_cast<const float*>(src);
        for (int64_t i = 0; i < h; ++i) dst[i] = f[i];
      } else {
        const auto* half = reinterpret_cast<const uint16_t*>(src);
        for (int64_t i = 0; i < h; ++i) dst[i] = bf16_to_f32(half[i]);
      }
      for (int64_t i = h; i < kOuterRows; ++i) dst[i] = 0.0f;
    }
  }
}

void gather_cols(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t rows, float* a) {
  for (int64_t p = 0; p < kc; ++p) {
    const std::byte* src = element(m, r0 + p, c0);
    if (m.dtype == DType::F32) {
      const auto* f = reinterpret_cast<const float*>(src);
      for (int64_t i = 0; i < rows; ++i) a[i * kc + p] = f[i];
    } else {
      const auto* half = reinterpret_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < rows; ++i) a[i * kc + p] = bf16_to_f32(half[i]);
    }
  }
}

int64_t pair_panel_dwords(int64_t kc) {
  const int64_t pairs = (kc + 1) / 2;
  return (pairs + kPairGroup - 1) / kPairGroup * kPairGroup * kOuterCols;
}

// Panel by panel: its rows' whole pairs through the set's pack_pairs (AVX2: 8 x 8 dword
// transposes), the pair of a last odd depth (its high half zero) and the pair rows that round the
// count up to a multiple of kPairGroup (zero) here. Every dword is written once.
void pack_pairs_transposed(const MatrixRef& m, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                           uint32_t* bp) {
  const MicroKernels& mk = micro_kernels();
  const int64_t dwords = pair_panel_dwords(kc), whole = kc / 2, pairs = (kc + 1) / 2;
  for (int64_t q = 0; q * kOuterCols < cols; ++q) {
    const int rows = static_cast<int>(std::min<int64_t>(kOuterCols, cols - q * kOuterCols));
    const auto* src = reinterpret_cast<const uint16_t*>(element(m, c0 + q * kOuterCols, k0));
    uint32_t* dst = bp + q * dwords;
    mk.pack_pairs(src, m.ld, rows, whole, dst);
    if (kc % 2 != 0) {
      for (int j = 0; j < kOuterCols; ++j) {
        dst[whole * kOuterCols + j] = j < rows ? src[j * m.ld + kc - 1] : 0;
      }
    }
    std::fill(dst + pairs * kOuterCols, dst + dwords, uint32_t{0});
  }
}

// All panels at once through the set's pack_pair_rows (AVX2: 16-bit unpacks of two rows), then the
// pair rows that round the count up to a multiple of kPairGroup (zero).
void pack_pairs_rows(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t cols,
                     uint32_t* bp) {
  const MicroKernels& mk = micro_kernels();
  const int64_t dwords = pair_panel_dwords(kc), pairs = (kc + 1) / 2;
  mk.pack_pair_rows(reinterpret_cast<const uint16_t*>(element(m, r0, c0)), m.ld, kc, cols, bp,
                    dwords);
  for (int64_t q = 0; q * kOuterCols < cols; ++q) {
    std::fill(bp + q * dwords + pairs * kOuterCols, bp + (q + 1) * dwords, uint32_t{0});
  }
}

void transpose_bf16(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t rows,
                    uint16_t* a, int64_t lda) {
  const auto* src = reinterpret_cast<const uint16_t*>(element(m, r0, c0));
#if defined(__x86_64__)
  // Whole 8 x 8 blocks through SSE2 registers (the scalar loop took 8% of a BF16 wgrad at 256
  // rows per expert); the ragged edges below.
  const int64_t kc8 = kc / 8 * 8, rows8 = rows / 8 * 8;
  for (int64_t p0 = 0; p0 < kc8; p0 += 8) {
    for (int64_t i0 = 0; i0 < rows8; i0 += 8) {
      __m128i r[8];
      for (int k = 0; k < 8; ++k) {
        r[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (p0 + k) * m.ld + i0));
      }
      const __m128i a0 = _mm_unpacklo_epi16(r[0], r[1]), a1 = _mm_unpackhi_epi16(r[0], r[1]);
      const __m128i a2 = _mm_unpacklo_epi16(r[2], r[3]), a3 = _mm_unpackhi_epi16(r[2], r[3]);
      const __m128i a4 = _mm_unpacklo_epi16(r[4], r[5]), a5 = _mm_unpackhi_epi16(r[4], r[5]);
      const __m128i a6 = _mm_unpacklo_epi16(r[6], r[7]), a7 = _mm_unpackhi_epi16(r[6], r[7]);
      const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
      const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
      const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
      const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
      const __m128i out[8] = {_mm_unpacklo_epi64(b0, b4), _mm_unpackhi_epi64(b0, b4),
                              _mm_unpacklo_epi64(b1, b5), _mm_unpackhi_epi64(b1, b5),
                              _mm_unpacklo_epi64(b2, b6), _mm_unpackhi_epi64(b2, b6),
                              _mm_unpacklo_epi64(b3, b7), _mm_unpackhi_epi64(b3, b7)};
      for (int j = 0; j < 8; ++j) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a + (i0 + j) * lda + p0), out[j]);
      }
    }
    for (int64_t i = rows8; i < rows; ++i) {
      for (int64_t p = p0; p < p0 + 8; ++p) a[i * lda + p] = src[p * m.ld + i];
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t p = kc8; p < kc; ++p) a[i * lda + p] = src[p * m.ld + i];
  }
#else
  // Blocks of 16 rows of m: their columns are read from L1 while each row of a is written in
  // one contiguous run of 32 bytes.
  constexpr int64_t kBlock = 16;
  for (int64_t p0 = 0; p0 < kc; p0 += kBlock) {
    const int64_t n = std::min(kBlock, kc - p0);
    for (int64_t i = 0; i < rows; ++i) {
      const uint16_t* col = src + p0 * m.ld + i;
      uint16_t* row = a + i * lda + p0;
      for (int64_t p = 0; p < n; ++p) row[p] = col[p * m.ld];
    }
  }
#endif
}

MatrixRef fp8_codes_as_bf16(const MatrixRef& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                            uint16_t* dst, int64_t ldd) {
  const MicroKernels& mk = micro_kernels();
  for (int64_t r = 0; r < rows; ++r) {
    mk.decode_fp8_bf16(reinterpret_cast<const uint8_t*>(element(m, r0 + r, c0)), dst + r * ldd,
                       cols);
  }
  return {reinterpret_cast<const std::byte*>(dst), DType::BF16, ldd};
}

void fp8_block_scales(const MatrixRef& m, bool depth_down_columns, int64_t p0, int64_t kc,
                      int64_t first, int64_t n, int64_t ld, float* table) {
  const int64_t b0 = p0 / kFp8Block, blocks = (kc + kFp8Block - 1) / kFp8Block;
  for (int64_t q = 0; q < blocks; ++q) {
    float* row = table + q * ld;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = (first + i) / kFp8Block;
      row[i] = depth_down_columns ? m.scales[(b0 + q) * m.scale_ld + b]
                                  : m.scales[b * m.scale_ld + b0 + q];
    }
    std::fill(row + n, row + ld, 0.0f);
  }
}

}  // namespace grouplin::kernels
