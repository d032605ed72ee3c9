// Private to the tile paths (tile_forward.cpp, tile_backward.cpp): what they share. One worker's
// scratch layout, where sums accumulate, prefetching the next block while this one computes, and
// the two blocked product loops: outer_product (packed or in-place B, 6 x 16 outer-product tiles)
// and pair_product (BF16 pairs on the AVX512-BF16 and AMX sets).
//
//   const Scratch s = split_scratch(tile, scratch);
//   outer_product(rows, cols, depth, c, ldc, s, pack_a, b_block, b_source, next_first[, kc]);
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/micro_kernels.hpp"
#include "kernels/tile_compute.hpp"

namespace grouplin::kernels {

inline constexpr int64_t kAlignFloats = 16;  // 64 bytes

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One worker's scratch for a tile of rows x cols, in 64-byte aligned pieces:
//   row  one row of floats (bias, or the old gradient when accumulating)
//   c    the F32 result tile, when it cannot accumulate in place (ldc = cols rounded to 16, or
//        16 more: with_padded_rows)
//   a    packed A-panels, or widened rows of x / dy for the unpacked paths
//   b    packed B-panels, or widened rows of W / x for the unpacked paths
//   scales  FP8 weights' block scales for one depth block of the pair kernels (fp8_block_scales)
struct Scratch {
  float* row;
  float* c;
  float* a;
  float* b;
  float* scales;
  int64_t ldc;
};

struct ScratchSizes {
  int64_t row, c, a, b, scales;
  int64_t total() const { return row + c + a + b + scales; }
};

// s with c's rows one 64-byte line further apart: rows a multiple of 4 KiB apart would share one
// L1 set (c holds rows x that ldc).
inline Scratch with_padded_rows(Scratch s) {
  s.ldc += kAlignFloats;
  return s;
}

// The scratch pieces for a tile of rows x cols (their sum is what scratch_floats reserves).
ScratchSizes sizes_for(int64_t rows, int64_t cols);
// Floats of pair panels pair_product packs at once for `depth` on the current set (0 without
// pair_block): the b piece is at least this large.
int64_t pair_block_floats(int64_t depth);
// Tile t's pieces, laid out from `base` (b last: scratch_floats sizes it for the whole plan).
Scratch split_scratch(const Tile& t, float* base);

// Where a tile's F32 sums accumulate: in place in an F32 output, else in the scratch tile.
struct Accumulator {
  float* c;
  int64_t ldc;
  bool in_place;
};

// zero: whether the path needs zeros to add to (the packed path starts its chains from +0 itself,
// which gives the same bits without writing the tile twice).
Accumulator accumulator_for(const MutableMatrixRef& out, int64_t row0, int64_t col0,
                            bool in_place_allowed, bool zero, const Tile& t, const Scratch& s);

// Rows row0.. (`rows` of them), columns k0.. (kc) of m as F32: read in place when m is F32, else
// widened into `scratch` (ld kc).
struct F32Rows {
  const float* data;
  int64_t ld;
};
inline F32Rows f32_rows(const MatrixRef& m, int64_t row0, int64_t rows, int64_t k0, int64_t kc,
                        float* scratch) {
  if (m.dtype == DType::F32) return {reinterpret_cast<const float*>(element(m, row0, k0)), m.ld};
  for (int64_t r = 0; r < rows; ++r) load_f32(m, row0 + r, k0, kc, scratch + r * kc);
  return {scratch, kc};
}

// The bytes the next depth block will pack: `rows` rows of `row_bytes`, `stride` bytes apart.
struct Region {
  const std::byte* base = nullptr;
  int64_t stride = 0;
  int64_t rows = 0;
  int64_t row_bytes = 0;
};

// Prefetches a region into L2 a few cache lines at a time, spread over the micro-kernel calls of
// the current block, so that the weights stream in while the current block computes instead of
// stalling the next pack.
class Prefetcher {
 public:
  Prefetcher(const Region& r, int64_t calls) : r_(r), row_ptr_(r.base) {
    lines_per_row_ = (r.row_bytes + 63) / 64;
    total_ = r.rows * lines_per_row_;
    per_call_ = calls > 1 ? (total_ + calls - 1) / calls : total_;
  }
  // Walks the region with running row and line counters: a division per line (the obvious
  // row = n / lines_per_row) cost a quarter of the forward time at 32 rows per expert.
  void step() {
    for (int64_t n = 0; n < per_call_ && next_ < total_; ++n, ++next_) {
      __builtin_prefetch(row_ptr_ + line_ * 64, 0, 2);
      if (++line_ == lines_per_row_) {
        line_ = 0;
        row_ptr_ += r_.stride;
      }
    }
  }

