#include "kernels/tile_products.hpp"

#include <algorithm>

namespace grouplin::kernels {

ScratchSizes sizes_for(int64_t rows, int64_t cols) {
  const int64_t padded_cols = round_up(cols, kOuterCols);
  ScratchSizes s;
  s.row = round_up(cols, kAlignFloats);
  s.c = round_up(std::max({round_up(rows, kOuterRows) * padded_cols,
                           round_up(cols, kOuterRows) * round_up(rows, kOuterCols),
                           rows * (padded_cols + kAlignFloats)}),
                 kAlignFloats);
  // The FP8 pair paths keep a row of block scales per kFp8Block depths, and decode up to
  // kOuterDepth codes of each column (dgrad) or weight row (forward) into BF16 in a.
  s.scales = kOuterDepth / kFp8Block * padded_cols;
  // + kAlignFloats: pack_transposed's slack.
  s.a = round_up(std::max({kOuterBlockRows * kOuterDepth, std::min(rows, kDotMaxRows) * kDotDepth,
                           rows * kOuterDepth, padded_cols * kOuterDepth / 2,
                           (kOuterRows + kDotTailMaxRows) * kBroadcastDepth +
                               2 * kDotTailMaxRows * round_up(cols, kAlignFloats)}) +
                     kAlignFloats,
                 kAlignFloats);
  s.b = round_up(std::max({std::max(padded_cols, round_up(rows, kOuterCols)) * kOuterDepth,
                           kDotCols * kDotDepth, dot_wide_floats(kDotWideRows, kDotDepth)}),
                 kAlignFloats);
  return s;
}

Scratch split_scratch(const Tile& t, float* base) {
  const ScratchSizes s = sizes_for(t.rows, t.cols);
  float* const a = base + s.row + s.c;
  return {base, base + s.row, a, a + s.a + s.scales, a + s.a, round_up(t.cols, kOuterCols)};
}

Accumulator accumulator_for(const MutableMatrixRef& out, int64_t row0, int64_t col0,
                            bool in_place_allowed, bool zero, const Tile& t, const Scratch& s) {
  Accumulator acc{s.c, s.ldc, false};
  if (in_place_allowed && out.dtype == DType::F32) {
    acc = {reinterpret_cast<float*>(element(out, row0, col0)), out.ld, true};
  }
  if (zero) {
    for (int64_t r = 0; r < t.rows; ++r) std::fill_n(acc.c + r * acc.ldc, t.cols, 0.0f);
  }
  return acc;
}

Region region_of(const MatrixRef& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  const int64_t elem = operand_size(m.dtype);
  return {element(m, r0, c0), m.ld * elem, rows, cols * elem};
}

void outer_tiles(int64_t rows, int64_t cols, int64_t kc, const float* ap, const BBlock& b, float* c,
                 int64_t ldc, bool accumulate, Prefetcher& prefetch) {
  const MicroKernels& mk = micro_kernels();
  const F32Products& products = mk.for_b(b.bf16);
  const auto* b_bytes = static_cast<const std::byte*>(b.b);
  const int64_t elem = b.bf16 ? 2 : 4;
  const bool packed = b.packed;
  const RowPanels panels(rows);
  const int64_t full_strips = cols / kOuterCols;
  const int64_t b_strip = packed ? kOuterCols * kc : kOuterCols;
  for (int64_t s0 = 0; s0 < full_strips; s0 += mk.max_strips) {
    const int ns = static_cast<int>(std::min<int64_t>(mk.max_strips, full_strips - s0));
    const int64_t j = s0 * kOuterCols;
    const int64_t b_offset = packed ? j * kc : j;
    for (int64_t q = 0; q < panels.count; ++q) {
      const float* a = ap + q * kOuterRows * kc;
      const int64_t i = panels.start(q);
      const int h = panels.height(q);
      for (int n = 0; n < ns; ++n) prefetch.step();
      products.outer_strips(h, ns, kc, a, 1, kOuterRows, b_bytes + b_offset * elem, b.ldb, b_strip,
                            c + i * ldc + j, ldc, accumulate);
    }
  }
  const int64_t j = full_strips * kOuterCols;
  if (j == cols) return;
  const std::byte* bj = b_bytes + (packed ? j * kc : j) * elem;
  const int64_t w = cols - j;
  for (int64_t q = 0; q < panels.count; ++q) {
    const float* a = ap + q * kOuterRows * kc;
    const int64_t i = panels.start(q);
    const int h = panels.height(q);
    prefetch.step();
    alignas(64) float local[kOuterRows * kOuterCols] = {};
    if (accumulate) {
      for (int64_t r = 0; r < h; ++r) std::copy_n(c + (i + r) * ldc + j, w, local + r * kOuterCols);
    }
    products.outer_tile(h, kOuterCols, kc, a, 1, kOuterRows, bj, b.ldb, local, kOuterCols,
                        accumulate);
    for (int64_t r = 0; r < h; ++r) std::copy_n(local + r * kOuterCols, w, c + (i + r) * ldc + j);
  }
}

void store_rows(const Accumulator& acc, const Tile& t, const MutableMatrixRef& out, int64_t row0,
                int64_t col0) {
  if (acc.in_place) return;
  for (int64_t r = 0; r < t.rows; ++r) stream_f32(acc.c + r * acc.ldc, t.cols, out, row0 + r, col0);
  stream_fence();
}

int64_t pair_block_floats(int64_t depth) {
  const MicroKernels& mk = micro_kernels();
  return mk.pair_block != nullptr ? mk.pair_strips * pair_panel_dwords(depth) : 0;
}

size_t scratch_floats(const TilePlan& plan) {
  ScratchSizes s = sizes_for(plan.max_rows, plan.max_cols);
  s.b = std::max(s.b, round_up(pair_block_floats(plan.max_depth), kAlignFloats));
  return static_cast<size_t>(s.total());
}

}  // namespace grouplin::kernels
