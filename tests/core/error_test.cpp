// Error and ErrorCode: every code has a unique printable name, and what() is "<Name>: <message>".
// The table below is built from the GROUPLIN_ERROR_CODES X-macro, so a new code is walked here
// without editing this file.
#include "grouplin/error.hpp"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace grouplin {
namespace {

struct CodeRow {
  ErrorCode code;
  const char* spelled;  // the identifier as written in the X-macro
};

const std::vector<CodeRow>& all_codes() {
  static const std::vector<CodeRow> rows = {
#define GROUPLIN_TEST_ROW(name) {ErrorCode::name, #name},
      GROUPLIN_ERROR_CODES(GROUPLIN_TEST_ROW)
#undef GROUPLIN_TEST_ROW
  };
  return rows;
}

TEST(ErrorCodeTest, EveryCodeHasItsOwnSpelledName) {
  std::set<std::string> seen;
  for (const CodeRow& row : all_codes()) {
    const std::string name(error_code_name(row.code));
    SCOPED_TRACE(row.spelled);
    EXPECT_EQ(name, row.spelled);
    EXPECT_NE(name, "Unknown");
    EXPECT_FALSE(name.empty());
    EXPECT_TRUE(seen.insert(name).second) << "duplicate name " << name;
  }
  EXPECT_EQ(seen.size(), all_codes().size());
}

TEST(ErrorCodeTest, CodesAreDistinctAndDense) {
  // The enum is generated from the same list: code k has underlying value k.
  for (size_t k = 0; k < all_codes().size(); ++k) {
    EXPECT_EQ(static_cast<size_t>(all_codes()[k].code), k) << all_codes()[k].spelled;
  }
}

TEST(ErrorCodeTest, ValueOutsideTheListIsUnknown) {
  const auto past_end = static_cast<ErrorCode>(all_codes().size());
  EXPECT_EQ(error_code_name(past_end), "Unknown");
}

TEST(ErrorTest, WhatIsNameColonMessageForEveryCode) {
  for (const CodeRow& row : all_codes()) {
    const std::string message = std::string("doing thing for ") + row.spelled;
    const Error e(row.code, message);
    SCOPED_TRACE(row.spelled);
    EXPECT_EQ(e.code(), row.code);
    EXPECT_EQ(e.message(), message);
    EXPECT_EQ(std::string(e.what()), std::string(row.spelled) + ": " + message);
  }
}

TEST(ErrorTest, IsARuntimeErrorCarryingItsCode) {
  try {
    throw Error(ErrorCode::SplitSumMismatch, "m_splits sum to 7, expected T = 8");
  } catch (const std::runtime_error& base) {
    EXPECT_STREQ(base.what(), "SplitSumMismatch: m_splits sum to 7, expected T = 8");
    const auto* e = dynamic_cast<const Error*>(&base);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->code(), ErrorCode::SplitSumMismatch);
    return;
  }
  FAIL() << "not caught as std::runtime_error";
}

TEST(ErrorTest, EmptyMessageKeepsThePrefix) {
  const Error e(ErrorCode::IoError, "");
  EXPECT_EQ(std::string(e.what()), "IoError: ");
  EXPECT_TRUE(e.message().empty());
}

// Messages name inputs in double quotes, whatever the name holds.
TEST(ErrorCodeTest, QuoteWrapsTheNameInDoubleQuotes) {
  EXPECT_EQ(quote("model.pt"), "\"model.pt\"");
  EXPECT_EQ(quote(""), "\"\"");
  EXPECT_EQ(quote("say \"hi\""), "\"say \\\"hi\\\"\"");
  EXPECT_EQ(quote("a\\b"), "\"a\\\\b\"");
}

// Regression: names from files reached the terminal raw, so a tensor named with an escape
// sequence could recolour, move the cursor or rewrite what `grouplin inspect` showed.
TEST(ErrorCodeTest, EscapedNeutralisesTerminalControls) {
  EXPECT_EQ(escaped("\x1b[2J\x1b]0;title\x07"), "\\x1b[2J\\x1b]0;title\\x07");
  EXPECT_EQ(escaped(std::string_view("a\0b\r\n\t\x7f", 7)), "a\\x00b\\x0d\\x0a\\x09\\x7f");
  // C1 controls (U+009B is CSI) and bidirectional overrides are valid UTF-8 but still hidden.
  EXPECT_EQ(escaped("x\xc2\x9by"), "x\\u009by");
  EXPECT_EQ(escaped("abc\xe2\x80\xae"
                    "def"),
            "abc\\u202edef");
  EXPECT_EQ(escaped("\xe2\x81\xa6"), "\\u2066");
  // Letters of any script stay readable.
  EXPECT_EQ(escaped("na\xc3\xafve \xe2\x82\xac \xf0\x9f\x98\x80"),
            "na\xc3\xafve \xe2\x82\xac \xf0\x9f\x98\x80");
  // Bytes that are not UTF-8: each shown as \xNN, the text after them kept.
  EXPECT_EQ(escaped("\xff\xc3(\xed\xa0\x80!"), "\\xff\\xc3(\\xed\\xa0\\x80!");
  EXPECT_EQ(escaped("\xe2\x82"), "\\xe2\\x82");  // truncated character
  EXPECT_EQ(quote("\x1b[31mred"), "\"\\x1b[31mred\"");
}

TEST(ErrorCodeTest, QuoteCutsLongNamesOnACharacterBoundary) {
  const std::string long_ascii(600, 'a');
  EXPECT_EQ(quote(long_ascii), "\"" + std::string(512, 'a') + "\"... (600 bytes)");
  // 511 ASCII bytes then a 2-byte character that would cross byte 512: cut before it.
  const std::string mixed = std::string(511, 'b') + "\xc3\xaf" + std::string(10, 'c');
  EXPECT_EQ(quote(mixed), "\"" + std::string(511, 'b') + "\"... (523 bytes)");
  const std::string exact(512, 'd');
  EXPECT_EQ(quote(exact), "\"" + exact + "\"");
}

TEST(DidYouMean, NamesTheClosestKnownNameOrNothing) {
  const std::vector<std::string> known = {"inspect", "convert", "verify", "qwen3_moe"};
  EXPECT_EQ(did_you_mean("conver", known), "; did you mean \"convert\"?");
  EXPECT_EQ(did_you_mean("Qwen3-MoE", known), "; did you mean \"qwen3_moe\"?");  // case, '-'
  EXPECT_EQ(did_you_mean("verfiy", known), "; did you mean \"verify\"?");        // 2 of 6 off
  EXPECT_EQ(did_you_mean("frobnicate", known), "");
  EXPECT_EQ(did_you_mean("x", {}), "");
}

}  // namespace
}  // namespace grouplin
