#include "kernels/grouped_gemm.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "kernels/gemm_plan.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/thread_pool.hpp"
#include "kernels/tile_compute.hpp"

namespace grouplin::kernels {
namespace {

// Tile shapes (tuning constants; the measurements behind them are in docs/PERFORMANCE.md).
// forward, experts with few rows (dot tiles): all rows share one pass over 192 weight rows.
constexpr TileShape kForwardDotTile = {
    .rows = 128, .cols = 192, .row_align = kDotRows, .col_align = kDotCols};
// forward with more rows, dgrad: outer-product tiles of up to 384 x 256. Each packs its
// 256-column slice of B (the weights for forward and dgrad) once per depth block and reuses it
// for all its rows, so the weights stream once per 384 rows (tiles of 96 rows: 0.67 of dense on
// an 8-expert forward with 512 rows each; 384 rows: 0.97; 192 rows: equal or 3% slower).
constexpr TileShape kOuterTile = {
    .rows = 384, .cols = 256, .row_align = kOuterRows, .col_align = kOuterCols};
constexpr TileShape kForwardTile = kOuterTile;
constexpr TileShape kDgradTile = kOuterTile;
// dgrad of experts with at most kDirectMaxRows rows (unpacked, weight-streaming): wide tiles, so
// that each weight row is read whole, in one contiguous run (docs/PERFORMANCE.md); of more rows
// on kDirect (summing in scratch), as wide as those sums stay in L1 (tile_paths.hpp).
constexpr TileShape kDgradDirectTile = {
    .rows = kDirectMaxRows, .cols = 8192, .row_align = 1, .col_align = kOuterCols};
constexpr TileShape kDgradDirectScratchTile = {.rows = kDirectScratchMaxRows,
                                               .cols = kDirectScratchCols,
                                               .row_align = 1,
                                               .col_align = kOuterCols};
// wgrad: 1024 columns, so that each gradient row goes out in long runs and x's rows are packed
// once per 1024 columns (docs/PERFORMANCE.md, "Wider wgrad tiles").
constexpr TileShape kWgradTile = {
    .rows = 384, .cols = 1024, .row_align = kOuterRows, .col_align = kOuterCols};
// wgrad of one depth block on pair panels (WgradPath::kPairPanels): gradient rows are formed a
// group at a time, so a tile's scratch does not grow with its rows, and taller tiles pack each
// 1024-column slice of x's rows fewer times (docs/PERFORMANCE.md, "Taller wgrad tiles").
constexpr TileShape kWgradPanelsTile = {
    .rows = 1024, .cols = 1024, .row_align = kOuterRows, .col_align = kOuterCols};
// bgrad: whole rows of dy (contiguous, so they stream); splitting columns between threads
// measured 2-3x slower (partial rows defeat the prefetchers). Rows are summed in order, so one
// expert's sums stay on one thread.
constexpr TileShape kBgradTile = {.rows = 1, .cols = 8192};
// bgrad of at most this many elements of dy (~100 us of work) runs unplanned on the caller.
constexpr int64_t kSerialBgradElements = int64_t{1} << 18;
// wgrad of an expert without rows: blocks of whole rows, zeroed by one memset each.
constexpr int64_t kZeroTileRows = 64;
// Plans cheaper than this (in plan cost units, ~flops; ~40 us on one core) run on the calling
// thread alone: waking the pool costs more than it saves.
constexpr double kParallelMinCost = 2e6;

MatrixRef matrix(const Tensor& t) {
  return {t.data(), t.dtype(), t.rank() == 0 ? 1 : t.dim(t.rank() - 1)};
}
// Expert e's weights: FP8 codes with their scales, or an F32 / BF16 matrix.
MatrixRef weight_matrix(std::span<const Tensor> weights, std::span<const Tensor> scales, size_t e) {
  MatrixRef m = matrix(weights[e]);
  if (!scales.empty()) {
    m.scales = scales[e].data_as<float>();
    m.scale_ld = scales[e].dim(1);
  }
  return m;
}
MutableMatrixRef mutable_matrix(Tensor& t) {
  return {t.numel() == 0 ? nullptr : t.mutable_data(), t.dtype(),
          t.rank() == 0 ? 1 : t.dim(t.rank() - 1)};
}

std::vector<int64_t> first_rows(std::span<const int64_t> m_splits) {
  std::vector<int64_t> first(m_splits.size());
  int64_t row = 0;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    first[e] = row;
    row += m_splits[e];
  }
  return first;
}

// Scratch for all workers of a run, kept by the calling thread from call to call (grow-only):
// allocating it per call would page-fault it in again every time. Uninitialised (every tile
// writes what it reads), 64-byte aligned. A run never starts another on the same thread.
float* calling_thread_scratch(size_t floats) {
  thread_local std::unique_ptr<float[]> arena;
  thread_local size_t capacity = 0;
  if (capacity < floats) {
    arena.reset();
    arena = std::make_unique_for_overwrite<float[]>(floats + 16);
    capacity = floats;
  }
  float* base = arena.get();
  while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
  return base;
}

// Runs compute(tile, next, scratch) over the plan on the pool, with `scratch_floats` of scratch
// per worker: the one scheduling helper behind all four operations. Each worker takes tiles in
// plan order (largest first) from one atomic counter, while many are left one tile ahead, so
// that it knows what it computes next and prefetches its first weights (+7% on a 128-expert
// forward with 32 rows per expert, same-run A/B with prefetching off).
template <class Compute>
void run_plan(const TilePlan& plan, size_t scratch_floats, const Compute& compute) {
  const size_t count = plan.tiles.size();
  if (count == 0) return;
  double cost = 0;
  for (const Tile& t : plan.tiles) cost += t.cost;
  const int workers = cost < kParallelMinCost ? 1 : workers_for(count);
  scratch_floats = (scratch_floats + 15) / 16 * 16;
  float* base = calling_thread_scratch(static_cast<size_t>(workers) * scratch_floats);
  std::atomic<size_t> next{0};
  void (*const release)() = micro_kernels().pair_release;
  run_tasks(static_cast<size_t>(workers), workers, [&](size_t, int worker) {
    float* mine = base + static_cast<size_t>(worker) * scratch_floats;
    size_t current = next.fetch_add(1, std::memory_order_relaxed);
    while (current < count) {
      // Claim the next tile early (to prefetch it) only while plenty are left: near the end it
      // would take work from an idle worker.
      size_t after = count;
      if (count - current > 2 * static_cast<size_t>(workers)) {
        after = next.fetch_add(1, std::memory_order_relaxed);
      }
      compute(plan.tiles[current], after < count ? &plan.tiles[after] : nullptr, mine);
      current = after < count ? after : next.fetch_add(1, std::memory_order_relaxed);
    }
    // What the pair kernels keep between tiles (the AMX configuration) ends with the call.
    if (release != nullptr) release();
  });
}

size_t bytes_of(const Tensor& t) { return dtype_size(t.dtype()); }

// Resolves the kernel set on the calling thread before anything is planned or written: its first
// use decides it (kernel_isa), so that a bad GROUPLIN_ISA is one error thrown here, with every
// output untouched, rather than one per tile on the workers (or none at all for a call without
// rows, which reaches no kernel).
void resolve_kernels() { (void)micro_kernels(); }

}  // namespace

