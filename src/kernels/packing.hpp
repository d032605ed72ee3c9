// Moving operands between their F32 or BF16 matrices and the F32 layouts the micro-kernels read:
// row loads and stores (widening and rounding), and the panel packs of the outer-product tiles.
//
//   MatrixRef w{weight.data(), weight.dtype(), in_features};
//   pack_b_transposed(w, k0, kc, col0, cols, b_panels);   // W rows as 16-column panels
//   pack_a_rows_of(x, row0, rows, k0, kc, a_panels);      // x rows as 6-row panels
//
// A-panels hold kOuterRows rows as kc groups of 6 floats (panel q: rows 6q..6q+5); B-panels
// hold kOuterCols columns as kc rows of 16 floats (panel q: columns 16q..16q+15). Rows or columns
// past the end are zero. Nothing here allocates.
#pragma once

#include <cstddef>
#include <cstdint>

#include "grouplin/dtype.hpp"
#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels {

// A row-major F32, BF16 or F8_E4M3 matrix: element (r, c) at data + (r * ld + c) *
// dtype_size(dtype). An F8_E4M3 matrix (FP8 weights) stands for its dequantized F32 values: code
// times scales[(r / kFp8Block) * scale_ld + c / kFp8Block] (one F32 multiply); every function
// here that reads it decodes it so, and the kernels treat it as an F32 matrix.
struct MatrixRef {
  const std::byte* data = nullptr;
  DType dtype = DType::F32;
  int64_t ld = 0;
  const float* scales = nullptr;
  int64_t scale_ld = 0;
};

// Whether the kernels treat m's values as BF16 ones (FP8 decodes to F32 values): which chain of
// operations they take (tile_paths.hpp) depends on it.
inline bool bf16_values(const MatrixRef& m) { return m.dtype == DType::BF16; }

struct MutableMatrixRef {
  std::byte* data = nullptr;
  DType dtype = DType::F32;
  int64_t ld = 0;
};

// Bytes per element of a kernel operand (F32, BF16 or F8_E4M3): computed in line, because
// element() runs in packing loops where the general dtype_size call showed in profiles.
inline int64_t operand_size(DType t) { return t == DType::BF16 ? 2 : t == DType::F8_E4M3 ? 1 : 4; }

inline const std::byte* element(const MatrixRef& m, int64_t r, int64_t c) {
  return m.data + (r * m.ld + c) * operand_size(m.dtype);
}
inline std::byte* element(const MutableMatrixRef& m, int64_t r, int64_t c) {
  return m.data + (r * m.ld + c) * operand_size(m.dtype);
}

// The FP8 matrix m from element (r, c) on, as the fused FP8 micro-kernels read it.
inline Fp8Operand fp8_operand(const MatrixRef& m, int64_t r, int64_t c) {
  return {reinterpret_cast<const uint8_t*>(element(m, r, c)), m.ld, m.scales, m.scale_ld, r, c};
}

// dst[0, n) = row r, columns [c, c + n) of m, as F32 (exact; FP8: decoded, see MatrixRef).
void load_f32(const MatrixRef& m, int64_t r, int64_t c, int64_t n, float* dst);
// Row r, columns [c, c + n) of m = src (BF16: rounded to nearest even).
void store_f32(const float* src, int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c);
// Row r, columns [c, c + n) of m = +0.
void store_zeros(int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c);

// As store_f32 and store_zeros, but with non-temporal stores for outputs written once and not
// read back by the kernels (tile results): no read-for-ownership, half the memory traffic. Call
// stream_fence() before the results are handed to another thread.
void stream_f32(const float* src, int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c);
void stream_zeros(int64_t n, const MutableMatrixRef& m, int64_t r, int64_t c);
void stream_fence();

// x's `rows` F32 rows (ldx apart, kc values each) in the layout of F32Products::dot_tile_wide
// (micro_kernels.hpp): dot_wide_floats(rows, kc) floats at xi.
void interleave_dot_rows(const float* x, int64_t ldx, int rows, int64_t kc, float* xi);

// B(p, j) = m(r0 + p, c0 + j): rows of m (dgrad's W, wgrad's x) as B-panels.
void pack_b_rows(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t cols, float* bp);
// B(p, j) = m(c0 + j, k0 + p): rows of m transposed (forward's W) as B-panels.
void pack_b_transposed(const MatrixRef& m, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                       float* bp);
// A(i, p) = m(r0 + i, c0 + p): rows of m (forward's x, dgrad's dy) as A-panels. Writes up to
// 8 floats of slack past the last panel.
void pack_a_rows_of(const MatrixRef& m, int64_t r0, int64_t rows, int64_t c0, int64_t kc,
                    float* ap);
// A(i, p) = m(r0 + p, c0 + i): columns of m (wgrad's dy) as A-panels.
void pack_a_cols_of(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t rows,
                    float* ap);
// a[i * kc + p] = m(r0 + p, c0 + i), i < rows, p < kc: columns of m as plain F32 rows (the
// unpacked wgrad path).
void gather_cols(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t rows, float* a);

// a[i * lda + p] = m(r0 + p, c0 + i), i < rows, p < kc, BF16 bits kept: columns of m as BF16
// rows (wgrad's dy as the pair kernels' A). Requires: m BF16, lda >= kc.
void transpose_bf16(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t rows,
                    uint16_t* a, int64_t lda);

// Pair panels (pair_tile's B, micro_kernels.hpp), BF16 bits kept: panel q holds columns
// 16q..16q+15 as pair_panel_dwords(kc) dwords, pair row r (depths 2r, 2r + 1) at dword r * 16 +
// column, the lower depth in the low half. Columns past `cols`, the high half of a last odd
// depth, and the pair rows that round the count up to a multiple of kPairGroup are zero.
// Requires: m BF16.
int64_t pair_panel_dwords(int64_t kc);
// B(p, j) = m(c0 + j, k0 + p): rows of m transposed (forward's W).
void pack_pairs_transposed(const MatrixRef& m, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                           uint32_t* bp);
// B(p, j) = m(r0 + p, c0 + j): rows of m, two interleaved per pair row (dgrad's W).
void pack_pairs_rows(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t cols,
                     uint32_t* bp);

// FP8 weights for the pair kernels, whose sums are scaled block by block (pair_tile_scaled):
// the codes of m's rows r0.. (`rows`) and columns c0.. (`cols`) as their BF16 values (exact, the
// scales not applied) in dst (ld `ldd` >= cols): a BF16 matrix the pair packers read as they read
// BF16 weights. Requires: m F8_E4M3, a set with decode_fp8_bf16.
MatrixRef fp8_codes_as_bf16(const MatrixRef& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols,
                            uint16_t* dst, int64_t ldd);
// The scales of the FP8 weights m that pair_tile_scaled applies to the blocks of depths
// [p0, p0 + kc) (p0 a multiple of kFp8Block), for n weight rows or columns from `first`:
// table[q * ld + i] = the scale of depth block q and, with depth_down_columns false (forward:
// the depth runs along m's rows), weight row first + i, or, true (dgrad: the depth runs down m's
// columns), weight column first + i; zero for n <= i < ld.
void fp8_block_scales(const MatrixRef& m, bool depth_down_columns, int64_t p0, int64_t kc,
                      int64_t first, int64_t n, int64_t ld, float* table);

}  // namespace grouplin::kernels