 private:
  Region r_;
  int64_t lines_per_row_ = 0, total_ = 0, per_call_ = 0, next_ = 0, line_ = 0;
  const std::byte* row_ptr_;
};

// The bytes of m's rows r0.. (rows of them) and columns c0.. (cols).
Region region_of(const MatrixRef& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols);

// The row panels of `rows` rows: as few as fit in `most` (kOuterRows) each, of nearly equal
// heights (32 rows: 6, 6, 5, 5, 5, 5). Below 4 rows a micro-tile has too few accumulators to hide
// the FMA latency and costs nearly as much as a full one (docs/PERFORMANCE.md, measurements behind
// the code's comments).
struct RowPanels {
  int64_t count, base, extra;  // the first `extra` panels have base + 1 rows, the rest base
  explicit RowPanels(int64_t rows, int64_t most = kOuterRows)
      : count((rows + most - 1) / most),
        base(count > 0 ? rows / count : 0),
        extra(count > 0 ? rows % count : 0) {}
  int64_t start(int64_t i) const { return i * base + std::min(i, extra); }
  int height(int64_t i) const { return static_cast<int>(base + (i < extra ? 1 : 0)); }
};

// B for one depth block: packed B-panels (F32, ldb = kOuterCols, panel j at j * kc), or, with
// packed = false, a matrix read in place (F32 or BF16, ldb = its ld, columns j.. at element j).
struct BBlock {
  const void* b;
  int64_t ldb;
  bool packed = true;
  bool bf16 = false;
};

// c[rows x cols] (ldc) += A · B over kc, A packed as RowPanels(rows) (panel i at i * 6 * kc).
// Full 16-column strips go through outer_strips, up to the set's max_strips at once (the AVX2 set
// takes one: the loop order of one strip against every row panel, its B strip in L1); a last
// strip with fewer than 16 columns (packed B only) runs on a zero-padded local copy, so nothing
// outside the tile is touched (the output may be the caller's tensor, with other threads writing
// next to it).
void outer_tiles(int64_t rows, int64_t cols, int64_t kc, const float* ap, const BBlock& b, float* c,
                 int64_t ldc, bool accumulate, Prefetcher& prefetch);

// The outer-product path shared by forward, dgrad and wgrad: c[rows x cols] = A · B over
// `depth`, in blocks of `depth_block` (at most kOuterDepth); each block gets B once (b_block(p0,
// kc, scratch): packed there, or read in place) and packs A in pieces of kOuterBlockRows rows, one
// row panel at a time (pack_a(i0, rows, p0, kc, a), rows <= kOuterRows), while prefetching what the
// next block's B will read (b_source(p0, kc)). During the last block it prefetches `after`, the
// next tile's first block.
template <class PackA, class BlockB, class SourceB>
void outer_product(int64_t rows, int64_t cols, int64_t depth, float* c, int64_t ldc,
                   const Scratch& s, const PackA& pack_a, const BlockB& b_block,
                   const SourceB& b_source, const Region& after,
                   int64_t depth_block = kOuterDepth) {
  const int64_t calls =
      ((rows + kOuterRows - 1) / kOuterRows) * ((cols + kOuterCols - 1) / kOuterCols);
  for (int64_t p0 = 0; p0 < depth; p0 += depth_block) {
    const int64_t kc = std::min(depth_block, depth - p0);
    const int64_t next = p0 + kc;
    Prefetcher prefetch(next < depth ? b_source(next, std::min(depth_block, depth - next)) : after,
                        calls);
    const BBlock b = b_block(p0, kc, s.b);
    for (int64_t i0 = 0; i0 < rows; i0 += kOuterBlockRows) {
      const int64_t mc = std::min(kOuterBlockRows, rows - i0);
      const RowPanels panels(mc);
      for (int64_t q = 0; q < panels.count; ++q)
        pack_a(i0 + panels.start(q), panels.height(q), p0, kc, s.a + q * kOuterRows * kc);
      outer_tiles(mc, cols, kc, s.a, b, c + i0 * ldc, ldc, p0 > 0, prefetch);
    }
  }
}

// A of the pair kernels for depths [p0, p0 + kc): BF16 rows from `a` (row i at a + i * lda).
struct PairA {
  const uint16_t* a;
  int64_t lda;
};
// BF16 rows read in place: row a_row0 + i of `a`, from column p0 (forward's x, dgrad's dy).
inline auto pair_rows_in_place(const MatrixRef& a, int64_t a_row0) {
  const auto* a0 = reinterpret_cast<const uint16_t*>(element(a, a_row0, 0));
  return [a0, lda = a.ld](int64_t p0, int64_t) { return PairA{a0 + p0, lda}; };
}
// Depths per block on a set with pair_block when A is formed in scratch a block at a time (wgrad's
// dy, transposed): as long as scratch's a piece holds for a tile's rows (rows x 2 * kOuterDepth
// BF16: 384 rows, 384 KiB).
inline constexpr int64_t kPairScratchDepth = 2 * kOuterDepth;

// B of the pair kernels: pair panels (packing.hpp) for a range of depths and 16-column strips,
// strip j at panels + j * strip. Packed into scratch a block at a time (strip =
// pair_panel_dwords(kc)), or a window into weights packed once for their whole depth
// (packed_weights.hpp: strip = pair_panel_dwords(in_features)); the same dwords either way.
struct PairB {
  const uint32_t* panels;
  int64_t strip;
};
inline PairB packed_in_scratch(const uint32_t* panels, int64_t kc) {
  return {panels, pair_panel_dwords(kc)};
}

// The block scales of one depth block for pair_tile_scaled (FP8 weights): table[q * ld + i] for
// row i of the product (per_row) or column i (micro_kernels.hpp).
struct ScaleTable {
  const float* table;
  int64_t ld;
  bool per_row;
};
// pair_product's default: plain pair_tile sums, unscaled.
struct Unscaled {};
// Scaled pair products go by kOuterDepth blocks, each of whole scale blocks.
static_assert(kOuterDepth % kFp8Block == 0);

// c[rows x cols] (ldc: cols rounded up to 16, scratch) = A · B over `depth` on the pair kernels:
// A from a_block(p0, kc) (a PairA whose rows cover depths [p0, p0 + kc)), B from
// pair_b(p0, kc, c0, ncols, scratch) (a PairB for depths [p0, p0 + kc) and the tile's columns
// [c0, c0 + ncols), packed into `scratch` or pointing elsewhere). Whole 16-column strips are
// computed (the panels are zero-padded), which the scratch's padded rows have room for, but for
// a last strip of at most 8 columns on a set with pair_tile_half: only its first 8 columns (the
// rest of c's padding is then neither read nor written).
// - Sets with pair_block (AMX): per group of pair_strips strips, B packed for the whole depth
//   (a_in_place) or blocks of kPairScratchDepth (A formed in scratch) once, then every row of the
//   tile in one call that keeps its sums in the matrix engine from the first depth of the block
//   to the last (pair_block_floats of scratch: 2 strips x 2048 depths, 128 KiB).
// - Others (AVX512-BF16): depth blocks of kOuterDepth outside, strip groups, then row groups
//   inside: a group's B panels (4 strips, 32 KiB at kc = 256) stay in L1 while every row group
//   of the tile passes over them. While a block computes, what the next block's pack_b will read
//   (b_source(p0, kc)) is prefetched, spread over its pair_tile calls; during the last block,
//   `after` (the next tile's first block), as outer_product does.
// Both give the same bits (the chains depend only on the depth: micro_kernels.hpp).
// With block_scales (FP8 weights decoded into BF16; sets without pair_block only), each depth
// block's ScaleTable comes from block_scales(p0, kc) and pair_tile_scaled sums instead.
template <class BlockA, class BlockB, class SourceB, class BlockScales = Unscaled>
void pair_product(int64_t rows, int64_t cols, int64_t depth, const BlockA& a_block, bool a_in_place,
                  float* c, int64_t ldc, const Scratch& s, const BlockB& pair_b,
                  const SourceB& b_source, const Region& after,
                  const BlockScales& block_scales = {}) {
  constexpr bool kScaled = !std::is_same_v<BlockScales, Unscaled>;
  const MicroKernels& mk = micro_kernels();
  auto* panels = reinterpret_cast<uint32_t*>(s.b);
  const int64_t strips = (cols + kOuterCols - 1) / kOuterCols;
  if (!kScaled && mk.pair_block != nullptr) {
    const int64_t block = a_in_place ? depth : kPairScratchDepth;
    for (int64_t p0 = 0; p0 < depth; p0 += block) {
      const int64_t kc = std::min(block, depth - p0);
      const PairA a = a_block(p0, kc);
      for (int64_t j = 0; j < strips; j += mk.pair_strips) {
        const int ns = static_cast<int>(std::min<int64_t>(mk.pair_strips, strips - j));
        const int64_t c0 = j * kOuterCols;
        const PairB b = pair_b(p0, kc, c0, std::min<int64_t>(ns * kOuterCols, cols - c0), panels);
        mk.pair_block(rows, ns, kc, a.a, a.lda, b.panels, b.strip, c + c0, ldc, p0 > 0);
      }
    }
    return;
  }
  // Row groups of nearly equal heights (RowPanels): a last group of 1-2 rows costs nearly as
  // much as a full one.
  const RowPanels panels_of_rows(rows);
  // A last strip of at most 8 columns is summed at half width (pair_tile_half: the same chains).
  const bool half_last =
      mk.pair_tile_half != nullptr && cols - (strips - 1) * kOuterCols <= kOuterCols / 2;
  const int64_t calls = (strips + mk.pair_strips - 1) / mk.pair_strips * panels_of_rows.count;
  for (int64_t p0 = 0; p0 < depth; p0 += kOuterDepth) {
    const int64_t kc = std::min(kOuterDepth, depth - p0);
    const PairA a = a_block(p0, kc);
    const PairB b = pair_b(p0, kc, 0, cols, panels);
    const int64_t next = p0 + kc;
    Prefetcher prefetch(next < depth ? b_source(next, std::min(kOuterDepth, depth - next)) : after,
                        calls);
    ScaleTable scales{};
    if constexpr (kScaled) scales = block_scales(p0, kc);
    for (int64_t j = 0; j < strips; j += mk.pair_strips) {
      const int ns = static_cast<int>(std::min<int64_t>(mk.pair_strips, strips - j));
      for (int64_t q = 0; q < panels_of_rows.count; ++q) {
        const int64_t i = panels_of_rows.start(q);
        const int h = panels_of_rows.height(q);
        prefetch.step();
        if constexpr (kScaled) {
          mk.pair_tile_scaled(h, ns, kc, a.a + i * a.lda, a.lda, b.panels + j * b.strip, b.strip,
                              scales.table + (scales.per_row ? i : j * kOuterCols), scales.ld,
                              scales.per_row, c + i * ldc + j * kOuterCols, ldc, p0 > 0);
        } else {
          const auto tile = half_last && j + ns == strips ? mk.pair_tile_half : mk.pair_tile;
          tile(h, ns, kc, a.a + i * a.lda, a.lda, b.panels + j * b.strip, b.strip,
               c + i * ldc + j * kOuterCols, ldc, p0 > 0);
        }
      }
    }
  }
}

// The rows of a scratch result into the output (rounded for BF16) by non-temporal stores, then a
// fence; in place, nothing to do. No tile reads another's result, and plain stores would first
// read every output line in from memory (docs/PERFORMANCE.md, "Tile results by non-temporal
// stores").
void store_rows(const Accumulator& acc, const Tile& t, const MutableMatrixRef& out, int64_t row0,
                int64_t col0);

}  // namespace grouplin::kernels
