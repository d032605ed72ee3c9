// The AVX-512F, AVX512-BF16 and AMX-BF16 kernel sets, each twice: compiled against emulated
// intrinsics (x86_emulation.hpp: SIMDe, an SDM-exact vdpbf16ps, a scalar tile emulator) and
// natively (kernel_set_fixture.hpp). Their FP8 kernels: emulated_fp8_kernels_test.cpp.
//
// Checked per set: the streaming stores write exactly their bytes; the F32 arithmetic gives the
// AVX2 set's bits (micro-kernels and whole grouped GEMMs); the pair kernels (BF16 x BF16) give,
// emulated, the bits of a scalar model of their documented chains, and, natively, results within
// the reference's tolerance; every operation within tolerance of the double-precision reference on
// the edge cases (empty experts, one expert with every row, T = 0, ragged tiles and depth blocks);
// the same bits for 1 and 3 threads, for separate and stacked weights, and for coarse and fine
// tilings. Shapes are small: the sanitizer build runs these at -O1, where each emulated instruction
// is a call.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "amx_emulator.hpp"
#include "bf16_dot_semantics.hpp"
#include "gemm_problem.hpp"
#include "grouplin/dtype.hpp"
#include "kernel_reference.hpp"
#include "kernel_set_fixture.hpp"
#include "kernels/grouped_gemm.hpp"
#include "kernels/isa.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/micro_kernels_x86.hpp"
#include "kernels/packing.hpp"
#include "kernels/thread_pool.hpp"
#include "kernels/tile_compute.hpp"
#include "pair_dot_models.hpp"

