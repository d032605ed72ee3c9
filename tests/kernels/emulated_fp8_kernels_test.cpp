// The FP8 kernels of the AVX-512F, AVX512-BF16 and AMX-BF16 sets, emulated and native
// (kernel_set_fixture.hpp): fma_rows_fp8 gives the AVX2 set's bits; the FP8 pair kernels
// (dot_tile_fp8_pairs, fma_rows_fp8_pairs, pair_tile_scaled on codes from decode_fp8_bf16) give
// the bits of their models (pair_dot_models.hpp), emulated and native; whole grouped GEMMs on
// FP8 weights give the dequantized weights' bits or the models', for any tiling.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "bf16_dot_semantics.hpp"
#include "fp8_problem.hpp"
#include "grouplin/dtype.hpp"
#include "kernel_reference.hpp"
#include "kernel_set_fixture.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/packing.hpp"
#include "pair_dot_models.hpp"

namespace grouplin::kernel_test {
namespace {

class Fp8SetTest : public KernelSetTest {};

// A block scale drawn from gen: 1 to 2 (61 steps) times 2^-12 to 2^-4.
float random_scale(std::mt19937& gen) {
  return std::ldexp(1.0f + static_cast<float>(gen() % 61) / 61.0f,
                    static_cast<int>(gen() % 9) - 12);
}

// fma_rows_fp8 (the few-row dgrad of FP8 weights) gives the AVX2 set's bits for 1-5 rows, over
// scale blocks of rows and columns, blocks with and without NaN codes, scales that E4M3's 2^120
// can and cannot be folded into, 16- and 8-column groups and ragged ends, with and without rows
// to prefetch; it writes only its rows' first `cols` columns.
TEST_P(Fp8SetTest, FmaRowsFp8EqualsAvx2Bits) {
  constexpr int64_t kRows = 300, kLd = 304, kLdc = 320;
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kLd));
  std::mt19937 gen(5);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(gen());
  // Random codes hold a NaN code in every block: clear them from blocks (0, 0) and (1, 1).
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t k = 0; k < 256; ++k) {
      uint8_t& c = codes[static_cast<size_t>(r * kLd + k)];
      if ((r < 128) == (k < 128)) c = finite_e4m3(c);
    }
  }
  // Row block 1's scales cannot take 2^120 (x 2^120 overflows).
  const std::vector<float> scales = {0.5f,    0.25f, 2.0f, 0x1p100f, 0.75f,
                                     0x1p99f, 3.0f,  1.5f, 0.125f};
  std::vector<float> scales_clean_middle = scales;
  scales_clean_middle[4] = 1.25f;  // block (1, 1): clean codes, a foldable scale
  for (const std::vector<float>* sc :
       std::vector<const std::vector<float>*>{&scales, &scales_clean_middle}) {
    for (const auto& [row0, depth] :
         {std::pair<int64_t, int64_t>{0, 16}, {2, 13}, {125, 9}, {126, 40}, {130, 16}, {254, 3}}) {
      for (const auto& [col0, cols] : {std::pair<int64_t, int64_t>{0, 45},
                                       {120, 17},
                                       {8, 256},
                                       {0, 128},
                                       {136, 120},
                                       {16, 200},
                                       {128, 96}}) {
        for (int64_t rows = 1; rows <= 5; ++rows) {
          for (bool ahead : {false, true}) {
            const std::vector<float> a = random_floats(static_cast<size_t>(rows * depth), 9);
            std::vector<float> want(static_cast<size_t>(rows * kLdc), 1.5f), got = want;
            kernels::Fp8Operand b{codes.data() + row0 * kLd + col0, kLd, sc->data(), 3, row0, col0};
            if (ahead && row0 + 2 * depth <= kRows) b.ahead = b.codes + depth * kLd;
            avx2_->fma_rows_fp8(rows, depth, a.data(), depth, b, cols, want.data(), kLdc);
            set_->fma_rows_fp8(rows, depth, a.data(), depth, b, cols, got.data(), kLdc);
            ASSERT_TRUE(same_bits(want, got)) << "rows " << rows << " from b row " << row0 << " x "
                                              << depth << ", column " << col0 << " x " << cols;
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t j = cols; j < kLdc; ++j) ASSERT_EQ(got[r * kLdc + j], 1.5f) << cols;
            }
          }
        }
      }
    }
  }
}

