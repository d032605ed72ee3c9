// Test helper: two state dicts hold the same entries, names and bits.
#pragma once

#include <gtest/gtest.h>

#include "grouplin/state_dict.hpp"

namespace grouplin::testing {

// `got` has exactly the names of `want`, each entry bit_equal (dtype, shape, bytes).
inline void expect_same_dict(const StateDict& got, const StateDict& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    EXPECT_TRUE(got.at(name).bit_equal(t)) << name;
  }
}

}  // namespace grouplin::testing
