// Private: UTF-8 validation shared by every reader and writer of names, and by the quoting of
// names in messages (grouplin::quote). One decoder, two policies: safetensors names follow
// Rust's str (no surrogates), pickle strings follow Python's pickle, which writes lone
// surrogates ("surrogatepass").
#pragma once

#include <cstddef>
#include <string_view>

namespace grouplin::utf8 {

// Length of the valid UTF-8 character starting at s[i] (1-4), or 0 if the bytes there are not
// one: overlong forms, code points above U+10FFFF, truncated sequences, stray continuation bytes,
// and surrogates unless `allow_surrogates`. Requires: i < s.size().
size_t char_length(std::string_view s, size_t i, bool allow_surrogates = false);

// Offset of the first byte of `s` that does not start a valid character, or s.size().
size_t error_offset(std::string_view s, bool allow_surrogates = false);

// True when every byte of `s` belongs to a valid character.
inline bool is_valid(std::string_view s, bool allow_surrogates = false) {
  return error_offset(s, allow_surrogates) == s.size();
}

// The code point of the valid character of `len` bytes at s[i] (as char_length returned).
char32_t decode(std::string_view s, size_t i, size_t len);

}  // namespace grouplin::utf8