void grouped_forward(const Tensor& x, std::span<const int64_t> m_splits,
                     std::span<const Tensor> weights, std::span<const Tensor> weight_scales,
                     std::span<const Tensor> biases, Tensor& y,
                     std::span<const std::byte* const> packed) {
  resolve_kernels();
  ForwardArgs args;
  for (const std::byte* p : packed) args.packed.push_back(reinterpret_cast<const uint32_t*>(p));
  args.x = matrix(x);
  args.in_features = x.dim(1);
  args.y = mutable_matrix(y);
  const std::vector<int64_t> first = first_rows(m_splits);
  args.first_row = first;
  std::vector<ExpertBlock> blocks;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    args.weights.push_back(weight_matrix(weights, weight_scales, e));
    if (!biases.empty()) args.biases.push_back(matrix(biases[e]));
    args.expert_rows.push_back(m_splits[e]);
    // Experts on the pair kernels take outer tiles whatever their rows: their columns start on
    // 16-column strips, where packed weights begin.
    const ForwardPath path = forward_path_of(args, static_cast<int32_t>(e));
    const bool pairs = path == ForwardPath::kPairDots || path == ForwardPath::kPairTiles;
    const bool dot_tiles = forward_dots(m_splits[e], bf16_values(args.weights.back())) && !pairs;
    blocks.push_back({first[e], m_splits[e], y.dim(1), x.dim(1),
                      static_cast<double>(bytes_of(weights[e])),
                      dot_tiles ? kForwardDotTile : kForwardTile});
  }
  const TilePlan plan = plan_tiles(blocks);
  run_plan(plan, scratch_floats(plan), [&](const Tile& t, const Tile* n, float* scratch) {
    forward_tile(args, t, n, scratch);
  });
}

