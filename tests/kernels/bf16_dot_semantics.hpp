// Test-only: the scalar arithmetic of the BF16 dot-product instructions as the Intel SDM documents
// it, shared by the emulated instructions (x86_emulation.hpp, amx_emulator.hpp) and the tests'
// bit-exact models of the pair kernels' chains. Plain C++: no intrinsics, any CPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace grouplin::kernels::emulated {

// Denormals read as zero or flushed to zero (sign kept): what VDPBF16PS and TDPBF16PS do to
// their inputs and results.
inline float flush_denormal(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// A BF16 operand as the instructions read it: widened exactly, a denormal read as zero.
inline float bf16_value(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return flush_denormal(f);
}

// One lane of VDPBF16PS (Intel SDM, "Operation"): srcdest += src1.bf16[1] * src2.bf16[1], then
// srcdest += src1.bf16[0] * src2.bf16[0], each one fused multiply-add rounded to nearest even;
// inputs and results with denormals flushed to zero. a and b are the lane's dwords (low half:
// element 0).
inline float dpbf16_lane(float acc, uint32_t a, uint32_t b) {
  acc = flush_denormal(acc);
  acc = flush_denormal(std::fma(bf16_value(static_cast<uint16_t>(a >> 16)),
                                bf16_value(static_cast<uint16_t>(b >> 16)), acc));
  return flush_denormal(
      std::fma(bf16_value(static_cast<uint16_t>(a)), bf16_value(static_cast<uint16_t>(b)), acc));
}

}  // namespace grouplin::kernels::emulated
