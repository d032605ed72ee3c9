#include "kernels/tile_compute.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/micro_kernels.hpp"

namespace grouplin::kernels {
namespace {

constexpr int64_t kAlignFloats = 16;  // 64 bytes
// Prefetch distances of the streaming paths: forward dot tiles, kDotAhead groups of weight rows;
// unpacked dgrad, kDirectChunk weight rows.
constexpr int64_t kDotAhead = 4;
constexpr int64_t kDirectChunk = 16;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// One worker's scratch for a tile of rows x cols, in 64-byte aligned pieces:
//   row  one row of floats (bias, or the old gradient when accumulating)
//   c    the F32 result tile, when it cannot accumulate in place (ldc = cols rounded to 16)
//   a    packed A-panels, or widened rows of x / dy for the unpacked paths
//   b    packed B-panels, or widened rows of W / x for the unpacked paths
struct Scratch {
  float* row;
  float* c;
  float* a;
  float* b;
  int64_t ldc;
};

struct ScratchSizes {
  int64_t row, c, a, b;
  int64_t total() const { return row + c + a + b; }
};

ScratchSizes sizes_for(int64_t rows, int64_t cols) {
  const int64_t padded_cols = round_up(cols, kOuterCols);
  ScratchSizes s;
  s.row = round_up(cols, kAlignFloats);
  s.c = round_up(std::max(round_up(rows, kOuterRows) * padded_cols,
                          round_up(cols, kOuterRows) * round_up(rows, kOuterCols)),
                 kAlignFloats);
  // + kAlignFloats: pack_transposed's slack.
  s.a = round_up(std::max({kOuterBlockRows * kOuterDepth, std::min(rows, kDotMaxRows) * kDotDepth,
                           rows * kOuterDepth,
                           (kOuterRows + kDotTailMaxRows) * kBroadcastDepth +
                               2 * kDotTailMaxRows * round_up(cols, kAlignFloats)}) +
                     kAlignFloats,
                 kAlignFloats);
  s.b = round_up(std::max(std::max(padded_cols, round_up(rows, kOuterCols)) * kOuterDepth,
                          kDotCols * kDotDepth),
                 kAlignFloats);
  return s;
}

Scratch split(const Tile& t, float* base) {
  const ScratchSizes s = sizes_for(t.rows, t.cols);
  return {base, base + s.row, base + s.row + s.c, base + s.row + s.c + s.a,
          round_up(t.cols, kOuterCols)};
}

// Where a tile's F32 sums accumulate: in place in an F32 output, else in the scratch tile.
struct Accumulator {
  float* c;
  int64_t ldc;
  bool in_place;
};

// zero: whether the path needs zeros to add to (the packed path starts its chains from +0 itself,
// which gives the same bits without writing the tile twice).
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

Region region_of(const MatrixRef& m, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  const int64_t elem = operand_size(m.dtype);
  return {element(m, r0, c0), m.ld * elem, rows, cols * elem};
}

// The row panels of `rows` rows: as few as fit in kOuterRows each, of nearly equal heights (32
// rows: 6, 6, 5, 5, 5, 5). Below 4 rows a micro-tile has too few accumulators to hide the FMA
// latency and costs as much as a full one: 32 rows as 6 x 5 + 2 ran 15% slower.
struct RowPanels {
  int64_t count, base, extra;  // the first `extra` panels have base + 1 rows, the rest base
  explicit RowPanels(int64_t rows)
      : count((rows + kOuterRows - 1) / kOuterRows),
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
                 int64_t ldc, bool accumulate, Prefetcher& prefetch) {
  const MicroKernels& mk = micro_kernels();
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
      if (b.bf16) {
        mk.outer_strips_bf16(h, ns, kc, a, 1, kOuterRows,
                             static_cast<const uint16_t*>(b.b) + b_offset, b.ldb, b_strip,
                             c + i * ldc + j, ldc, accumulate);
      } else {
        mk.outer_strips(h, ns, kc, a, 1, kOuterRows, static_cast<const float*>(b.b) + b_offset,
                        b.ldb, b_strip, c + i * ldc + j, ldc, accumulate);
      }
    }
  }
  const int64_t j = full_strips * kOuterCols;
  if (j == cols) return;
  const float* bj = static_cast<const float*>(b.b) + (packed ? j * kc : j);
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
    mk.outer_tile(h, kOuterCols, kc, a, 1, kOuterRows, bj, b.ldb, local, kOuterCols, accumulate);
    for (int64_t r = 0; r < h; ++r) std::copy_n(local + r * kOuterCols, w, c + (i + r) * ldc + j);
  }
}

