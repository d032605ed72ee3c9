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
TEST(ErrorCodeTest, QuotedWrapsTheNameInDoubleQuotes) {
  EXPECT_EQ(quoted("model.pt"), "\"model.pt\"");
  EXPECT_EQ(quoted(""), "\"\"");
  EXPECT_EQ(quoted(std::string_view("a\0b", 3)), std::string("\"a\0b\"", 5));
}

}  // namespace
}  // namespace grouplin
