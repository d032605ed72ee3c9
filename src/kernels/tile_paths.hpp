// Which loops each expert's tiles run: the tuning constants and the rules that choose a path, as
// pure functions of the operation, the expert's rows, the dtypes, what the kernel set has
// (SetCaps) and, for the forward, the depth (in_features), tested by themselves
// (tests/kernels/tile_paths_test.cpp). The tile functions (tile_compute.hpp) switch on
// forward_path, dgrad_path and wgrad_path; the plan (grouped_gemm.cpp), the prefetching of the next
// tile and forward_chain (which chain of operations a row's sums get) read the same rules, so that
// no two places decide apart.
//
//   const SetCaps set = SetCaps::of(micro_kernels());
//   switch (forward_path(expert_rows, in_features, x.dtype, w.dtype, set)) { ... }
//
// A path depends on the expert's row count (a function of m_splits) and the layer's shape, never
// on the tile, the thread count or timing, so the tiling never changes which chain a row gets;
// within a path, tile-level choices (turned pair tiles, weights read in place) change only speed.
#pragma once

#include <cstdint>

#include "grouplin/dtype.hpp"
#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels {

// Tuning constants and the rules that pick each expert's path. Every value was chosen by a
// same-run measurement; the figures are in docs/PERFORMANCE.md, "The kernels' constants and the
// measurements behind them": one line here says why, the section says by how much.
// kDotDepth: K per pass of the forward dot tiles: long, so that each weight row streams in long
// runs.
inline constexpr int64_t kDotDepth = 2048;
// kOuterDepth: depth of one packed block (a 16-column B-panel of 16 KiB stays in L1).
// kOuterBlockRows: rows of A packed at once (96 x 256 floats, 96 KiB, in L2 next to the 256 KiB
// B block).
inline constexpr int64_t kOuterDepth = 256;
inline constexpr int64_t kOuterBlockRows = 96;
// Forward: experts with at most kDotMaxRows rows run dot tiles straight from x and W (weights
// streamed once, unpacked: the memory-bound case); larger ones run outer-product tiles. The two
// sum in different orders, so how a row is computed depends on its expert's row count (a
// function of m_splits, never of threads or timing). BF16 weights take dot tiles only up to
// kDotMaxRowsBf16 rows: each 4-row group widens the weights again in registers, where the
// packed path widens them once.
inline constexpr int64_t kDotMaxRows = 8;
inline constexpr int64_t kDotMaxRowsBf16 = 3;
// Whether an expert of `rows` rows runs forward dot tiles (bf16: its weights are BF16).
inline bool forward_dots(int64_t rows, bool bf16) {
  return rows <= (bf16 ? kDotMaxRowsBf16 : kDotMaxRows);
}
// Forward: experts with more rows, up to kBroadcastMaxRows, read W in place as the broadcast
// operand of the outer-product tiles instead of packing it (same bits as the packed path).
// Beyond, packing W once per 384 rows pays. kBroadcastDepth: depth per block of that path (x
// panels of up to 96 rows stay in L2; 256 halves the dot tails' per-block sums against 128).
inline constexpr int64_t kBroadcastMaxRows = 96;
inline constexpr int64_t kBroadcastDepth = 256;
// In that path, an expert whose last 16-lane panel of x would hold only 1 to kDotTailMaxRows rows
// (after full panels) sums those last rows by dot tiles instead, on the weights the panels have
// just broadcast (in L1): a mostly empty panel costs as many broadcasts of W as a full one.
inline constexpr int64_t kDotTailMaxRows = 8;
// Whether an expert of `rows` rows takes the broadcast path (bf16: its weights are BF16). BF16
// weights are widened on either path, so packing them costs little more, and packing wins where
// the last panel of x would waste lanes: tails of 1-4 and 9-12 rows (F32 weights measured the
// same either way there and keep the broadcast path).
inline bool forward_broadcasts(int64_t rows, bool bf16) {
  const int64_t tail = rows % 16;
  const bool wasteful_tail = (tail >= 1 && tail <= 4) || (tail >= 9 && tail <= 12);
  return rows > kDotMaxRows && rows <= kBroadcastMaxRows && !(bf16 && wasteful_tail);
}
// In that path, the expert-relative row from which its rows are summed by dot tiles (rows: none).
inline int64_t forward_dot_tail_start(int64_t rows) {
  const int64_t full = rows / 16 * 16, tail = rows - full;
  return full > 0 && tail <= kDotTailMaxRows ? full : rows;
}
// dgrad tiles of at most kInPlaceMaxRows rows (F32 weights, and FP8 ones decoded row by row into
// a row-major F32 block; kInPlaceMaxRowsBf16 for BF16, which are widened in registers) read the
// weights in place as the B operand instead of packing them (same bits): with few rows per
// weight, packing costs more than it saves.
inline constexpr int64_t kInPlaceMaxRows = 64;
inline constexpr int64_t kInPlaceMaxRowsBf16 = 96;
// F32 weights read in place by dgrad tiles of at most kShortInPlaceMaxRows rows go by depth
// blocks of kShortInPlaceDepth instead of kOuterDepth: a block's weight rows lie a whole weight
// row apart, so 256 of them and the next block's, prefetched meanwhile, crowd the same cache
// sets; few rows per tile lose little reuse by halving the block, more rows lose more
// (docs/PERFORMANCE.md, "Shorter dgrad depth blocks"). The same chains either way: depth blocks
// only split where the sums are stored.
inline constexpr int64_t kShortInPlaceMaxRows = 32;
inline constexpr int64_t kShortInPlaceDepth = 128;
static_assert(kShortInPlaceDepth <= kOuterDepth);  // outer_product's scratch holds kOuterDepth
inline int64_t dgrad_in_place_depth(int64_t tile_rows, bool f32_weights) {
  return f32_weights && tile_rows <= kShortInPlaceMaxRows ? kShortInPlaceDepth : kOuterDepth;
}
// dgrad tiles of at most kDirectMaxRows rows and wgrad tiles of depth at most kDirectMaxDepth
// skip packing and run fma_rows straight from the operands (same bits as the packed path),
// summing in place in dx; at 8 rows, 8 rows of dx a 4 KiB stride apart alias in L1 and packing
// wins again. F32 weights on a set whose fma_rows takes at least kDirectScratchMaxRows weight
// rows per pass (fma_rows_steps: AVX-512) run it up to kDirectScratchMaxRows rows too, summing
// in scratch rows a line longer than the tile (no aliasing) of at most kDirectScratchCols
// columns (8 rows' sums, 32 KiB, stay in L1 beside 8 weight rows' lines): each weight row is
// read once, as it lies, where the outer tiles read 256 bytes of it per depth step 2 or more
// times; with one weight row per pass (AVX2) every sum passes through L1 per weight row, and
// packing stays ahead.
inline constexpr int64_t kDirectMaxRows = 4;
inline constexpr int64_t kDirectMaxDepth = 4;
inline constexpr int64_t kDirectScratchMaxRows = 8;
inline constexpr int64_t kDirectScratchCols = 1024;
// BF16 dgrad on the pair kernels from more than kDgradPairsMinRows rows per expert: at 3-4 rows
// the widened fma_rows are compute-bound (each sum read and written per weight row), and packing
// pair panels pays; at 2 rows the weights' stream bounds both and fma_rows is faster.

