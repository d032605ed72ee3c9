// Planning for the grouped GEMM kernels: cutting every expert's output block into tiles and
// ordering the tiles largest-first. Kept apart from the code that computes one tile.
//
//   std::vector<ExpertBlock> blocks = ...;   // one per expert: where its output block lies
//   TilePlan plan = plan_tiles(blocks);   // each block says its tile shape
//   run_tasks(plan.tiles.size(), workers, [&](size_t i, int w) { compute(plan.tiles[i], w); });
//
// A plan depends only on the blocks and the tile shape, never on the thread count or on
// timing, and every output element lies in exactly one tile. The kernels compute an element
// the same way in whichever tile it falls, so results do not depend on the plan either; the plan
// only decides speed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace grouplin::kernels {

// The largest tile: at most `rows` x `cols` elements. Cuts fall on multiples of row_align and
// col_align (the micro-kernel's sizes) so that only the last tile of a block has a ragged edge.
// Requires: rows % row_align == 0, cols % col_align == 0, all >= 1.
struct TileShape {
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t row_align = 1;
  int64_t col_align = 1;
};

// The output block of one expert: rows [row0, row0 + rows) of some output matrix, all `cols`
// columns, each element a sum over `depth` products (depth 0: the block is only zero-filled).
struct ExpertBlock {
  int64_t row0 = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t depth = 0;
  // Bytes the tile of one column reads that no other tile of its rows shares, per unit of depth
  // (the weights, for forward and dgrad); feeds the cost model.
  double streamed_bytes_per_col = 0;
  TileShape shape;  // how to cut it
};

// One task: rows [row0, row0 + rows) x columns [col0, col0 + cols) of expert `expert`'s block.
struct Tile {
  int32_t expert = 0;
  int64_t row0 = 0;
  int64_t rows = 0;
  int64_t col0 = 0;
  int64_t cols = 0;
  int64_t depth = 0;
  double cost = 0;  // estimated time, arbitrary units; the plan is sorted by it, largest first
};

struct TilePlan {
  std::vector<Tile> tiles;  // largest cost first; equal costs in (expert, row0, col0) order
  int64_t max_rows = 0;     // the largest tile, for sizing scratch
  int64_t max_cols = 0;
  int64_t max_depth = 0;
};

// Cuts each block with rows > 0 and cols > 0 into as few tiles as fit in its shape, of nearly
// equal sizes, and sorts them largest-first by estimated cost.
// Requires: every block's shape as documented, blocks.size() < 2^31.
TilePlan plan_tiles(std::span<const ExpertBlock> blocks);

}  // namespace grouplin::kernels
