// The Error a call throws, for tests that check its code and message.
//
//   EXPECT_EQ(grouplin::testing::error_of([&] { layer.forward(x, splits); }).code(),
//             grouplin::ErrorCode::SplitSumMismatch);
#pragma once

#include <gtest/gtest.h>

#include "grouplin/error.hpp"

namespace grouplin::testing {

// The Error `f` throws; a call that throws none fails the test (and gives an InvalidArgument
// saying so).
template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no grouplin::Error was thrown";
  return Error(ErrorCode::InvalidArgument, "no error was thrown");
}

}  // namespace grouplin::testing