// BF16 x BF16 products (x or dy and the weights all BF16) on a kernel set with pair kernels
// (AVX512-BF16, AMX: MicroKernels::pair_tile, pair_block) run on them, the operands kept BF16,
// in depth blocks of kOuterDepth (a multiple of 2 * kPairGroup, so that blocking never splits a
// pair group) or, on AMX, the whole depth at once (wgrad: blocks of kPairScratchDepth;
// pair_product in tile_products.hpp):
// forward for experts with more rows than forward_dots takes (and, on a set with dot_tile_pairs,
// `few_rows`: AVX512-BF16, for every expert with rows), dgrad for experts with more than
// kDgradPairsMinRows rows and wgrad for more than kDirectMaxDepth (the fewer-row paths are memory-
// or write-bound and stay widened). Decided by the expert's row count, never the tile's, so the
// tiling does not change which chain a row gets. Forward of experts of 1 to kPairDotMaxRows rows
// runs dot_tile_pairs, which reads each weight row as it lies, one load and one vdpbf16ps per 32
// weights, no transposes and no packing, one weight row at a time (one memory stream per core reads
// faster than several). AMX not measured (it keeps widened dot tiles for 1-3 rows). Experts of up
// to kPairDotShallowMaxRows rows run it too where the depth is at most kPairDotShallowMaxDepth:
// two register tiles (4 + 3 or 4 + 4 rows) take each weight row in turn, x's rows (32 KiB at a
// depth of 2048) in L1 beside the weights' stream, where the turned pair tiles would spend a
// 16-lane strip on 7-8 rows; deeper, x's rows leave L1.
inline constexpr int64_t kPairDotMaxRows = kPairDotRows;
inline constexpr int64_t kPairDotShallowMaxRows = 8;
inline constexpr int64_t kPairDotShallowMaxDepth = 2048;
inline bool forward_pair_dots(int64_t rows, int64_t depth, bool bf16_operands, bool pair_dots) {
  const int64_t most = depth <= kPairDotShallowMaxDepth ? kPairDotShallowMaxRows : kPairDotMaxRows;
  return pair_dots && bf16_operands && rows > 0 && rows <= most;
}
// Whether the forward of an expert of `rows` rows runs the pair kernels (dots or tiles). Which of
// the two is forward_pair_dots' choice; here it only answers for the rows forward_dots would
// take (at most kDotMaxRowsBf16), which it takes at every depth: hence the depth 0.
inline bool forward_pairs(int64_t rows, bool bf16_operands, bool pair_kernels, bool few_rows) {
  return pair_kernels && bf16_operands &&
         (!forward_dots(rows, true) || forward_pair_dots(rows, 0, true, few_rows));
}
static_assert(kDotMaxRowsBf16 <= kPairDotMaxRows);
static_assert(kPairDotShallowMaxRows <= kPairDotCallRows && kPairDotCallRows <= 2 * kPairDotRows);
// FP8 weights against BF16 x or dy, on a set with the FP8 pair kernels (SetCaps), run them
// (sums scaled block by block, micro_kernels.hpp) instead of the F32 kernels on decoded and
// scaled codes (the bits of F32 weights holding the dequantized values). Forward of experts of
// up to kFp8DotMaxRows rows: dot_tile_fp8_pairs, a tile's rows in groups of at most kPairDotRows
// of nearly equal heights (each group reads the tile's weights again, from L2 after the first);
// dgrad of up to kFp8RowsMaxRows rows: fma_rows_fp8_pairs, kFp8PairRows at a time. More rows:
// pair_tile_scaled on the codes decoded to BF16 a depth block at a time (forward: as A of the
// turned tiles, or pair panels for tiles of more than kTurnedMaxRows rows; dgrad: pair panels). The
// bounds: below them a pair tile would decode and pack its codes for only those rows.
inline constexpr int64_t kFp8DotMaxRows = 12;
inline constexpr int64_t kFp8RowsMaxRows = 8;
// Which FP8 pair kernel an expert of `rows` rows runs, by its row count (never the tile's, so
// that the tiling does not change a row's chain).
inline bool fp8_forward_dots(int64_t rows) { return rows <= kFp8DotMaxRows; }
inline bool fp8_dgrad_rows(int64_t rows) { return rows <= kFp8RowsMaxRows; }
inline constexpr int64_t kDgradPairsMinRows = 2;
inline bool dgrad_pairs(int64_t rows, bool bf16_operands, bool pair_kernels) {
  return pair_kernels && bf16_operands && rows > kDgradPairsMinRows;
}
// BF16 dgrad of at most kPairRowsMaxRows rows, on a set with fma_rows_pairs: the weights read
// along their rows a depth block at a time, two rows interleaved into pairs in registers (the
// chains of the pair tiles, the same bits), instead of packed into pair panels for so few rows of
// dy (faster up to 64 rows, even at 128; beyond, packing pays: docs/PERFORMANCE.md).
inline constexpr int64_t kPairRowsMaxRows = 64;
inline bool dgrad_pair_rows(int64_t rows, bool pair_rows) {
  return pair_rows && rows <= kPairRowsMaxRows;
}
// Forward pair tiles of at most kTurnedMaxRows rows, and of a multiple of 16 rows up to
// kTurnedAlignedMaxRows (without packed weights), turn the product around: the weights are A,
// read in place (a row's depth pairs are adjacent, as x's are), and the tile's rows of x are
// packed as B, so that the weights are never packed. The pair kernels' products commute, so the
// bits are the same; only speed decides. Past 48 rows a ragged last strip of x's rows wastes
// lanes, and turning pays only without one (docs/PERFORMANCE.md, issues 22 and 43).
inline constexpr int64_t kTurnedMaxRows = 48;
inline constexpr int64_t kTurnedAlignedMaxRows = 128;
inline bool forward_pairs_turned(int64_t tile_rows) {
  return tile_rows <= kTurnedMaxRows ||
         (tile_rows <= kTurnedAlignedMaxRows && tile_rows % kOuterCols == 0);
}
// BF16 pair tiles on a set with dot_tile_pairs: an expert of at most kTurnedMaxRows rows (its
// tiles turned: x's rows are B's 16-lane strips) whose last strip would hold only 1 to
// kPairDotTailMaxRows rows, after at least one whole strip, sums those last rows by dot_tile_pairs
// along the whole depth (ForwardChain::kPairDots): a pair strip spends its 16 lanes on them however
// few they are, dot_tile_pairs one vdpbf16ps per row (the bound: docs/PERFORMANCE.md, "An
// expert's last few rows by dot_tile_pairs").
inline constexpr int64_t kPairDotTailMaxRows = 4;
// The expert-relative row from which an expert of `rows` rows on the pair tiles sums its rows by
// dot_tile_pairs (rows: none).
inline int64_t forward_pair_dot_tail_start(int64_t rows, bool pair_dots) {
  const int64_t full = rows / kOuterCols * kOuterCols, tail = rows - full;
  const bool dot_tail =
      pair_dots && full > 0 && rows <= kTurnedMaxRows && tail > 0 && tail <= kPairDotTailMaxRows;
  return dot_tail ? full : rows;
}
// The FP8 pair tiles turn up to kTurnedMaxRows rows only (the aligned tiles beyond were measured
// on BF16 weights, not on FP8 codes decoded per block).
inline bool fp8_forward_turned(int64_t tile_rows) { return tile_rows <= kTurnedMaxRows; }
// wgrad (x and dy BF16; the depth is the expert's rows) for experts of more than kDirectMaxDepth
// rows: dyᵀ transposed into BF16 rows a block at a time, x's rows interleaved into pair panels.
inline bool wgrad_pairs(int64_t rows, bool bf16_operands, bool pair_kernels) {
  return pair_kernels && bf16_operands && rows > kDirectMaxDepth;
}

