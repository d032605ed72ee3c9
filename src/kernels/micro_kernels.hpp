// The innermost loops of the grouped GEMM kernels, one set per instruction set, selected once from
// the CPU's features (kernel_isa() in isa.hpp): portable loops (any CPU; the only set in builds for
// other architectures), AVX2+FMA, AVX-512F, AVX512-BF16 and AMX-BF16 (x86-64 builds). One file per
// set (micro_kernels_portable.cpp, _avx2.cpp, _avx512.cpp, _avx512bf16.cpp, _amx.cpp) behind one
// dispatch point, micro_kernels.cpp.
//
//   const MicroKernels& mk = micro_kernels();
//   mk.f32.dot_tile(4, 3, kc, x, ldx, w, ldw, c, ldc);  // c[i][j] += x_i · w_j over kc
//   mk.for_b(bf16).outer_tile(6, 16, kc, a_panel, 1, 6, b_panel, 16, c, ldc, true);  // += A · B
//
// Each function computes an output element with the same operations in the same order wherever
// the element lies in a tile, so the tiling never changes results. The F32 arithmetic of the
// AVX-512 sets is that of the AVX2 set, bit for bit (the same fused multiply-add chains, 16 lanes
// wide); the portable set rounds differently. BF16 x BF16 products run on the AVX512-BF16 and
// AMX sets' pair kernels (pair_tile), which sum in their own order. Only one set runs in a
// process (force_kernels switches, for tests).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/fp8.hpp"

