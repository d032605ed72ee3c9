// Planning: tiles cover every output element of every expert exactly once, within the tile
// shape and on its alignment, largest first, and depend only on the blocks.
#include "kernels/gemm_plan.hpp"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace grouplin::kernels {
namespace {

constexpr TileShape kShape = {.rows = 12, .cols = 32, .row_align = 6, .col_align = 16};

std::vector<ExpertBlock> blocks_for(const std::vector<int64_t>& splits, int64_t cols,
                                    int64_t depth) {
  std::vector<ExpertBlock> blocks;
  int64_t row = 0;
  for (int64_t m : splits) {
    blocks.push_back({row, m, cols, depth, 4.0, kShape});
    row += m;
  }
  return blocks;
}

// Counts how often each (expert, row, col) is covered and checks every tile's limits.
void expect_exact_cover(const std::vector<ExpertBlock>& blocks, const TilePlan& plan) {
  std::map<std::tuple<int32_t, int64_t, int64_t>, int> covered;
  for (const Tile& t : plan.tiles) {
    const ExpertBlock& b = blocks[static_cast<size_t>(t.expert)];
    EXPECT_GE(t.row0, b.row0);
    EXPECT_LE(t.row0 + t.rows, b.row0 + b.rows) << "tile leaves its expert's rows";
    EXPECT_LE(t.rows, b.shape.rows);
    EXPECT_LE(t.cols, b.shape.cols);
    EXPECT_EQ((t.row0 - b.row0) % b.shape.row_align, 0);
    EXPECT_EQ(t.col0 % b.shape.col_align, 0);
    EXPECT_EQ(t.depth, b.depth);
    for (int64_t r = t.row0; r < t.row0 + t.rows; ++r) {
      for (int64_t c = t.col0; c < t.col0 + t.cols; ++c) ++covered[{t.expert, r, c}];
    }
  }
  int64_t expected = 0;
  for (size_t e = 0; e < blocks.size(); ++e) {
    expected += blocks[e].rows * blocks[e].cols;
    for (int64_t r = blocks[e].row0; r < blocks[e].row0 + blocks[e].rows; ++r) {
      for (int64_t c = 0; c < blocks[e].cols; ++c) {
        ASSERT_EQ((covered[{static_cast<int32_t>(e), r, c}]), 1) << e << " " << r << " " << c;
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(covered.size()), expected);
}

TEST(GemmPlanTest, ExpertBoundariesInsideMicroTilesAreCoveredOnce) {
  const auto blocks = blocks_for({5, 0, 7, 13, 1, 25}, 37, 10);
  const TilePlan plan = plan_tiles(blocks);
  expect_exact_cover(blocks, plan);
  EXPECT_EQ(plan.max_rows, 12);
  EXPECT_EQ(plan.max_cols, 21);  // 37 columns on multiples of 16: 16 + 21
  EXPECT_EQ(plan.max_depth, 10);
}

TEST(GemmPlanTest, CutsAreNearlyEqualAndOnTheAlignment) {
  // 26 rows in tiles of at most 12 on multiples of 6: three tiles of 12, 12, 2 would leave a
  // sliver; the plan cuts 12 + 6 + 8 or similar: no tile smaller than one aligned unit except
  // the ragged last one, and at most ceil(26 / 12) = 3 tiles.
  const auto blocks = blocks_for({26}, 16, 1);
  const TilePlan plan = plan_tiles(blocks);
  expect_exact_cover(blocks, plan);
  EXPECT_EQ(plan.tiles.size(), 3u);
}

TEST(GemmPlanTest, AnExpertLargerThanAllOthersIsSplitSoEveryThreadWorks) {
  const auto blocks = blocks_for({1, 500, 2, 0, 3}, 64, 8);
  const TilePlan plan = plan_tiles(blocks);
  expect_exact_cover(blocks, plan);
  int giant = 0;
  for (const Tile& t : plan.tiles) giant += t.expert == 1;
  EXPECT_GE(giant, 16);  // 500 / 12 row tiles x 2 column tiles: plenty for any thread count
  // Largest first: the giant's full tiles come before every tile of the small experts.
  EXPECT_EQ(plan.tiles.front().expert, 1);
  for (size_t i = 1; i < plan.tiles.size(); ++i) {
    EXPECT_GE(plan.tiles[i - 1].cost, plan.tiles[i].cost);
  }
}

TEST(GemmPlanTest, Many256ExpertsMostlyEmpty) {
  std::vector<int64_t> splits(256, 0);
  splits[3] = 7;
  splits[200] = 1;
  splits[255] = 30;
  const auto blocks = blocks_for(splits, 20, 4);
  const TilePlan plan = plan_tiles(blocks);
  expect_exact_cover(blocks, plan);
  for (const Tile& t : plan.tiles) EXPECT_TRUE(t.expert == 3 || t.expert == 200 || t.expert == 255);
}

TEST(GemmPlanTest, DepthZeroBlocksStillGetTilesAndEmptyBlocksNone) {
  // wgrad of an expert without rows: rows = out features, depth 0 (zero-fill tiles).
  std::vector<ExpertBlock> blocks = {{0, 9, 20, 0, 0.0, kShape}, {0, 0, 20, 5, 0.0, kShape}};
  const TilePlan plan = plan_tiles(blocks);
  expect_exact_cover(blocks, plan);
  for (const Tile& t : plan.tiles) {
    EXPECT_EQ(t.expert, 0);
    EXPECT_EQ(t.depth, 0);
    EXPECT_GT(t.cost, 0.0);
  }
}

TEST(GemmPlanTest, EqualCostsKeepExpertRowColumnOrder) {
  const auto blocks = blocks_for({12, 12, 12}, 32, 8);
  const TilePlan plan = plan_tiles(blocks);
  ASSERT_EQ(plan.tiles.size(), 3u);
  for (int32_t e = 0; e < 3; ++e) EXPECT_EQ(plan.tiles[static_cast<size_t>(e)].expert, e);
}

}  // namespace
}  // namespace grouplin::kernels
