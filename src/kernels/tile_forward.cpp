// The forward tile paths (forward_tile in tile_compute.hpp), one function per ForwardPath of
// tile_paths.hpp: dot tiles for experts with few rows, the weights broadcast in place for a few
// dozen, packed outer-product tiles beyond, BF16 pairs and FP8 pair kernels on the sets that have
// them.
#include <algorithm>
#include <cstddef>

#include "kernels/micro_kernels.hpp"
#include "kernels/tile_compute.hpp"
#include "kernels/tile_products.hpp"

namespace grouplin::kernels {
namespace {

// For each K block: x rows (widened once per block if BF16) against 3 W rows at a time (widened
// once per block if BF16), 4 x 3 dot tiles into c.
void forward_dot(const ForwardArgs& args, const MatrixRef& w, const Tile& t, float* c, int64_t ldc,
                 const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const int64_t in = args.in_features;
  for (int64_t k0 = 0; k0 < in; k0 += kDotDepth) {
    const int64_t kc = std::min(kDotDepth, in - k0);
    const F32Rows xr = f32_rows(args.x, t.row0, t.rows, k0, kc, s.a);
    const float* xp = xr.data;
    const int64_t ldx = xr.ld;
    // 5-8 rows against F32 weights, where the set has it: one wide tile over all the rows (x's
    // rows interleaved once per depth block, in b's scratch), each weight row read once.
    const bool wide = w.dtype == DType::F32 && mk.f32.dot_tile_wide != nullptr &&
                      t.rows >= kDotWideMinRows && t.rows <= kDotWideRows;
    if (wide) interleave_dot_rows(xp, ldx, static_cast<int>(t.rows), kc, s.b);
    for (int64_t j = 0; j < t.cols; j += kDotCols) {
      const int nr = static_cast<int>(std::min<int64_t>(kDotCols, t.cols - j));
      const std::byte* wp = element(w, t.col0 + j, k0);
      // The weight rows two groups on, prefetched by the first row group's call as it reads these
      // (whole groups prefetched at once ran 0.68-0.81x as fast at 4-8 rows, one group on 0.8x:
      // docs/PERFORMANCE.md, "Forward dot tiles prefetch as they read").
      const std::byte* ahead =
          j + 2 * kDotCols + nr <= t.cols ? element(w, t.col0 + j + 2 * kDotCols, k0) : nullptr;
      // FP8 rows are decoded in registers, or (sets without dot_tile_fp8) here, nr x kc at a time
      // (in L1), and read as F32 rows.
      const bool fp8 = w.dtype == DType::F8_E4M3, fused = fp8 && mk.dot_tile_fp8 != nullptr;
      if (wide) {
        mk.f32.dot_tile_wide(static_cast<int>(t.rows), nr, kc, s.b, wp, w.ld, c + j, ldc, ahead);
        continue;
      }
      const F32Rows wd =
          fp8 && !fused ? f32_rows(w, t.col0 + j, nr, k0, kc, s.b) : F32Rows{nullptr, 0};
      for (int64_t i = 0; i < t.rows; i += kDotRows) {
        const int mr = static_cast<int>(std::min<int64_t>(kDotRows, t.rows - i));
        const std::byte* next = i == 0 ? ahead : nullptr;
        if (fused) {
          Fp8Operand b = fp8_operand(w, t.col0 + j, k0);
          b.ahead = reinterpret_cast<const uint8_t*>(next);
          mk.dot_tile_fp8(mr, nr, kc, xp + i * ldx, ldx, b, c + i * ldc + j, ldc);
        } else if (wd.data != nullptr) {
          mk.f32.dot_tile(mr, nr, kc, xp + i * ldx, ldx, wd.data, wd.ld, c + i * ldc + j, ldc,
                          nullptr);
        } else {
          mk.for_b(w.dtype == DType::BF16)
              .dot_tile(mr, nr, kc, xp + i * ldx, ldx, wp, w.ld, c + i * ldc + j, ldc, next);
        }
      }
    }
  }
}

// Forward with the roles turned: ct = W_slice · x_rowsᵀ, the weights read in place as the
// broadcast operand (no packing: each weight is used by only a few rows, so packing would cost a
// large share of the product) and x packed as B-panels once per depth block. fma(w, x, acc)
// equals fma(x, w, acc), so this gives the bits of the packed path. ct is [cols][rows] with
// ldct = `panel_rows` rounded up to 16. The tile's rows from panel_rows on (an expert's last few,
// forward_dot_tail_start) are summed by dot tiles into tail[row][col] (ld t.cols, zeroed here)
// while the same weights are in L1.
struct BroadcastScratch {
  float* w;     // 6 weight rows widened from BF16: 6 x kBroadcastDepth
  float* x;     // the dot rows of x widened from BF16: kDotTailMaxRows x kBroadcastDepth
  float* tail;  // the dot rows' results: kDotTailMaxRows x cols
  float* rows;  // 8 rows of y on their way out: 8 x cols
};
BroadcastScratch broadcast_scratch(const Scratch& s, int64_t cols) {
  float* w = s.a;
  float* x = w + kOuterRows * kBroadcastDepth;
  float* tail = x + kDotTailMaxRows * kBroadcastDepth;
  return {w, x, tail, tail + kDotTailMaxRows * round_up(cols, kAlignFloats)};
}

void forward_broadcast_w(const ForwardArgs& args, const MatrixRef& w, const Tile& t,
                         int64_t panel_rows, const Region& after, float* ct, int64_t ldct,
                         const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const BroadcastScratch bs = broadcast_scratch(s, t.cols);
  const int64_t in = args.in_features;
  const int64_t dot_rows = t.rows - panel_rows;
  for (int64_t r = 0; r < dot_rows; ++r) std::fill_n(bs.tail + r * t.cols, t.cols, 0.0f);
  const int64_t calls = ((t.cols + kOuterRows - 1) / kOuterRows) * (ldct / kOuterCols);
  for (int64_t k0 = 0; k0 < in; k0 += kBroadcastDepth) {
    const int64_t kc = std::min(kBroadcastDepth, in - k0);
    const int64_t next = k0 + kc;
    Prefetcher prefetch(
        next < in ? region_of(w, t.col0, t.cols, next, std::min(kBroadcastDepth, in - next))
                  : after,
        calls);
    if (panel_rows > 0) pack_b_transposed(args.x, k0, kc, t.row0, panel_rows, s.b);
    const F32Rows xd = dot_rows > 0 ? f32_rows(args.x, t.row0 + panel_rows, dot_rows, k0, kc, bs.x)
                                    : F32Rows{nullptr, 0};
    for (int64_t n = 0; n < t.cols; n += kOuterRows) {
      const int h = static_cast<int>(std::min<int64_t>(kOuterRows, t.cols - n));
      const F32Rows wr = f32_rows(w, t.col0 + n, h, k0, kc, bs.w);
      const float* a = wr.data;
      const int64_t lda = wr.ld;
      // Panels of x holding more than 8 rows go through outer_strips, up to max_strips at once;
      // a last panel with at most 8 rows computes only those lanes (the rest of ct is never
      // read).
      const int64_t full = (panel_rows + 7) / kOuterCols;
      for (int64_t q = 0; q < full; q += mk.max_strips) {
        const int ns = static_cast<int>(std::min<int64_t>(mk.max_strips, full - q));
        for (int i = 0; i < ns; ++i) prefetch.step();
        mk.f32.outer_strips(h, ns, kc, a, lda, 1, s.b + q * kOuterCols * kc, kOuterCols,
                            kOuterCols * kc, ct + n * ldct + q * kOuterCols, ldct, k0 > 0);
      }
      if (full * kOuterCols < ldct) {
        prefetch.step();
        mk.f32.outer_tile(h, 8, kc, a, lda, 1, s.b + full * kOuterCols * kc, kOuterCols,
                          ct + n * ldct + full * kOuterCols, ldct, k0 > 0);
      }
      for (int64_t j = 0; j < h; j += kDotCols) {
        const int nr = static_cast<int>(std::min<int64_t>(kDotCols, h - j));
        for (int64_t i = 0; i < dot_rows; i += kDotRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kDotRows, dot_rows - i));
          mk.f32.dot_tile(mr, nr, kc, xd.data + i * xd.ld, xd.ld, a + j * lda, lda,
                          bs.tail + i * t.cols + n + j, t.cols, nullptr);
        }
      }
    }
  }
}