namespace grouplin::kernels {

// Rows and columns of the outer-product micro-tile, and the dot tile's limits.
inline constexpr int kOuterRows = 6;
inline constexpr int kOuterCols = 16;
inline constexpr int kDotRows = 4;
inline constexpr int kDotCols = 3;
// The rows of one F32Products::dot_tile_wide call, and its x operand's layout: for each step of
// 8 depths, the rows two by two, each pair's 8 values side by side (16 floats; a zero row after
// an odd last one, zeros past kc), written by interleave_dot_rows (packing.hpp).
inline constexpr int kDotWideMinRows = 5;
inline constexpr int kDotWideRows = 8;
// Floats of dot_tile_wide's x operand for `rows` rows of kc depths.
inline constexpr int64_t dot_wide_floats(int64_t rows, int64_t kc) {
  return (kc + 7) / 8 * 8 * ((rows + 1) / 2 * 2);
}
// The most rows of one register tile of dot_tile_pairs and dot_tile_fp8_pairs, and of one
// dot_tile_fp8_pairs call.
inline constexpr int kPairDotRows = 6;
// The most rows of one dot_tile_pairs call: past kPairDotRows, two register tiles take each
// weight row in turn.
inline constexpr int kPairDotCallRows = 8;
// The most 16-column strips an outer_strips or pair_tile call takes, in any set.
inline constexpr int kMaxStrips = 4;
// Pair panels (pair_tile's B) hold their pair rows in groups of kPairGroup, zero-padded: AMX
// multiplies 16 pairs (32 BF16 values of depth) per tile operation.
inline constexpr int64_t kPairGroup = 16;

// FP8 weights carry one F32 scale per block of kFp8Block x kFp8Block codes (DeepSeek-V3's form;
// core/fp8.hpp, where FP8 block scaling lives).
using core::kFp8Block;
// The most rows of one fma_rows_fp8_pairs call.
inline constexpr int kFp8PairRows = 4;

// FP8 weights as the fused FP8 kernels read them: element (r, c) of the codes (row-major,
// leading dimension ld) is code x scales[((row0 + r) / kFp8Block) * scale_ld + (col0 + c) /
// kFp8Block] (one F32 multiply): the decoded values of packing.hpp's MatrixRef, where
// (row0, col0) is the codes pointer's place in the whole matrix.
struct Fp8Operand {
  const uint8_t* codes;
  int64_t ld;
  const float* scales;
  int64_t scale_ld;
  int64_t row0, col0;
  // Where the caller reads next, or null: dot_tile_fp8 (its rows) and fma_rows_fp8 (`depth`
  // rows) prefetch from here on at the columns they read, as they read them (a burst per tile
  // left FP8's stream at half the rate); fma_rows_fp8_pairs prefetches the first kFp8Block rows
  // from here (same ld, its columns) during its last block. Prefetches never fault, but keep
  // them inside the matrix.
  const uint8_t* ahead = nullptr;
};

// The F32 products (F32 A, F32 sums) over a B operand stored as F32 or as BF16 bits, widened
// exactly in registers: the bits of the F32 kernel on the widened values, without a widened copy.
// A set holds one per storage dtype of B (MicroKernels::f32, bf16; `for_b` picks one), so that a
// caller writes its loop once for both. ldb and b_strip count B's elements.
struct F32Products {
  // c[i * ldc + j] += sum over k < kc of a[i * lda + k] * b[j * ldb + k], for i < mr, j < nr.
  // Each sum is formed in 8 partial sums (k mod 8, fused multiply-adds in k order), added
  // pairwise in a fixed tree, then added to c once.
  // `ahead`: where the caller reads next, or null: nr rows of B's dtype, ldb apart, prefetched
  // at the columns read as they are read (a line per 64 bytes of B; sets may ignore it; keep it
  // inside the matrix).
  // Requires: 1 <= mr <= kDotRows, 1 <= nr <= kDotCols, kc >= 0.
  void (*dot_tile)(int mr, int nr, int64_t kc, const float* a, int64_t lda, const void* b,
                   int64_t ldb, float* c, int64_t ldc, const void* ahead);
  // dot_tile on 5 to 8 rows of a at once, given interleaved (xi: kDotWideRows above): the same
  // sums, bit for bit (each element's 8 partial sums in k order, their tree, one addition to c),
  // with two rows' partial sums side by side in one 16-lane register, so that each row of B is
  // read once for all the rows and twice as many products run per instruction. Null in sets
  // without it (B as F32 on the AVX-512 sets only).
  // Requires: kDotWideMinRows <= mr <= kDotWideRows, 1 <= nr <= kDotCols, kc >= 0; xi 64-byte
  // aligned.
  void (*dot_tile_wide)(int mr, int nr, int64_t kc, const float* xi, const void* b, int64_t ldb,
                        float* c, int64_t ldc, const void* ahead);
  // c[i * ldc + j] (+)= sum over p < kc of A(i, p) * b[p * ldb + j], for i < mr, j < nr, with
  // A(i, p) = a[i * a_row + p * a_step]: a packed A-panel (a_row 1, a_step kOuterRows) or rows of
  // a matrix read in place (a_row = its ld, a_step 1); B a packed B-panel (ldb kOuterCols) or
  // columns of a matrix read in place (ldb = its ld). One chain of fused multiply-adds in p
  // order, starting from c's value when `accumulate`, else from +0 (the same bits as from a zeroed
  // c, so splitting kc into blocks gives the same bits), whatever mr and nr are.
  // Requires: 1 <= mr <= kOuterRows, nr == 8 or kOuterCols; c has room for mr x nr.
  void (*outer_tile)(int mr, int nr, int64_t kc, const float* a, int64_t a_row, int64_t a_step,
                     const void* b, int64_t ldb, float* c, int64_t ldc, bool accumulate);
  // outer_tile(mr, 16, ...) on `strips` adjacent 16-column strips at once, strip s reading B from
  // b + s * b_strip and writing c + 16 s: the bits of `strips` outer_tile calls, with the
  // register tile of the set (AVX-512: 6 rows x 4 strips, 24 of the 32 zmm registers).
  // Requires: 1 <= mr <= kOuterRows, 1 <= strips <= MicroKernels::max_strips.
  void (*outer_strips)(int mr, int strips, int64_t kc, const float* a, int64_t a_row,
                       int64_t a_step, const void* b, int64_t ldb, int64_t b_strip, float* c,
                       int64_t ldc, bool accumulate);
  // c[r * ldc + j] += sum over p < depth of a[r * lda + p] * b[p * ldb + j], for r < rows,
  // j < cols: the same chain of fused multiply-adds in p order as outer_tile, without packing.
  // For products with few rows (dgrad, where BF16 weights make it memory-bound) or little depth
  // (wgrad), where packing does not pay.
  void (*fma_rows)(int64_t rows, int64_t depth, const float* a, int64_t lda, const void* b,
                   int64_t ldb, int64_t cols, float* c, int64_t ldc);
  // Weight rows fma_rows takes per pass over c when the depth is longer than the rows (dgrad
  // streaming the weights): each row of c passes through memory once per fma_rows_steps rows of
  // b. The dgrad rules read it (tile_paths.hpp, dgrad_direct_max_rows).
  int fma_rows_steps;
};

struct MicroKernels {
  F32Products f32;   // B given as F32
  F32Products bf16;  // B given as BF16 bits
  // The products for B stored as BF16 (true) or F32.
  const F32Products& for_b(bool b_bf16) const { return b_bf16 ? bf16 : f32; }

