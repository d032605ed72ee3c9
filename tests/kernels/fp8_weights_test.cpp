// FP8 weights in the grouped GEMM kernels: the decoding micro-kernel of every compiled set against
// the definition, and forward and dgrad on FP8 weights against the dequantized weights on the
// portable set and the CPU's own (the emulated AVX-512 and AMX sets: emulated_kernels_test.cpp).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fp8_problem.hpp"
#include "grouplin/dtype.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin::kernel_test {
namespace {

// Every code, at every offset of an 8-lane step (so the tails run too), under scales that are
// powers of two, ordinary, tiny (products turn subnormal), huge (products overflow) and negative.
void expect_decode_defined(const kernels::MicroKernels& mk) {
  for (float scale : {1.0f, 0.7071f, 3.0e-39f, 1.0e36f, -2.5f}) {
    std::vector<uint8_t> codes(256 + 7);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 + 11);
    for (int64_t offset = 0; offset < 8; ++offset) {
      const int64_t n = 256 - offset;
      std::vector<float> got(static_cast<size_t>(n));
      mk.decode_e4m3(codes.data() + offset, scale, got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const float want = f8e4m3_to_f32(codes[static_cast<size_t>(offset + i)]) * scale;
        ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]),
                  std::bit_cast<uint32_t>(want))
            << mk.name << " code " << int{codes[static_cast<size_t>(offset + i)]} << " scale "
            << scale;
      }
    }
  }
}

TEST(Fp8Weights, DecodeIsCodeTimesScaleInEverySet) {
  expect_decode_defined(kernels::portable_kernels());
  if (kernels::avx2_kernels() == nullptr) {
    GTEST_SKIP() << "skipped: the AVX2 set (this CPU lacks AVX2+FMA, or the build has no x86 code)";
  }
  expect_decode_defined(*kernels::avx2_kernels());
  expect_decode_defined(kernels::micro_kernels());
}

// Forward and dgrad on FP8 weights give the bits of F32 weights holding the dequantized values
// (or, with BF16 activations on a set with the FP8 pair kernels, their models'), whatever the
// tiles: portable set (which decodes into scratch), the CPU's best (AVX2: decoded in registers),
// one and three threads, F32 and BF16 activations.
TEST(Fp8Weights, ForwardAndDgradGiveTheDequantizedWeightsBits) {
  const int saved = kernels::num_threads();
  for (const kernels::MicroKernels* set :
       {&kernels::portable_kernels(), (const kernels::MicroKernels*)nullptr}) {
    kernels::force_kernels(set);
    for (int threads : {1, 3}) {
      kernels::set_num_threads(threads);
      for (const Case& c : fp8_cases()) {
        for (DType dt : {DType::F32, DType::BF16}) {
          Fp8Problem p(c, dt);
          p.expect_dequantized_bits(c, std::string(kernels::micro_kernels().name) + " " + c.name +
                                           " " + std::string(dtype_name(dt)) + " threads " +
                                           std::to_string(threads));
          p.expect_same_bits_by_tiles(c, {{7, 48, 1, 16}, {12, 48, 6, 16}});
        }
      }
    }
  }
  kernels::force_kernels(nullptr);
  kernels::set_num_threads(saved);
}

}  // namespace
}  // namespace grouplin::kernel_test