// dot_tile_fp8_pairs on BF16 rows and FP8 code rows read in place (their gaps hold NaN, which must
// never be read), every code but NaN, rows whose scales cross a block row, depths around the
// 128-depth blocks and their 32-depth groups: emulated and native, the model's bits; nothing
// outside the call's mr x nr elements is written. A NaN code gives NaN.
TEST_P(Fp8SetTest, DotTileFp8PairsScalesEachBlockSumAndWritesOnlyItsTile) {
  if (set_->dot_tile_fp8_pairs == nullptr) {
    GTEST_SKIP() << "skipped: " << set_->name
                 << " has no FP8 pair dots (FP8 forward decodes to F32 there)";
  }
  constexpr int kCols = 4;
  constexpr int64_t kRow0 = 126;  // rows 126-129: two rows of scale blocks
  for (int64_t kc : {1, 2, 31, 33, 64, 127, 128, 129, 200, 256, 300, 1000}) {
    const int64_t lda = kc + 3, ldb = kc + 5, blocks = (kc + 127) / 128;
    std::vector<uint16_t> a = random_bf16(static_cast<size_t>(kernels::kPairDotRows * lda), 31);
    for (int64_t i = 0; i < kernels::kPairDotRows; ++i) {
      for (int64_t p = kc; p < lda; ++p) a[i * lda + p] = 0x7fc0;  // NaN
    }
    std::vector<uint8_t> codes(static_cast<size_t>(kCols * ldb), 0x7f);  // NaN gaps
    std::mt19937 gen(static_cast<unsigned>(kc));
    for (int64_t j = 0; j < kCols; ++j) {
      for (int64_t p = 0; p < kc; ++p) {
        codes[static_cast<size_t>(j * ldb + p)] =
            finite_e4m3(static_cast<uint8_t>((j * kc + p) * 37 + gen() % 7));
      }
    }
    std::vector<float> scales(static_cast<size_t>(2 * blocks));  // [2 block rows][blocks]
    for (size_t q = 0; q < scales.size(); ++q) {
      scales[q] = random_scale(gen);
    }
    const kernels::Fp8Operand b{codes.data(), ldb,   scales.data() - blocks * (kRow0 / 128),
                                blocks,       kRow0, 0};
    for (int mr = 1; mr <= kernels::kPairDotRows; ++mr) {
      for (int nr = 1; nr <= kCols; ++nr) {
        const int64_t ldc = kCols + 2;
        std::vector<float> c(static_cast<size_t>((kernels::kPairDotRows + 1) * ldc), 7.0f);
        set_->dot_tile_fp8_pairs(mr, nr, kc, a.data(), lda, b, c.data(), ldc);
        for (int64_t i = 0; i <= kernels::kPairDotRows; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const float got = c[static_cast<size_t>(i * ldc + j)];
            if (i >= mr || j >= nr) {
              ASSERT_EQ(got, 7.0f) << "wrote outside at " << i << "," << j;
              continue;
            }
            const float* row_scales = scales.data() + ((kRow0 + j) / 128 - kRow0 / 128) * blocks;
            const float want =
                model_fp8_pair_dots(a.data() + i * lda, codes.data() + j * ldb, row_scales, kc);
            ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                << "kc " << kc << " mr " << mr << " nr " << nr << " at " << i << "," << j << ": "
                << got << " vs " << want;
          }
        }
      }
    }
  }
  std::vector<uint16_t> a(128, f32_to_bf16(1.0f));
  std::vector<uint8_t> codes(128, 0x38);  // 1.0
  codes[77] = 0xff;                       // NaN
  const float scale = 1.0f;
  float c = 0.0f;
  set_->dot_tile_fp8_pairs(1, 1, 128, a.data(), 128, {codes.data(), 128, &scale, 1, 0, 0}, &c, 1);
  EXPECT_TRUE(std::isnan(c)) << c;
}