// y = ct transposed (8 rows at a time through registers) and the dot rows, plus the bias.
void store_broadcast_result(const ForwardArgs& args, const Tile& t, int64_t panel_rows,
                            const float* ct, int64_t ldct, const Scratch& s) {
  const auto e = static_cast<size_t>(t.expert);
  const BroadcastScratch bs = broadcast_scratch(s, t.cols);
  const bool bias = !args.biases.empty();
  if (bias) load_f32(args.biases[e], 0, t.col0, t.cols, s.row);
  const auto store_row = [&](float* yr, int64_t r) {
    if (bias) {
      for (int64_t n = 0; n < t.cols; ++n) yr[n] += s.row[n];
    }
    stream_f32(yr, t.cols, args.y, t.row0 + r, t.col0);  // as store_rows (tile_products.hpp)
  };
  const MicroKernels& mk = micro_kernels();
  for (int64_t r0 = 0; r0 < panel_rows; r0 += 8) {
    const int64_t h = std::min<int64_t>(8, panel_rows - r0);
    mk.transpose(ct + r0, ldct, h, t.cols, bs.rows, t.cols);
    for (int64_t i = 0; i < h; ++i) store_row(bs.rows + i * t.cols, r0 + i);
  }
  for (int64_t r = panel_rows; r < t.rows; ++r) store_row(bs.tail + (r - panel_rows) * t.cols, r);
  stream_fence();
}