// BF16 wgrad of at most this many rows per expert (one depth block of the pair tiles) streams each
// group of gradient rows out as soon as it is formed (WgradPath::kPairPanels).
inline constexpr int64_t kPairPanelsMaxDepth = kOuterDepth;

// What the rules read of a kernel set: which of its optional kernels it has.
struct SetCaps {
  bool pair_tiles = false;  // pair_tile: BF16 x BF16 products (AVX512-BF16, AMX)
  bool pair_dots = false;   // dot_tile_pairs: forward of a few rows along the depth
  bool fp8_dots = false;    // dot_tile_fp8_pairs (with the scaled pair tiles: FP8 forward)
  bool fp8_rows = false;    // fma_rows_fp8_pairs (with the scaled pair tiles: FP8 dgrad)
  bool pair_rows = false;   // fma_rows_pairs: BF16 dgrad of a few rows
  bool pair_block = false;  // pair_block: pair products want long runs per call (AMX)
  int f32_rows_steps = 1;   // f32.fma_rows_steps: weight rows per pass of fma_rows (F32 weights)
  static SetCaps of(const MicroKernels& mk) {
    return {mk.pair_tile != nullptr,
            mk.dot_tile_pairs != nullptr,
            mk.dot_tile_fp8_pairs != nullptr,
            mk.fma_rows_fp8_pairs != nullptr,
            mk.fma_rows_pairs != nullptr,
            mk.pair_block != nullptr,
            mk.f32.fma_rows_steps};
  }
};

