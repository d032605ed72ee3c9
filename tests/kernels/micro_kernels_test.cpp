// The micro-kernels: each AVX2 routine against the portable one (bitwise for data movement and
// rounding, the same operation order where the header promises it), and the properties the
// tiling relies on: an element gets the same bits in an edge tile as in a full tile, and the
// unpacked fma_rows path equals the packed outer-product path.
#include "kernels/micro_kernels.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "grouplin/dtype.hpp"
#include "kernel_reference.hpp"
#include "kernels/isa.hpp"
#include "kernels/packing.hpp"

namespace grouplin::kernels {
namespace {

using kernel_test::random_floats;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class MicroKernelsTest : public ::testing::Test {
 protected:
  void TearDown() override { force_portable_kernels(false); }
  const MicroKernels& portable() {
    force_portable_kernels(true);
    const MicroKernels& p = micro_kernels();
    force_portable_kernels(false);
    return p;
  }
  // The CPU's set, the portable one and, where the CPU has it, the AVX2 set.
  std::vector<const MicroKernels*> sets_this_cpu_runs() {
    std::vector<const MicroKernels*> sets = {&micro_kernels(), &portable()};
    if (avx2_kernels() != nullptr) sets.push_back(avx2_kernels());
    return sets;
  }
};

// The dispatch: the set of kernel_isa()'s level on x86-64 CPUs (AVX2+FMA where the CPU has both
// and no more, ...), the portable loops on other CPUs and in builds for other architectures (where
// the x86 code is compiled out), so that a guard that drops a fast set from x86-64 builds by
// mistake fails here.
TEST_F(MicroKernelsTest, PicksTheSetOfTheChosenInstructionSet) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  const bool avx2 = false;
#endif
  const char* want = "portable";
  switch (kernel_isa()) {
    case Isa::Portable:
      break;
    case Isa::Avx2:
      want = "avx2+fma";
      break;
    case Isa::Avx512:
      want = "avx512f";
      break;
    case Isa::Avx512Bf16:
      want = "avx512bf16";
      break;
    case Isa::Amx:
      want = "amx-bf16";
      break;
  }
  if (avx2 && std::getenv("GROUPLIN_ISA") == nullptr) {
    EXPECT_GE(kernel_isa(), Isa::Avx2);
  }
  EXPECT_STREQ(micro_kernels().name, want);
  EXPECT_STREQ(portable().name, "portable");
  EXPECT_EQ(micro_kernels().pair_tile != nullptr, kernel_isa() >= Isa::Avx512Bf16);
}

TEST_F(MicroKernelsTest, NarrowMatchesScalarConversionOnSpecialAndRandomValues) {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          1.00390625f /* tie, even */,
                          1.01171875f /* tie, odd */,
                          3.4e38f,
                          -3.4e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(),
                          1e-40f};
  // NaNs whose payload lies only in the low 16 bits (rounding them naively gives infinity).
  for (uint32_t bits : {0x7f800001u, 0xff800001u, 0x7fc00000u}) {
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 5000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  std::vector<uint16_t> got(v.size()), ported(v.size());
  micro_kernels().narrow_bf16(v.data(), got.data(), static_cast<int64_t>(v.size()));
  portable().narrow_bf16(v.data(), ported.data(), static_cast<int64_t>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(got[i], f32_to_bf16(v[i])) << "value " << i;
    ASSERT_EQ(ported[i], got[i]) << "value " << i;
  }
  std::vector<float> back(v.size());
  micro_kernels().widen_bf16(got.data(), back.data(), static_cast<int64_t>(got.size()));
  for (size_t i = 0; i < v.size(); ++i) {
    const float want = bf16_to_f32(got[i]);
    ASSERT_EQ(std::memcmp(&back[i], &want, 4), 0) << "value " << i;
  }
}

// stream_bf16 writes what narrow_bf16 writes, wherever dst starts and whatever the length, and
// nothing past n.
TEST_F(MicroKernelsTest, StreamBf16EqualsNarrow) {
  const std::vector<float> v = random_floats(200, 17);
  for (int64_t offset : {0, 1, 7, 16}) {
    for (int64_t n : {0, 1, 15, 16, 17, 100, 183}) {
      alignas(64) uint16_t want[256], got[256];
      std::fill(std::begin(want), std::end(want), uint16_t{0xABCD});
      std::fill(std::begin(got), std::end(got), uint16_t{0xABCD});
      micro_kernels().narrow_bf16(v.data(), want + offset, n);
      micro_kernels().stream_bf16(v.data(), got + offset, n);
      portable().stream_bf16(v.data(), want + offset, n);
      EXPECT_EQ(std::memcmp(want, got, sizeof want), 0) << "offset " << offset << " n " << n;
    }
  }
}

// stream_f32 copies exactly, wherever dst starts and whatever the length, and nothing past n:
// the CPU's set, the portable one and, where the CPU has it, the AVX2 set.
TEST_F(MicroKernelsTest, StreamF32Copies) {
  const std::vector<float> v = random_floats(200, 23);
  for (const MicroKernels* set : sets_this_cpu_runs()) {
    for (int64_t offset : {0, 1, 7, 8, 16}) {
      for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 100, 183}) {
        alignas(64) float want[256], got[256];
        std::fill(std::begin(want), std::end(want), -3.0f);
        std::fill(std::begin(got), std::end(got), -3.0f);
        std::copy_n(v.data(), n, want + offset);
        set->stream_f32(v.data(), got + offset, n);
        EXPECT_EQ(std::memcmp(want, got, sizeof want), 0)
            << set->name << " offset " << offset << " n " << n;
      }
    }
  }
}

