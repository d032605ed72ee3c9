// The backward tile paths (tile_compute.hpp; one function per path of tile_paths.hpp): dgrad (dx =
// dy · W), wgrad (dW = dyᵀ · x) and bgrad (column sums of dy), each choosing between unpacked loops
// for little work per weight and packed outer-product tiles.
#include <algorithm>
#include <cstddef>

#include "kernels/micro_kernels.hpp"
#include "kernels/tile_compute.hpp"
#include "kernels/tile_products.hpp"

namespace grouplin::kernels {
namespace {

// Prefetch distance of the unpacked dgrad: kDirectChunk weight rows.
constexpr int64_t kDirectChunk = 16;
// Rows of the unpacked wgrad formed per fma_rows call (4 rows of a tile's 1024 floats: 16 KiB,
// in L1; 8 rows fill it: docs/PERFORMANCE.md, "Wider wgrad tiles").
constexpr int64_t kDirectRowGroup = 4;

Region dgrad_first(const DgradArgs& args, const Tile* t) {
  if (t == nullptr) return {};
  return region_of(args.weights[static_cast<size_t>(t->expert)], 0,
                   std::min(kOuterDepth, args.out_features), t->col0, t->cols);
}
Region wgrad_first(const WgradArgs& args, const Tile* t) {
  if (t == nullptr || t->depth == 0) return {};
  return region_of(args.x, args.first_row[static_cast<size_t>(t->expert)],
                   std::min(kOuterDepth, t->depth), t->col0, t->cols);
}

// c[j] = old + c[j] for the tile's columns of gradient row `row`: accumulating is one F32
// addition per element. `old` is scratch for one row.
void add_old_gradient(const MutableMatrixRef& g, int64_t row, const Tile& t, float* c, float* old) {
  load_f32(MatrixRef{g.data, g.dtype, g.ld}, row, t.col0, t.cols, old);
  for (int64_t j = 0; j < t.cols; ++j) c[j] = old[j] + c[j];
}

// The tile's sums into its weight gradient (added to the old values when accumulating), streamed.
void store_gradient(const WgradArgs& args, const Tile& t, const Accumulator& acc,
                    const Scratch& s) {
  const MutableMatrixRef& g = args.wgrads[static_cast<size_t>(t.expert)];
  if (args.accumulate) {
    for (int64_t r = 0; r < t.rows; ++r)
      add_old_gradient(g, t.row0 + r, t, acc.c + r * acc.ldc, s.row);
  }
  store_rows(acc, t, g, t.row0, t.col0);
}

// Gradient rows t.row0 + i.. (h of them) from the first h rows of the scratch tile (formed in L1
// a group at a time), added to the old gradient first when accumulating, streamed out.
void stream_gradient_rows(const WgradArgs& args, const Tile& t, int64_t i, int64_t h,
                          const Scratch& s) {
  const MutableMatrixRef& g = args.wgrads[static_cast<size_t>(t.expert)];
  for (int64_t r = 0; r < h; ++r) {
    float* c = s.c + r * s.ldc;
    if (args.accumulate) add_old_gradient(g, t.row0 + i + r, t, c, s.row);
    stream_f32(c, t.cols, g, t.row0 + i + r, t.col0);
  }
}

// wgrad of one depth block (few rows per expert: write-bound): x's rows packed once, then each
// panel of up to 6 gradient rows is formed in L1 and streamed out (added to the old gradient
// first when accumulating), instead of summing in place in the output or storing the whole tile
// and streaming it from L2 (faster up to 64 rows: docs/PERFORMANCE.md).
void wgrad_by_panels(const WgradArgs& args, const Tile& t, int64_t first, const Region& after,
                     const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const int64_t kc = t.depth;
  pack_b_rows(args.x, first, kc, t.col0, t.cols, s.b);
  const RowPanels panels(t.rows);
  const int64_t strips = (t.cols + kOuterCols - 1) / kOuterCols;
  Prefetcher prefetch(after, panels.count);
  for (int64_t q = 0; q < panels.count; ++q) {
    const int64_t i = panels.start(q);
    const int h = panels.height(q);
    pack_a_cols_of(args.dy, first, kc, t.row0 + i, h, s.a);
    prefetch.step();
    for (int64_t j = 0; j < strips; j += mk.max_strips) {
      const int ns = static_cast<int>(std::min<int64_t>(mk.max_strips, strips - j));
      mk.f32.outer_strips(h, ns, kc, s.a, 1, kOuterRows, s.b + j * kOuterCols * kc, kOuterCols,
                          kOuterCols * kc, s.c + j * kOuterCols, s.ldc, false);
    }
    stream_gradient_rows(args, t, i, h, s);
  }
  stream_fence();
}

// dgrad, one function per DgradPath (tile_paths.hpp).
// BF16 pair tiles: dy's rows read in place as A, the weights' rows interleaved into pair panels.
void dgrad_pair_tiles(const DgradArgs& args, const MatrixRef& w, const Tile& t, const Tile* next,
                      const Scratch& s) {
  const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, false, false, t, s);
  pair_product(
      t.rows, t.cols, args.out_features, pair_rows_in_place(args.dy, t.row0), true, acc.c, acc.ldc,
      s,
      [&](int64_t p0, int64_t kc, int64_t c0, int64_t ncols, uint32_t* b) {
        pack_pairs_rows(w, p0, kc, t.col0 + c0, ncols, b);
        return packed_in_scratch(b, kc);
      },
      [&](int64_t p0, int64_t kc) { return region_of(w, p0, kc, t.col0, t.cols); },
      dgrad_first(args, next));
  store_rows(acc, t, args.dx, t.row0, t.col0);
}

// BF16 weights against all of the tile's rows of dy in one call, the weights read along their rows
// a depth block at a time; during the last block the next tile's first rows are prefetched (when
// it is as wide, so that the prefetches stay inside its matrix).
void dgrad_pair_rows(const DgradArgs& args, const MatrixRef& w, const Tile& t, const Tile* next,
                     const Scratch& s) {
  const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, true, false, t, s);
  const uint16_t* ahead = nullptr;
  if (next != nullptr && next->cols == t.cols) {
    const MatrixRef& wn = args.weights[static_cast<size_t>(next->expert)];
    if (wn.dtype == DType::BF16 && wn.ld == w.ld)
      ahead = reinterpret_cast<const uint16_t*>(element(wn, 0, next->col0));
  }
  micro_kernels().fma_rows_pairs(static_cast<int>(t.rows), args.out_features,
                                 reinterpret_cast<const uint16_t*>(element(args.dy, t.row0, 0)),
                                 args.dy.ld,
                                 reinterpret_cast<const uint16_t*>(element(w, 0, t.col0)), w.ld,
                                 t.cols, acc.c, acc.ldc, ahead);
  store_rows(acc, t, args.dx, t.row0, t.col0);
}

