// Test-only: a scalar emulator of the AMX intrinsics the AMX kernel file uses (_tile_loadconfig,
// _tile_loadd, _tile_stored, _tile_zero, _tile_dpbf16ps, _tile_release), per thread, so that the
// tests run micro_kernels_amx.cpp's logic on CPUs without AMX (included by x86_emulation.hpp).
//
// It checks what the hardware faults on (a tile used unconfigured, TDPBF16PS shapes that do not
// fit: #UD) and aborts with a message. TDPBF16PS follows the Intel SDM's pseudo-code: for each
// row m and column n, the even-indexed and the odd-indexed products of the pairs are summed in two
// F32 sums (fused multiply-adds in pair order), which are then added together and to the
// destination; denormal inputs are read as zero and denormal results flushed to zero. (The
// Intrinsics Guide describes a single sequential sum instead; the hardware's internal order is
// not documented further, so the native tests hold AMX results to the double-precision reference
// with tolerances, and only these emulated ones to a bit-exact model of this semantics.)
//
// It also counts every tile instruction, over all threads (tile_counts()), so that a test can
// hold the kernel to its instruction budget on any machine: how many TDPBF16PS each
// configuration load, sum load and store, and release carries.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bf16_dot_semantics.hpp"

namespace grouplin::kernels::emulated {

struct EmulatedTiles {
  bool configured = false;
  uint8_t rows[8] = {};
  uint16_t colsb[8] = {};
  alignas(64) uint8_t data[8][16][64] = {};
};

// Tile instructions executed since the last reset, all threads together; loads and stores per
// tile register.
struct TileCounts {
  std::atomic<int64_t> configs{0}, releases{0}, zeros{0}, products{0};
  std::atomic<int64_t> loads[8] = {}, stores[8] = {};
  void reset() {
    configs = releases = zeros = products = 0;
    for (int t = 0; t < 8; ++t) loads[t] = stores[t] = 0;
  }
};

inline TileCounts& tile_counts() {
  static TileCounts counts;
  return counts;
}

inline EmulatedTiles& emulated_tiles() {
  thread_local EmulatedTiles tiles;
  return tiles;
}

[[noreturn]] inline void amx_fault(const char* what, int tile) {
  std::fprintf(stderr, "AMX emulator: %s (tile %d)\n", what, tile);
  std::abort();
}

inline void check_tile(int t) {
  const EmulatedTiles& s = emulated_tiles();
  if (!s.configured) amx_fault("tile used without a configuration", t);
  if (t < 0 || t > 7 || s.rows[t] == 0 || s.colsb[t] == 0) amx_fault("tile not configured", t);
}

// The 64-byte ldtilecfg operand: palette, start_row, 14 reserved bytes, 16 colsb (uint16),
// 16 rows (uint8). Palette 1: 8 tiles of at most 16 rows x 64 bytes.
inline void emulated_tile_loadconfig(const void* config) {
  const auto* bytes = static_cast<const uint8_t*>(config);
  EmulatedTiles& s = emulated_tiles();
  if (bytes[0] != 1) amx_fault("palette is not 1", -1);
  if (bytes[1] != 0) amx_fault("start_row is not 0", -1);
  s = EmulatedTiles{};
  ++tile_counts().configs;
  for (int t = 0; t < 8; ++t) {
    std::memcpy(&s.colsb[t], bytes + 16 + 2 * t, 2);
    s.rows[t] = bytes[48 + t];
    if (s.rows[t] > 16 || s.colsb[t] > 64 || s.colsb[t] % 4 != 0) amx_fault("bad tile shape", t);
    // An unused tile has both zero (LDTILECFG's operand description).
    if ((s.rows[t] == 0) != (s.colsb[t] == 0)) amx_fault("tile with rows or colsb zero", t);
  }
  s.configured = true;
}

inline void emulated_tile_release() {
  ++tile_counts().releases;
  emulated_tiles() = EmulatedTiles{};
}

inline void emulated_tile_zero(int t) {
  check_tile(t);
  ++tile_counts().zeros;
  std::memset(emulated_tiles().data[t], 0, sizeof emulated_tiles().data[t]);
}

inline void emulated_tile_loadd(int t, const void* base, int64_t stride) {
  check_tile(t);
  ++tile_counts().loads[t];
  EmulatedTiles& s = emulated_tiles();
  std::memset(s.data[t], 0, sizeof s.data[t]);
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(s.data[t][r], static_cast<const uint8_t*>(base) + r * stride, s.colsb[t]);
}

inline void emulated_tile_stored(int t, void* base, int64_t stride) {
  check_tile(t);
  ++tile_counts().stores[t];
  const EmulatedTiles& s = emulated_tiles();
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, s.data[t][r], s.colsb[t]);
}

// C (m x n F32) += A (m x k pairs) · B (k pair rows x n pairs), as the SDM's pseudo-code reads.
inline void emulated_tile_dpbf16ps(int c, int a, int b) {
  check_tile(c);
  check_tile(a);
  check_tile(b);
  ++tile_counts().products;
  EmulatedTiles& s = emulated_tiles();
  const int m_rows = s.rows[c], k_pairs = s.colsb[a] / 4, n_cols = s.colsb[c] / 4;
  if (s.colsb[c] != s.colsb[b] || s.rows[b] != k_pairs || s.rows[a] != m_rows) {
    amx_fault("TDPBF16PS operand shapes do not fit", c);
  }
  for (int m = 0; m < m_rows; ++m) {
    for (int n = 0; n < n_cols; ++n) {
      float even = 0.0f, odd = 0.0f;
      for (int k = 0; k < k_pairs; ++k) {
        uint16_t a_pair[2], b_pair[2];
        std::memcpy(a_pair, &s.data[a][m][4 * k], 4);
        std::memcpy(b_pair, &s.data[b][k][4 * n], 4);
        even = flush_denormal(std::fma(bf16_value(a_pair[0]), bf16_value(b_pair[0]), even));
        odd = flush_denormal(std::fma(bf16_value(a_pair[1]), bf16_value(b_pair[1]), odd));
      }
      float acc;
      std::memcpy(&acc, &s.data[c][m][4 * n], 4);
      acc = flush_denormal(flush_denormal(acc) + flush_denormal(even + odd));
      std::memcpy(&s.data[c][m][4 * n], &acc, 4);
    }
  }
}

}  // namespace grouplin::kernels::emulated

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadconfig(config) grouplin::kernels::emulated::emulated_tile_loadconfig(config)
#define _tile_release() grouplin::kernels::emulated::emulated_tile_release()
#define _tile_zero(t) grouplin::kernels::emulated::emulated_tile_zero(t)
#define _tile_loadd(t, base, stride) \
  grouplin::kernels::emulated::emulated_tile_loadd(t, base, stride)
#define _tile_stored(t, base, stride) \
  grouplin::kernels::emulated::emulated_tile_stored(t, base, stride)
#define _tile_dpbf16ps(c, a, b) grouplin::kernels::emulated::emulated_tile_dpbf16ps(c, a, b)