// fma_rows_fp8_pairs on BF16 rows of dy and FP8 code rows read in place (gaps and the rows past
// the depth hold NaN, which must never be read), depths around the 128-row scale blocks, odd
// depths, column groups of 64 whole or ragged, columns that start mid scale block: emulated and
// native, the model's bits; nothing outside the rows x cols of the call is written. A NaN code
// gives NaN in its column only.
TEST_P(Fp8SetTest, FmaRowsFp8PairsScalesEachBlockSumAndWritesOnlyItsColumns) {
  if (set_->fma_rows_fp8_pairs == nullptr) {
    GTEST_SKIP() << "skipped: " << set_->name
                 << " has no FP8 pair rows (FP8 dgrad decodes to F32 there)";
  }
  constexpr int kRows = kernels::kFp8PairRows;
  for (int64_t depth : {1, 2, 3, 127, 128, 129, 256, 301}) {
    for (int64_t col0 : {0, 112}) {
      for (int64_t cols : {5, 64, 80, 200}) {
        const int64_t ld = col0 + cols + 9, lda = depth + 3, ldc = cols + 2;
        const int64_t scale_ld = (ld + 127) / 128;
        std::mt19937 gen(static_cast<unsigned>(depth * 1000 + col0 + cols));
        std::vector<uint16_t> a = random_bf16(static_cast<size_t>(kRows * lda), depth + cols);
        for (int64_t i = 0; i < kRows; ++i) {
          for (int64_t p = depth; p < lda; ++p) a[i * lda + p] = 0x7fc0;  // NaN
        }
        std::vector<uint8_t> codes(static_cast<size_t>((depth + 1) * ld), 0x7f);  // NaN gaps
        for (int64_t p = 0; p < depth; ++p) {
          for (int64_t j = col0; j < col0 + cols; ++j) {
            codes[static_cast<size_t>(p * ld + j)] = finite_e4m3(static_cast<uint8_t>(gen()));
          }
        }
        std::vector<float> scales(static_cast<size_t>((depth + 127) / 128 * scale_ld));
        for (float& f : scales) {
          f = random_scale(gen);
        }
        const kernels::Fp8Operand b{codes.data() + col0, ld, scales.data(), scale_ld, 0, col0};
        for (int rows = 1; rows <= kRows; ++rows) {
          std::vector<float> c(static_cast<size_t>((kRows + 1) * ldc), 7.0f);
          set_->fma_rows_fp8_pairs(rows, depth, a.data(), lda, b, cols, c.data(), ldc);
          for (int64_t i = 0; i <= kRows; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const float got = c[static_cast<size_t>(i * ldc + j)];
              if (i >= rows || j >= cols) {
                ASSERT_EQ(got, 7.0f) << "wrote outside at " << i << "," << j;
                continue;
              }
              const float want =
                  model_fp8_pair_rows(a.data() + i * lda, codes.data() + col0 + j, ld,
                                      scales.data() + (col0 + j) / 128, scale_ld, depth);
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << "depth " << depth << " col0 " << col0 << " cols " << cols << " rows " << rows
                  << " at " << i << "," << j << ": " << got << " vs " << want;
            }
          }
        }
      }
    }
  }
  std::vector<uint16_t> a(130, f32_to_bf16(1.0f));
  std::vector<uint8_t> codes(130 * 64, 0x38);  // 1.0
  codes[129 * 64 + 21] = 0xff;                 // NaN, in the second depth block
  const float scales[2] = {1.0f, 1.0f};
  std::vector<float> c(64);
  set_->fma_rows_fp8_pairs(1, 130, a.data(), 130, {codes.data(), 64, scales, 1, 0, 0}, 64, c.data(),
                           64);
  for (int j = 0; j < 64; ++j) {
    if (j == 21) {
      EXPECT_TRUE(std::isnan(c[j])) << c[j];
    } else {
      EXPECT_EQ(c[j], 130.0f) << j;
    }
  }
}