namespace grouplin::kernel_test {
namespace {

using kernels::kOuterCols;
using kernels::kOuterDepth;
using kernels::kOuterRows;

// ---- Micro-kernels ----

// The set's streaming stores (weight gradients, and zeros for experts without rows) write exactly
// the values and bytes asked for, at every alignment: the 64-byte stores of the AVX-512 sets
// under emulation are plain ones, so this checks their loops' heads, bodies and tails.
TEST_P(KernelSetTest, StreamStoresWriteExactlyTheirBytes) {
  const std::vector<float> v = random_floats(200, 5);
  for (int64_t offset : {0, 1, 3, 16, 17}) {
    for (int64_t n : {0, 1, 15, 16, 17, 47, 100, 183}) {
      alignas(64) float want[256], got[256];
      std::fill(std::begin(want), std::end(want), -3.0f);
      std::fill(std::begin(got), std::end(got), -3.0f);
      std::copy_n(v.data(), n, want + offset);
      set_->stream_f32(v.data(), got + offset, n);
      EXPECT_EQ(std::memcmp(want, got, sizeof want), 0) << "stream_f32 " << offset << " " << n;
      std::byte* bytes = reinterpret_cast<std::byte*>(got);
      std::memset(want, 0x5A, sizeof want);
      std::memset(got, 0x5A, sizeof got);
      std::memset(reinterpret_cast<std::byte*>(want) + 2 * offset + 1, 0, 4 * n + 1);
      set_->stream_zeros(bytes + 2 * offset + 1, 4 * n + 1);
      EXPECT_EQ(std::memcmp(want, got, sizeof want), 0) << "stream_zeros " << offset << " " << n;
    }
  }
}

// outer_strips and outer_tile give the AVX2 set's bits for every row count, strip count, B dtype,
// A packed or read in place, and start; they write only their own rows and columns.
TEST_P(KernelSetTest, OuterProductTilesEqualAvx2Bits) {
  const int64_t ldb = 4 * kOuterCols + 5, ldc = 4 * kOuterCols + 3;
  for (int64_t kc : {1, 7, 29}) {
    const std::vector<float> a = random_floats(static_cast<size_t>(kOuterRows * kc), 1);
    std::vector<float> ap(static_cast<size_t>(kc * kOuterRows));
    for (int64_t p = 0; p < kc; ++p) {
      for (int i = 0; i < kOuterRows; ++i) ap[p * kOuterRows + i] = a[i * kc + p];
    }
    const std::vector<float> b = random_floats(static_cast<size_t>(kc * ldb), 2);
    std::vector<uint16_t> half(b.size());
    for (size_t i = 0; i < b.size(); ++i) half[i] = f32_to_bf16(b[i]);
    for (bool bf16 : {false, true}) {
      const void* b_ptr = bf16 ? static_cast<const void*>(half.data()) : b.data();
      for (bool packed : {false, true}) {
        const float* a_ptr = packed ? ap.data() : a.data();
        const int64_t a_row = packed ? 1 : kc, a_step = packed ? kOuterRows : 1;
        for (int mr = 1; mr <= kOuterRows; ++mr) {
          for (int strips = 1; strips <= set_->max_strips; ++strips) {
            for (bool accumulate : {false, true}) {
              std::vector<float> want((kOuterRows + 1) * ldc, 0.5f), got = want;
              avx2_->for_b(bf16).outer_strips(mr, strips, kc, a_ptr, a_row, a_step, b_ptr, ldb,
                                              kOuterCols, want.data(), ldc, accumulate);
              set_->for_b(bf16).outer_strips(mr, strips, kc, a_ptr, a_row, a_step, b_ptr, ldb,
                                             kOuterCols, got.data(), ldc, accumulate);
              ASSERT_TRUE(same_bits(want, got)) << "kc " << kc << " bf16 " << bf16 << " packed "
                                                << packed << " mr " << mr << " strips " << strips;
              for (int64_t i = 0; i <= kOuterRows; ++i) {
                for (int64_t j = 0; j < ldc; ++j) {
                  if (i < mr && j < strips * kOuterCols) continue;
                  ASSERT_EQ(got[i * ldc + j], 0.5f) << "wrote outside at " << i << "," << j;
                }
              }
            }
          }
          // 8 columns: the broadcast path's last panel.
          std::vector<float> want(kOuterRows * kOuterCols, 0.25f), got = want;
          avx2_->for_b(bf16).outer_tile(mr, 8, kc, a_ptr, a_row, a_step, b_ptr, ldb, want.data(),
                                        kOuterCols, true);
          set_->for_b(bf16).outer_tile(mr, 8, kc, a_ptr, a_row, a_step, b_ptr, ldb, got.data(),
                                       kOuterCols, true);
          ASSERT_TRUE(same_bits(want, got)) << "8 columns, mr " << mr;
          for (int j = 8; j < kOuterCols; ++j) ASSERT_EQ(got[j], 0.25f);
        }
      }
    }
  }
}

// fma_rows: the AVX2 set's bits for ragged widths (masked tails) and both loop orders, F32 and
// BF16 B, and nothing written past `cols`.
TEST_P(KernelSetTest, FmaRowsEqualAvx2BitsAndWriteOnlyTheirColumns) {
  const int64_t ld = 131;
  for (int64_t cols : {1, 15, 16, 17, 63, 64, 65, 100}) {
    for (int64_t rows : {1, 3, 8}) {
      // Depths past the rows take dgrad's order (several weight rows per pass over c from 2 rows
      // of c: 19 = 2 passes of 8 and 3 single rows), the others wgrad's.
      for (int64_t depth : {2, 5, 19}) {
        const std::vector<float> a = random_floats(static_cast<size_t>(rows * depth), 3);
        const std::vector<float> b = random_floats(static_cast<size_t>(depth * ld), 4);
        std::vector<uint16_t> half(b.size());
        for (size_t i = 0; i < b.size(); ++i) half[i] = f32_to_bf16(b[i]);
        for (bool bf16 : {false, true}) {
          std::vector<float> want(static_cast<size_t>(rows * ld), 9.0f), got = want;
          const void* b_ptr = bf16 ? static_cast<const void*>(half.data()) : b.data();
          avx2_->for_b(bf16).fma_rows(rows, depth, a.data(), depth, b_ptr, ld, cols, want.data(),
                                      ld);
          set_->for_b(bf16).fma_rows(rows, depth, a.data(), depth, b_ptr, ld, cols, got.data(), ld);
          ASSERT_TRUE(same_bits(want, got))
              << "cols " << cols << " rows " << rows << " depth " << depth << " bf16 " << bf16;
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = cols; j < ld; ++j) ASSERT_EQ(got[r * ld + j], 9.0f) << cols;
          }
        }
      }
    }
  }
}

