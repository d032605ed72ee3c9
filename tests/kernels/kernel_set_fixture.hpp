// Test-only: the fixture of the kernel-set tests (emulated_kernels_test.cpp,
// emulated_fp8_kernels_test.cpp): each AVX-512-level set twice, compiled against emulated
// intrinsics (runs wherever the CPU has AVX2 and FMA) and natively (runs only where the CPU has
// the instruction set; skipped otherwise, with the reason printed, so a log shows which ran).
//
//   class MySetTest : public KernelSetTest {};
//   TEST_P(MySetTest, Something) { kernels::force_kernels(&*set_); ... }
//   INSTANTIATE_TEST_SUITE_P(Sets, MySetTest, ::testing::ValuesIn(sets_under_test()), set_name);
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "emulated_kernels.hpp"
#include "grouplin/dtype.hpp"
#include "kernel_reference.hpp"
#include "kernels/isa.hpp"
#include "kernels/micro_kernels.hpp"
#include "kernels/micro_kernels_x86.hpp"
#include "kernels/thread_pool.hpp"

namespace grouplin::kernel_test {

enum class Level { kAvx512, kAvx512Bf16, kAmx };

struct SetUnderTest {
  Level level;
  bool native;
  const char* name;
};

inline void PrintTo(const SetUnderTest& u, std::ostream* os) { *os << u.name; }

// The set, or why it cannot run on this CPU.
inline std::optional<kernels::MicroKernels> make_set(const SetUnderTest& u, std::string& why_not) {
  const kernels::MicroKernels* avx2 = kernels::avx2_kernels();
  if (avx2 == nullptr) {
    why_not =
        "this CPU lacks AVX2+FMA, which the AVX-512 sets build on (and the emulation runs on)";
    return std::nullopt;
  }
  kernels::MicroKernels set = *avx2;
  if (u.native) {
    const kernels::CpuFeatures f = kernels::detect_cpu();
    const bool has = u.level == Level::kAvx512       ? f.avx512f
                     : u.level == Level::kAvx512Bf16 ? f.avx512bf16
                                                     : f.amx_bf16 && f.avx512bf16;
    if (!has) {
      why_not = std::string("this CPU (") + kernels::describe(f) + ") lacks what the native " +
                u.name + " kernels need; their emulated twins ran instead";
      return std::nullopt;
    }
    kernels::native::add_avx512(set);
    if (u.level >= Level::kAvx512Bf16) kernels::native::add_avx512bf16(set);
    if (u.level >= Level::kAvx512Bf16 && f.avx512vbmi) kernels::native::add_fp8_pairs(set);
    if (u.level == Level::kAmx) kernels::native::add_amx(set);
  } else {
    kernels::emulated::add_avx512(set);
    if (u.level >= Level::kAvx512Bf16) kernels::emulated::add_avx512bf16(set);
    if (u.level >= Level::kAvx512Bf16) kernels::emulated::add_fp8_pairs(set);
    if (u.level == Level::kAmx) kernels::emulated::add_amx(set);
  }
  return set;
}

inline std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  const std::vector<float> f = random_floats(n, seed);
  for (size_t i = 0; i < n; ++i) v[i] = f32_to_bf16(f[i]);
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class KernelSetTest : public ::testing::TestWithParam<SetUnderTest> {
 protected:
  void SetUp() override {
    std::string why_not;
    set_ = make_set(GetParam(), why_not);
    if (!set_) GTEST_SKIP() << "skipped: " << GetParam().name << ": " << why_not;
    avx2_ = kernels::avx2_kernels();
    std::printf("running: %s kernels (%s)\n", set_->name,
                GetParam().native ? "native" : "emulated");
  }
  void TearDown() override {
    kernels::force_kernels(nullptr);
    kernels::set_num_threads(saved_threads_);
  }
  bool has_pairs() const { return set_->pair_tile != nullptr; }

  std::optional<kernels::MicroKernels> set_;
  const kernels::MicroKernels* avx2_ = nullptr;
  int saved_threads_ = kernels::num_threads();
};

// Every set, emulated and native.
inline std::vector<SetUnderTest> sets_under_test() {
  return {{Level::kAvx512, false, "avx512f_emulated"},
          {Level::kAvx512Bf16, false, "avx512bf16_emulated"},
          {Level::kAmx, false, "amx_emulated"},
          {Level::kAvx512, true, "avx512f_native"},
          {Level::kAvx512Bf16, true, "avx512bf16_native"},
          {Level::kAmx, true, "amx_native"}};
}
inline std::string set_name(const ::testing::TestParamInfo<SetUnderTest>& info) {
  return info.param.name;
}

}  // namespace grouplin::kernel_test
