// StateDict: insertion order, duplicate names, replace in place, erase, lookups.
#include "grouplin/state_dict.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grouplin/error.hpp"

namespace grouplin {
namespace {

Tensor filled(float v) { return Tensor::from_f32({2}, std::vector<float>{v, v}); }

float first(const Tensor& t) { return t.data_as<float>()[0]; }

// "k<i>" (built with +=: GCC 12 warns falsely on "literal" + std::string, bug 105651).
std::string key(int i) {
  std::string s = "k";
  s += std::to_string(i);
  return s;
}

TEST(StateDictTest, EmptyDict) {
  StateDict sd;
  EXPECT_TRUE(sd.empty());
  EXPECT_EQ(sd.size(), 0u);
  EXPECT_EQ(sd.find("a"), nullptr);
  EXPECT_FALSE(sd.contains("a"));
  EXPECT_TRUE(sd.keys().empty());
  EXPECT_EQ(sd.begin(), sd.end());
}

TEST(StateDictTest, IteratesInInsertionOrderNotSortedOrder) {
  StateDict sd;
  const std::vector<std::string> names = {"z.weight", "a.bias", "m.weight10", "m.weight2"};
  for (size_t i = 0; i < names.size(); ++i) sd.insert(names[i], filled(static_cast<float>(i)));
  EXPECT_EQ(sd.keys(), names);
  size_t i = 0;
  for (const auto& [name, tensor] : sd) {
    EXPECT_EQ(name, names[i]);
    EXPECT_EQ(first(tensor), static_cast<float>(i));
    ++i;
  }
  EXPECT_EQ(i, names.size());
  EXPECT_FALSE(sd.empty());
}

TEST(StateDictTest, InsertDuplicateThrowsNamingTheKeyAndKeepsTheFirst) {
  StateDict sd;
  sd.insert("fc1.weight0", filled(1.0f));
  try {
    sd.insert("fc1.weight0", filled(2.0f));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DuplicateName);
    EXPECT_NE(e.message().find("fc1.weight0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(sd.size(), 1u);
  EXPECT_EQ(first(sd.at("fc1.weight0")), 1.0f);
}

TEST(StateDictTest, SetReplacesInPlaceOrAppends) {
  StateDict sd;
  sd.insert("a", filled(1.0f));
  sd.insert("b", filled(2.0f));
  sd.insert("c", filled(3.0f));
  sd.set("b", filled(20.0f));
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(first(sd.at("b")), 20.0f);
  sd.set("d", filled(4.0f));
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(first(sd.at("d")), 4.0f);
}

TEST(StateDictTest, EraseKeepsLookupsOfLaterEntriesRight) {
  StateDict sd;
  for (int i = 0; i < 5; ++i) sd.insert(key(i), filled(static_cast<float>(i)));
  EXPECT_TRUE(sd.erase("k1"));
  EXPECT_FALSE(sd.erase("k1"));
  EXPECT_FALSE(sd.erase("absent"));
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"k0", "k2", "k3", "k4"}));
  // Every remaining key still finds its own tensor (the index was shifted, not left stale).
  for (int i : {0, 2, 3, 4}) {
    const Tensor* t = sd.find(key(i));
    ASSERT_NE(t, nullptr) << i;
    EXPECT_EQ(first(*t), static_cast<float>(i));
  }
  EXPECT_EQ(sd.find("k1"), nullptr);
  // set on a shifted entry replaces that entry, not its old position.
  sd.set("k4", filled(40.0f));
  EXPECT_EQ(first(sd.at("k4")), 40.0f);
  EXPECT_EQ(first(sd.at("k3")), 3.0f);
  // A re-inserted key goes to the end.
  sd.insert("k1", filled(10.0f));
  EXPECT_EQ(sd.keys().back(), "k1");
  EXPECT_EQ(first(sd.at("k1")), 10.0f);
  EXPECT_EQ(sd.size(), 5u);
}

TEST(StateDictTest, EraseFirstAndLast) {
  StateDict sd;
  sd.insert("a", filled(1.0f));
  sd.insert("b", filled(2.0f));
  sd.insert("c", filled(3.0f));
  EXPECT_TRUE(sd.erase("a"));
  EXPECT_TRUE(sd.erase("c"));
  EXPECT_EQ(sd.keys(), std::vector<std::string>{"b"});
  EXPECT_EQ(first(sd.at("b")), 2.0f);
  EXPECT_TRUE(sd.erase("b"));
  EXPECT_TRUE(sd.empty());
}

TEST(StateDictTest, AtOnMissingKeyThrowsMissingKeyNamingIt) {
  StateDict sd;
  sd.insert("decoder.fc1.weight0", filled(1.0f));
  try {
    sd.at("decoder.fc1.weight1");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::MissingKey);
    EXPECT_NE(e.message().find("decoder.fc1.weight1"), std::string::npos) << e.what();
  }
}

TEST(StateDictTest, HoldsViewsAndCopiesShareTensorsNotBytes) {
  Tensor t = filled(1.0f);
  StateDict sd;
  sd.insert("w", t);
  EXPECT_TRUE(sd.at("w").same_view(t));
  StateDict copy = sd;
  EXPECT_TRUE(copy.at("w").same_view(t));
  t.mutable_data_as<float>()[0] = 5.0f;  // visible through both dicts: no bytes were copied
  EXPECT_EQ(first(sd.at("w")), 5.0f);
  EXPECT_EQ(first(copy.at("w")), 5.0f);
  // Changing the copy's entries leaves the original dict alone.
  copy.set("w", filled(7.0f));
  copy.insert("extra", filled(8.0f));
  EXPECT_EQ(first(sd.at("w")), 5.0f);
  EXPECT_EQ(sd.size(), 1u);
}

}  // namespace
}  // namespace grouplin