// The documented chain of one pair_tile element: A row a (value p at a[p * a_step]), B column b
// (value p at b[p * b_step]), n values each, from +0. AVX512-BF16: one vdpbf16ps per pair in
// order; AMX: per 32 depths, the even and the odd products summed apart, then added to the
// running sum (x86_emulation.hpp).
float model_pairs(Level level, const uint16_t* a, int64_t a_step, const uint16_t* b, int64_t b_step,
                  int64_t n) {
  using kernels::emulated::bf16_value;
  using kernels::emulated::flush_denormal;
  const auto at = [](const uint16_t* v, int64_t step, int64_t i, int64_t n_) -> uint16_t {
    return i < n_ ? v[i * step] : uint16_t{0};
  };
  float acc = 0.0f;
  if (level == Level::kAvx512Bf16) {
    for (int64_t q = 0; 2 * q < n; ++q) {
      const uint32_t ap = at(a, a_step, 2 * q, n) | uint32_t{at(a, a_step, 2 * q + 1, n)} << 16;
      const uint32_t bp = at(b, b_step, 2 * q, n) | uint32_t{at(b, b_step, 2 * q + 1, n)} << 16;
      acc = kernels::emulated::dpbf16_lane(acc, ap, bp);
    }
    return acc;
  }
  for (int64_t g = 0; 32 * g < n; ++g) {
    float even = 0.0f, odd = 0.0f;
    for (int64_t q = 16 * g; q < 16 * g + 16; ++q) {
      even = flush_denormal(
          std::fma(bf16_value(at(a, a_step, 2 * q, n)), bf16_value(at(b, b_step, 2 * q, n)), even));
      odd = flush_denormal(std::fma(bf16_value(at(a, a_step, 2 * q + 1, n)),
                                    bf16_value(at(b, b_step, 2 * q + 1, n)), odd));
    }
    acc = flush_denormal(acc + flush_denormal(even + odd));
  }
  return acc;
}

// dot_tile_wide on x's 5-8 rows interleaved by interleave_dot_rows, against the AVX2 set's dot
// tile on the same rows four at a time: the same bits for every row count, every width and depths
// around its steps of 8 (the rows' and B's gaps hold NaN, which must never be read); only the
// call's mr x nr elements of c change, each by one addition.
TEST_P(KernelSetTest, DotTileWideGivesDotTileBitsAndWritesOnlyItsTile) {
  if (set_->f32.dot_tile_wide == nullptr) {
    GTEST_SKIP() << "skipped: " << set_->name << " runs 5-8 rows on dot tiles of 4";
  }
  using kernels::kDotCols;
  using kernels::kDotRows;
  using kernels::kDotWideRows;
  for (int64_t kc : {0, 1, 7, 8, 9, 15, 16, 17, 31, 100, 1001}) {
    const int64_t lda = kc + 3, ldb = kc + 5, ldc = kDotCols + 2;
    std::vector<float> a = random_floats(static_cast<size_t>(kDotWideRows * lda), 31);
    std::vector<float> b = random_floats(static_cast<size_t>(kDotCols * ldb), 32);
    for (int64_t i = 0; i < kDotWideRows; ++i) {
      for (int64_t p = kc; p < lda; ++p) a[i * lda + p] = std::nanf("");
    }
    for (int64_t j = 0; j < kDotCols; ++j) {
      for (int64_t p = kc; p < ldb; ++p) b[j * ldb + p] = std::nanf("");
    }
    std::vector<float> xi(static_cast<size_t>(kernels::dot_wide_floats(kDotWideRows, kc)) + 16);
    float* aligned = xi.data() + (16 - reinterpret_cast<uintptr_t>(xi.data()) / 4 % 16) % 16;
    const std::vector<float> start =
        random_floats(static_cast<size_t>((kDotWideRows + 1) * ldc), 33);
    for (int mr = kernels::kDotWideMinRows; mr <= kDotWideRows; ++mr) {
      kernels::interleave_dot_rows(a.data(), lda, mr, kc, aligned);
      for (int nr = 1; nr <= kDotCols; ++nr) {
        std::vector<float> want = start, got = start;
        for (int i = 0; i < mr; i += kDotRows) {
          avx2_->f32.dot_tile(std::min(kDotRows, mr - i), nr, kc, a.data() + i * lda, lda, b.data(),
                              ldb, want.data() + i * ldc, ldc, nullptr);
        }
        set_->f32.dot_tile_wide(mr, nr, kc, aligned, b.data(), ldb, got.data(), ldc, b.data());
        ASSERT_TRUE(same_bits(want, got)) << "kc " << kc << " mr " << mr << " nr " << nr;
        for (int64_t i = 0; i <= kDotWideRows; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            if (i < mr && j < nr) continue;
            ASSERT_EQ(std::bit_cast<uint32_t>(got[i * ldc + j]),
                      std::bit_cast<uint32_t>(start[i * ldc + j]))
                << "wrote outside at " << i << "," << j;
          }
        }
      }
    }
  }
}