// y = the tile's sums + the bias (one F32 addition per element), rounded for BF16.
void add_bias_and_store(const ForwardArgs& args, const Tile& t, const Accumulator& acc,
                        const Scratch& s) {
  if (!args.biases.empty()) {
    load_f32(args.biases[static_cast<size_t>(t.expert)], 0, t.col0, t.cols, s.row);
    for (int64_t r = 0; r < t.rows; ++r) {
      float* c = acc.c + r * acc.ldc;
      for (int64_t j = 0; j < t.cols; ++j) c[j] += s.row[j];
    }
  }
  store_rows(acc, t, args.y, t.row0, t.col0);
}

// Expert e's packed weights for tile t (null: pack them per tile). A tile whose columns start
// off a strip (finer tilings in tests) packs its own.
const uint32_t* packed_for(const ForwardArgs& args, const Tile& t) {
  if (args.packed.empty() || t.col0 % kOuterCols != 0) return nullptr;
  return args.packed[static_cast<size_t>(t.expert)];
}

// The window of packed weights p for depths [k0, k0 + kc) and the tile's columns c0.. (relative
// to the tile's first): strips of pair_panel_dwords(in) dwords, pair row k0 / 2 of each.
PairB packed_window(const uint32_t* p, const ForwardArgs& args, const Tile& t, int64_t k0,
                    int64_t c0) {
  const int64_t strip = pair_panel_dwords(args.in_features);
  return {p + (t.col0 + c0) / kOuterCols * strip + k0 / 2 * kOuterCols, strip};
}

// The bytes of that window for `cols` columns, as a Region of one row per strip.
Region packed_region(const uint32_t* p, const ForwardArgs& args, const Tile& t, int64_t k0,
                     int64_t kc) {
  const PairB b = packed_window(p, args, t, k0, 0);
  return {reinterpret_cast<const std::byte*>(b.panels),
          b.strip * static_cast<int64_t>(sizeof(uint32_t)), (t.cols + kOuterCols - 1) / kOuterCols,
          (kc + 1) / 2 * kOuterCols * static_cast<int64_t>(sizeof(uint32_t))};
}