// stream_zeros clears exactly the bytes asked for, wherever dst starts (odd byte offsets too: BF16
// gradients) and whatever the length: every set the CPU has.
TEST_F(MicroKernelsTest, StreamZerosClears) {
  for (const MicroKernels* set : sets_this_cpu_runs()) {
    for (int64_t offset : {0, 1, 2, 15, 16, 33, 64}) {
      for (int64_t bytes : {0, 1, 2, 15, 16, 31, 32, 63, 64, 65, 130, 400}) {
        alignas(64) std::byte want[512], got[512];
        std::memset(want, 0xA5, sizeof want);
        std::memset(got, 0xA5, sizeof got);
        std::memset(want + offset, 0, static_cast<size_t>(bytes));
        set->stream_zeros(got + offset, bytes);
        EXPECT_EQ(std::memcmp(want, got, sizeof want), 0)
            << set->name << " offset " << offset << " bytes " << bytes;
      }
    }
  }
}

TEST_F(MicroKernelsTest, PackTransposedMatchesPortable) {
  for (int width : {kOuterRows, kOuterCols}) {
    for (int rows : {1, 5, width}) {
      for (int64_t kc : {1, 7, 8, 21, 64}) {
        const int64_t ld = kc + 3;
        const std::vector<float> src = random_floats(static_cast<size_t>(rows * ld), 11);
        std::vector<uint16_t> half(src.size());
        micro_kernels().narrow_bf16(src.data(), half.data(), static_cast<int64_t>(src.size()));
        for (bool bf16 : {false, true}) {
          const void* p = bf16 ? static_cast<const void*>(half.data()) : src.data();
          std::vector<float> a(static_cast<size_t>(kc * width + 8), -7.0f), b = a;
          micro_kernels().pack_transposed(p, bf16, ld, rows, kc, a.data(), width);
          portable().pack_transposed(p, bf16, ld, rows, kc, b.data(), width);
          a.resize(static_cast<size_t>(kc * width));
          b.resize(a.size());
          EXPECT_TRUE(same_bits(a, b)) << width << " " << rows << " " << kc << " " << bf16;
        }
      }
    }
  }
}