// The forward paths (tile_forward.cpp, one function each):
//   kFp8PairDots   FP8 codes against BF16 x along the depth (dot_tile_fp8_pairs), a few rows
//   kFp8PairTiles  FP8 codes decoded to BF16 a block at a time, scaled pair tiles
//   kPairDots      BF16 x against BF16 weights along the depth (dot_tile_pairs), a few rows
//   kPairTiles     BF16 pair tiles (turned for short tiles, forward_pairs_turned)
//   kDots          F32 dot tiles (weights widened or decoded in registers or scratch)
//   kBroadcast     F32 outer-product tiles with the weights broadcast in place, dot tails
//   kOuter         F32 outer-product tiles on packed weights
enum class ForwardPath {
  kFp8PairDots,
  kFp8PairTiles,
  kPairDots,
  kPairTiles,
  kDots,
  kBroadcast,
  kOuter
};
inline ForwardPath forward_path(int64_t rows, int64_t depth, DType x, DType w, const SetCaps& set) {
  if (set.fp8_dots && w == DType::F8_E4M3 && x == DType::BF16) {
    return fp8_forward_dots(rows) ? ForwardPath::kFp8PairDots : ForwardPath::kFp8PairTiles;
  }
  const bool bf16_weights = w == DType::BF16;  // FP8 codes decode to F32 values
  if (forward_pairs(rows, bf16_weights && x == DType::BF16, set.pair_tiles, set.pair_dots)) {
    return forward_pair_dots(rows, depth, true, set.pair_dots) ? ForwardPath::kPairDots
                                                               : ForwardPath::kPairTiles;
  }
  if (forward_dots(rows, bf16_weights)) return ForwardPath::kDots;
  if (forward_broadcasts(rows, bf16_weights)) return ForwardPath::kBroadcast;
  return ForwardPath::kOuter;
}