// dot_tile_pairs on rows of a and w read in place (their gaps hold NaN, which must never be
// read), for every row count it takes and depths around its blocks of 32 (odd ones included):
// emulated and native, the model's bits (the lane chains and the tree are all the instructions
// do); nothing outside the call's mr x nr elements is written.
TEST_P(KernelSetTest, DotTilePairsFollowsItsLaneChainsAndWritesOnlyItsTile) {
  if (set_->dot_tile_pairs == nullptr) {
    GTEST_SKIP() << "skipped: " << set_->name << " keeps experts of few rows on dot tiles";
  }
  constexpr int kCols = 5;
  for (int64_t kc : {1, 2, 31, 32, 33, 64, 65, 96, 127, 128, 129, 160, 161, 200, 1000}) {
    const int64_t lda = kc + 3, ldw = kc + 5;
    std::vector<uint16_t> a = random_bf16(static_cast<size_t>(kernels::kPairDotCallRows * lda), 21);
    std::vector<uint16_t> w = random_bf16(static_cast<size_t>(kCols * ldw), 22);
    for (int64_t i = 0; i < kernels::kPairDotCallRows; ++i) {
      for (int64_t p = kc; p < lda; ++p) a[i * lda + p] = 0x7fc0;  // NaN
    }
    for (int64_t j = 0; j < kCols; ++j) {
      for (int64_t p = kc; p < ldw; ++p) w[j * ldw + p] = 0x7fc0;
    }
    for (int mr = 1; mr <= kernels::kPairDotCallRows; ++mr) {
      for (int nr = 1; nr <= kCols; ++nr) {
        const int64_t ldc = kCols + 2;
        std::vector<float> c(static_cast<size_t>((kernels::kPairDotCallRows + 1) * ldc), 7.0f);
        set_->dot_tile_pairs(mr, nr, kc, a.data(), lda, w.data(), ldw, c.data(), ldc);
        for (int64_t i = 0; i <= kernels::kPairDotCallRows; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const float got = c[i * ldc + j];
            if (i >= mr || j >= nr) {
              ASSERT_EQ(got, 7.0f) << "wrote outside at " << i << "," << j;
              continue;
            }
            const float want = model_pair_dots(a.data() + i * lda, w.data() + j * ldw, kc);
            ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                << "kc " << kc << " mr " << mr << " nr " << nr << " at " << i << "," << j << ": "
                << got << " vs " << want;
          }
        }
      }
    }
  }
}