// pack_pairs: each dword is the pair of its row's two BF16 values (low half first), zero past
// `rows`, for every row count and pair count around the 8 x 8 blocks; exactly what it owns is
// written (the pair rows x 16 columns), nothing after.
TEST_F(MicroKernelsTest, PackPairsTransposesPairsExactly) {
  for (int rows : {1, 7, 8, 9, 16}) {
    for (int64_t pairs : {0, 1, 7, 8, 13, 24}) {
      const int64_t ld = 2 * pairs + 5;
      std::vector<uint16_t> src(static_cast<size_t>(rows * ld));
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
      const size_t n = static_cast<size_t>(pairs * kOuterCols);
      std::vector<uint32_t> a(n + 16, 0xdeadbeef), b = a;
      micro_kernels().pack_pairs(src.data(), ld, rows, pairs, a.data());
      portable().pack_pairs(src.data(), ld, rows, pairs, b.data());
      EXPECT_EQ(a, b) << rows << " rows, " << pairs << " pairs";
      for (int64_t r = 0; r < pairs; ++r) {
        for (int j = 0; j < kOuterCols; ++j) {
          const uint32_t want =
              j < rows ? src[j * ld + 2 * r] | uint32_t{src[j * ld + 2 * r + 1]} << 16 : 0;
          ASSERT_EQ(a[r * kOuterCols + j], want) << r << "," << j;
        }
      }
      for (size_t i = n; i < a.size(); ++i) ASSERT_EQ(a[i], 0xdeadbeefu) << "wrote past at " << i;
    }
  }
}

// pack_pair_rows: each dword pairs a column's values of two consecutive rows (the even row low),
// the last odd row alone, one panel per 16 columns, zero past `cols`; nothing between panels or
// past the last one's pair rows is written.
TEST_F(MicroKernelsTest, PackPairRowsInterleavesRowsExactly) {
  for (int64_t cols : {1, 9, 15, 16, 17, 32, 47, 64}) {
    for (int64_t depth : {1, 2, 7, 8, 33}) {
      const int64_t ld = 71, pairs = (depth + 1) / 2, panels = (cols + 15) / 16;
      const int64_t strip = pairs * kOuterCols + 5;  // a gap after each panel
      std::vector<uint16_t> src(static_cast<size_t>(depth * ld));
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 2654435761u >> 9);
      const size_t n = static_cast<size_t>(panels * strip);
      std::vector<uint32_t> a(n + 16, 0xdeadbeef), b = a;
      micro_kernels().pack_pair_rows(src.data(), ld, depth, cols, a.data(), strip);
      portable().pack_pair_rows(src.data(), ld, depth, cols, b.data(), strip);
      EXPECT_EQ(a, b) << cols << " cols, depth " << depth;
      for (int64_t s = 0; s < panels; ++s) {
        for (int64_t r = 0; r < pairs; ++r) {
          for (int64_t j = 0; j < kOuterCols; ++j) {
            const int64_t c = s * kOuterCols + j;
            const uint32_t odd = 2 * r + 1 < depth && c < cols ? src[(2 * r + 1) * ld + c] : 0;
            const uint32_t want = c < cols ? src[2 * r * ld + c] | odd << 16 : 0;
            ASSERT_EQ(a[s * strip + r * kOuterCols + j], want) << s << "," << r << "," << j;
          }
        }
        for (int64_t i = pairs * kOuterCols; i < strip; ++i) {
          ASSERT_EQ(a[s * strip + i], 0xdeadbeefu) << "wrote into the gap of panel " << s;
        }
      }
      for (size_t i = n; i < a.size(); ++i) ASSERT_EQ(a[i], 0xdeadbeefu) << "wrote past at " << i;
    }
  }
}

// A 4 x 3 tile computes each element as the 1 x 1 tile of the same operands does.
// transpose_bf16: columns of a BF16 matrix as rows, bits kept, at every size around the 8 x 8
// blocks it moves through registers; nothing past each row's kc values is written.
TEST_F(MicroKernelsTest, TransposeBf16MovesColumnsToRowsExactly) {
  for (int64_t rows : {1, 7, 8, 9, 16, 23}) {
    for (int64_t kc : {1, 5, 8, 15, 16, 33}) {
      const int64_t ld = 37, r0 = 2, c0 = 3, lda = kc + 3;
      std::vector<uint16_t> src(static_cast<size_t>((r0 + kc) * ld));
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
      std::vector<uint16_t> a(static_cast<size_t>(rows * lda), 0xbeef);
      const MatrixRef m{reinterpret_cast<const std::byte*>(src.data()), DType::BF16, ld};
      transpose_bf16(m, r0, kc, c0, rows, a.data(), lda);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t p = 0; p < lda; ++p) {
          const uint16_t want = p < kc ? src[(r0 + p) * ld + c0 + i] : 0xbeef;
          ASSERT_EQ(a[i * lda + p], want) << rows << " rows, kc " << kc << ": " << i << "," << p;
        }
      }
    }
  }
}