// FP8 codes, more than a few rows: pair_tile_scaled on the codes decoded to BF16 a depth block at
// a time (kc rows x the tile's columns, in L2) and packed into pair panels.
void dgrad_fp8_pair_tiles(const DgradArgs& args, const MatrixRef& w, const Tile& t,
                          const Tile* next, const Scratch& s) {
  const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, false, false, t, s);
  auto* decoded = reinterpret_cast<uint16_t*>(s.a);
  const int64_t ld = round_up(t.cols, kOuterCols);
  pair_product(
      t.rows, t.cols, args.out_features, pair_rows_in_place(args.dy, t.row0), true, acc.c, acc.ldc,
      s,
      [&](int64_t p0, int64_t kc, int64_t c0, int64_t ncols, uint32_t* b) {
        const MatrixRef d = fp8_codes_as_bf16(w, p0, kc, t.col0 + c0, ncols, decoded, ld);
        pack_pairs_rows(d, 0, kc, 0, ncols, b);
        return packed_in_scratch(b, kc);
      },
      [&](int64_t p0, int64_t kc) { return region_of(w, p0, kc, t.col0, t.cols); },
      dgrad_first(args, next),
      [&](int64_t p0, int64_t kc) {
        fp8_block_scales(w, true, p0, kc, t.col0, t.cols, ld, s.scales);
        return ScaleTable{s.scales, ld, false};
      });
  store_rows(acc, t, args.dx, t.row0, t.col0);
}