// pair_tile on A read in place (its row gaps hold NaN, which must never be read) and B packed by
// pack_pairs_transposed, for every row and strip count the set takes and ragged depths: emulated,
// the model's bits; native, within the F32 tolerance of the exact sum. Nothing outside the rows
// and strips of the call is written. pair_tile_half, where the set has it, likewise with its last
// strip's first 8 columns only, each the bits of pair_tile's.
TEST_P(KernelSetTest, PairTileFollowsItsChainAndWritesOnlyItsTile) {
  if (!has_pairs()) {
    EXPECT_EQ(set_->pair_rows, 0);
    GTEST_SKIP() << "skipped: " << set_->name << " has no pair kernels (BF16 is widened to F32)";
  }
  const int64_t cols = 16 * set_->pair_strips;
  for (int64_t kc : {1, 2, 31, 32, 33, 69}) {
    const int64_t lda = kc + 3;
    std::vector<uint16_t> a = random_bf16(static_cast<size_t>(set_->pair_rows * lda), 5);
    for (int64_t i = 0; i < set_->pair_rows; ++i) {
      for (int64_t p = kc; p < lda; ++p) a[i * lda + p] = 0x7fc0;  // NaN
    }
    const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(cols * kc), 6);  // [cols][kc]
    std::vector<uint32_t> panels(
        static_cast<size_t>(set_->pair_strips * kernels::pair_panel_dwords(kc)));
    kernels::pack_pairs_transposed({reinterpret_cast<const std::byte*>(w.data()), DType::BF16, kc},
                                   0, kc, 0, cols, panels.data());
    for (int mr : {1, 5, set_->pair_rows / 2 + 1, set_->pair_rows}) {
      for (int strips = 1; strips <= set_->pair_strips; ++strips) {
        for (bool half : {false, true}) {
          if (half && set_->pair_tile_half == nullptr) continue;
          const int64_t ldc = cols + 3, width = 16 * strips - (half ? 8 : 0);
          std::vector<float> c(static_cast<size_t>((set_->pair_rows + 1) * ldc), 7.0f), whole = c;
          (half ? set_->pair_tile_half : set_->pair_tile)(
              mr, strips, kc, a.data(), lda, panels.data(), kernels::pair_panel_dwords(kc),
              c.data(), ldc, false);
          set_->pair_tile(mr, strips, kc, a.data(), lda, panels.data(),
                          kernels::pair_panel_dwords(kc), whole.data(), ldc, false);
          for (int64_t i = 0; i <= set_->pair_rows; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              const float got = c[i * ldc + j];
              if (i >= mr || j >= width) {
                ASSERT_EQ(got, 7.0f) << "wrote outside at " << i << "," << j << " half " << half;
                continue;
              }
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(whole[i * ldc + j]))
                  << "pair_tile_half against pair_tile: kc " << kc << " mr " << mr << " strips "
                  << strips << " at " << i << "," << j;
              const float want =
                  model_pairs(GetParam().level, a.data() + i * lda, 1, w.data() + j * kc, 1, kc);
              if (!GetParam().native) {
                ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                    << "kc " << kc << " mr " << mr << " strips " << strips << " at " << i << ","
                    << j << ": " << got << " vs " << want;
              } else {
                double exact = 0, scale = 0;
                for (int64_t p = 0; p < kc; ++p) {
                  const double t =
                      static_cast<double>(bf16_to_f32(a[i * lda + p])) * bf16_to_f32(w[j * kc + p]);
                  exact += t;
                  scale += std::abs(t);
                }
                ASSERT_LE(std::abs(got - exact), 2.0 * (kc + 1) * std::ldexp(1.0, -24) * scale)
                    << "kc " << kc << " at " << i << "," << j;
              }
            }
          }
        }
      }
    }
  }
}