TEST_F(MicroKernelsTest, DotTileElementsDoNotDependOnTileSize) {
  for (int64_t kc : {1, 8, 13, 100}) {
    const std::vector<float> a = random_floats(static_cast<size_t>(4 * kc), 1);
    const std::vector<float> b = random_floats(static_cast<size_t>(3 * kc), 2);
    std::vector<float> full(12, 0.5f), single(12, 0.5f);
    // Prefetching rows ahead (here B's own) never changes a sum.
    micro_kernels().f32.dot_tile(4, 3, kc, a.data(), kc, b.data(), kc, full.data(), 3, b.data());
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j) {
        micro_kernels().f32.dot_tile(1, 1, kc, a.data() + i * kc, kc, b.data() + j * kc, kc,
                                     single.data() + i * 3 + j, 3, nullptr);
      }
    }
    EXPECT_TRUE(same_bits(full, single)) << kc;
    // B as BF16 bits gives the bits of B widened.
    std::vector<uint16_t> half(b.size());
    micro_kernels().narrow_bf16(b.data(), half.data(), static_cast<int64_t>(b.size()));
    std::vector<float> widened(b.size()), from_half(12, 0.5f), from_widened(12, 0.5f);
    micro_kernels().widen_bf16(half.data(), widened.data(), static_cast<int64_t>(b.size()));
    // Every tile size: each is its own compiled instance, with its own ragged tail.
    for (int mr = 1; mr <= kDotRows; ++mr) {
      for (int nr = 1; nr <= kDotCols; ++nr) {
        micro_kernels().bf16.dot_tile(mr, nr, kc, a.data(), kc, half.data(), kc, from_half.data(),
                                      3, nullptr);
        micro_kernels().f32.dot_tile(mr, nr, kc, a.data(), kc, widened.data(), kc,
                                     from_widened.data(), 3, nullptr);
        EXPECT_TRUE(same_bits(from_half, from_widened)) << kc << " " << mr << "x" << nr;
      }
    }
  }
}

