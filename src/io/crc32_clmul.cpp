// CRC-32 by folding with carry-less multiplication (see io/crc32_clmul.hpp).
//
// The message is kept as four 128-bit lanes; each step multiplies every lane by x^512 mod P (split
// in two 64-bit halves, constants k1, k2) and adds the next 64 bytes, which keeps the value of
// the message mod P. The four lanes are then folded into one (x^128 mod P: k3, k4), 16 bytes at
// a time after that, and the last 16 bytes plus any tail go through the table CRC starting from
// zero: a message congruent mod P, ending at the same place, has the same CRC.
// Constants for the bit-reflected polynomial 0xEDB88320, as in the paper and the Linux kernel
// (arch/x86/crypto/crc32-pclmul_asm.S): k1 = x^(4*128+32) mod P etc., bit-reflected and shifted.
#include "io/crc32_clmul.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>

#include "io/zip.hpp"

namespace grouplin::zip {

#if defined(__x86_64__)

namespace {

constexpr uint64_t kK1 = 0x154442bd4;  // fold by 4 x 128 bits, low half
constexpr uint64_t kK2 = 0x1c6e41596;  // fold by 4 x 128 bits, high half
constexpr uint64_t kK3 = 0x1751997d0;  // fold by 128 bits, low half
constexpr uint64_t kK4 = 0x0ccaa009e;  // fold by 128 bits, high half

__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
  __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), next);
}

__attribute__((target("pclmul,sse4.1"))) inline __m128i load(const std::byte* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

}  // namespace

bool crc32_clmul_supported() {
  static const bool ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return ok;
}

__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_clmul(uint32_t crc,
                                                              std::span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  size_t n = bytes.size();
  if (n < 64) return crc32(crc, bytes);

  // The pre-conditioning of the CRC (~crc) is added to the first 4 bytes; the final ~ is done by
  // the table CRC at the end, which is given a raw remainder of zero (crc argument ~0).
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(~crc)));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += 64;
  n -= 64;
  const __m128i k12 = _mm_set_epi64x(static_cast<long long>(kK2), static_cast<long long>(kK1));
  while (n >= 64) {
    x0 = fold(x0, k12, load(p));
    x1 = fold(x1, k12, load(p + 16));
    x2 = fold(x2, k12, load(p + 32));
    x3 = fold(x3, k12, load(p + 48));
    p += 64;
    n -= 64;
  }
  const __m128i k34 = _mm_set_epi64x(static_cast<long long>(kK4), static_cast<long long>(kK3));
  __m128i x = fold(x0, k34, x1);
  x = fold(x, k34, x2);
  x = fold(x, k34, x3);
  while (n >= 16) {
    x = fold(x, k34, load(p));
    p += 16;
    n -= 16;
  }
  alignas(16) std::byte last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), x);
  // crc32(c, ...) starts from ~c: pass ~0 for a raw start of 0.
  uint32_t raw_start = 0xFFFFFFFFu;
  uint32_t r = crc32(raw_start, std::span<const std::byte>(last, 16));
  return crc32(r, std::span<const std::byte>(p, n));
}

#else  // not x86-64: no PCLMULQDQ, and crc32 uses its tables

bool crc32_clmul_supported() { return false; }

uint32_t crc32_clmul(uint32_t crc, std::span<const std::byte> bytes) { return crc32(crc, bytes); }

#endif

}  // namespace grouplin::zip