// fma_rows_pairs on rows of dy and weight rows read in place (the gaps between them and the rows
// past the depth hold NaN, which must never be read), rows in one, two and three groups, depths
// around its blocks (odd ones included), column groups whole and ragged: emulated and native, the
// bits of pair_tile on the same weights packed into pair panels (the chain it shares with the pair
// tiles) and, emulated, of the scalar model of that chain; nothing outside the call's rows x cols
// is written. A NaN weight gives NaN in its column only.
TEST_P(KernelSetTest, FmaRowsPairsGivesPairTileBitsAndWritesOnlyItsColumns) {
  if (set_->fma_rows_pairs == nullptr) {
    GTEST_SKIP() << "skipped: " << set_->name << " has no pair rows (BF16 dgrad of a few rows "
                 << "runs on pair tiles or widened)";
  }
  constexpr int kRows = 17;  // groups of 8 rows: one, two and three of them
  for (int64_t depth : {1, 2, 3, 127, 128, 129, 257, 301}) {
    for (int64_t cols : {5, 32, 33, 64, 80, 200}) {
      const int64_t ldw = cols + 9, lda = depth + 3, ldc = cols + 2;
      std::vector<uint16_t> a = random_bf16(static_cast<size_t>(kRows * lda), depth + cols);
      for (int64_t i = 0; i < kRows; ++i) {
        for (int64_t p = depth; p < lda; ++p) a[i * lda + p] = 0x7fc0;  // NaN
      }
      std::vector<uint16_t> w = random_bf16(static_cast<size_t>((depth + 1) * ldw), depth * cols);
      for (int64_t p = 0; p <= depth; ++p) {
        for (int64_t j = p < depth ? cols : 0; j < ldw; ++j) w[p * ldw + j] = 0x7fc0;
      }
      const int64_t strips = (cols + kOuterCols - 1) / kOuterCols;
      std::vector<uint32_t> panels(static_cast<size_t>(strips * kernels::pair_panel_dwords(depth)));
      kernels::pack_pairs_rows({reinterpret_cast<const std::byte*>(w.data()), DType::BF16, ldw}, 0,
                               depth, 0, cols, panels.data());
      for (int rows : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, kRows}) {
        const int64_t ldt = 16 * strips;
        std::vector<float> tiles(static_cast<size_t>(rows * ldt));
        for (int64_t s = 0; s < strips; s += set_->pair_strips) {
          const int ns = static_cast<int>(std::min<int64_t>(set_->pair_strips, strips - s));
          for (int i = 0; i < rows; i += set_->pair_rows) {
            set_->pair_tile(std::min(set_->pair_rows, rows - i), ns, depth, a.data() + i * lda, lda,
                            panels.data() + s * kernels::pair_panel_dwords(depth),
                            kernels::pair_panel_dwords(depth), tiles.data() + i * ldt + 16 * s, ldt,
                            false);
          }
        }
        std::vector<float> c(static_cast<size_t>((kRows + 1) * ldc), 7.0f);
        set_->fma_rows_pairs(rows, depth, a.data(), lda, w.data(), ldw, cols, c.data(), ldc,
                             rows == 3 ? w.data() : nullptr);
        for (int64_t i = 0; i <= kRows; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const float got = c[static_cast<size_t>(i * ldc + j)];
            if (i >= rows || j >= cols) {
              ASSERT_EQ(got, 7.0f) << "wrote outside at " << i << "," << j;
              continue;
            }
            const float tile = tiles[static_cast<size_t>(i * ldt + j)];
            ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(tile))
                << "depth " << depth << " cols " << cols << " rows " << rows << " at " << i << ","
                << j << ": " << got << " vs pair_tile " << tile;
            if (!GetParam().native) {
              const float want =
                  model_pairs(GetParam().level, a.data() + i * lda, 1, w.data() + j, ldw, depth);
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << "depth " << depth << " cols " << cols << " rows " << rows << " at " << i << ","
                  << j << ": " << got << " vs " << want;
            }
          }
        }
      }
    }
  }
  std::vector<uint16_t> a(130, f32_to_bf16(1.0f));
  std::vector<uint16_t> w(130 * 64, f32_to_bf16(1.0f));
  w[129 * 64 + 21] = 0x7fc0;  // NaN, in the second depth block
  std::vector<float> c(64);
  set_->fma_rows_pairs(1, 130, a.data(), 130, w.data(), 64, 64, c.data(), 64, nullptr);
  for (int j = 0; j < 64; ++j) {
    if (j == 21) {
      EXPECT_TRUE(std::isnan(c[j])) << c[j];
    } else {
      EXPECT_EQ(c[j], 130.0f) << j;
    }
  }
}

// ---- Whole grouped GEMMs ----

std::vector<Case> cases() {
  return {
      // Ragged everything, an empty expert in the middle.
      {"odd_sizes", 37, 29, {5, 0, 7, 13, 1}, true},
      // Depth past one block of 256 with an odd remainder (forward 265, dgrad 259), 16 full
      // strips + 3 columns, experts on every forward path (dot tiles up to 8 rows, broadcast
      // with dot tails of 2 and 5 rows and a 10-row last panel, packed from 97; BF16 pairs from
      // 4 rows) and dgrad path (direct up to 4 rows, in place, and F32 weights up to 8 on the
      // AVX-512 sets, in scratch; packed from 65).
      {"blocks", kOuterDepth + 9, kOuterDepth + 3, {4, 5, 8, 9, 0, 2, 18, 21, 26, 97}, false},
      // Every row to one expert.
      {"all_to_one", 33, 70, {0, 0, 50, 0}, true},
      // One expert larger than all others together: wgrad depth past one block.
      {"one_giant", 40, 24, {1, kOuterDepth + 37, 2, 0, 5}, true},
      // T = 0.
      {"no_rows", 16, 8, {0, 0, 0}, true},
  };
}