// fma_rows (unpacked) and outer_tile (packed panels) form the same chain of fused multiply-adds,
// and splitting the depth into blocks does not change it.
TEST_F(MicroKernelsTest, FmaRowsEqualsOuterProductAndDepthBlocking) {
  const int64_t depth = 37;
  const std::vector<float> a =
      random_floats(static_cast<size_t>(kOuterRows * depth), 3);  // [6][depth]
  const std::vector<float> b =
      random_floats(static_cast<size_t>(depth * kOuterCols), 4);  // [depth][16]
  std::vector<float> ap(static_cast<size_t>(depth * kOuterRows));
  for (int64_t p = 0; p < depth; ++p) {
    for (int i = 0; i < kOuterRows; ++i)
      ap[static_cast<size_t>(p * kOuterRows + i)] = a[static_cast<size_t>(i * depth + p)];
  }
  alignas(32) float bp[depth * kOuterCols];
  std::memcpy(bp, b.data(), sizeof bp);
  std::vector<float> outer(kOuterRows * kOuterCols, 0.25f), rows = outer, blocked = outer;
  micro_kernels().f32.outer_tile(kOuterRows, kOuterCols, depth, ap.data(), 1, kOuterRows, bp,
                                 kOuterCols, outer.data(), kOuterCols, true);
  micro_kernels().f32.fma_rows(kOuterRows, depth, a.data(), depth, b.data(), kOuterCols, kOuterCols,
                               rows.data(), kOuterCols);
  micro_kernels().f32.outer_tile(kOuterRows, kOuterCols, 20, ap.data(), 1, kOuterRows, bp,
                                 kOuterCols, blocked.data(), kOuterCols, true);
  micro_kernels().f32.outer_tile(kOuterRows, kOuterCols, depth - 20, ap.data() + 20 * kOuterRows, 1,
                                 kOuterRows, bp + 20 * kOuterCols, kOuterCols, blocked.data(),
                                 kOuterCols, true);
  EXPECT_TRUE(same_bits(outer, rows));
  EXPECT_TRUE(same_bits(outer, blocked));
  // Starting from +0 without reading c equals accumulating onto zeros, whatever c held.
  std::vector<float> fresh(kOuterRows * kOuterCols, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> zeros(kOuterRows * kOuterCols, 0.0f);
  micro_kernels().f32.outer_tile(kOuterRows, kOuterCols, depth, ap.data(), 1, kOuterRows, bp,
                                 kOuterCols, fresh.data(), kOuterCols, false);
  micro_kernels().f32.outer_tile(kOuterRows, kOuterCols, depth, ap.data(), 1, kOuterRows, bp,
                                 kOuterCols, zeros.data(), kOuterCols, true);
  // Rows read in place (a_row = depth, a_step = 1) equal the packed panel.
  std::vector<float> in_place(kOuterRows * kOuterCols, 0.25f);
  micro_kernels().f32.outer_tile(kOuterRows, kOuterCols, depth, a.data(), depth, 1, bp, kOuterCols,
                                 in_place.data(), kOuterCols, true);
  EXPECT_TRUE(same_bits(outer, in_place));
  EXPECT_TRUE(same_bits(fresh, zeros));
}

// Every row count and both widths give each element the bits of the 6 x 16 tile and write only
// their own rows and columns; B read in place with a leading dimension equals the packed panel.
TEST_F(MicroKernelsTest, OuterTileRowCountsAndInPlaceB) {
  const int64_t depth = 29, ldb = 21;
  const std::vector<float> a = random_floats(static_cast<size_t>(kOuterRows * depth), 7);
  const std::vector<float> wide = random_floats(static_cast<size_t>(depth * ldb), 8);
  alignas(32) float bp[depth * kOuterCols];
  for (int64_t p = 0; p < depth; ++p)
    std::copy_n(wide.data() + p * ldb + 2, kOuterCols, bp + p * kOuterCols);
  std::vector<float> full(kOuterRows * kOuterCols, 0.5f);
  micro_kernels().f32.outer_tile(kOuterRows, kOuterCols, depth, a.data(), depth, 1, bp, kOuterCols,
                                 full.data(), kOuterCols, true);
  for (int nr : {8, kOuterCols}) {
    for (int mr = 1; mr <= kOuterRows; ++mr) {
      std::vector<float> part((kOuterRows + 1) * kOuterCols, 0.5f);
      micro_kernels().f32.outer_tile(mr, nr, depth, a.data(), depth, 1, wide.data() + 2, ldb,
                                     part.data(), kOuterCols, true);
      for (int i = 0; i <= kOuterRows; ++i) {
        for (int j = 0; j < kOuterCols; ++j) {
          const float got = part[static_cast<size_t>(i * kOuterCols + j)];
          const float want =
              i < mr && j < nr ? full[static_cast<size_t>(i * kOuterCols + j)] : 0.5f;
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
              << "mr " << mr << " nr " << nr << " row " << i << " col " << j;
        }
      }
    }
  }
}

// The BF16 variants of outer_tile and fma_rows (B widened in registers) give the bits of the F32
// kernels on the widened B, in both kernel sets.
TEST_F(MicroKernelsTest, Bf16BKernelsEqualF32KernelsOnWidenedB) {
  const int64_t depth = 23, ldb = 37, cols = 35;
  const std::vector<float> a = random_floats(static_cast<size_t>(kOuterRows * depth), 11);
  const std::vector<float> b = random_floats(static_cast<size_t>(depth * ldb), 12);
  std::vector<uint16_t> half(b.size());
  micro_kernels().narrow_bf16(b.data(), half.data(), static_cast<int64_t>(b.size()));
  std::vector<float> widened(b.size());
  micro_kernels().widen_bf16(half.data(), widened.data(), static_cast<int64_t>(b.size()));
  for (const MicroKernels* mk : {&micro_kernels(), &portable()}) {
    for (int nr : {8, kOuterCols}) {
      for (int mr : {1, 4, kOuterRows}) {
        std::vector<float> want(kOuterRows * kOuterCols, 0.5f), got = want;
        mk->f32.outer_tile(mr, nr, depth, a.data(), depth, 1, widened.data() + 3, ldb, want.data(),
                           kOuterCols, true);
        mk->bf16.outer_tile(mr, nr, depth, a.data(), depth, 1, half.data() + 3, ldb, got.data(),
                            kOuterCols, true);
        EXPECT_TRUE(same_bits(want, got)) << mk->name << " mr " << mr << " nr " << nr;
      }
    }
    for (int64_t rows : {1, 3}) {
      std::vector<float> want(static_cast<size_t>(rows * ldb), 0.25f), got = want;
      mk->f32.fma_rows(rows, depth, a.data(), depth, widened.data(), ldb, cols, want.data(), ldb);
      mk->bf16.fma_rows(rows, depth, a.data(), depth, half.data(), ldb, cols, got.data(), ldb);
      EXPECT_TRUE(same_bits(want, got)) << mk->name << " rows " << rows;
    }
  }
}

// transpose copies exactly, ragged sizes included, and writes nothing past each row's cols.
TEST_F(MicroKernelsTest, TransposeMatchesPortableAndWritesOnlyItsColumns) {
  for (int64_t rows : {1, 5, 8, 13}) {
    for (int64_t cols : {1, 7, 8, 19}) {
      const int64_t lds = 16, ldd = cols + 2;
      const std::vector<float> src = random_floats(static_cast<size_t>(cols * lds), 17);
      for (const MicroKernels* mk : {&micro_kernels(), &portable()}) {
        std::vector<float> dst(static_cast<size_t>(rows * ldd), -3.0f);
        mk->transpose(src.data(), lds, rows, cols, dst.data(), ldd);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < ldd; ++j) {
            const float want = j < cols ? src[static_cast<size_t>(j * lds + i)] : -3.0f;
            ASSERT_EQ(dst[static_cast<size_t>(i * ldd + j)], want)
                << mk->name << " " << rows << "x" << cols << " at " << i << "," << j;
          }
        }
      }
    }
  }
}

