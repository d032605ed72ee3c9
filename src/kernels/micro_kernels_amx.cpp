// The AMX-BF16 kernel set (x86-64 builds; see micro_kernels_x86.hpp): the AVX512-BF16 set with
// pair_tile on the tile registers. One call computes up to 32 rows x 32 columns as 2 x 2 result
// tiles of 16 x 16 F32 (tmm0-3), from A tiles of 16 rows x 32 BF16 depths (tmm4-5: rows of x or
// dy read in place, or copied zero-padded at the ragged edges) and B tiles of 16 pair rows x 16
// columns (tmm6-7: the pair panels, whose layout is the one TDPBF16PS reads). Each TDPBF16PS
// adds 16 x 16 x 32 products: 1024 BF16 flops per instruction.
//
// Each result element is a fixed chain: one TDPBF16PS per kPairGroup pair rows (32 depths) in
// order, starting from c (accumulate) or +0; how the instruction sums its 32 products inside
// (Intel SDM: even and odd products in separate F32 sums, then added, denormals flushed to zero)
// depends only on the values, so the bits depend only on the values and kc.
//
// The Linux permission for the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA))
// is requested by detect_cpu (isa.cpp) before this set is chosen; without it, AMX is not used.
// Each call loads the tile configuration and releases the tiles at its end, so nothing is
// assumed about other code's use of the tiles between calls (not measured: the cost of that
// against keeping the configuration per thread).
//
// Not measured: this project has had no AMX machine. Tested under emulation (a scalar tile
// emulator, tests/kernels/amx_emulator.hpp) and, where the CPU has AMX, natively against the
// double-precision reference.
//
// Only what this file defines goes into its object (see micro_kernels_avx512.cpp).
#include <cstdint>

#include "kernels/micro_kernels_x86.hpp"
#include "kernels/x86_intrinsics.hpp"

namespace grouplin::kernels::GROUPLIN_X86_NS {
namespace {

#define GROUPLIN_AMX GROUPLIN_TARGET("amx-tile,amx-bf16,avx512f,avx2,fma")

constexpr int kTileRows = 16;
constexpr int kTileBytes = 64;  // bytes per tile row: 16 F32, 32 BF16 or 16 pairs

// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0-3: results (row tile r, strip s at 2 r + s); tmm4-5: A row tiles; tmm6-7: B strips. All
// 16 rows x 64 bytes.
GROUPLIN_AMX void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = kTileBytes;
    cfg.rows[t] = kTileRows;
  }
  _tile_loadconfig(&cfg);
}

// One A tile: 16 rows x 32 depths from a (row stride lda elements), depths [k, k + n) of `rows`
// rows, in place when whole, else copied zero-padded into `pad` (which must then stay until the
// tile is loaded: the caller loads it at once).
struct ATile {
  const void* base;
  int64_t stride;  // bytes
};
GROUPLIN_AMX inline ATile a_tile(const uint16_t* a, int64_t lda, int rows, int64_t n,
                                 uint16_t* pad) {
  if (rows == kTileRows && n == 32) return {a, lda * 2};
  for (int r = 0; r < kTileRows; ++r) {
    for (int64_t e = 0; e < 32; ++e) pad[r * 32 + e] = r < rows && e < n ? a[r * lda + e] : 0;
  }
  return {pad, kTileBytes};
}

GROUPLIN_AMX void pair_tile_amx(int mr, int strips, int64_t kc, const uint16_t* a, int64_t lda,
                                const uint32_t* b, int64_t b_strip, float* c, int64_t ldc,
                                bool accumulate) {
  const bool two_rows = mr > kTileRows, two_strips = strips > 1;
  const int rows0 = two_rows ? kTileRows : mr, rows1 = two_rows ? mr - kTileRows : 0;
  alignas(64) float cbuf[4][kTileRows * 16];
  alignas(64) uint16_t apad[2][kTileRows * 32];
  // The sums start in cbuf: c's rows (zero below the call's rows) or zeros. Result tile t holds
  // rows 16 (t / 2).. of strip t % 2.
  for (int t = 0; t < 4; ++t) {
    const int rows = t < 2 ? rows0 : rows1;
    const bool used = accumulate && t % 2 < strips;
    const float* src = c + 16 * (t / 2) * ldc + 16 * (t % 2);
    for (int r = 0; r < kTileRows; ++r) {
      for (int j = 0; j < 16; ++j) cbuf[t][r * 16 + j] = used && r < rows ? src[r * ldc + j] : 0;
    }
  }
  configure_tiles();
  _tile_loadd(0, cbuf[0], kTileBytes);
  _tile_loadd(1, cbuf[1], kTileBytes);
  _tile_loadd(2, cbuf[2], kTileBytes);
  _tile_loadd(3, cbuf[3], kTileBytes);
  const int64_t groups = (kc + 31) / 32;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t k = 32 * g, n = kc - k < 32 ? kc - k : 32;
    const ATile a0 = a_tile(a + k, lda, rows0, n, apad[0]);
    _tile_loadd(4, a0.base, a0.stride);
    _tile_loadd(6, b + g * kPairGroup * 16, kTileBytes);
    _tile_dpbf16ps(0, 4, 6);
    if (two_strips) {
      _tile_loadd(7, b + b_strip + g * kPairGroup * 16, kTileBytes);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (two_rows) {
      const ATile a1 = a_tile(a + kTileRows * lda + k, lda, rows1, n, apad[1]);
      _tile_loadd(5, a1.base, a1.stride);
      _tile_dpbf16ps(2, 5, 6);
      if (two_strips) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, cbuf[0], kTileBytes);
  _tile_stored(1, cbuf[1], kTileBytes);
  _tile_stored(2, cbuf[2], kTileBytes);
  _tile_stored(3, cbuf[3], kTileBytes);
  _tile_release();
  for (int t = 0; t < 4; ++t) {
    if (t % 2 >= strips) continue;
    const int rows = t < 2 ? rows0 : rows1;
    float* dst = c + 16 * (t / 2) * ldc + 16 * (t % 2);
    for (int r = 0; r < rows; ++r) {
      for (int j = 0; j < 16; ++j) dst[r * ldc + j] = cbuf[t][r * 16 + j];
    }
  }
}

}  // namespace

void add_amx(MicroKernels& set) {
  set.pair_tile = pair_tile_amx;
  set.pair_rows = 2 * kTileRows;
  set.pair_strips = 2;
  set.name = "amx-bf16";
}

}  // namespace grouplin::kernels::GROUPLIN_X86_NS