TEST_P(KernelSetTest, GroupedGemmMatchesReferenceOnEdgeCases) {
  kernels::force_kernels(&*set_);
  for (const Case& c : cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
      Problem p(c, dt, false);
      p.run(c);
      EXPECT_TRUE(close_to(p.y, ref_forward(p.x, c.splits, p.weights, p.biases, c.out)));
      EXPECT_TRUE(close_to(p.dx, ref_dgrad(p.dy, c.splits, p.weights, c.in)));
      for (size_t e = 0; e < c.splits.size(); ++e) {
        EXPECT_TRUE(close_to(p.wgrads[e], ref_wgrad(p.x, p.dy, c.splits, e))) << "wgrad " << e;
        EXPECT_TRUE(close_to(p.bgrads[e], ref_bgrad(p.dy, c.splits, e))) << "bgrad " << e;
        if (c.splits[e] == 0) {
          EXPECT_TRUE(p.wgrads[e].bit_equal(Tensor::zeros({c.out, c.in}, dt))) << e;
          EXPECT_TRUE(p.bgrads[e].bit_equal(Tensor::zeros({c.out}, dt))) << e;
        }
      }
    }
  }
}

// F32 everywhere, and BF16 wherever the set widens (every operation without pair kernels; bgrad
// always): the AVX2 set's bits. Where BF16 runs on pair kernels, the emulated set gives the
// model's bits, element by element (forward rows, dgrad rows and weight gradients of the experts
// on that path).
TEST_P(KernelSetTest, GroupedGemmGivesAvx2BitsOrItsPairChain) {
  for (const Case& c : cases()) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
      kernels::force_kernels(avx2_);
      Problem want(c, dt, false);
      want.run(c);
      kernels::force_kernels(&*set_);
      Problem got(c, dt, false);
      got.run(c);
      const bool pairs = dt == DType::BF16 && has_pairs();
      const std::vector<int64_t> first = first_rows(c.splits);
      for (size_t e = 0; e < c.splits.size(); ++e) {
        EXPECT_TRUE(want.bgrads[e].bit_equal(got.bgrads[e])) << "bgrad " << e;
        if (!kernels::wgrad_pairs(c.splits[e], pairs, pairs)) {
          EXPECT_TRUE(want.wgrads[e].bit_equal(got.wgrads[e])) << "wgrad " << e;
          continue;
        }
        if (GetParam().native) continue;
        // dW(o, k): column o of dy against column k of x, over the expert's rows.
        const auto* g = reinterpret_cast<const uint16_t*>(got.dy.data()) + first[e] * c.out;
        const auto* x = reinterpret_cast<const uint16_t*>(got.x.data()) + first[e] * c.in;
        const auto* dw = reinterpret_cast<const uint16_t*>(got.wgrads[e].data());
        for (int64_t o = 0; o < c.out; ++o) {
          for (int64_t k = 0; k < c.in; ++k) {
            const float v = model_pairs(GetParam().level, g + o, c.out, x + k, c.in, c.splits[e]);
            ASSERT_EQ(f32_to_bf16(v), dw[o * c.in + k]) << "wgrad " << e << " at " << o << "," << k;
          }
        }
      }
      for (size_t e = 0; e < c.splits.size(); ++e) {
        const int64_t m = c.splits[e];
        const bool few = pairs && set_->dot_tile_pairs != nullptr;
        const bool fwd_pairs = kernels::forward_pairs(m, pairs, pairs, few);
        const bool dgrad_pairs = kernels::dgrad_pairs(m, pairs, pairs);
        for (int64_t r = first[e]; r < first[e] + m; ++r) {
          const bool fwd_dots = kernels::forward_chain(m, c.in, r - first[e], pairs, pairs, few) ==
                                kernels::ForwardChain::kPairDots;
          if (!fwd_pairs) {
            EXPECT_TRUE(want.y.select(r).bit_equal(got.y.select(r))) << "forward row " << r;
          }
          if (!dgrad_pairs) {
            EXPECT_TRUE(want.dx.select(r).bit_equal(got.dx.select(r))) << "dgrad row " << r;
          }
          if (GetParam().native || (!fwd_pairs && !dgrad_pairs)) continue;
          const auto* x = reinterpret_cast<const uint16_t*>(got.x.data()) + r * c.in;
          const auto* w = reinterpret_cast<const uint16_t*>(got.weights[e].data());
          const auto* y = reinterpret_cast<const uint16_t*>(got.y.data()) + r * c.out;
          const auto* g = reinterpret_cast<const uint16_t*>(got.dy.data()) + r * c.out;
          const auto* dx = reinterpret_cast<const uint16_t*>(got.dx.data()) + r * c.in;
          for (int64_t o = 0; fwd_pairs && o < c.out; ++o) {
            float v = fwd_dots ? model_pair_dots(x, w + o * c.in, c.in)
                               : model_pairs(GetParam().level, x, 1, w + o * c.in, 1, c.in);
            if (c.bias)
              v += bf16_to_f32(reinterpret_cast<const uint16_t*>(got.biases[e].data())[o]);
            ASSERT_EQ(f32_to_bf16(v), y[o]) << "forward row " << r << " col " << o;
          }
          for (int64_t k = 0; dgrad_pairs && k < c.in; ++k) {
            const float v = model_pairs(GetParam().level, g, 1, w + k, c.in, c.out);
            ASSERT_EQ(f32_to_bf16(v), dx[k]) << "dgrad row " << r << " col " << k;
          }
        }
      }
    }
  }
}

