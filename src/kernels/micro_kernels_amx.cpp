// The AMX-BF16 kernel set (x86-64 builds; see micro_kernels_x86.hpp): the AVX512-BF16 set with
// pair_tile and pair_block on the tile registers. A row group of up to 32 rows x 32 columns is
// 2 x 2 result tiles of 16 x 16 F32 (tmm0-3), fed by A tiles of 16 rows x 32 BF16 depths
// (tmm4-5: rows of x or dy read in place) and B tiles of 16 pair rows x 16 columns (tmm6-7: the
// pair panels, whose layout is the one TDPBF16PS reads). Each TDPBF16PS adds 16 x 16 x 32
// products: 1024 BF16 flops per instruction.
//
// How the work is laid out for the matrix engine (the first version configured the tiles, copied
// the sums in and out through a stack buffer element by element and released the tiles on every
// call of one short depth block: a Sapphire Rapids ran it at 4-10% of its BF16 peak):
// - pair_block runs every row group of a tile over the whole depth (forward, dgrad) or blocks of
//   it (wgrad, whose A is transposed into scratch a block at a time): the sums stay in the
//   result tiles from the first depth of the call to the last, start from _tile_zero (or, for
//   a wgrad block after the first, a load of the previous block's sums), and go from the tiles
//   straight to the caller's F32 rows (TILESTORED with the caller's stride); per group of 32
//   depths, only tile loads and TDPBF16PS.
// - Ragged rows are the configuration's row counts (a tile of 5 rows loads, multiplies and stores
//   5 rows), not zero-padded copies. The configuration is loaded only when the row counts change
//   and is kept between calls on the thread; each worker releases it when its share of a grouped
//   GEMM ends (pair_release), so nothing outlives a call.
// - Only a depth that is not a multiple of 32 copies: its last A tile, zero-padded (TDPBF16PS
//   would read past the row, and 0 x NaN is NaN).
//
// Each result element is a fixed chain: one TDPBF16PS per kPairGroup pair rows (32 depths) in
// order, starting from c (accumulate) or +0; how the instruction sums its 32 products inside
// (Intel SDM: even and odd products in separate F32 sums, then added, denormals flushed to zero)
// depends only on the values, so the bits depend only on the values and kc, whichever entry point
// and however many calls computed them.
//
// The Linux permission for the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA))
// is requested by detect_cpu (isa.cpp) before this set is chosen; without it, AMX is not used.
//
// Tested under emulation (a scalar tile emulator that also counts the tile instructions,
// tests/kernels/amx_emulator.hpp; the instruction budget test holds the counts above) and, where
// the CPU has AMX, natively against the double-precision reference. Not measured by this
// project's own machines (none has AMX); docs/PERFORMANCE.md says what was.
//
// Only what this file defines goes into its object (see micro_kernels_avx512.cpp).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

#define GROUPLIN_AMX GROUPLIN_TARGET("amx-tile,amx-bf16,avx512f,avx2,fma")

constexpr int kTileRows = 16;
constexpr int kTileBytes = 64;  // bytes per tile row: 16 F32, 32 BF16 or 16 pairs
constexpr int kGroupDepth = 2 * static_cast<int>(kPairGroup);  // BF16 depths per TDPBF16PS

// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The row counts of the configuration this thread has loaded (rows0 * 32 + rows1), or kNoShape.
constexpr int kNoShape = -1;
thread_local int loaded_shape = kNoShape;

// The row shape of a group of `rows` (1..32) rows: its first 16-row tile's rows * 32 + the
// second's.
int shape_of(int rows) {
  const int rows0 = std::min(rows, kTileRows);
  return rows0 * 32 + (rows - rows0);
}

// tmm0-1: results of the first 16 rows (strips 0 and 1), tmm2-3: of the next 16; tmm4-5: their A
// tiles; tmm6-7: the B strips. Tiles of a row tile without rows are left unconfigured (0 x 0).
GROUPLIN_AMX void configure(int rows0, int rows1) {
  const int shape = shape_of(rows0 + rows1);
  if (loaded_shape == shape) return;
  TileConfig cfg;
  const auto set = [&cfg](int t, int rows) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = rows > 0 ? kTileBytes : 0;
  };
  for (int t : {0, 1, 4}) set(t, rows0);
  for (int t : {2, 3, 5}) set(t, rows1);
  set(6, kTileRows);
  set(7, kTileRows);
  _tile_loadconfig(&cfg);
  loaded_shape = shape;
}

GROUPLIN_AMX void release_tiles() {
  if (loaded_shape == kNoShape) return;
  _tile_release();
  loaded_shape = kNoShape;
}

// The A tile of `rows` rows at depths [k, k + n) of a: in place when n is a whole group, else
// copied zero-padded into pad (loaded by the caller before pad is reused).
struct ATile {
  const void* base;
  int64_t stride;  // bytes
};
GROUPLIN_AMX inline ATile a_tile(const uint16_t* a, int64_t lda, int rows, int64_t n,
                                 uint16_t* pad) {
  if (n == kGroupDepth) return {a, lda * 2};
  for (int r = 0; r < rows; ++r) {
    std::memcpy(pad + r * kGroupDepth, a + r * lda, static_cast<size_t>(n) * 2);
    std::fill(pad + r * kGroupDepth + n, pad + (r + 1) * kGroupDepth, uint16_t{0});
  }
  return {pad, kTileBytes};
}

