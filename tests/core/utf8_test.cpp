#include "core/utf8.hpp"

#include <gtest/gtest.h>

#include <string>

namespace grouplin::utf8 {
namespace {

using std::string_literals::operator""s;

TEST(Utf8, ValidCharactersOfEveryLength) {
  EXPECT_TRUE(is_valid(""));
  EXPECT_TRUE(is_valid("plain ascii"));
  EXPECT_TRUE(is_valid("na\xc3\xafve \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_TRUE(is_valid("\x00"s));
  EXPECT_TRUE(is_valid("\xf4\x8f\xbf\xbf"));  // U+10FFFF, the last code point
  EXPECT_EQ(char_length("\xf0\x9f\x98\x80", 0), 4u);
  EXPECT_EQ(decode("\xf0\x9f\x98\x80", 0, 4), U'\U0001F600');
  EXPECT_EQ(decode("\xe2\x82\xac", 0, 3), U'\u20AC');
  EXPECT_EQ(decode("\xc3\xaf", 0, 2), U'\u00EF');
}

TEST(Utf8, IllFormedSequencesAreFoundAtTheirFirstByte) {
  EXPECT_EQ(error_offset("ab\xc3\x28"), 2u);         // bad continuation
  EXPECT_EQ(error_offset("\xc0\xaf"), 0u);           // overlong '/'
  EXPECT_EQ(error_offset("\xe0\x80\xaf"), 0u);       // overlong, 3 bytes
  EXPECT_EQ(error_offset("\xf0\x80\x80\xaf"), 0u);   // overlong, 4 bytes
  EXPECT_EQ(error_offset("x\xf4\x90\x80\x80"), 1u);  // past U+10FFFF
  EXPECT_EQ(error_offset("\xf5\x80\x80\x80"), 0u);
  EXPECT_EQ(error_offset("abc\x80"), 3u);      // stray continuation byte
  EXPECT_EQ(error_offset("abc\xe2\x82"), 3u);  // truncated at the end
}

TEST(Utf8, SurrogatesOnlyWhenAllowed) {
  const std::string lone = "\xed\xa0\x80";  // U+D800, as Python's "surrogatepass" writes it
  EXPECT_FALSE(is_valid(lone));
  EXPECT_TRUE(is_valid(lone, /*allow_surrogates=*/true));
  EXPECT_TRUE(is_valid("\xed\x9f\xbf"));  // U+D7FF, just below
}

}  // namespace
}  // namespace grouplin::utf8