// FP8 codes against dy's rows, kFp8PairRows at a time, the weights read along their rows a depth
// block at a time.
void dgrad_fp8_rows(const DgradArgs& args, const MatrixRef& w, const Tile& t, const Tile* next,
                    const Scratch& s) {
  const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, true, false, t, s);
  Fp8Operand operand = fp8_operand(w, 0, t.col0);
  if (next != nullptr) {
    const MatrixRef& wn = args.weights[static_cast<size_t>(next->expert)];
    if (wn.dtype == DType::F8_E4M3) operand.ahead = fp8_operand(wn, 0, next->col0).codes;
  }
  for (int64_t i = 0; i < t.rows; i += kFp8PairRows) {
    const int h = static_cast<int>(std::min<int64_t>(kFp8PairRows, t.rows - i));
    Fp8Operand b = operand;
    if (i + h < t.rows) b.ahead = nullptr;  // only the last group reads on to the next tile
    micro_kernels().fma_rows_fp8_pairs(
        h, args.out_features, reinterpret_cast<const uint16_t*>(element(args.dy, t.row0 + i, 0)),
        args.dy.ld, b, t.cols, acc.c + i * acc.ldc, acc.ldc);
  }
  store_rows(acc, t, args.dx, t.row0, t.col0);
}

// A few rows: fma_rows straight from dy (widened a depth block at a time) and the weights, in
// chunks of weight rows (BF16 widened in registers, FP8 decoded in registers or scratch),
// prefetching a chunk ahead; the chain of the packed path. Up to kDirectMaxRows rows sum in place
// in dx; more sum in scratch, each row a 64-byte line further on than the last (tile_paths.hpp).
void dgrad_direct(const DgradArgs& args, const MatrixRef& w, const Tile& t, const Scratch& s) {
  const bool in_place = t.rows <= kDirectMaxRows;
  const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, in_place, true, t,
                                          in_place ? s : with_padded_rows(s));
  const MicroKernels& mk = micro_kernels();
  const bool fp8_fused = w.dtype == DType::F8_E4M3 && mk.fma_rows_fp8 != nullptr;
  for (int64_t p0 = 0; p0 < args.out_features; p0 += kOuterDepth) {
    const int64_t kc = std::min(kOuterDepth, args.out_features - p0);
    const F32Rows dyr = f32_rows(args.dy, t.row0, t.rows, p0, kc, s.a);
    const float* a = dyr.data;
    const int64_t lda = dyr.ld;
    for (int64_t p = 0; p < kc; p += kDirectChunk) {
      const int64_t ahead = p0 + p + kDirectChunk;
      if (ahead < args.out_features && !fp8_fused) {
        Prefetcher(
            region_of(w, ahead, std::min(kDirectChunk, args.out_features - ahead), t.col0, t.cols),
            1)
            .step();
      }
      const int64_t n = std::min(kDirectChunk, kc - p);
      const std::byte* b = element(w, p0 + p, t.col0);
      if (fp8_fused) {  // decoded in registers, the next chunk prefetched as this one is read
        Fp8Operand operand = fp8_operand(w, p0 + p, t.col0);
        if (ahead + kDirectChunk <= args.out_features) {
          operand.ahead = operand.codes + kDirectChunk * operand.ld;
        }
        mk.fma_rows_fp8(t.rows, n, a + p, lda, operand, t.cols, acc.c, acc.ldc);
      } else if (w.dtype == DType::F8_E4M3) {  // decoded n rows at a time into scratch
        const F32Rows wd = f32_rows(w, p0 + p, n, t.col0, t.cols, s.b);
        mk.f32.fma_rows(t.rows, n, a + p, lda, wd.data, wd.ld, t.cols, acc.c, acc.ldc);
      } else {
        mk.for_b(w.dtype == DType::BF16)
            .fma_rows(t.rows, n, a + p, lda, b, w.ld, t.cols, acc.c, acc.ldc);
      }
    }
  }
  store_rows(acc, t, args.dx, t.row0, t.col0);
}