  // f32.dot_tile with b FP8 codes decoded in registers (the bits of dot_tile on the decoded
  // values), row j of b being row j of the operand. Null where the set has none: the tiles then
  // decode rows into scratch for dot_tile. Requires: b.col0 a multiple of 8.
  void (*dot_tile_fp8)(int mr, int nr, int64_t kc, const float* a, int64_t lda, const Fp8Operand& b,
                       float* c, int64_t ldc);

  // The most strips outer_strips computes in one register tile (1: it loops over outer_tile).
  int max_strips;

  // BF16 x BF16 products (null in sets without them: portable, AVX2, AVX-512F, which widen BF16
  // operands to F32). c[i * ldc + j] (+)= sum over p < kc of A(i, p) * B(p, j), for i < mr and j <
  // 16 * strips, with A(i, p) = BF16 a[i * lda + p] read in place (nothing at or past a[i * lda +
  // kc] is read) and B pair-packed (pack_pairs in packing.hpp): strip s at b + s * b_strip holds,
  // for each pair row q (depth 2q, 2q + 1), 16 dwords, column j's two BF16 values (low half: depth
  // 2q). Starts from c's value when `accumulate`, else from +0. AVX512-BF16: one vdpbf16ps chain
  // over the pair rows in order per element; AMX: one tile multiply per kPairGroup pair rows. Both
  // flush denormal inputs and results to zero (the instructions do). The chain depends only on kc,
  // so splitting the depth into blocks of a multiple of 2 * kPairGroup gives the same bits.
  // Requires: 1 <= mr <= pair_rows, 1 <= strips <= pair_strips, kc >= 1; c has room for mr rows
  // of 16 * strips floats.
  void (*pair_tile)(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                    const uint32_t* b, int64_t b_strip, float* c, int64_t ldc, bool accumulate);
  // pair_tile whose last strip computes only its first 8 columns, at half the cost (256-bit
  // vdpbf16ps); that strip's other 8 columns of c are neither read nor written. The same chains,
  // so the same bits. Null where the set has none (AMX).
  void (*pair_tile_half)(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                         const uint32_t* b, int64_t b_strip, float* c, int64_t ldc,
                         bool accumulate);
  // c[i * ldc + j] = the sum over p < kc of a[i * lda + p] * w[j * ldw + p], i < mr, j < nr (a
  // few rows of x against rows of the weights, both BF16 and read along the depth as they lie:
  // forward of experts of a few rows, whose products cannot pay for packing anything). Each sum
  // is four chains of 16 lane sums from +0: block g (depths 32g to 32g + 31, zeros past kc) goes
  // to chain g mod 4, whose lane l adds the pair at depths 32g + 2l, 32g + 2l + 1 by vdpbf16ps,
  // blocks in order; then the chains are added lane by lane as (0 + 1) + (2 + 3), and the lanes
  // l and l + 8, then l and l + 4, l and l + 2, l and l + 1 (plain F32 adds). Null in sets
  // without it (AMX keeps those experts on widened dot tiles: not measured there).
  // Requires: 1 <= mr <= kPairDotCallRows, nr >= 1, kc >= 1.
  void (*dot_tile_pairs)(int mr, int nr, int64_t kc, const uint16_t* a, int64_t lda,
                         const uint16_t* w, int64_t ldw, float* c, int64_t ldc);
  // c[i * ldc + j] = the sum over p < kc of a[i * lda + p] * W(j, p) for BF16 rows of a and FP8
  // weights b (codes along the depth with their 128 x 128 block scales), scaled block by block as
  // block-scaled FP8 GEMMs do, not weight by weight: each code becomes its BF16 value (exact), and
  // each sum is 16 lane sums from +0; in block q of kFp8Block depths (zeros past kc), lane l forms
  // t by one vdpbf16ps chain from +0 over the block's pairs at 32k + 2l, 32k + 2l + 1 of a and of
  // the codes, k = 0..3 in order, and becomes fma(t, block q's scale, lane); the lanes are then
  // added as dot_tile_pairs' are (l + 8, l + 4, l + 2, l + 1). Null in sets without it (it needs
  // AVX512-BF16 and AVX512-VBMI; AMX not measured). Requires: 1 <= mr <= kPairDotRows, nr >= 1,
  // kc >= 1, b.col0 a multiple of kFp8Block.
  void (*dot_tile_fp8_pairs)(int mr, int nr, int64_t kc, const uint16_t* a, int64_t lda,
                             const Fp8Operand& b, float* c, int64_t ldc);
  // pair_tile with each block of kFp8Block depths (counted from the call's first; the last may
  // be shorter) summed apart and scaled once, as block-scaled FP8 GEMMs sum (FP8 weights decoded
  // into pair panels): per element and block q, t = one vdpbf16ps chain from +0 over the block's
  // pair rows in order, then c = fma(t, scale, c), c starting from its value when `accumulate`,
  // else +0. The scale of block q is scales[q * scale_q + i] for row i when `per_row`, else
  // scales[q * scale_q + 16 s + j] for column j of strip s. Null in sets without pair_tile and in
  // AMX (not measured there). Requires as pair_tile.
  void (*pair_tile_scaled)(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                           const uint32_t* b, int64_t b_strip, const float* scales, int64_t scale_q,
                           bool per_row, float* c, int64_t ldc, bool accumulate);
  int pair_rows;    // the most rows of one pair_tile call (0 without pair kernels)
  int pair_strips;  // the most strips of one pair_tile call
  // pair_tile over any number of rows and a long depth in one call: the same chains, the same
  // bits (c[i * ldc + j] (+)= the sum, i < rows, j < 16 * strips). For a set whose per-call costs
  // (AMX: tile configuration, loading and storing the sums) want long runs, so that the caller
  // packs B for the whole depth (or long blocks of it), not per short depth block. Null in the
  // other sets. Requires: rows >= 1, 1 <= strips <= pair_strips, kc >= 1.
  void (*pair_block)(int64_t rows, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                     const uint32_t* b, int64_t b_strip, float* c, int64_t ldc, bool accumulate);
  // Ends the calling thread's use of what pair_tile and pair_block left set up between calls
  // (AMX: the tile configuration, kept while the shapes repeat): each worker calls it when its
  // share of a grouped GEMM is done. Null where there is nothing to end.
  void (*pair_release)();