// B of the turned forward pair tiles: the tile's rows of x from c0 (nrows of them), packed as
// pair panels for depths [k0, k0 + kc).
auto x_rows_as_pair_b(const ForwardArgs& args, const Tile& t) {
  return [&args, &t](int64_t k0, int64_t kc, int64_t c0, int64_t nrows, uint32_t* b) {
    pack_pairs_transposed(args.x, k0, kc, t.row0 + c0, nrows, b);
    return packed_in_scratch(b, kc);
  };
}

// What each operation's tile streams first, for prefetching it from the tile before.
Region forward_first(const ForwardArgs& args, const Tile* t) {
  if (t == nullptr) return {};
  const MatrixRef& w = args.weights[static_cast<size_t>(t->expert)];
  const ForwardPath path = forward_path_of(args, t->expert);
  const uint32_t* packed = packed_for(args, *t);
  if (path == ForwardPath::kPairTiles && packed != nullptr) {
    return packed_region(packed, args, *t, 0, std::min(kOuterDepth, args.in_features));
  }
  const bool along_depth = path == ForwardPath::kDots || path == ForwardPath::kFp8PairDots;
  const int64_t depth = along_depth ? kDotDepth : kOuterDepth;
  return region_of(w, t->col0, t->cols, 0, std::min(depth, args.in_features));
}

// FP8 weights beside BF16 x, experts of a few rows (ForwardPath::kFp8PairDots):
// dot_tile_fp8_pairs, the codes against x's rows along the whole depth, in groups of at most
// kPairDotRows rows of nearly equal heights (RowPanels: 8 rows as 4 + 4, not 6 + 2). Each group
// after the first reads the codes again, from L2; groups of equal heights keep fewer of x's rows
// in L1 beside the codes (docs/PERFORMANCE.md, "Weight rows prefetched ahead into L2").
void forward_fp8_pair_dots(const ForwardArgs& args, const MatrixRef& w, const Tile& t,
                           const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, false, false, t, s);
  const RowPanels groups(t.rows, kPairDotRows);
  for (int64_t g = 0; g < groups.count; ++g) {
    const int64_t i = groups.start(g);
    const int h = groups.height(g);
    mk.dot_tile_fp8_pairs(h, static_cast<int>(t.cols), args.in_features,
                          reinterpret_cast<const uint16_t*>(element(args.x, t.row0 + i, 0)),
                          args.x.ld, fp8_operand(w, t.col0, 0), acc.c + i * acc.ldc, acc.ldc);
  }
  add_bias_and_store(args, t, acc, s);
}

// FP8 weights beside BF16 x, more rows (ForwardPath::kFp8PairTiles): pair_tile_scaled on codes
// decoded to BF16 a depth block at a time, as the turned pair tiles' A (tiles of up to
// kTurnedMaxRows rows: x's rows packed as B, the weights decoded once per block) or, for taller
// tiles, into pair panels that all the tile's rows share.
void forward_fp8_pair_tiles(const ForwardArgs& args, const MatrixRef& w, const Tile& t,
                            const Tile* next, const Scratch& s) {
  const int64_t in = args.in_features;
  auto* decoded = reinterpret_cast<uint16_t*>(s.a);
  const int64_t ld_scales = round_up(t.cols, kOuterCols);
  const auto scales = [&](int64_t p0, int64_t kc, bool per_row) {
    fp8_block_scales(w, false, p0, kc, t.col0, t.cols, ld_scales, s.scales);
    return ScaleTable{s.scales, ld_scales, per_row};
  };
  const auto source = [&](int64_t k0, int64_t kc) { return region_of(w, t.col0, t.cols, k0, kc); };
  if (fp8_forward_turned(t.rows)) {
    const int64_t ldct = round_up(t.rows, kOuterCols);
    pair_product(
        t.cols, t.rows, in,
        [&](int64_t k0, int64_t kc) {
          fp8_codes_as_bf16(w, t.col0, t.cols, k0, kc, decoded, kc);
          return PairA{decoded, kc};
        },
        false, s.c, ldct, s, x_rows_as_pair_b(args, t), source, forward_first(args, next),
        [&](int64_t k0, int64_t kc) { return scales(k0, kc, true); });
    store_broadcast_result(args, t, t.rows, s.c, ldct, s);
    return;
  }
  const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, false, false, t, s);
  pair_product(
      t.rows, t.cols, in, pair_rows_in_place(args.x, t.row0), true, acc.c, acc.ldc, s,
      [&](int64_t k0, int64_t kc, int64_t c0, int64_t ncols, uint32_t* b) {
        // A strip of 16 weight rows at a time, decoded in L1 and packed.
        const int64_t dwords = pair_panel_dwords(kc);
        for (int64_t j = 0; j < ncols; j += kOuterCols) {
          const int64_t n = std::min<int64_t>(kOuterCols, ncols - j);
          const MatrixRef strip = fp8_codes_as_bf16(w, t.col0 + c0 + j, n, k0, kc, decoded, kc);
          pack_pairs_transposed(strip, 0, kc, 0, n, b + j / kOuterCols * dwords);
        }
        return packed_in_scratch(b, kc);
      },
      source, forward_first(args, next),
      [&](int64_t k0, int64_t kc) { return scales(k0, kc, false); });
  add_bias_and_store(args, t, acc, s);
}