// The set's results depend only on the values, shapes and m_splits: 1 or 3 threads, separate or
// stacked weights, and coarse or fine tilings give the same bits.
TEST_P(KernelSetTest, SameBitsForThreadsLayoutsAndTilings) {
  kernels::force_kernels(&*set_);
  for (const Case& c : cases()) {
    // The cases that reach every path (three runs each take 7 s per set at -O1 with ASan).
    if (c.name != "odd_sizes" && c.name != "blocks" && c.name != "no_rows") continue;
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dt)));
      kernels::set_num_threads(1);
      Problem one(c, dt, false);
      one.run(c);
      kernels::set_num_threads(3);
      Problem three(c, dt, false), stacked(c, dt, true);
      three.run(c);
      stacked.run(c);
      expect_bit_equal(one, three, "3 threads");
      expect_bit_equal(one, stacked, "stacked weights");
      if (c.name != "blocks") continue;
      // Forward and dgrad tile by tile, with tiles of 7 x 40 (off every grid of the register
      // and AMX tiles) and of 12 x 48. (1 x 1 tiles, which kernels_test runs on the native set,
      // take minutes on the tile emulator.)
      for (kernels::TileShape shape :
           {kernels::TileShape{7, 40, 1, 1}, kernels::TileShape{12, 48, 6, 16}}) {
        std::vector<kernels::MatrixRef> weights;
        for (const Tensor& w : one.weights) weights.push_back({w.data(), dt, c.in});
        Tensor y = Tensor::zeros(one.y.shape(), dt), dx = Tensor::zeros(one.dx.shape(), dt);
        run_by_tiles(c, one.x, one.dy, weights, {}, shape, y, dx);
        EXPECT_TRUE(y.bit_equal(one.y)) << "forward, tiles " << shape.rows << "x" << shape.cols;
        EXPECT_TRUE(dx.bit_equal(one.dx)) << "dgrad, tiles " << shape.rows << "x" << shape.cols;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, KernelSetTest, ::testing::ValuesIn(sets_under_test()), set_name);

// The tile emulator refuses what the hardware faults on (tiles used unconfigured, TDPBF16PS
// shapes that do not fit), so that the emulated AMX tests catch a kernel that configures or uses
// its tiles wrongly.
TEST(AmxEmulator, RefusesWhatTheHardwareFaultsOn) {
  if (kernels::avx2_kernels() == nullptr) {
    GTEST_SKIP() << "skipped: the emulator is built with AVX2+FMA, which this CPU lacks";
  }
  EXPECT_DEATH(kernels::emulated::emulated_tile_dpbf16ps(0, 4, 6), "without a configuration");
  alignas(64) uint8_t config[64] = {1};
  for (int t = 0; t < 3; ++t) {
    config[16 + 2 * t] = 64;  // colsb
    config[48 + t] = 16;      // rows
  }
  config[48 + 1] = 8;  // A with 8 rows against C with 16
  EXPECT_DEATH(
      {
        kernels::emulated::emulated_tile_loadconfig(config);
        kernels::emulated::emulated_tile_dpbf16ps(0, 1, 2);
      },
      "shapes do not fit");
  alignas(64) uint8_t half[64] = {1};
  half[16 + 2 * 3] = 64;  // tile 3: colsb without rows
  EXPECT_DEATH(kernels::emulated::emulated_tile_loadconfig(half), "rows or colsb zero");
}

}  // namespace
}  // namespace grouplin::kernel_test