// The outer-product path shared by forward, dgrad and wgrad: c[rows x cols] = A · B over
// `depth`, in blocks of kOuterDepth; each block gets B once (b_block(p0, kc, scratch): packed
// there, or read in place) and packs A in pieces of kOuterBlockRows rows, one row panel at a time
// (pack_a(i0, rows, p0, kc, a), rows <= kOuterRows), while prefetching what the next block's B will
// read (b_source(p0, kc)). During the last block it prefetches `after`, the next tile's first
// block.
template <class PackA, class BlockB, class SourceB>
void outer_product(int64_t rows, int64_t cols, int64_t depth, float* c, int64_t ldc,
                   const Scratch& s, const PackA& pack_a, const BlockB& b_block,
                   const SourceB& b_source, const Region& after) {
  const int64_t calls =
      ((rows + kOuterRows - 1) / kOuterRows) * ((cols + kOuterCols - 1) / kOuterCols);
  for (int64_t p0 = 0; p0 < depth; p0 += kOuterDepth) {
    const int64_t kc = std::min(kOuterDepth, depth - p0);
    const int64_t next = p0 + kc;
    Prefetcher prefetch(next < depth ? b_source(next, std::min(kOuterDepth, depth - next)) : after,
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

// c[rows x cols] (ldc: cols rounded up to 16, scratch) = A · B over `depth` on the pair kernels:
// A is BF16 rows of `a` from row a_row0 read in place, B packed per depth block of kOuterDepth
// into pair panels by pack_b(p0, kc, panels). Strip groups outside, row groups inside: a group's
// B panels (AVX512-BF16: 4 strips, 32 KiB at kc = 256) stay in L1 while every row group of the
// tile passes over them. Whole 16-column strips are computed (the panels are zero-padded), which
// the scratch's padded rows have room for.
template <class PackB>
void pair_product(int64_t rows, int64_t cols, int64_t depth, const MatrixRef& a, int64_t a_row0,
                  float* c, int64_t ldc, const Scratch& s, const PackB& pack_b) {
  const MicroKernels& mk = micro_kernels();
  auto* panels = reinterpret_cast<uint32_t*>(s.b);
  const int64_t strips = (cols + kOuterCols - 1) / kOuterCols;
  for (int64_t p0 = 0; p0 < depth; p0 += kOuterDepth) {
    const int64_t kc = std::min(kOuterDepth, depth - p0);
    const int64_t b_strip = pair_panel_dwords(kc);
    pack_b(p0, kc, panels);
    for (int64_t j = 0; j < strips; j += mk.pair_strips) {
      const int ns = static_cast<int>(std::min<int64_t>(mk.pair_strips, strips - j));
      for (int64_t i = 0; i < rows; i += mk.pair_rows) {
        const int h = static_cast<int>(std::min<int64_t>(mk.pair_rows, rows - i));
        const auto* ai = reinterpret_cast<const uint16_t*>(element(a, a_row0 + i, p0));
        mk.pair_tile(h, ns, kc, ai, a.ld, panels + j * b_strip, b_strip,
                     c + i * ldc + j * kOuterCols, ldc, p0 > 0);
      }
    }
  }
}

// For each K block: x rows (widened once per block if BF16) against 3 W rows at a time (widened
// once per block if BF16), 4 x 3 dot tiles into c.
void forward_dot(const ForwardArgs& args, const MatrixRef& w, const Tile& t, float* c, int64_t ldc,
                 const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const int64_t in = args.in_features;
  // The weights stream once, in groups of kDotCols rows x kDotDepth: prefetch kDotAhead groups
  // ahead (rows are a page apart, where hardware prefetchers stop).
  const int64_t groups = (t.cols + kDotCols - 1) / kDotCols;
  const auto prefetch_group = [&](int64_t g) {
    const int64_t k0 = g / groups * kDotDepth, j = g % groups * kDotCols;
    if (k0 >= in) return;
    const Region r = region_of(w, t.col0 + j, std::min<int64_t>(kDotCols, t.cols - j), k0,
                               std::min(kDotDepth, in - k0));
    Prefetcher(r, 1).step();
  };
  int64_t group = 0;
  for (int64_t g = 0; g < kDotAhead; ++g) prefetch_group(g);
  for (int64_t k0 = 0; k0 < in; k0 += kDotDepth) {
    const int64_t kc = std::min(kDotDepth, in - k0);
    const float* xp = reinterpret_cast<const float*>(element(args.x, t.row0, k0));
    int64_t ldx = args.x.ld;
    if (args.x.dtype != DType::F32) {
      for (int64_t r = 0; r < t.rows; ++r) load_f32(args.x, t.row0 + r, k0, kc, s.a + r * kc);
      xp = s.a;
      ldx = kc;
    }
    for (int64_t j = 0; j < t.cols; j += kDotCols, ++group) {
      prefetch_group(group + kDotAhead);
      const int nr = static_cast<int>(std::min<int64_t>(kDotCols, t.cols - j));
      const std::byte* wp = element(w, t.col0 + j, k0);
      for (int64_t i = 0; i < t.rows; i += kDotRows) {
        const int mr = static_cast<int>(std::min<int64_t>(kDotRows, t.rows - i));
        if (w.dtype == DType::F32) {
          mk.dot_tile(mr, nr, kc, xp + i * ldx, ldx, reinterpret_cast<const float*>(wp), w.ld,
                      c + i * ldc + j, ldc);
        } else {
          mk.dot_tile_bf16(mr, nr, kc, xp + i * ldx, ldx, reinterpret_cast<const uint16_t*>(wp),
                           w.ld, c + i * ldc + j, ldc);
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
    const float* xd = nullptr;
    int64_t ldxd = 0;
    if (dot_rows > 0) {
      xd = reinterpret_cast<const float*>(element(args.x, t.row0 + panel_rows, k0));
      ldxd = args.x.ld;
      if (args.x.dtype != DType::F32) {
        for (int64_t r = 0; r < dot_rows; ++r)
          load_f32(args.x, t.row0 + panel_rows + r, k0, kc, bs.x + r * kc);
        xd = bs.x;
        ldxd = kc;
      }
    }
    for (int64_t n = 0; n < t.cols; n += kOuterRows) {
      const int h = static_cast<int>(std::min<int64_t>(kOuterRows, t.cols - n));
      const float* a = reinterpret_cast<const float*>(element(w, t.col0 + n, k0));
      int64_t lda = w.ld;
      if (w.dtype != DType::F32) {
        for (int64_t i = 0; i < h; ++i) load_f32(w, t.col0 + n + i, k0, kc, bs.w + i * kc);
        a = bs.w;
        lda = kc;
      }
      // Panels of x holding more than 8 rows go through outer_strips, up to max_strips at once;
      // a last panel with at most 8 rows computes only those lanes (the rest of ct is never
      // read).
      const int64_t full = (panel_rows + 7) / kOuterCols;
      for (int64_t q = 0; q < full; q += mk.max_strips) {
        const int ns = static_cast<int>(std::min<int64_t>(mk.max_strips, full - q));
        for (int i = 0; i < ns; ++i) prefetch.step();
        mk.outer_strips(h, ns, kc, a, lda, 1, s.b + q * kOuterCols * kc, kOuterCols,
                        kOuterCols * kc, ct + n * ldct + q * kOuterCols, ldct, k0 > 0);
      }
      if (full * kOuterCols < ldct) {
        prefetch.step();
        mk.outer_tile(h, 8, kc, a, lda, 1, s.b + full * kOuterCols * kc, kOuterCols,
                      ct + n * ldct + full * kOuterCols, ldct, k0 > 0);
      }
      for (int64_t j = 0; j < h; j += kDotCols) {
        const int nr = static_cast<int>(std::min<int64_t>(kDotCols, h - j));
        for (int64_t i = 0; i < dot_rows; i += kDotRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kDotRows, dot_rows - i));
          mk.dot_tile(mr, nr, kc, xd + i * ldxd, ldxd, a + j * lda, lda,
                      bs.tail + i * t.cols + n + j, t.cols);
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
    store_f32(yr, t.cols, args.y, t.row0 + r, t.col0);
  };
  const MicroKernels& mk = micro_kernels();
  for (int64_t r0 = 0; r0 < panel_rows; r0 += 8) {
    const int64_t h = std::min<int64_t>(8, panel_rows - r0);
    mk.transpose(ct + r0, ldct, h, t.cols, bs.rows, t.cols);
    for (int64_t i = 0; i < h; ++i) store_row(bs.rows + i * t.cols, r0 + i);
  }
  for (int64_t r = panel_rows; r < t.rows; ++r) store_row(bs.tail + (r - panel_rows) * t.cols, r);
}

// The rows of a scratch result into the output (rounded for BF16); in place, nothing to do.
// stream: written once and not read back soon (gradients): non-temporal stores.
void store_rows(const Accumulator& acc, const Tile& t, const MutableMatrixRef& out, int64_t row0,
                int64_t col0, bool stream = false) {
  if (acc.in_place) return;
  for (int64_t r = 0; r < t.rows; ++r) {
    if (stream) {
      stream_f32(acc.c + r * acc.ldc, t.cols, out, row0 + r, col0);
    } else {
      store_f32(acc.c + r * acc.ldc, t.cols, out, row0 + r, col0);
    }
  }
  if (stream) stream_fence();
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

// What each operation's tile streams first, for prefetching it from the tile before.
Region forward_first(const ForwardArgs& args, const Tile* t) {
  if (t == nullptr) return {};
  const MatrixRef& w = args.weights[static_cast<size_t>(t->expert)];
  const int64_t depth =
      forward_dots(args.expert_rows[static_cast<size_t>(t->expert)], w.dtype == DType::BF16)
          ? kDotDepth
          : kOuterDepth;
  return region_of(w, t->col0, t->cols, 0, std::min(depth, args.in_features));
}
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

// wgrad of one depth block (few rows per expert: write-bound): x's rows packed once, then each
// panel of up to 6 gradient rows is formed in L1 and streamed out (added to the old gradient
// first when accumulating), instead of summing in place in the output or storing the whole tile
// and streaming it from L2. 128 experts of 1024 x 384, 2 threads, same-run A/B, GF/s before /
// after: F32 16 rows 108 / 133, 32 rows 153 / 165, 64 rows 103 / 179, 128 rows 200 / 197.
void wgrad_by_panels(const WgradArgs& args, const Tile& t, int64_t first, const Region& after,
                     const Scratch& s) {
  const MicroKernels& mk = micro_kernels();
  const MutableMatrixRef& g = args.wgrads[static_cast<size_t>(t.expert)];
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
      mk.outer_strips(h, ns, kc, s.a, 1, kOuterRows, s.b + j * kOuterCols * kc, kOuterCols,
                      kOuterCols * kc, s.c + j * kOuterCols, s.ldc, false);
    }
    for (int64_t r = 0; r < h; ++r) {
      float* c = s.c + r * s.ldc;
      if (args.accumulate) add_old_gradient(g, t.row0 + i + r, t, c, s.row);
      stream_f32(c, t.cols, g, t.row0 + i + r, t.col0);
    }
  }
  stream_fence();
}

}  // namespace

size_t scratch_floats(const TilePlan& plan) {
  return static_cast<size_t>(sizes_for(plan.max_rows, plan.max_cols).total());
}

void forward_tile(const ForwardArgs& args, const Tile& t, const Tile* next, float* scratch) {
  const auto e = static_cast<size_t>(t.expert);
  const MatrixRef& w = args.weights[e];
  const Scratch s = split(t, scratch);
  const int64_t m = args.expert_rows[e];
  const bool bf16_operands = w.dtype == DType::BF16 && args.x.dtype == DType::BF16;
  if (forward_pairs(m, bf16_operands, micro_kernels().pair_tile != nullptr)) {
    const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, false, false, t, s);
    pair_product(t.rows, t.cols, args.in_features, args.x, t.row0, acc.c, acc.ldc, s,
                 [&](int64_t k0, int64_t kc, uint32_t* b) {
                   pack_pairs_transposed(w, k0, kc, t.col0, t.cols, b);
                 });
    add_bias_and_store(args, t, acc, s);
    return;
  }
  if (forward_broadcasts(m, w.dtype == DType::BF16)) {
    // The tile's rows before the expert's dot rows go through 16-lane panels into
    // ct[col][row] (scratch), the rest through dot tiles.
    const int64_t first_dot = args.first_row[e] + forward_dot_tail_start(m);
    const int64_t panel_rows = std::clamp<int64_t>(first_dot - t.row0, 0, t.rows);
    const int64_t ldct = round_up(panel_rows, kOuterCols);
    forward_broadcast_w(args, w, t, panel_rows, forward_first(args, next), s.c, ldct, s);
    store_broadcast_result(args, t, panel_rows, s.c, ldct, s);
    return;
  }
  const bool dot = forward_dots(m, w.dtype == DType::BF16);
  const Accumulator acc = accumulator_for(args.y, t.row0, t.col0, true, dot, t, s);
  if (dot) {
    forward_dot(args, w, t, acc.c, acc.ldc, s);
  } else {
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
  }
  add_bias_and_store(args, t, acc, s);
}

// Few rows: W streams once through fma_rows, unpacked (packing would cost as much as the
// product). Otherwise packed panels and 6 x 16 outer-product tiles. Same bits either way.
void dgrad_tile(const DgradArgs& args, const Tile& t, const Tile* next, float* scratch) {
  const MatrixRef& w = args.weights[static_cast<size_t>(t.expert)];
  const Scratch s = split(t, scratch);
  const bool bf16_operands = w.dtype == DType::BF16 && args.dy.dtype == DType::BF16;
  if (dgrad_pairs(args.expert_rows[static_cast<size_t>(t.expert)], bf16_operands,
                  micro_kernels().pair_tile != nullptr)) {
    const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, false, false, t, s);
    pair_product(t.rows, t.cols, args.out_features, args.dy, t.row0, acc.c, acc.ldc, s,
                 [&](int64_t p0, int64_t kc, uint32_t* b) {
                   pack_pairs_rows(w, p0, kc, t.col0, t.cols, b);
                 });
    store_rows(acc, t, args.dx, t.row0, t.col0);
    return;
  }
  const bool direct = t.rows <= kDirectMaxRows;
  const Accumulator acc = accumulator_for(args.dx, t.row0, t.col0, true, direct, t, s);
  if (direct) {
    const MicroKernels& mk = micro_kernels();
    for (int64_t p0 = 0; p0 < args.out_features; p0 += kOuterDepth) {
      const int64_t kc = std::min(kOuterDepth, args.out_features - p0);
      const float* a = reinterpret_cast<const float*>(element(args.dy, t.row0, p0));
      int64_t lda = args.dy.ld;
      if (args.dy.dtype != DType::F32) {
        for (int64_t r = 0; r < t.rows; ++r) load_f32(args.dy, t.row0 + r, p0, kc, s.a + r * kc);
        a = s.a;
        lda = kc;
      }
      // In chunks of weight rows (BF16 widened in registers), prefetching a chunk ahead; same
      // chains, same order.
      for (int64_t p = 0; p < kc; p += kDirectChunk) {
        const int64_t ahead = p0 + p + kDirectChunk;
        if (ahead < args.out_features) {
          Prefetcher(region_of(w, ahead, std::min(kDirectChunk, args.out_features - ahead), t.col0,
                               t.cols),
                     1)
              .step();
        }
        const int64_t n = std::min(kDirectChunk, kc - p);
        const std::byte* b = element(w, p0 + p, t.col0);
        if (w.dtype == DType::F32) {
          mk.fma_rows(t.rows, n, a + p, lda, reinterpret_cast<const float*>(b), w.ld, t.cols, acc.c,
                      acc.ldc);
        } else {
          mk.fma_rows_bf16(t.rows, n, a + p, lda, reinterpret_cast<const uint16_t*>(b), w.ld,
                           t.cols, acc.c, acc.ldc);
        }
      }
    }
  } else {
    // Few rows share each weight: read W in place rather than pack it (BF16 widened in registers;
    // same bits). Full 16-column micro-tiles only, so that nothing past the tile's columns is read.
    const bool in_place =
        t.rows <= (w.dtype == DType::F32 ? kInPlaceMaxRows : kInPlaceMaxRowsBf16) &&
        t.cols % kOuterCols == 0;
    outer_product(
        t.rows, t.cols, args.out_features, acc.c, acc.ldc, s,
        [&](int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* a) {
          pack_a_rows_of(args.dy, t.row0 + i0, rows, p0, kc, a);
        },
        [&](int64_t p0, int64_t kc, float* b) {
          if (in_place) return BBlock{element(w, p0, t.col0), w.ld, false, w.dtype == DType::BF16};
          pack_b_rows(w, p0, kc, t.col0, t.cols, b);
          return BBlock{b, kOuterCols};
        },
        [&](int64_t p0, int64_t kc) { return region_of(w, p0, kc, t.col0, t.cols); },
        dgrad_first(args, next));
  }
  store_rows(acc, t, args.dx, t.row0, t.col0);
}

// Depth 0 (an expert without rows): zeros. Little depth: fma_rows straight from x. Otherwise
// packed panels and outer-product tiles. Same bits either way.
void wgrad_tile(const WgradArgs& args, const Tile& t, const Tile* next, float* scratch) {
  const auto e = static_cast<size_t>(t.expert);
  const MutableMatrixRef& g = args.wgrads[e];
  if (t.depth == 0 && !args.accumulate) {
    if (t.col0 == 0 && t.cols == g.ld) {
      stream_zeros(t.rows * t.cols, g, t.row0, 0);  // whole rows: one contiguous block
    } else {
      for (int64_t r = 0; r < t.rows; ++r) stream_zeros(t.cols, g, t.row0 + r, t.col0);
    }
    stream_fence();
    return;
  }
  const int64_t first = args.first_row[e];
  const Scratch s = split(t, scratch);
  const bool direct = t.depth <= kDirectMaxDepth;
  // The unpacked path reads a[i * depth + p] = dy(first + p, row0 + i) and the rows of x.
  const float* b = nullptr;
  int64_t ldb = 0;
  if (direct) {
    gather_cols(args.dy, first, t.depth, t.row0, t.rows, s.a);
    b = reinterpret_cast<const float*>(element(args.x, first, t.col0));
    ldb = args.x.ld;
    if (args.x.dtype != DType::F32) {
      for (int64_t p = 0; p < t.depth; ++p)
        load_f32(args.x, first + p, t.col0, t.cols, s.b + p * t.cols);
      b = s.b;
      ldb = t.cols;
    }
  }
  if (direct && !args.accumulate) {
    // Write-bound (few products per element): each row is formed in L1 and streamed out once.
    for (int64_t r = 0; r < t.rows; ++r) {
      std::fill_n(s.row, t.cols, 0.0f);
      micro_kernels().fma_rows(1, t.depth, s.a + r * t.depth, t.depth, b, ldb, t.cols, s.row,
                               t.cols);
      stream_f32(s.row, t.cols, g, t.row0 + r, t.col0);
    }
    stream_fence();
    return;
  }
  if (!direct && t.depth <= kOuterDepth) {
    wgrad_by_panels(args, t, first, wgrad_first(args, next), s);
    return;
  }
  const Accumulator acc = accumulator_for(g, t.row0, t.col0, !args.accumulate, direct, t, s);
  if (direct) {
    micro_kernels().fma_rows(t.rows, t.depth, s.a, t.depth, b, ldb, t.cols, acc.c, acc.ldc);
  } else {
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
  }
  if (args.accumulate) {
    for (int64_t r = 0; r < t.rows; ++r)
      add_old_gradient(g, t.row0 + r, t, acc.c + r * acc.ldc, s.row);
  }
  store_rows(acc, t, g, t.row0, t.col0, /*stream=*/true);
}

// Column sums in row order, in scratch (summing in place in an F32 output measured no faster).
// Blocks of dy that likely sit in cache take 8 rows per pass of add_rows (the sums of a column
// block stay in registers through the pass); larger ones, streamed from memory, one row per pass,
// in address order: jumping between 8 rows every 256 bytes defeated the prefetchers. Same bits
// either way. One core, rows of 384 F32: 64 rows in L2, 88 GB/s with 8 rows per pass against 36
// with one; 16384 rows from memory, 14-18 GB/s against 28-37.
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