// One row group (1..32 rows) x `strips` strips over all kc depths, sums from c or +0, stored to
// c. The sums stay in tmm0-3 for the whole depth.
GROUPLIN_AMX void row_group(int rows, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                            const uint32_t* b, int64_t b_strip, float* c, int64_t ldc,
                            bool accumulate) {
  const int rows0 = std::min(rows, kTileRows), rows1 = rows - rows0;
  configure(rows0, rows1);
  const bool two_rows = rows1 > 0, two_strips = strips > 1;
  const int64_t ldc_bytes = ldc * 4;
  float* c1 = c + kTileRows * ldc;
  if (accumulate) {
    _tile_loadd(0, c, ldc_bytes);
    if (two_strips) _tile_loadd(1, c + 16, ldc_bytes);
    if (two_rows) _tile_loadd(2, c1, ldc_bytes);
    if (two_rows && two_strips) _tile_loadd(3, c1 + 16, ldc_bytes);
  } else {
    _tile_zero(0);
    if (two_strips) _tile_zero(1);
    if (two_rows) _tile_zero(2);
    if (two_rows && two_strips) _tile_zero(3);
  }
  alignas(64) uint16_t pad[kTileRows * kGroupDepth];
  const uint16_t* a1 = a + kTileRows * lda;
  const int64_t groups = (kc + kGroupDepth - 1) / kGroupDepth;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k = kGroupDepth * g, n = std::min<int64_t>(kc - k, kGroupDepth);
    const uint32_t* bg = b + g * kPairGroup * 16;
    _tile_loadd(6, bg, kTileBytes);
    if (two_strips) _tile_loadd(7, bg + b_strip, kTileBytes);
    const ATile t0 = a_tile(a + k, lda, rows0, n, pad);
    _tile_loadd(4, t0.base, t0.stride);
    _tile_dpbf16ps(0, 4, 6);
    if (two_strips) _tile_dpbf16ps(1, 4, 7);
    if (two_rows) {
      const ATile t1 = a_tile(a1 + k, lda, rows1, n, pad);
      _tile_loadd(5, t1.base, t1.stride);
      _tile_dpbf16ps(2, 5, 6);
      if (two_strips) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, ldc_bytes);
  if (two_strips) _tile_stored(1, c + 16, ldc_bytes);
  if (two_rows) _tile_stored(2, c1, ldc_bytes);
  if (two_rows && two_strips) _tile_stored(3, c1 + 16, ldc_bytes);
}

GROUPLIN_AMX void pair_tile_amx(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                                const uint32_t* b, int64_t b_strip, float* c, int64_t ldc,
                                bool accumulate) {
  row_group(mr, strips, kc, a, lda, b, b_strip, c, ldc, accumulate);
}

// Row groups of 32 rows, the ragged last one (rows % 32) first when its shape is the one loaded:
// a tile whose rows are not a multiple of 32 then loads one configuration per call instead of
// two (the full groups' and the ragged one's, again for every strip group and depth block).
// Each row's chain is the same in either order.
GROUPLIN_AMX void pair_block_amx(int64_t rows, int strips, int64_t kc, const uint16_t* a,
                                 int64_t lda, const uint32_t* b, int64_t b_strip, float* c,
                                 int64_t ldc, bool accumulate) {
  const int64_t full = rows / (2 * kTileRows) * (2 * kTileRows);
  const int ragged = static_cast<int>(rows - full);
  const auto group = [&](int64_t i, int h) {
    row_group(h, strips, kc, a + i * lda, lda, b, b_strip, c + i * ldc, ldc, accumulate);
  };
  const bool ragged_first = ragged > 0 && loaded_shape == shape_of(ragged);
  if (ragged_first) group(full, ragged);
  for (int64_t i = 0; i < full; i += 2 * kTileRows) group(i, 2 * kTileRows);
  if (ragged > 0 && !ragged_first) group(full, ragged);
}

}  // namespace

void add_amx(MicroKernels& set) {
  set.pair_tile = pair_tile_amx;
  set.pair_block = pair_block_amx;
  set.dot_tile_pairs = nullptr;      // experts of a few rows stay on dot tiles: not measured on AMX
  set.dot_tile_fp8_pairs = nullptr;  // not measured on AMX either
  set.fma_rows_fp8_pairs = nullptr;
  set.fma_rows_pairs = nullptr;  // dgrad of a few rows stays on pair tiles: not measured on AMX
  set.pair_tile_scaled = nullptr;
  set.pair_tile_half = nullptr;  // its pair_tile sums in its own order
  set.decode_fp8_bf16 = nullptr;
  set.pair_release = release_tiles;
  set.pair_rows = 2 * kTileRows;
  set.pair_strips = 2;
  set.name = "amx-bf16";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
