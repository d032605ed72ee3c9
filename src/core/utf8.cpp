// UTF-8 by Unicode's table 3-7 (well-formed byte sequences).
#include "core/utf8.hpp"

#include <cstdint>

namespace grouplin::utf8 {

size_t char_length(std::string_view s, size_t i, bool allow_surrogates) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return 1;
  // Lead byte: sequence length and the allowed range of the second byte.
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;                       // no overlong forms
    if (b == 0xED && !allow_surrogates) hi = 0x9F;  // U+D800..U+DFFF
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;  // no overlong forms
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;  // continuation byte, C0/C1 (overlong) or F5..FF
  }
  if (len > s.size() - i) return 0;
  const auto b1 = static_cast<uint8_t>(s[i + 1]);
  if (b1 < lo || b1 > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    const auto bk = static_cast<uint8_t>(s[i + k]);
    if (bk < 0x80 || bk > 0xBF) return 0;
  }
  return len;
}

size_t error_offset(std::string_view s, bool allow_surrogates) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = char_length(s, i, allow_surrogates);
    if (len == 0) return i;
    i += len;
  }
  return s.size();
}

char32_t decode(std::string_view s, size_t i, size_t len) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (len == 1) return b;
  char32_t cp = b & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  return cp;
}

}  // namespace grouplin::utf8
