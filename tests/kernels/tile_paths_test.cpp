// The path rules by themselves (tile_paths.hpp): which loops an expert's tiles run, as a pure
// function of the operation, the expert's rows, the dtypes, what the kernel set has and, for the
// forward, the depth. Each boundary is checked on both sides, for every kind of set.
#include "kernels/tile_paths.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace grouplin::kernels {
namespace {

constexpr SetCaps kWidening{};                                  // portable, AVX2, AVX-512F
constexpr SetCaps kBf16Pairs{true, true, false, false, true};   // AVX512-BF16 without VBMI
constexpr SetCaps kBf16Fp8Pairs{true, true, true, true, true};  // AVX512-BF16 with VBMI
// AMX: pair tiles (long runs), no dots, no pair rows.
constexpr SetCaps kAmx{true, false, false, false, false, true};
constexpr DType kF32 = DType::F32, kBf16 = DType::BF16, kFp8 = DType::F8_E4M3;
// A depth (in_features) past the shallow bound of the forward's pair dots: the rules by rows alone.
constexpr int64_t kDeep = kPairDotShallowMaxDepth + 1;

TEST(TilePaths, ForwardOfF32WeightsByRows) {
  for (const SetCaps& set : {kWidening, kBf16Pairs, kBf16Fp8Pairs, kAmx}) {
    EXPECT_EQ(forward_path(1, kDeep, kF32, kF32, set), ForwardPath::kDots);
    EXPECT_EQ(forward_path(kDotMaxRows, kDeep, kF32, kF32, set), ForwardPath::kDots);
    EXPECT_EQ(forward_path(kDotMaxRows + 1, kDeep, kF32, kF32, set), ForwardPath::kBroadcast);
    EXPECT_EQ(forward_path(kBroadcastMaxRows, kDeep, kF32, kF32, set), ForwardPath::kBroadcast);
    EXPECT_EQ(forward_path(kBroadcastMaxRows + 1, kDeep, kF32, kF32, set), ForwardPath::kOuter);
    // F32 x beside BF16 weights never takes the pair kernels.
    EXPECT_EQ(forward_path(200, kDeep, kF32, kBf16, set), ForwardPath::kOuter);
  }
}

TEST(TilePaths, ForwardOfBf16WeightsWidenedWithoutPairKernels) {
  EXPECT_EQ(forward_path(kDotMaxRowsBf16, kDeep, kBf16, kBf16, kWidening), ForwardPath::kDots);
  EXPECT_EQ(forward_path(kDotMaxRowsBf16 + 1, kDeep, kBf16, kBf16, kWidening), ForwardPath::kOuter);
  // Wasteful last panels of x (tails of 1-4 and 9-12 rows) pack rather than broadcast.
  EXPECT_EQ(forward_path(16 + 5, kDeep, kBf16, kBf16, kWidening), ForwardPath::kBroadcast);
  EXPECT_EQ(forward_path(16 + 4, kDeep, kBf16, kBf16, kWidening), ForwardPath::kOuter);
  EXPECT_EQ(forward_path(16 + 12, kDeep, kBf16, kBf16, kWidening), ForwardPath::kOuter);
  EXPECT_EQ(forward_path(32, kDeep, kBf16, kBf16, kWidening), ForwardPath::kBroadcast);
  EXPECT_EQ(forward_path(16 + 4, kDeep, kF32, kF32, kWidening), ForwardPath::kBroadcast);
}

TEST(TilePaths, ForwardOfBf16OperandsOnPairKernels) {
  for (const SetCaps& set : {kBf16Pairs, kBf16Fp8Pairs}) {
    EXPECT_EQ(forward_path(1, kDeep, kBf16, kBf16, set), ForwardPath::kPairDots);
    EXPECT_EQ(forward_path(kPairDotMaxRows, kDeep, kBf16, kBf16, set), ForwardPath::kPairDots);
    EXPECT_EQ(forward_path(kPairDotMaxRows + 1, kDeep, kBf16, kBf16, set), ForwardPath::kPairTiles);
    EXPECT_EQ(forward_path(5000, kDeep, kBf16, kBf16, set), ForwardPath::kPairTiles);
  }
  // AMX has no pair dots: a few rows stay on widened dot tiles.
  EXPECT_EQ(forward_path(kDotMaxRowsBf16, kDeep, kBf16, kBf16, kAmx), ForwardPath::kDots);
  EXPECT_EQ(forward_path(kPairDotShallowMaxRows, 64, kBf16, kBf16, kAmx), ForwardPath::kPairTiles);
  EXPECT_EQ(forward_path(kDotMaxRowsBf16 + 1, kDeep, kBf16, kBf16, kAmx), ForwardPath::kPairTiles);
}

TEST(TilePaths, ForwardPairDotsTakeMoreRowsWhereTheDepthIsShallow) {
  static_assert(kPairDotMaxRows < kPairDotShallowMaxRows);
  constexpr int64_t kShallow = kPairDotShallowMaxDepth;
  for (const SetCaps& set : {kBf16Pairs, kBf16Fp8Pairs}) {
    EXPECT_EQ(forward_path(kPairDotShallowMaxRows, kShallow, kBf16, kBf16, set),
              ForwardPath::kPairDots);
    EXPECT_EQ(forward_path(kPairDotMaxRows + 1, 1, kBf16, kBf16, set), ForwardPath::kPairDots);
    EXPECT_EQ(forward_path(kPairDotShallowMaxRows + 1, kShallow, kBf16, kBf16, set),
              ForwardPath::kPairTiles);
    EXPECT_EQ(forward_path(kPairDotMaxRows + 1, kShallow + 1, kBf16, kBf16, set),
              ForwardPath::kPairTiles);
    EXPECT_EQ(forward_path(kPairDotMaxRows, kShallow + 1, kBf16, kBf16, set),
              ForwardPath::kPairDots);
    // F32 x or FP8 weights keep their own paths at any depth.
    EXPECT_EQ(forward_path(kPairDotShallowMaxRows, kShallow, kF32, kF32, set), ForwardPath::kDots);
  }
  EXPECT_EQ(forward_path(kPairDotShallowMaxRows, kShallow, kBf16, kFp8, kBf16Fp8Pairs),
            ForwardPath::kFp8PairDots);
  EXPECT_EQ(
      forward_chain(kPairDotShallowMaxRows, kShallow, kPairDotShallowMaxRows - 1, true, true, true),
      ForwardChain::kPairDots);
  EXPECT_EQ(forward_chain(kPairDotShallowMaxRows, kShallow + 1, 0, true, true, true),
            ForwardChain::kPairs);
}

TEST(TilePaths, DgradInPlaceDepthBlocksByTileRows) {
  // F32 weights read in place: short tiles take the shorter depth blocks, taller ones and other
  // weight dtypes (widened or decoded) kOuterDepth.
  EXPECT_EQ(dgrad_in_place_depth(1, true), kShortInPlaceDepth);
  EXPECT_EQ(dgrad_in_place_depth(kShortInPlaceMaxRows, true), kShortInPlaceDepth);
  EXPECT_EQ(dgrad_in_place_depth(kShortInPlaceMaxRows + 1, true), kOuterDepth);
  EXPECT_EQ(dgrad_in_place_depth(1, false), kOuterDepth);
}

TEST(TilePaths, ForwardOfFp8Weights) {
  EXPECT_EQ(forward_path(1, kDeep, kBf16, kFp8, kBf16Fp8Pairs), ForwardPath::kFp8PairDots);
  EXPECT_EQ(forward_path(kFp8DotMaxRows, kDeep, kBf16, kFp8, kBf16Fp8Pairs),
            ForwardPath::kFp8PairDots);
  EXPECT_EQ(forward_path(kFp8DotMaxRows + 1, kDeep, kBf16, kFp8, kBf16Fp8Pairs),
            ForwardPath::kFp8PairTiles);
  // Without the FP8 pair kernels, or beside F32 x, FP8 codes decode to F32 values.
  for (const SetCaps& set : {kWidening, kBf16Pairs, kAmx}) {
    EXPECT_EQ(forward_path(kDotMaxRows, kDeep, kBf16, kFp8, set), ForwardPath::kDots);
    EXPECT_EQ(forward_path(kDotMaxRows + 1, kDeep, kBf16, kFp8, set), ForwardPath::kBroadcast);
  }
  EXPECT_EQ(forward_path(4, kDeep, kF32, kFp8, kBf16Fp8Pairs), ForwardPath::kDots);
}

TEST(TilePaths, ForwardPairTilesTurnWhereXFillsItsStrips) {
  EXPECT_TRUE(forward_pairs_turned(1));
  EXPECT_TRUE(forward_pairs_turned(kTurnedMaxRows));
  EXPECT_FALSE(forward_pairs_turned(kTurnedMaxRows + 1));
  EXPECT_TRUE(forward_pairs_turned(64));
  EXPECT_FALSE(forward_pairs_turned(72));
  EXPECT_TRUE(forward_pairs_turned(kTurnedAlignedMaxRows));
  EXPECT_FALSE(forward_pairs_turned(kTurnedAlignedMaxRows + kOuterCols));
  EXPECT_TRUE(fp8_forward_turned(kTurnedMaxRows));
  EXPECT_FALSE(fp8_forward_turned(64));
}

TEST(TilePaths, Dgrad) {
  for (const SetCaps& set : {kWidening, kBf16Pairs, kBf16Fp8Pairs, kAmx}) {
    EXPECT_EQ(dgrad_path(kDirectMaxRows, kF32, kF32, set), DgradPath::kDirect);
    EXPECT_EQ(dgrad_path(kDirectMaxRows + 1, kF32, kF32, set), DgradPath::kOuter);
    EXPECT_EQ(dgrad_path(kDgradPairsMinRows, kBf16, kBf16, set), DgradPath::kDirect);
  }
  EXPECT_EQ(dgrad_path(kDirectMaxRows, kBf16, kBf16, kWidening), DgradPath::kDirect);
  EXPECT_EQ(dgrad_path(kDirectMaxRows + 1, kBf16, kBf16, kWidening), DgradPath::kOuter);
  for (const SetCaps& set : {kBf16Pairs, kBf16Fp8Pairs}) {
    EXPECT_EQ(dgrad_path(kDgradPairsMinRows + 1, kBf16, kBf16, set), DgradPath::kPairRows);
    EXPECT_EQ(dgrad_path(kPairRowsMaxRows, kBf16, kBf16, set), DgradPath::kPairRows);
    EXPECT_EQ(dgrad_path(kPairRowsMaxRows + 1, kBf16, kBf16, set), DgradPath::kPairTiles);
    // F32 dy beside BF16 weights never takes the pair kernels.
    EXPECT_EQ(dgrad_path(kDgradPairsMinRows + 1, kF32, kBf16, set), DgradPath::kDirect);
  }
  EXPECT_EQ(dgrad_path(kDgradPairsMinRows + 1, kBf16, kBf16, kAmx), DgradPath::kPairTiles);
  // F32 weights on a set whose fma_rows takes kDirectScratchMaxRows weight rows per pass go
  // direct up to that many rows, whatever dy is; BF16 and FP8 weights, and fewer steps, do not.
  for (SetCaps set : {kWidening, kBf16Pairs, kBf16Fp8Pairs, kAmx}) {
    set.f32_rows_steps = kDirectScratchMaxRows;
    EXPECT_EQ(dgrad_path(kDirectScratchMaxRows, kF32, kF32, set), DgradPath::kDirect);
    EXPECT_EQ(dgrad_path(kDirectScratchMaxRows, kBf16, kF32, set), DgradPath::kDirect);
    EXPECT_EQ(dgrad_path(kDirectScratchMaxRows + 1, kF32, kF32, set), DgradPath::kOuter);
    EXPECT_EQ(dgrad_path(kDirectMaxRows + 1, kF32, kBf16, set), DgradPath::kOuter);
    EXPECT_EQ(dgrad_path(kDirectMaxRows + 1, kF32, kFp8, set), DgradPath::kOuter);
    set.f32_rows_steps = kDirectScratchMaxRows - 1;
    EXPECT_EQ(dgrad_path(kDirectMaxRows + 1, kF32, kF32, set), DgradPath::kOuter);
  }
  EXPECT_EQ(dgrad_path(1, kBf16, kFp8, kBf16Fp8Pairs), DgradPath::kFp8Rows);
  EXPECT_EQ(dgrad_path(kFp8RowsMaxRows, kBf16, kFp8, kBf16Fp8Pairs), DgradPath::kFp8Rows);
  EXPECT_EQ(dgrad_path(kFp8RowsMaxRows + 1, kBf16, kFp8, kBf16Fp8Pairs), DgradPath::kFp8PairTiles);
  EXPECT_EQ(dgrad_path(kFp8RowsMaxRows + 1, kBf16, kFp8, kBf16Pairs), DgradPath::kOuter);
  EXPECT_EQ(dgrad_path(2, kF32, kFp8, kBf16Fp8Pairs), DgradPath::kDirect);
}

TEST(TilePaths, Wgrad) {
  for (const SetCaps& set : {kWidening, kBf16Pairs, kAmx}) {
    EXPECT_EQ(wgrad_path(kDirectMaxDepth, kF32, kF32, set), WgradPath::kDirect);
    EXPECT_EQ(wgrad_path(kDirectMaxDepth + 1, kF32, kF32, set), WgradPath::kPanels);
    EXPECT_EQ(wgrad_path(kOuterDepth, kF32, kF32, set), WgradPath::kPanels);
    EXPECT_EQ(wgrad_path(kOuterDepth + 1, kF32, kF32, set), WgradPath::kOuter);
    EXPECT_EQ(wgrad_path(kDirectMaxDepth, kBf16, kBf16, set), WgradPath::kDirect);
  }
  EXPECT_EQ(wgrad_path(kOuterDepth + 1, kBf16, kBf16, kWidening), WgradPath::kOuter);
  // One depth block streams its gradient rows out as formed, except on AMX (long runs per call).
  EXPECT_EQ(wgrad_path(kDirectMaxDepth + 1, kBf16, kBf16, kBf16Pairs), WgradPath::kPairPanels);
  EXPECT_EQ(wgrad_path(kPairPanelsMaxDepth, kBf16, kBf16, kBf16Pairs), WgradPath::kPairPanels);
  EXPECT_EQ(wgrad_path(kPairPanelsMaxDepth + 1, kBf16, kBf16, kBf16Pairs), WgradPath::kPairTiles);
  EXPECT_EQ(wgrad_path(kDirectMaxDepth + 1, kBf16, kBf16, kAmx), WgradPath::kPairTiles);
  EXPECT_EQ(wgrad_path(kPairPanelsMaxDepth, kBf16, kBf16, kAmx), WgradPath::kPairTiles);
}

// BF16 pair tiles of turned experts: a last strip of 1 to kPairDotTailMaxRows rows after a whole
// one runs dot_tile_pairs, where the set has it.
TEST(TilePaths, PairTilesSumAShortLastStripByPairDots) {
  EXPECT_EQ(forward_pair_dot_tail_start(16 + kPairDotTailMaxRows, true), 16);
  EXPECT_EQ(forward_pair_dot_tail_start(33, true), 32);
  EXPECT_EQ(forward_pair_dot_tail_start(16 + kPairDotTailMaxRows + 1, true),
            16 + kPairDotTailMaxRows + 1);                          // a fuller strip: pair tiles
  EXPECT_EQ(forward_pair_dot_tail_start(32, true), 32);             // no last strip
  EXPECT_EQ(forward_pair_dot_tail_start(3, true), 3);               // no whole strip before it
  EXPECT_EQ(forward_pair_dot_tail_start(17, false), 17);            // no dot_tile_pairs (AMX)
  EXPECT_EQ(forward_pair_dot_tail_start(kTurnedMaxRows + 1, true),  // tiles not turned
            kTurnedMaxRows + 1);
}

// forward_chain (which chain of operations a row's sums get, for the tests' models) reads the
// same rules.
TEST(TilePaths, ForwardChainFollowsTheForwardPath) {
  EXPECT_EQ(forward_chain(3, kDeep, 0, true, true, true), ForwardChain::kPairDots);
  EXPECT_EQ(forward_chain(3, kDeep, 0, true, true, false), ForwardChain::kDot);
  EXPECT_EQ(forward_chain(kPairDotMaxRows, kDeep, kPairDotMaxRows - 1, true, true, true),
            ForwardChain::kPairDots);
  EXPECT_EQ(forward_chain(kPairDotMaxRows + 1, kDeep, 0, true, true, true), ForwardChain::kPairs);
  EXPECT_EQ(forward_chain(33, kDeep, 31, true, true, true), ForwardChain::kPairs);
  EXPECT_EQ(forward_chain(33, kDeep, 32, true, true, true), ForwardChain::kPairDots);
  EXPECT_EQ(forward_chain(33, kDeep, 32, true, true, false), ForwardChain::kPairs);
  EXPECT_EQ(forward_chain(8, kDeep, 0, false, true, true), ForwardChain::kDot);
  EXPECT_EQ(forward_chain(17, kDeep, 0, false, false, false), ForwardChain::kFma);
  EXPECT_EQ(forward_chain(17, kDeep, 16, false, false, false), ForwardChain::kDotTail);
  EXPECT_EQ(forward_chain(200, kDeep, 199, false, false, false), ForwardChain::kFma);
}

TEST(TilePaths, SetCapsReadTheSet) {
  MicroKernels set{};
  EXPECT_FALSE(SetCaps::of(set).pair_tiles);
  set.pair_tile = [](int, int, int64_t, const uint16_t*, int64_t, const uint32_t*, int64_t, float*,
                     int64_t, bool) {};
  const SetCaps caps = SetCaps::of(set);
  EXPECT_TRUE(caps.pair_tiles);
  EXPECT_FALSE(caps.pair_dots);
  EXPECT_FALSE(caps.fp8_dots);
  EXPECT_FALSE(caps.fp8_rows);
  EXPECT_FALSE(caps.pair_rows);
  set.fma_rows_pairs = [](int, int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t,
                          float*, int64_t, const uint16_t*) {};
  EXPECT_TRUE(SetCaps::of(set).pair_rows);
  EXPECT_FALSE(SetCaps::of(set).pair_block);
}

}  // namespace
}  // namespace grouplin::kernels