  // f32.fma_rows with b FP8 codes decoded in registers (the bits of fma_rows on the decoded values;
  // the memory-bound dgrad of FP8 weights). Null where the set has none (as dot_tile_fp8).
  // Requires: b.col0 a multiple of 8.
  void (*fma_rows_fp8)(int64_t rows, int64_t depth, const float* a, int64_t lda,
                       const Fp8Operand& b, int64_t cols, float* c, int64_t ldc);
  // dst[i] = the BF16 bits of E4M3 code src[i], i < n (exact: every E4M3 value is a BF16 value;
  // NaN codes become BF16 NaN, the sign kept). Null in sets without FP8 pair kernels.
  void (*decode_fp8_bf16)(const uint8_t* src, uint16_t* dst, int64_t n);
  // c[r * ldc + j] = the sum over p < depth of a[r * lda + p] * W(p, j) for BF16 rows of a (dy)
  // and FP8 weights b read along their rows (dgrad, a few rows at a time), scaled block by
  // block as dot_tile_fp8_pairs is, not weight by weight: each code becomes its BF16 value
  // (exact); per block q of kFp8Block depths, t = one vdpbf16ps chain from +0 over the pairs of
  // depths 128q + 2i, 128q + 2i + 1 (i in order; past depth, the last pair's high halves are +0),
  // then s = fma(t, the scale of block q and column j, s), s starting at +0; c = s. Null in sets
  // without it (as dot_tile_fp8_pairs). Requires: 1 <= rows <= kFp8PairRows, depth >= 1,
  // b.row0 a multiple of kFp8Block, b.col0 a multiple of 16.
  void (*fma_rows_fp8_pairs)(int rows, int64_t depth, const uint16_t* a, int64_t lda,
                             const Fp8Operand& b, int64_t cols, float* c, int64_t ldc);
  // c[r * ldc + j] = the sum over p < depth of a[r * lda + p] * w[p * ldw + j] for BF16 rows of
  // a (dy) and BF16 weights read along their rows (dgrad, a few rows at a time), in pair_tile's
  // chain: one vdpbf16ps chain from +0 per element over the pairs of depths 2q, 2q + 1 in order
  // (past depth, the last pair's high halves are +0), so the bits of pair_tile on the weights'
  // pair panels. `ahead`: the weights the caller reads next (same ldw, the call's columns), whose
  // first rows are prefetched during the last depth block; null: none. Null in sets without it
  // (as dot_tile_pairs). Requires: rows >= 1, depth >= 1, cols >= 1.
  void (*fma_rows_pairs)(int rows, int64_t depth, const uint16_t* a, int64_t lda, const uint16_t* w,
                         int64_t ldw, int64_t cols, float* c, int64_t ldc, const uint16_t* ahead);