// F32 outer-product tiles. Few rows share each weight: read W in place rather than pack it (BF16
// widened in registers, FP8 decoded row by row into a row-major F32 block read the same way; same
// bits). Full 16-column micro-tiles only, so that nothing past the tile's columns is read.
void dgrad_outer(const DgradArgs& args, const MatrixRef& w, const Tile& t, const Tile* next,
                 const Scratch& s) {
  const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, true, false, t, s);
  const bool fp8 = w.dtype == DType::F8_E4M3;
  const bool in_place =
      t.rows <= (w.dtype == DType::BF16 ? kInPlaceMaxRowsBf16 : kInPlaceMaxRows) &&
      t.cols % kOuterCols == 0;
  outer_product(
      t.rows, t.cols, args.out_features, acc.c, acc.ldc, s,
      [&](int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* a) {
        pack_a_rows_of(args.dy, t.row0 + i0, rows, p0, kc, a);
      },
      [&](int64_t p0, int64_t kc, float* b) {
        if (in_place && fp8) {
          for (int64_t p = 0; p < kc; ++p) load_f32(w, p0 + p, t.col0, t.cols, b + p * t.cols);
          return BBlock{b, t.cols, false, false};
        }
        if (in_place) return BBlock{element(w, p0, t.col0), w.ld, false, w.dtype == DType::BF16};
        pack_b_rows(w, p0, kc, t.col0, t.cols, b);
        return BBlock{b, kOuterCols};
      },
      [&](int64_t p0, int64_t kc) { return region_of(w, p0, kc, t.col0, t.cols); },
      dgrad_first(args, next),
      in_place ? dgrad_in_place_depth(t.rows, w.dtype == DType::F32) : kOuterDepth);
  store_rows(acc, t, args.dx, t.row0, t.col0);
}

}  // namespace

void dgrad_tile(const DgradArgs& args, const Tile& t, const Tile* next, float* scratch) {
  const auto e = static_cast<size_t>(t.expert);
  const MatrixRef& w = args.weights[e];
  const Scratch s = split_scratch(t, scratch);
  switch (dgrad_path(args.expert_rows[e], args.dy.dtype, w.dtype, SetCaps::of(micro_kernels()))) {
    case DgradPath::kPairRows:
      dgrad_pair_rows(args, w, t, next, s);
      return;
    case DgradPath::kPairTiles:
      dgrad_pair_tiles(args, w, t, next, s);
      return;
    case DgradPath::kFp8PairTiles:
      dgrad_fp8_pair_tiles(args, w, t, next, s);
      return;
    case DgradPath::kFp8Rows:
      dgrad_fp8_rows(args, w, t, next, s);
      return;
    case DgradPath::kDirect:
      dgrad_direct(args, w, t, s);
      return;
    case DgradPath::kOuter:
      dgrad_outer(args, w, t, next, s);
      return;
  }
}

