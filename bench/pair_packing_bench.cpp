// Pair-panel packing (the BF16 weights of the AVX512-BF16 and AMX pair kernels, packed every call),
// same run: the first loops (kept here as the baseline: a memset of the panels, then one scalar
// store per dword), the current code on the portable set, and on the CPU's set (AVX2: 8 x 8 dword
// transposes for forward's panels, 16-bit unpacks for dgrad's).
//
//   build/bench/pair_packing_bench [out in reps]     (default: a 2048 x 768 BF16 expert, 5)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "best_seconds.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/packing.hpp"

using namespace grouplin;
using namespace grouplin::kernels;

namespace {

void first_transposed(const MatrixRef& m, int64_t k0, int64_t kc, int64_t c0, int64_t cols,
                      uint32_t* bp) {
  const int64_t dwords = pair_panel_dwords(kc), pairs = (kc + 1) / 2;
  const int64_t panels = (cols + kOuterCols - 1) / kOuterCols;
  std::memset(bp, 0, static_cast<size_t>(panels * dwords) * sizeof(uint32_t));
  for (int64_t j = 0; j < cols; ++j) {
    const auto* row = reinterpret_cast<const uint16_t*>(element(m, c0 + j, k0));
    uint32_t* dst = bp + j / kOuterCols * dwords + j % kOuterCols;
    for (int64_t r = 0; r < kc / 2; ++r) {
      uint32_t pair;
      std::memcpy(&pair, row + 2 * r, sizeof pair);
      dst[r * kOuterCols] = pair;
    }
    if (kc % 2 != 0) dst[(pairs - 1) * kOuterCols] = row[kc - 1];
  }
}

void first_rows(const MatrixRef& m, int64_t r0, int64_t kc, int64_t c0, int64_t cols,
                uint32_t* bp) {
  const int64_t dwords = pair_panel_dwords(kc), pairs = (kc + 1) / 2;
  const int64_t panels = (cols + kOuterCols - 1) / kOuterCols;
  std::memset(bp, 0, static_cast<size_t>(panels * dwords) * sizeof(uint32_t));
  for (int64_t r = 0; r < pairs; ++r) {
    const auto* even = reinterpret_cast<const uint16_t*>(element(m, r0 + 2 * r, c0));
    const uint16_t* odd = 2 * r + 1 < kc ? even + m.ld : nullptr;
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t high = odd != nullptr ? uint32_t{odd[j]} << 16 : 0;
      bp[j / kOuterCols * dwords + r * kOuterCols + j % kOuterCols] = even[j] | high;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t out = argc > 1 ? std::atol(argv[1]) : 2048,
                in = argc > 2 ? std::atol(argv[2]) : 768;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  std::vector<uint16_t> w(static_cast<size_t>(out * in));
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(0x3c00 + i % 1021);
  const MatrixRef m{reinterpret_cast<const std::byte*>(w.data()), DType::BF16, in};
  // As pair_product packs for the AMX set: 32 columns (2 strips) x the whole depth at a time.
  std::vector<uint32_t> fwd(static_cast<size_t>(2 * pair_panel_dwords(in)));
  std::vector<uint32_t> bwd(static_cast<size_t>(2 * pair_panel_dwords(out)));
  const double bytes = static_cast<double>(out * in * 2);
  std::printf("%ld x %ld BF16 weights, best of %d, GB/s of weights packed\n",
              static_cast<long>(out), static_cast<long>(in), reps);
  for (int v = 0; v < 3; ++v) {
    force_portable_kernels(v == 1);
    const char* name = v == 0 ? "first loops" : v == 1 ? "portable" : micro_kernels().name;
    const double f = best_seconds(reps, [&] {
      for (int64_t c = 0; c < out; c += 32) {
        if (v == 0)
          first_transposed(m, 0, in, c, std::min<int64_t>(32, out - c), fwd.data());
        else
          pack_pairs_transposed(m, 0, in, c, std::min<int64_t>(32, out - c), fwd.data());
      }
    });
    const double b = best_seconds(reps, [&] {
      for (int64_t c = 0; c < in; c += 32) {
        if (v == 0)
          first_rows(m, 0, out, c, std::min<int64_t>(32, in - c), bwd.data());
        else
          pack_pairs_rows(m, 0, out, c, std::min<int64_t>(32, in - c), bwd.data());
      }
    });
    std::printf("  %-12s forward panels %6.2f GB/s   dgrad panels %6.2f GB/s\n", name,
                bytes / f / 1e9, bytes / b / 1e9);
  }
  force_portable_kernels(false);
  return 0;
}