// The dgrad paths (tile_backward.cpp):
//   kPairRows      BF16 weights against dy's rows (fma_rows_pairs), a few rows
//   kPairTiles     BF16 pair tiles on pair panels of the weights' rows
//   kFp8Rows       FP8 codes against BF16 dy rows (fma_rows_fp8_pairs), a few rows
//   kFp8PairTiles  FP8 codes decoded to BF16 a block at a time, scaled pair tiles
//   kDirect        fma_rows straight from dy and the weights (a few rows: weight-streaming)
//   kOuter         F32 outer-product tiles, the weights packed or read in place
enum class DgradPath { kPairRows, kPairTiles, kFp8Rows, kFp8PairTiles, kDirect, kOuter };
// The most rows per expert on kDirect (kDirectMaxRows above).
inline int64_t dgrad_direct_max_rows(DType w, const SetCaps& set) {
  const bool steps = w == DType::F32 && set.f32_rows_steps >= kDirectScratchMaxRows;
  return steps ? kDirectScratchMaxRows : kDirectMaxRows;
}
inline DgradPath dgrad_path(int64_t rows, DType dy, DType w, const SetCaps& set) {
  if (dgrad_pairs(rows, w == DType::BF16 && dy == DType::BF16, set.pair_tiles)) {
    return dgrad_pair_rows(rows, set.pair_rows) ? DgradPath::kPairRows : DgradPath::kPairTiles;
  }
  if (set.fp8_rows && w == DType::F8_E4M3 && dy == DType::BF16) {
    return fp8_dgrad_rows(rows) ? DgradPath::kFp8Rows : DgradPath::kFp8PairTiles;
  }
  return rows <= dgrad_direct_max_rows(w, set) ? DgradPath::kDirect : DgradPath::kOuter;
}