// add_rows gives both kernel sets the same sums, F32 or BF16 rows, whatever the rows per call
// (the chain is start + row 0 + row 1 + ... either way), and touches only n sums.
TEST_F(MicroKernelsTest, AddRowsMatchesPortableInAnyBlockingAndWritesOnlyItsColumns) {
  const int64_t count = 5, ld = 90;
  for (int64_t n : {1, 7, 8, 33, 70, 88}) {
    const std::vector<float> rows = random_floats(static_cast<size_t>(count * ld), 13);
    std::vector<uint16_t> half(rows.size());
    micro_kernels().narrow_bf16(rows.data(), half.data(), static_cast<int64_t>(rows.size()));
    for (bool bf16 : {false, true}) {
      const void* data = bf16 ? static_cast<const void*>(half.data()) : rows.data();
      const int64_t row_bytes = ld * (bf16 ? 2 : 4);
      const auto* bytes = static_cast<const std::byte*>(data);
      // One row per call on the portable set, starting from zero.
      std::vector<float> want(static_cast<size_t>(n + 1), 0.125f);
      for (int64_t r = 0; r < count; ++r)
        portable().add_rows(bytes + r * row_bytes, row_bytes, 1, bf16, n, want.data(), r == 0);
      // Blocks of 2 + 3 rows, and all 5 at once, on this CPU's set.
      std::vector<float> blocks(want.size(), 0.125f), whole(want.size(), 0.125f);
      micro_kernels().add_rows(bytes, row_bytes, 2, bf16, n, blocks.data(), true);
      micro_kernels().add_rows(bytes + 2 * row_bytes, row_bytes, 3, bf16, n, blocks.data(), false);
      micro_kernels().add_rows(bytes, row_bytes, count, bf16, n, whole.data(), true);
      EXPECT_TRUE(same_bits(want, blocks)) << "n " << n << " bf16 " << bf16;
      EXPECT_TRUE(same_bits(want, whole)) << "n " << n << " bf16 " << bf16;
      EXPECT_EQ(whole[static_cast<size_t>(n)], 0.125f);
      EXPECT_NE(whole[0], 0.125f);
    }
  }
}