namespace {

// wgrad, one function per WgradPath (tile_paths.hpp). An expert without rows writes zeros.
void wgrad_zeros(const WgradArgs& args, const Tile& t) {
  const MutableMatrixRef& g = args.wgrads[static_cast<size_t>(t.expert)];
  if (t.col0 == 0 && t.cols == g.ld) {
    stream_zeros(t.rows * t.cols, g, t.row0, 0);  // whole rows: one contiguous block
  } else {
    for (int64_t r = 0; r < t.rows; ++r) stream_zeros(t.cols, g, t.row0 + r, t.col0);
  }
  stream_fence();
}

// BF16 pair tiles: A = dyᵀ, the tile's columns of dy transposed into BF16 rows a block of depth
// at a time (the pair kernels read A along the depth); B = rows of x, two interleaved per pair
// row.
void wgrad_pair_tiles(const WgradArgs& args, const Tile& t, const Tile* next, const Scratch& s) {
  const MutableMatrixRef& g = args.wgrads[static_cast<size_t>(t.expert)];
  const int64_t first = args.first_row[static_cast<size_t>(t.expert)];
  auto* at = reinterpret_cast<uint16_t*>(s.a);
  const Accumulator acc = accumulator_for(g, t.row0, t.col0, false, false, t, s);
  pair_product(
      t.rows, t.cols, t.depth,
      [&](int64_t p0, int64_t kc) {
        const int64_t lda = round_up(kc, 2 * kPairGroup);
        transpose_bf16(args.dy, first + p0, kc, t.row0, t.rows, at, lda);
        return PairA{at, lda};
      },
      false, acc.c, acc.ldc, s,
      [&](int64_t p0, int64_t kc, int64_t c0, int64_t ncols, uint32_t* b) {
        pack_pairs_rows(args.x, first + p0, kc, t.col0 + c0, ncols, b);
        return packed_in_scratch(b, kc);
      },
      [&](int64_t p0, int64_t kc) { return region_of(args.x, first + p0, kc, t.col0, t.cols); },
      wgrad_first(args, next));
  store_gradient(args, t, acc, s);
}

// BF16 pair tiles over one depth block (few rows per expert: write-bound), the pair-kernel form of
// wgrad_by_panels: dyᵀ transposed and x's rows packed once, then each group of gradient rows
// formed in L1 across the tile's columns and streamed out at once, so that writing the gradient
// overlaps the next group's products instead of following the whole tile. The calls of
// wgrad_pair_tiles' one depth block in another order: the same bits.
void wgrad_pair_panels(const WgradArgs& args, const Tile& t, const Tile* next, const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const int64_t first = args.first_row[static_cast<size_t>(t.expert)];
  const int64_t kc = t.depth;
  auto* at = reinterpret_cast<uint16_t*>(s.a);
  const int64_t lda = round_up(kc, 2 * kPairGroup);
  transpose_bf16(args.dy, first, kc, t.row0, t.rows, at, lda);
  auto* panels = reinterpret_cast<uint32_t*>(s.b);
  pack_pairs_rows(args.x, first, kc, t.col0, t.cols, panels);
  const int64_t strip = pair_panel_dwords(kc);
  const int64_t strips = (t.cols + kOuterCols - 1) / kOuterCols;
  const RowPanels groups(t.rows);
  Prefetcher prefetch(wgrad_first(args, next), groups.count);
  for (int64_t q = 0; q < groups.count; ++q) {
    const int64_t i = groups.start(q);
    const int h = groups.height(q);
    prefetch.step();
    for (int64_t j = 0; j < strips; j += mk.pair_strips) {
      const int ns = static_cast<int>(std::min<int64_t>(mk.pair_strips, strips - j));
      mk.pair_tile(h, ns, kc, at + i * lda, lda, panels + j * strip, strip, s.c + j * kOuterCols,
                   s.ldc, false);
    }
    stream_gradient_rows(args, t, i, h, s);
  }
  stream_fence();
}

// A depth of a few rows: fma_rows straight from dy's columns (gathered as F32 rows) and x's rows.
// Write-bound: without accumulating, each group of kDirectRowGroup rows is formed in L1 and
// streamed out once.
void wgrad_direct(const WgradArgs& args, const Tile& t, const Scratch& s) {
  const MutableMatrixRef& g = args.wgrads[static_cast<size_t>(t.expert)];
  const int64_t first = args.first_row[static_cast<size_t>(t.expert)];
  const MicroKernels& mk = micro_kernels();
  // a[i * depth + p] = dy(first + p, row0 + i), and the rows of x.
  gather_cols(args.dy, first, t.depth, t.row0, t.rows, s.a);
  const F32Rows xr = f32_rows(args.x, first, t.depth, t.col0, t.cols, s.b);
  if (!args.accumulate) {
    for (int64_t r0 = 0; r0 < t.rows; r0 += kDirectRowGroup) {
      const int64_t h = std::min(kDirectRowGroup, t.rows - r0);
      for (int64_t r = 0; r < h; ++r) std::fill_n(s.c + r * s.ldc, t.cols, 0.0f);
      mk.f32.fma_rows(h, t.depth, s.a + r0 * t.depth, t.depth, xr.data, xr.ld, t.cols, s.c, s.ldc);
      stream_gradient_rows(args, t, r0, h, s);
    }
    stream_fence();
    return;
  }
  const Accumulator acc = accumulator_for(g, t.row0, t.col0, false, true, t, s);
  mk.f32.fma_rows(t.rows, t.depth, s.a, t.depth, xr.data, xr.ld, t.cols, acc.c, acc.ldc);
  store_gradient(args, t, acc, s);
}

// F32 outer-product tiles over depth blocks: dy's columns packed as A, x's rows as B.
void wgrad_outer(const WgradArgs& args, const Tile& t, const Tile* next, const Scratch& s) {
  const MutableMatrixRef& g = args.wgrads[static_cast<size_t>(t.expert)];
  const int64_t first = args.first_row[static_cast<size_t>(t.expert)];
  const Accumulator acc = accumulator_for(g, t.row0, t.col0, !args.accumulate, false, t, s);
  outer_product(
      t.rows, t.cols, t.depth, acc.c, acc.ldc, s,
      [&](int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* a) {
        pack_a_cols_of(args.dy, first + p0, kc, t.row0 + i0, rows, a);
      },
      [&](int64_t p0, int64_t kc, float* b) {
        pack_b_rows(args.x, first + p0, kc, t.col0, t.cols, b);
        return BBlock{b, kOuterCols};
      },
      [&](int64_t p0, int64_t kc) { return region_of(args.x, first + p0, kc, t.col0, t.cols); },
      wgrad_first(args, next));
  store_gradient(args, t, acc, s);
}

}  // namespace

