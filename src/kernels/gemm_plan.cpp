#include "kernels/gemm_plan.hpp"

#include <algorithm>

namespace grouplin::kernels {
namespace {

// Cost model: time ~ flops / F + streamed bytes / B. On the reference machine one core runs
// ~90 GF/s in the micro-kernels and streams ~12 GB/s from memory, so a streamed byte costs about
// as much as 8 flops. Only the order of tiles depends on it.
constexpr double kFlopsPerStreamedByte = 8.0;
// Writing or zeroing a 4-byte output element, in the same units.
constexpr double kCostPerOutputElement = 4.0 * kFlopsPerStreamedByte;

// Cut points of [0, total) into the fewest pieces of at most `max`, nearly equal, on multiples of
// `align` (except `total` itself): cuts[i] .. cuts[i + 1] is piece i.
std::vector<int64_t> cut_points(int64_t total, int64_t max, int64_t align) {
  const int64_t units = (total + align - 1) / align;
  const int64_t max_units = max / align;
  const int64_t pieces = (units + max_units - 1) / max_units;
  std::vector<int64_t> cuts;
  for (int64_t i = 0; i <= pieces; ++i)
    cuts.push_back(std::min(total, align * (units * i / pieces)));
  return cuts;
}

}  // namespace

TilePlan plan_tiles(std::span<const ExpertBlock> blocks) {
  TilePlan plan;
  for (size_t e = 0; e < blocks.size(); ++e) {
    const ExpertBlock& b = blocks[e];
    if (b.rows <= 0 || b.cols <= 0) continue;
    const TileShape& shape = b.shape;
    const std::vector<int64_t> row_cuts = cut_points(b.rows, shape.rows, shape.row_align);
    const std::vector<int64_t> col_cuts = cut_points(b.cols, shape.cols, shape.col_align);
    for (size_t i = 0; i + 1 < row_cuts.size(); ++i) {
      const int64_t r = row_cuts[i], rows = row_cuts[i + 1] - r;
      for (size_t j = 0; j + 1 < col_cuts.size(); ++j) {
        const int64_t c = col_cuts[j], cols = col_cuts[j + 1] - c;
        Tile t;
        t.expert = static_cast<int32_t>(e);
        t.row0 = b.row0 + r;
        t.rows = rows;
        t.col0 = c;
        t.cols = cols;
        t.depth = b.depth;
        const auto elements = static_cast<double>(rows) * static_cast<double>(cols);
        t.cost = 2.0 * elements * static_cast<double>(b.depth) +
                 kFlopsPerStreamedByte * b.streamed_bytes_per_col * static_cast<double>(cols) *
                     static_cast<double>(b.depth) +
                 kCostPerOutputElement * elements;
        plan.tiles.push_back(t);
        plan.max_rows = std::max(plan.max_rows, rows);
        plan.max_cols = std::max(plan.max_cols, cols);
        plan.max_depth = std::max(plan.max_depth, b.depth);
      }
    }
  }
  // Tiles were appended in (expert, row0, col0) order; a stable sort keeps it among equals.
  std::stable_sort(plan.tiles.begin(), plan.tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.cost > b.cost; });
  return plan;
}

}  // namespace grouplin::kernels
