// Computing one tile of a grouped GEMM: the loops between a planned Tile (gemm_plan.hpp) and the
// micro-kernels (micro_kernels.hpp), in tile_forward.cpp and tile_backward.cpp on the blocked
// loops they share (tile_products.hpp). No allocation: every function works in scratch that
// scratch_floats sized for the plan.
//
//   TilePlan plan = plan_tiles(blocks);
//   const size_t per_worker = scratch_floats(plan);
//   ... forward_tile(args, plan.tiles[i], &plan.tiles[j], scratch + worker * per_worker);
//
// Which path each expert's tiles take is tile_paths.hpp's. Operands are F32 or BF16 matrices;
// arithmetic is F32. Each output element is computed in one tile, by one chain of operations
// whose order is fixed by the shapes alone (see micro_kernels.hpp), and BF16 results are rounded
// once, at the end. F32 results accumulate in place in the output; BF16 results (and accumulated
// gradients) in F32 scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/gemm_plan.hpp"
#include "kernels/packing.hpp"
#include "kernels/tile_paths.hpp"

namespace grouplin::kernels {

// Floats of scratch one worker needs for any tile of `plan`.
size_t scratch_floats(const TilePlan& plan);

// Each *_tile function computes `tile` in `scratch`; `next`, when not null, is the tile the
// same worker computes next: its first weights (or rows of x) are prefetched during the last
// block of this one, so that streaming them overlaps with computing.

// y = x · W_eᵀ (+ b_e): tile rows are rows of x and y, columns output features.
struct ForwardArgs {
  MatrixRef x;                       // [T, in]
  std::vector<MatrixRef> weights;    // per expert [out, in]
  std::vector<MatrixRef> biases;     // per expert [1, out], or empty
  std::vector<int64_t> expert_rows;  // m_splits
  std::vector<int64_t> first_row;    // per expert: its first row of x and y
  MutableMatrixRef y;                // [T, out]
  int64_t in_features = 0;
  // Empty, or per expert its BF16 weights packed for their whole depth (packed_weights.hpp), or
  // null: what pair tiles whose columns start on a 16-column strip read instead of packing.
  std::vector<const uint32_t*> packed;
};
void forward_tile(const ForwardArgs& args, const Tile& tile, const Tile* next, float* scratch);
// The path of `expert`'s forward tiles on the current kernel set (tile_paths.hpp).
ForwardPath forward_path_of(const ForwardArgs& args, int32_t expert);

// dx = dy · W_e: tile rows are rows of dy and dx, columns input features. For FP8 weights the
// tile's first column is a multiple of 16 (the fused FP8 kernels read whole 16-column strips of
// a scale block; dgrad plans cut on them).
struct DgradArgs {
  MatrixRef dy;                      // [T, out]
  std::vector<MatrixRef> weights;    // per expert [out, in]
  std::vector<int64_t> expert_rows;  // m_splits
  MutableMatrixRef dx;               // [T, in]
  int64_t out_features = 0;
};
void dgrad_tile(const DgradArgs& args, const Tile& tile, const Tile* next, float* scratch);

// dW_e = dy_eᵀ · x_e, written, or with accumulate added to the existing values in one F32
// addition per element. Tile rows are output features, columns input features, depth the
// expert's rows from first_row[expert]. A tile of depth 0 writes zeros.
struct WgradArgs {
  MatrixRef x;                           // [T, in]
  MatrixRef dy;                          // [T, out]
  std::vector<int64_t> first_row;        // per expert: its first row of x and dy
  std::vector<MutableMatrixRef> wgrads;  // per expert [out, in]
  bool accumulate = false;
};
void wgrad_tile(const WgradArgs& args, const Tile& tile, const Tile* next, float* scratch);

// db_e = column sums of dy_e in row order: the tile is columns of b_e (one row), its depth the
// expert's rows from first_row[expert] (0: zeros).
struct BgradArgs {
  MatrixRef dy;
  std::vector<int64_t> first_row;
  std::vector<MutableMatrixRef> bgrads;  // per expert [1, out]
};
void bgrad_tile(const BgradArgs& args, const Tile& tile, float* scratch);

}  // namespace grouplin::kernels