// pair_tile_scaled on A read in place (its row gaps hold NaN, which must never be read) and B
// packed from BF16 columns, scales by row and by column, from +0 and accumulating, every row and
// strip count, depths around the 128-depth blocks: emulated and native, the model's bits
// (model_scaled_pairs); nothing outside the call's rows and strips is written.
TEST_P(Fp8SetTest, PairTileScaledScalesEachBlockAndWritesOnlyItsTile) {
  if (set_->pair_tile_scaled == nullptr) {
    GTEST_SKIP() << "skipped: " << set_->name << " has no scaled pair tiles (FP8 decodes to F32)";
  }
  const int rows = set_->pair_rows;
  const int64_t cols = 16 * set_->pair_strips, ld = cols + 5;
  for (int64_t kc : {1, 2, 63, 127, 128, 129, 256}) {
    const int64_t lda = kc + 3, blocks = (kc + 127) / 128;
    std::vector<uint16_t> a = random_bf16(static_cast<size_t>(rows * lda), kc);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t p = kc; p < lda; ++p) a[i * lda + p] = 0x7fc0;  // NaN
    }
    const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(cols * kc), kc + 1);
    std::vector<uint32_t> panels(
        static_cast<size_t>(set_->pair_strips * kernels::pair_panel_dwords(kc)));
    kernels::pack_pairs_transposed({reinterpret_cast<const std::byte*>(w.data()), DType::BF16, kc},
                                   0, kc, 0, cols, panels.data());
    std::mt19937 gen(static_cast<unsigned>(kc));
    std::vector<float> scales(static_cast<size_t>(blocks * ld));
    for (float& f : scales) {
      f = random_scale(gen);
    }
    const std::vector<float> start = random_floats(static_cast<size_t>((rows + 1) * ld), kc + 2);
    for (bool per_row : {false, true}) {
      for (bool accumulate : {false, true}) {
        for (int mr : {1, 4, rows}) {
          for (int strips = 1; strips <= set_->pair_strips; ++strips) {
            std::vector<float> c = start;
            set_->pair_tile_scaled(mr, strips, kc, a.data(), lda, panels.data(),
                                   kernels::pair_panel_dwords(kc), scales.data(), ld, per_row,
                                   c.data(), ld, accumulate);
            for (int64_t i = 0; i <= rows; ++i) {
              for (int64_t j = 0; j < ld; ++j) {
                const auto at = static_cast<size_t>(i * ld + j);
                if (i >= mr || j >= 16 * strips) {
                  ASSERT_EQ(c[at], start[at]) << "wrote outside at " << i << "," << j;
                  continue;
                }
                const float want = model_scaled_pairs(
                    a.data() + i * lda, w.data() + j * kc, kc, accumulate ? start[at] : 0.0f,
                    [&](int64_t q) {
                      return scales[static_cast<size_t>(q * ld + (per_row ? i : j))];
                    });
                ASSERT_EQ(std::bit_cast<uint32_t>(c[at]), std::bit_cast<uint32_t>(want))
                    << "kc " << kc << " per_row " << per_row << " accumulate " << accumulate
                    << " mr " << mr << " strips " << strips << " at " << i << "," << j << ": "
                    << c[at] << " vs " << want;
              }
            }
          }
        }
      }
    }
  }
}

// decode_fp8_bf16: every code, at every offset of a 4-byte step, lengths around its 64-code
// steps, gives the code's BF16 value, and nothing past n is written.
TEST_P(Fp8SetTest, DecodeFp8Bf16GivesEachCodesBf16Value) {
  if (set_->decode_fp8_bf16 == nullptr) {
    GTEST_SKIP() << "skipped: " << set_->name << " has no FP8 pair kernels";
  }
  std::vector<uint8_t> codes(256 + 3);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 + 11);
  for (int64_t offset = 0; offset < 4; ++offset) {
    for (int64_t n : {1, 63, 64, 65, 130, 256}) {
      std::vector<uint16_t> got(static_cast<size_t>(n + 1), 0xdead);
      set_->decode_fp8_bf16(codes.data() + offset, got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t code = codes[static_cast<size_t>(offset + i)];
        ASSERT_EQ(got[static_cast<size_t>(i)], f32_to_bf16(f8e4m3_to_f32(code)))
            << "code " << int{code} << " n " << n;
      }
      ASSERT_EQ(got[static_cast<size_t>(n)], 0xdead) << "wrote past n " << n;
    }
  }
}

// FP8 weights, decoded where the set's kernels read them (packing.hpp): forward and dgrad give
// the bits of F32 weights holding the dequantized values, on the set's own F32 paths, and its
// decoding micro-kernel gives code x scale.
TEST_P(Fp8SetTest, Fp8WeightsGiveTheDequantizedWeightsBits) {
  kernels::force_kernels(&*set_);
  for (const Case& c : fp8_cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      Fp8Problem p(c, dt);
      p.expect_dequantized_bits(c, c.name + " " + std::string(dtype_name(dt)));
      // Tiles off every grid (7 x 40 from any row and column) and on the kernels' (12 x 48).
      if (dt == DType::BF16) p.expect_same_bits_by_tiles(c, {{7, 48, 1, 16}, {12, 48, 6, 16}});
    }
  }
  std::vector<uint8_t> codes(256);
  std::vector<float> got(256);
  for (size_t i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  set_->decode_e4m3(codes.data(), 0.375f, got.data(), 256);
  for (size_t i = 0; i < 256; ++i) {
    const float want = f8e4m3_to_f32(codes[i]) * 0.375f;
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want)) << "code " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, Fp8SetTest, ::testing::ValuesIn(sets_under_test()), set_name);

}  // namespace
}  // namespace grouplin::kernel_test