// fma_rows leaves columns past `cols` untouched (its masked tail).
TEST_F(MicroKernelsTest, FmaRowsWritesOnlyItsColumns) {
  for (int64_t cols : {1, 7, 8, 9, 33}) {
    const std::vector<float> a = random_floats(4, 5),
                             b = random_floats(static_cast<size_t>(2 * 40), 6);
    std::vector<float> c(static_cast<size_t>(2 * 40), 9.0f);
    micro_kernels().f32.fma_rows(2, 2, a.data(), 2, b.data(), 40, cols, c.data(), 40);
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t j = cols; j < 40; ++j)
        EXPECT_EQ(c[static_cast<size_t>(r * 40 + j)], 9.0f) << cols;
      for (int64_t j = 0; j < cols; ++j)
        EXPECT_NE(c[static_cast<size_t>(r * 40 + j)], 9.0f) << cols;
    }
  }
}

// fma_rows_fp8 gives fma_rows' bits on the decoded values (code x its block's scale) wherever
// its rows and columns start and end in the scale blocks, for 1-5 rows of c (the unrolled counts
// and the general loop), with ragged columns and NaN codes.
TEST_F(MicroKernelsTest, FmaRowsFp8EqualsFmaRowsOnDecodedValues) {
  const MicroKernels& mk = micro_kernels();
  if (mk.fma_rows_fp8 == nullptr) GTEST_SKIP() << mk.name << " decodes FP8 while packing";
  constexpr int64_t kRows = 300, kLd = 304;  // 300 x 300 codes: 3 x 3 scale blocks
  std::vector<uint8_t> codes(static_cast<size_t>(kRows * kLd));
  std::mt19937 gen(7);
  for (uint8_t& c : codes) c = static_cast<uint8_t>(gen());
  // Random codes put a NaN code in every block; the kernel takes another path for blocks without
  // one (sums in registers), so the top-left block has none. The middle row's blocks have a scale
  // that E4M3's 2^120 cannot be folded into (x 2^120 overflows), clean block included.
  for (int64_t r = 0; r < 128; ++r) {
    for (int64_t k = 0; k < 128; ++k) {
      uint8_t& c = codes[static_cast<size_t>(r * kLd + k)];
      c = kernel_test::finite_e4m3(c);
    }
  }
  for (int64_t r = 128; r < 256; ++r) {
    for (int64_t k = 128; k < 256; ++k) {
      uint8_t& c = codes[static_cast<size_t>(r * kLd + k)];
      c = kernel_test::finite_e4m3(c);
    }
  }
  const std::vector<float> scales = {0.5f,    0.25f, 2.0f, 0x1p100f, 0x1p101f,
                                     0x1p99f, 0.75f, 3.0f, 1.5f};
  for (const auto& [row0, depth] :
       {std::pair<int64_t, int64_t>{0, 16}, {2, 13}, {125, 9}, {126, 40}, {254, 3}, {130, 16}}) {
    for (const auto& [col0, cols] :
         {std::pair<int64_t, int64_t>{0, 45}, {120, 17}, {8, 256}, {0, 128}, {136, 120}}) {
      for (int64_t rows = 1; rows <= 5; ++rows) {
        // The decoded values of b's rows [row0, row0 + depth), columns [col0, col0 + cols).
        std::vector<float> decoded(static_cast<size_t>(depth * cols));
        for (int64_t p = 0; p < depth; ++p) {
          for (int64_t j = 0; j < cols; ++j) {
            const int64_t r = row0 + p, k = col0 + j;
            decoded[static_cast<size_t>(p * cols + j)] =
                f8e4m3_to_f32(codes[static_cast<size_t>(r * kLd + k)]) *
                scales[static_cast<size_t>((r / 128) * 3 + k / 128)];
          }
        }
        const std::vector<float> a = random_floats(static_cast<size_t>(rows * depth), 11);
        std::vector<float> want(static_cast<size_t>(rows * 320), 1.5f), got = want;
        mk.f32.fma_rows(rows, depth, a.data(), depth, decoded.data(), cols, cols, want.data(), 320);
        const Fp8Operand b{codes.data() + row0 * kLd + col0, kLd, scales.data(), 3, row0, col0};
        mk.fma_rows_fp8(rows, depth, a.data(), depth, b, cols, got.data(), 320);
        EXPECT_TRUE(same_bits(got, want)) << mk.name << " rows " << rows << " from b row " << row0
                                          << " x " << depth << ", column " << col0 << " x " << cols;
      }
    }
  }
}

}  // namespace
}  // namespace grouplin::kernels