void grouped_dgrad(const Tensor& dy, std::span<const int64_t> m_splits,
                   std::span<const Tensor> weights, std::span<const Tensor> weight_scales,
                   Tensor& dx) {
  resolve_kernels();
  DgradArgs args;
  args.dy = matrix(dy);
  args.dx = mutable_matrix(dx);
  args.out_features = dy.dim(1);
  const std::vector<int64_t> first = first_rows(m_splits);
  std::vector<ExpertBlock> blocks;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    args.weights.push_back(weight_matrix(weights, weight_scales, e));
    args.expert_rows.push_back(m_splits[e]);
    const DgradPath path =
        dgrad_path(m_splits[e], dy.dtype(), weights[e].dtype(), SetCaps::of(micro_kernels()));
    const TileShape direct =
        m_splits[e] <= kDirectMaxRows ? kDgradDirectTile : kDgradDirectScratchTile;
    blocks.push_back({first[e], m_splits[e], dx.dim(1), dy.dim(1),
                      static_cast<double>(bytes_of(weights[e])),
                      path == DgradPath::kDirect ? direct : kDgradTile});
  }
  const TilePlan plan = plan_tiles(blocks);
  run_plan(plan, scratch_floats(plan),
           [&](const Tile& t, const Tile* n, float* scratch) { dgrad_tile(args, t, n, scratch); });
}

void grouped_wgrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> m_splits,
                   std::span<Tensor> wgrads, bool accumulate) {
  resolve_kernels();
  WgradArgs args;
  args.x = matrix(x);
  args.dy = matrix(dy);
  args.first_row = first_rows(m_splits);
  args.accumulate = accumulate;
  std::vector<ExpertBlock> blocks;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    args.wgrads.push_back(mutable_matrix(wgrads[e]));
    // Accumulating, an expert without rows keeps its gradient: no tiles at all. Otherwise its
    // gradient is zeroed in blocks of whole rows.
    const bool empty = m_splits[e] == 0;
    const int64_t rows = accumulate && empty ? 0 : dy.dim(1);
    const TileShape zero_tile = {.rows = kZeroTileRows, .cols = std::max<int64_t>(1, x.dim(1))};
    const bool panels = wgrad_path(m_splits[e], x.dtype(), dy.dtype(),
                                   SetCaps::of(micro_kernels())) == WgradPath::kPairPanels;
    blocks.push_back({0, rows, x.dim(1), m_splits[e], 0.0,
                      empty    ? zero_tile
                      : panels ? kWgradPanelsTile
                               : kWgradTile});
  }
  const TilePlan plan = plan_tiles(blocks);
  run_plan(plan, scratch_floats(plan),
           [&](const Tile& t, const Tile* n, float* scratch) { wgrad_tile(args, t, n, scratch); });
}

void grouped_bgrad(const Tensor& dy, std::span<const int64_t> m_splits, std::span<Tensor> bgrads) {
  resolve_kernels();
  BgradArgs args;
  args.dy = matrix(dy);
  args.first_row = first_rows(m_splits);
  if (dy.numel() <= kSerialBgradElements) {
    // Small: one full-width tile per expert on this thread, no plan (same sums, same order).
    float* scratch = calling_thread_scratch(static_cast<size_t>(dy.dim(1)));
    for (size_t e = 0; e < m_splits.size(); ++e) {
      args.bgrads.push_back(mutable_matrix(bgrads[e]));
      Tile t;
      t.expert = static_cast<int32_t>(e);
      t.rows = 1;
      t.cols = dy.dim(1);
      t.depth = m_splits[e];
      bgrad_tile(args, t, scratch);
    }
    return;
  }
  std::vector<ExpertBlock> blocks;
  for (size_t e = 0; e < m_splits.size(); ++e) {
    args.bgrads.push_back(mutable_matrix(bgrads[e]));
    blocks.push_back({0, 1, dy.dim(1), m_splits[e], static_cast<double>(bytes_of(dy)), kBgradTile});
  }
  const TilePlan plan = plan_tiles(blocks);
  run_plan(plan, scratch_floats(plan),
           [&](const Tile& t, const Tile*, float* scratch) { bgrad_tile(args, t, scratch); });
}

}  // namespace grouplin::kernels
