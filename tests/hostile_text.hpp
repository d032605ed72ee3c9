// Characters a hostile file uses to recolour, move or reorder the line a message is printed on,
// and the check that a message carries none of them raw: each must come out escaped.
//
//   for (const HostileControl& c : kHostileControls) {
//     expect_escaped(message_of(index_with(c.raw)), c);
//   }
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace grouplin::test_text {

struct HostileControl {
  std::string raw;      // its UTF-8 bytes
  std::string escaped;  // how grouplin::escaped writes it
};

// DEL, C1 controls (U+0085 NEL, U+009B CSI) and Unicode's direction controls.
inline const std::vector<HostileControl> kHostileControls = {
    {"\x7f", "\\x7f"},            // DEL
    {"\xc2\x85", "\\u0085"},      // NEL
    {"\xc2\x9b", "\\u009b"},      // CSI
    {"\xe2\x80\xae", "\\u202e"},  // RIGHT-TO-LEFT OVERRIDE
    {"\xe2\x81\xa6", "\\u2066"},  // LEFT-TO-RIGHT ISOLATE
    {"\xe2\x80\x8f", "\\u200f"},  // RIGHT-TO-LEFT MARK
    {"\xd8\x9c", "\\u061c"},      // ARABIC LETTER MARK
};

// `message` shows `c` escaped and never holds its raw bytes.
inline void expect_escaped(const std::string& message, const HostileControl& c) {
  EXPECT_EQ(message.find(c.raw), std::string::npos) << "raw " << c.escaped << " in: " << message;
  EXPECT_NE(message.find(c.escaped), std::string::npos) << c.escaped << " not in: " << message;
}

}  // namespace grouplin::test_text