void wgrad_tile(const WgradArgs& args, const Tile& t, const Tile* next, float* scratch) {
  if (t.depth == 0 && !args.accumulate) {
    wgrad_zeros(args, t);
    return;
  }
  const Scratch s = split_scratch(t, scratch);
  switch (wgrad_path(t.depth, args.x.dtype, args.dy.dtype, SetCaps::of(micro_kernels()))) {
    case WgradPath::kPairTiles:
      wgrad_pair_tiles(args, t, next, s);
      return;
    case WgradPath::kPairPanels:
      wgrad_pair_panels(args, t, next, s);
      return;
    case WgradPath::kDirect:
      wgrad_direct(args, t, s);
      return;
    case WgradPath::kPanels:
      wgrad_by_panels(args, t, args.first_row[static_cast<size_t>(t.expert)],
                      wgrad_first(args, next), s);
      return;
    case WgradPath::kOuter:
      wgrad_outer(args, t, next, s);
      return;
  }
}

// Column sums in row order, in scratch (summing in place in an F32 output measured no faster).
// Blocks of dy that likely sit in cache take 8 rows per pass of add_rows (the sums of a column
// block stay in registers through the pass); larger ones, streamed from memory, one row per pass,
// in address order: jumping between 8 rows every 256 bytes defeated the prefetchers. Same bits
// either way (docs/PERFORMANCE.md).
constexpr int64_t kBgradRowsPerPass = 8;
constexpr int64_t kBgradCachedBytes = int64_t{1} << 20;

void bgrad_tile(const BgradArgs& args, const Tile& t, float* scratch) {
  const auto e = static_cast<size_t>(t.expert);
  if (t.depth == 0) {
    // An expert without rows: +0 written directly (rounding zero sums to BF16 was 60% of a
    // 128-expert bgrad of 16 rows).
    store_zeros(t.cols, args.bgrads[e], 0, t.col0);
    return;
  }
  float* sums = scratch;
  const MicroKernels& mk = micro_kernels();
  const int64_t row_bytes = args.dy.ld * operand_size(args.dy.dtype);
  const int64_t per_pass =
      t.depth * t.cols * operand_size(args.dy.dtype) <= kBgradCachedBytes ? kBgradRowsPerPass : 1;
  for (int64_t r = 0; r < t.depth; r += per_pass) {
    mk.add_rows(element(args.dy, args.first_row[e] + r, t.col0), row_bytes,
                std::min(per_pass, t.depth - r), args.dy.dtype == DType::BF16, t.cols, sums,
                r == 0);
  }
  store_f32(sums, t.cols, args.bgrads[e], 0, t.col0);
}

}  // namespace grouplin::kernels