// A few rows (dot_tile_pairs): x's rows and the weights' read along the depth as they lie
// (packed weights are not read: their panels would give these rows the pair_tile chain), up to
// kPairDotCallRows rows per call (the kernel takes each weight row through its register tiles in
// turn).
void forward_pair_dots(const ForwardArgs& args, const MatrixRef& w, const Tile& t,
                       const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, false, false, t, s);
  const RowPanels groups(t.rows, kPairDotCallRows);
  for (int64_t g = 0; g < groups.count; ++g) {
    const int64_t i = groups.start(g);
    const int h = groups.height(g);
    mk.dot_tile_pairs(h, static_cast<int>(t.cols), args.in_features,
                      reinterpret_cast<const uint16_t*>(element(args.x, t.row0 + i, 0)), args.x.ld,
                      reinterpret_cast<const uint16_t*>(element(w, t.col0, 0)), w.ld,
                      acc.c + i * acc.ldc, acc.ldc);
  }
  add_bias_and_store(args, t, acc, s);
}

// BF16 pair tiles: turned for short tiles without packed weights (forward_pairs_turned:
// ct[col][row] = W_slice · x_rowsᵀ, the weights as A read in place, x's rows packed as B once
// per block, ct transposed into y), else x's rows as A against the weights packed once per tile
// and block, or packed beforehand.
void forward_pair_tiles(const ForwardArgs& args, const MatrixRef& w, const Tile& whole,
                        const Tile* next, const Scratch& s) {
  // The expert's last few rows, where the tile holds them, by dot_tile_pairs (tile_paths.hpp).
  const auto e = static_cast<size_t>(whole.expert);
  const int64_t first_dot =
      args.first_row[e] +
      forward_pair_dot_tail_start(args.expert_rows[e], SetCaps::of(micro_kernels()).pair_dots);
  Tile t = whole;
  t.rows = std::clamp<int64_t>(first_dot - whole.row0, 0, whole.rows);
  if (t.rows < whole.rows) {
    Tile tail = whole;
    tail.row0 = whole.row0 + t.rows;
    tail.rows = whole.rows - t.rows;
    forward_pair_dots(args, w, tail, s);
    if (t.rows == 0) return;
  }
  const uint32_t* packed = packed_for(args, t);
  if (packed == nullptr && forward_pairs_turned(t.rows)) {
    const int64_t ldct = round_up(t.rows, kOuterCols);
    pair_product(
        t.cols, t.rows, args.in_features, pair_rows_in_place(w, t.col0), true, s.c, ldct, s,
        x_rows_as_pair_b(args, t),
        [&](int64_t k0, int64_t kc) { return region_of(w, t.col0, t.cols, k0, kc); },
        forward_first(args, next));
    store_broadcast_result(args, t, t.rows, s.c, ldct, s);
    return;
  }
  const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, false, false, t, s);
  pair_product(
      t.rows, t.cols, args.in_features, pair_rows_in_place(args.x, t.row0), true, acc.c, acc.ldc, s,
      [&](int64_t k0, int64_t kc, int64_t c0, int64_t ncols, uint32_t* b) {
        if (packed != nullptr) return packed_window(packed, args, t, k0, c0);
        pack_pairs_transposed(w, k0, kc, t.col0 + c0, ncols, b);
        return packed_in_scratch(b, kc);
      },
      [&](int64_t k0, int64_t kc) {
        return packed != nullptr ? packed_region(packed, args, t, k0, kc)
                                 : region_of(w, t.col0, t.cols, k0, kc);
      },
      forward_first(args, next));
  add_bias_and_store(args, t, acc, s);
}