  // sums[j] = (start + row_0[j]) + row_1[j] + ... + row_{count-1}[j], in that order, for j < n,
  // where start is +0 when `zero` and sums[j] otherwise; row i starts at rows + i * row_bytes,
  // F32 or (bf16) BF16 bits widened exactly. One addition per element per row, so summing in
  // blocks of rows gives the same bits in both sets (bgrad).
  void (*add_rows)(const void* rows, int64_t row_bytes, int64_t count, bool bf16, int64_t n,
                   float* sums, bool zero);

  // Transposing pack: dst[p * width + i] = element (i, p) of the F32 or BF16 (bf16 = true)
  // matrix at src with leading dimension ld, widened to F32, for i < rows, p < kc; zero for
  // rows <= i < width. May write up to 8 floats past dst[kc * width - 1].
  // Requires: 1 <= rows <= width, width == kOuterRows or kOuterCols.
  void (*pack_transposed)(const void* src, bool bf16, int64_t ld, int rows, int64_t kc, float* dst,
                          int width);

  // One pair panel's rows (pack_pairs_transposed in packing.hpp): dst[r * kOuterCols + j] = the
  // dword of the BF16 values src[j * ld + 2r] (low half) and src[j * ld + 2r + 1] (high half),
  // for j < rows, and 0 for rows <= j < kOuterCols, for every r < pairs. An exact permutation.
  // Requires: 1 <= rows <= kOuterCols.
  void (*pack_pairs)(const uint16_t* src, int64_t ld, int rows, int64_t pairs, uint32_t* dst);
  // Pair panels of rows (pack_pairs_rows in packing.hpp: dgrad's weights and wgrad's x, rows
  // interleaved), one per 16 columns, panel s at dst + s * dst_strip: dst[s * dst_strip + r *
  // kOuterCols + j] = the dword of src[2r * ld + 16s + j] (low half) and src[(2r + 1) * ld + 16s
  // + j] (high half; 0 when 2r + 1 == depth) for 16s + j < cols, and 0 past cols in the last
  // panel, for every r < ceil(depth / 2). Row pair by row pair across all panels, so that each
  // source row is read once, in order (panel by panel, rows a page apart missed L1 at every
  // load; docs/PERFORMANCE.md). Requires: cols >= 1, dst_strip >= kOuterCols * ceil(depth / 2).
  void (*pack_pair_rows)(const uint16_t* src, int64_t ld, int64_t depth, int64_t cols,
                         uint32_t* dst, int64_t dst_strip);