// The wgrad paths (tile_backward.cpp; an expert without rows only writes zeros, or keeps its
// gradient when accumulating):
//   kPairTiles  BF16 pair tiles: dyᵀ transposed into BF16 rows, x's rows into pair panels
//   kPairPanels the same for one depth block (at most kPairPanelsMaxDepth rows), each group of
//               gradient rows streamed out as soon as formed (sets without pair_block)
//   kDirect     fma_rows straight from the operands (depth of a few rows: write-bound)
//   kPanels     one depth block: x's rows packed once, dy's columns a panel at a time
//   kOuter      F32 outer-product tiles over depth blocks
enum class WgradPath { kPairTiles, kPairPanels, kDirect, kPanels, kOuter };
inline WgradPath wgrad_path(int64_t rows, DType x, DType dy, const SetCaps& set) {
  if (wgrad_pairs(rows, x == DType::BF16 && dy == DType::BF16, set.pair_tiles)) {
    return rows <= kPairPanelsMaxDepth && !set.pair_block ? WgradPath::kPairPanels
                                                          : WgradPath::kPairTiles;
  }
  if (rows <= kDirectMaxDepth) return WgradPath::kDirect;
  return rows <= kOuterDepth ? WgradPath::kPanels : WgradPath::kOuter;
}

// How forward sums row r (counted within its expert) of an expert of `rows` rows at a depth of
// `depth` (in_features): one chain of fused multiply-adds over in_features in order (the broadcast
// and packed paths: the same bits), dot tiles in kDotDepth blocks (experts with few rows), dot
// tiles in kBroadcastDepth blocks (an expert's last few rows in the broadcast path), the pair
// kernels' chain (BF16 x BF16 on a set with pair kernels: `pair_kernels`), or, for experts of a
// few rows on a set with dot_tile_pairs (`few_rows`), its 16 lane chains. The choice depends on the
// weights' dtype, so a BF16 forward matches the F32 forward on the widened values, rounded, where
// both use one FMA chain.
enum class ForwardChain { kFma, kDot, kDotTail, kPairs, kPairDots };
inline ForwardChain forward_chain(int64_t rows, int64_t depth, int64_t r, bool bf16,
                                  bool pair_kernels, bool few_rows) {
  const DType d = bf16 ? DType::BF16 : DType::F32;
  switch (forward_path(rows, depth, d, d, {pair_kernels, few_rows, false, false})) {
    case ForwardPath::kPairDots:
      return ForwardChain::kPairDots;
    case ForwardPath::kPairTiles:
      return r >= forward_pair_dot_tail_start(rows, few_rows) ? ForwardChain::kPairDots
                                                              : ForwardChain::kPairs;
    case ForwardPath::kDots:
      return ForwardChain::kDot;
    case ForwardPath::kBroadcast:
      return r >= forward_dot_tail_start(rows) ? ForwardChain::kDotTail : ForwardChain::kFma;
    default:
      return ForwardChain::kFma;
  }
}

}  // namespace grouplin::kernels
