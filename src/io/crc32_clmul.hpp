// Private: CRC-32 (zip polynomial) by carry-less multiplication, for zip::crc32 on CPUs that have
// it.
//
//   if (grouplin::zip::crc32_clmul_supported()) crc = grouplin::zip::crc32_clmul(crc, bytes);
#pragma once

#include <cstdint>
#include <span>

namespace grouplin::zip {

// True when the CPU has PCLMULQDQ and SSE4.1 (checked once); always false in builds for other
// architectures than x86-64.
bool crc32_clmul_supported();

// The same value as zip::crc32(crc, bytes), computed by folding 64 bytes at a time with
// PCLMULQDQ (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ",
// Intel 2009). Inputs shorter than 64 bytes go to the table version, as do all inputs in builds
// for other architectures than x86-64.
// Requires: crc32_clmul_supported().
uint32_t crc32_clmul(uint32_t crc, std::span<const std::byte> bytes);

}  // namespace grouplin::zip