// The weights broadcast in place: the tile's rows before the expert's dot rows go through
// 16-lane panels into ct[col][row] (scratch), the rest through dot tiles.
void forward_broadcast(const ForwardArgs& args, const MatrixRef& w, const Tile& t, const Tile* next,
                       const Scratch& s) {
  const int64_t m = args.expert_rows[static_cast<size_t>(t.expert)];
  const int64_t first_dot =
      args.first_row[static_cast<size_t>(t.expert)] + forward_dot_tail_start(m);
  const int64_t panel_rows = std::clamp<int64_t>(first_dot - t.row0, 0, t.rows);
  const int64_t ldct = round_up(panel_rows, kOuterCols);
  forward_broadcast_w(args, w, t, panel_rows, forward_first(args, next), s.c, ldct, s);
  store_broadcast_result(args, t, panel_rows, s.c, ldct, s);
}

// F32 outer-product tiles on the weights packed once per tile and depth block.
void forward_outer(const ForwardArgs& args, const MatrixRef& w, const Tile& t, const Tile* next,
                   const Scratch& s) {
  const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, true, false, t, s);
  outer_product(
      t.rows, t.cols, args.in_features, acc.c, acc.ldc, s,
      [&](int64_t i0, int64_t rows, int64_t k0, int64_t kc, float* a) {
        pack_a_rows_of(args.x, t.row0 + i0, rows, k0, kc, a);
      },
      [&](int64_t k0, int64_t kc, float* b) {
        pack_b_transposed(w, k0, kc, t.col0, t.cols, b);
        return BBlock{b, kOuterCols};
      },
      [&](int64_t k0, int64_t kc) { return region_of(w, t.col0, t.cols, k0, kc); },
      forward_first(args, next));
  add_bias_and_store(args, t, acc, s);
}

// F32 dot tiles, summed into zeros.
void forward_dots_tile(const ForwardArgs& args, const MatrixRef& w, const Tile& t,
                       const Scratch& s) {
  const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, true, true, t, s);
  forward_dot(args, w, t, acc.c, acc.ldc, s);
  add_bias_and_store(args, t, acc, s);
}

}  // namespace

ForwardPath forward_path_of(const ForwardArgs& args, int32_t expert) {
  const auto e = static_cast<size_t>(expert);
  return forward_path(args.expert_rows[e], args.in_features, args.x.dtype, args.weights[e].dtype,
                      SetCaps::of(micro_kernels()));
}

void forward_tile(const ForwardArgs& args, const Tile& t, const Tile* next, float* scratch) {
  const MatrixRef& w = args.weights[static_cast<size_t>(t.expert)];
  const Scratch s = split_scratch(t, scratch);
  switch (forward_path_of(args, t.expert)) {
    case ForwardPath::kFp8PairDots:
      forward_fp8_pair_dots(args, w, t, s);
      return;
    case ForwardPath::kFp8PairTiles:
      forward_fp8_pair_tiles(args, w, t, next, s);
      return;
    case ForwardPath::kPairDots:
      forward_pair_dots(args, w, t, s);
      return;
    case ForwardPath::kPairTiles:
      forward_pair_tiles(args, w, t, next, s);
      return;
    case ForwardPath::kBroadcast:
      forward_broadcast(args, w, t, next, s);
      return;
    case ForwardPath::kDots:
      forward_dots_tile(args, w, t, s);
      return;
    case ForwardPath::kOuter:
      forward_outer(args, w, t, next, s);
      return;
  }
}

}  // namespace grouplin::kernels