  // dst[i * ldd + j] = src[j * lds + i] for i < rows, j < cols: an exact out-of-place transpose.
  // May read src[j * lds + i] for i up to rows rounded up to 8 (the caller's slack).
  void (*transpose)(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                    int64_t ldd);

  // dst[i] = the F32 value of the BF16 bits src[i] (exact), i < n.
  void (*widen_bf16)(const uint16_t* src, float* dst, int64_t n);

  // dst[i] = src[i] rounded to BF16, nearest even; NaN stays NaN (quiet, sign kept), exactly as
  // grouplin::f32_to_bf16.
  void (*narrow_bf16)(const float* src, uint16_t* dst, int64_t n);

  // narrow_bf16 written with non-temporal stores (where dst is 32-byte aligned; plain stores at
  // the ragged ends): for outputs written once and not read back by the kernels (every tile's
  // result, tile_products.hpp's store_rows). The caller fences.
  void (*stream_bf16)(const float* src, uint16_t* dst, int64_t n);

  // dst[i] = src[i], i < n, with non-temporal stores where dst is aligned to the set's vector
  // width (plain stores at the ragged ends, and throughout off x86-64): F32 outputs written once
  // and not read back by the kernels, as stream_bf16. The caller fences.
  void (*stream_f32)(const float* src, float* dst, int64_t n);

  // dst[i] = 0, i < bytes, with non-temporal stores of the set's vector width where dst is
  // aligned to it (plain stores at the ragged ends, and throughout off x86-64): the weight
  // gradients of experts without rows. The caller fences.
  void (*stream_zeros)(std::byte* dst, int64_t bytes);

  // dst[i] = the F32 value of the F8_E4M3 code src[i] times `scale`, one F32 multiply (the
  // dequantizing rule), i < n. How FP8 weights reach every kernel (packing.hpp decodes them a
  // tile at a time where a set has no fused FP8 kernel).
  void (*decode_e4m3)(const uint8_t* src, float scale, float* dst, int64_t n);

  const char* name;  // "portable", "avx2+fma", "avx512f", "avx512bf16" or "amx-bf16"
};

// The set for this CPU and GROUPLIN_ISA (or the one force_kernels chose).
const MicroKernels& micro_kernels();

// Makes micro_kernels() return the portable set (true) or the CPU's best (false). For tests;
// not thread-safe with running kernels.
void force_portable_kernels(bool portable);
// Makes micro_kernels() return `set` (nullptr: the CPU's best again); `set` must outlive its use.
// For tests (the emulated AVX-512 and AMX sets); not thread-safe with running kernels.
void force_kernels(const MicroKernels* set);

// The portable and AVX2+FMA sets (nullptr where the AVX2 code is not compiled, or the CPU lacks
// AVX2+FMA), whatever micro_kernels() returns: the bases the other sets are built on.
const MicroKernels& portable_kernels();
const MicroKernels* avx2_kernels();

}  // namespace grouplin::kernels
