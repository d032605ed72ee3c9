// How many bytes load_state_dict copies and how many storages it allocates (issue 3): at most
// one copy of each byte, straight into the module's storage, no stacked or split temporaries;
// assign=true adopts the source's storage and training copies it on first write.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/storage_stats.hpp"
#include "grouplin/optimizer.hpp"
#include "grouplin/storage.hpp"
#include "nn/load_test_util.hpp"

namespace grouplin {
namespace {

using testing::gl_options;
using testing::make_gl;

constexpr int64_t kN = 8, kIn = 16, kOut = 8;
constexpr uint64_t kWeightBytes = kN * kOut * kIn * 4, kBiasBytes = kN * kOut * 4;

std::shared_ptr<GroupedLinear> layer(WeightLayout l, uint64_t seed, DType dt = DType::F32) {
  return make_gl(gl_options(kN, l, seed, true, dt, kIn, kOut));
}

struct Delta {
  uint64_t allocations, copied_bytes;
};
template <class Fn>
Delta measure(Fn&& fn) {
  const detail::StorageStats a = detail::storage_stats();
  fn();
  const detail::StorageStats b = detail::storage_stats();
  return {b.allocations - a.allocations, b.copied_bytes - a.copied_bytes};
}

// The storage of every parameter, to prove the load wrote in place.
std::vector<const Storage*> storages(const Module& m) {
  std::vector<const Storage*> v;
  for (const Parameter& p : m.parameters()) v.push_back(p.value.storage().get());
  return v;
}

TEST(LoadCopies, PerExpertIntoSingleOrContiguousCopiesEachByteOnceInPlace) {
  for (WeightLayout from : {WeightLayout::PerExpert, WeightLayout::Contiguous}) {
    for (WeightLayout to : {WeightLayout::Single, WeightLayout::Contiguous}) {
      SCOPED_TRACE(std::string(layout_name(from)) + " -> " + std::string(layout_name(to)));
      auto src = layer(from, 1);
      auto dst = layer(to, 2);
      const StateDict sd = src->state_dict();
      const auto before = storages(*dst);
      const Delta d = measure([&] { dst->load_state_dict(sd); });
      EXPECT_EQ(d.copied_bytes, kWeightBytes + kBiasBytes);  // +0 for the empty _extra_state
      EXPECT_EQ(d.allocations, 0u);                          // no stacked temporary
      EXPECT_EQ(storages(*dst), before);
      testing::expect_same_experts(*src, *dst);
    }
  }
}

TEST(LoadCopies, NestedLoadCopiesEachByteOnce) {
  testing::Tree s =
      testing::make_tree(layer(WeightLayout::PerExpert, 1), layer(WeightLayout::Single, 3));
  testing::Tree t =
      testing::make_tree(layer(WeightLayout::Single, 2), layer(WeightLayout::Contiguous, 4));
  const StateDict sd = s.root->state_dict();
  const Delta d = measure([&] { t.root->load_state_dict(sd); });
  EXPECT_EQ(d.copied_bytes, 2 * (kWeightBytes + kBiasBytes));
  EXPECT_EQ(d.allocations, 0u);
  testing::expect_same_experts(*s.fc1, *t.fc1);
  testing::expect_same_experts(*s.fc2, *t.fc2);
}

TEST(LoadCopies, StackedIntoPerExpertCopiesEachByteOnceWithoutSplits) {
  for (WeightLayout to : {WeightLayout::PerExpert, WeightLayout::Contiguous}) {
    SCOPED_TRACE(std::string(layout_name(to)));
    auto src = layer(WeightLayout::Single, 1);
    auto dst = layer(to, 2);
    const StateDict sd = src->state_dict();
    const auto before = storages(*dst);
    const Delta d = measure([&] { dst->load_state_dict(sd); });
    EXPECT_EQ(d.copied_bytes, kWeightBytes + kBiasBytes);
    EXPECT_EQ(d.allocations, 0u);
    EXPECT_EQ(storages(*dst), before);  // copied, not adopted
    testing::expect_same_experts(*src, *dst);
  }
}

// A BF16 checkpoint converts element by element straight into the F32 parameters: the F32
// bytes are written once, and no converted temporary is allocated.
TEST(LoadCopies, DtypeConversionWritesInPlace) {
  for (WeightLayout from : testing::kLayouts) {
    for (WeightLayout to : testing::kLayouts) {
      auto src = layer(from, 1, DType::BF16);
      auto dst = layer(to, 2);
      const StateDict sd = src->state_dict();
      const Delta d = measure([&] { dst->load_state_dict(sd); });
      EXPECT_EQ(d.copied_bytes, kWeightBytes + kBiasBytes);
      EXPECT_EQ(d.allocations, 0u);
    }
  }
}

TEST(LoadCopies, AssignStackedIntoSingleSharesTheSourceUntilTraining) {
  auto src = layer(WeightLayout::Single, 1);
  auto dst = layer(WeightLayout::Single, 2);
  const StateDict sd = src->state_dict();
  const testing::Snapshot source_bits = testing::snapshot(sd);
  const Delta d = measure([&] { dst->load_state_dict(sd, LoadOptions{.assign = true}); });
  EXPECT_EQ(d.copied_bytes, 0u);
  EXPECT_EQ(d.allocations, 0u);
  const Parameter& w = dst->parameters()[0];
  EXPECT_TRUE(w.value.same_view(sd.at("weight")));
  EXPECT_EQ(w.value.data(), src->parameters()[0].value.data());  // the source's own bytes
  EXPECT_TRUE(dst->parameters()[1].value.same_view(sd.at("bias")));
  EXPECT_FALSE(w.value.writable());

  testing::expect_same_pass(testing::run_pass(*src), testing::run_pass(*dst));
  const Delta step = measure([&] { sgd_step(*dst, 0.25f); });
  EXPECT_EQ(step.copied_bytes, kWeightBytes + kBiasBytes);  // one private copy of each
  EXPECT_EQ(step.allocations, 2u);
  testing::expect_same(source_bits, sd);  // the source is untouched
  testing::expect_same(source_bits, src->state_dict());
  EXPECT_NE(dst->parameters()[0].value.data(), sd.at("weight").data());
  EXPECT_TRUE(dst->parameters()[0].value.writable());
  EXPECT_FALSE(dst->expert_weight(0).bit_equal(src->expert_weight(0)));  // it trained
  // A second step writes in place: no more copies.
  testing::run_pass(*dst);
  EXPECT_EQ(measure([&] { sgd_step(*dst, 0.25f); }).copied_bytes, 0u);
}

TEST(LoadCopies, AssignIntoPerExpertAdoptsEitherLayout) {
  for (WeightLayout from : testing::kLayouts) {
    SCOPED_TRACE(std::string(layout_name(from)));
    auto src = layer(from, 1);
    auto dst = layer(WeightLayout::PerExpert, 2);
    const StateDict sd = src->state_dict();
    const Delta d = measure([&] { dst->load_state_dict(sd, LoadOptions{.assign = true}); });
    EXPECT_EQ(d.copied_bytes, 0u);
    EXPECT_EQ(d.allocations, 0u);
    for (int64_t i = 0; i < kN; ++i) {
      EXPECT_TRUE(dst->expert_weight(i).same_view(src->expert_weight(i))) << i;
      EXPECT_TRUE(dst->expert_bias(i).same_view(src->expert_bias(i))) << i;
    }
    const testing::Snapshot source_bits = testing::snapshot(sd);
    testing::run_pass(*dst);
    sgd_step(*dst, 0.25f);
    testing::expect_same(source_bits, sd);
    EXPECT_FALSE(dst->expert_weight(0).bit_equal(src->expert_weight(0)));
  }
}

// Where the layout cannot adopt (per-expert into Single, anything into Contiguous) assign
// copies once, in place, and leaves nothing copy-on-write.
TEST(LoadCopies, AssignCopiesWhereTheLayoutCannotAdopt) {
  const std::pair<WeightLayout, WeightLayout> pairs[] = {
      {WeightLayout::PerExpert, WeightLayout::Single},
      {WeightLayout::Single, WeightLayout::Contiguous},
      {WeightLayout::PerExpert, WeightLayout::Contiguous}};
  for (auto [from, to] : pairs) {
    auto src = layer(from, 1);
    auto dst = layer(to, 2);
    const auto before = storages(*dst);
    const Delta d =
        measure([&] { dst->load_state_dict(src->state_dict(), LoadOptions{.assign = true}); });
    EXPECT_EQ(d.copied_bytes, kWeightBytes + kBiasBytes);
    EXPECT_EQ(d.allocations, 0u);
    EXPECT_EQ(storages(*dst), before);
    for (const Parameter& p : dst->parameters()) EXPECT_TRUE(p.value.writable());
  }
}

// A checkpoint in read-only memory (as a file mapping gives): stacked weight and bias views of
// one const buffer. assign adopts it; forward and backward read it; training copies it first.
TEST(LoadCopies, AssignFromReadOnlyStorage) {
  auto src = layer(WeightLayout::Single, 1);
  auto buffer = std::make_shared<std::vector<std::byte>>(kWeightBytes + kBiasBytes);
  std::memcpy(buffer->data(), src->parameters()[0].value.data(), kWeightBytes);
  std::memcpy(buffer->data() + kWeightBytes, src->parameters()[1].value.data(), kBiasBytes);
  const std::vector<std::byte> original = *buffer;
  auto storage = Storage::wrap(buffer->data(), buffer->size(), buffer);
  StateDict sd;
  sd.insert("weight", Tensor::view_of(storage, 0, {kN, kOut, kIn}, DType::F32));
  sd.insert("bias", Tensor::view_of(storage, kWeightBytes, {kN, kOut}, DType::F32));
  sd.insert("_extra_state", Tensor::zeros({0}, DType::U8));

  for (WeightLayout to : {WeightLayout::Single, WeightLayout::PerExpert}) {
    SCOPED_TRACE(std::string(layout_name(to)));
    auto dst = layer(to, 2);
    const Delta d = measure([&] { dst->load_state_dict(sd, LoadOptions{.assign = true}); });
    EXPECT_EQ(d.copied_bytes, 0u);
    EXPECT_EQ(d.allocations, 0u);
    EXPECT_FALSE(dst->parameters()[0].value.writable());
    EXPECT_EQ(dst->parameters()[0].value.storage(), storage);
    testing::expect_same_pass(testing::run_pass(*src), testing::run_pass(*dst));
    const Delta step = measure([&] { sgd_step(*dst, 0.25f); });
    EXPECT_EQ(step.copied_bytes, kWeightBytes + kBiasBytes);
    for (const Parameter& p : dst->parameters()) EXPECT_TRUE(p.value.writable()) << p.name;
    EXPECT_TRUE(*buffer == original);
    EXPECT_FALSE(dst->expert_weight(0).bit_equal(src->expert_weight(0)));
  }
  // Without assign the read-only checkpoint is copied into the module's own storage.
  auto dst = layer(WeightLayout::Contiguous, 2);
  const Delta d = measure([&] { dst->load_state_dict(sd); });
  EXPECT_EQ(d.copied_bytes, kWeightBytes + kBiasBytes);
  EXPECT_TRUE(dst->parameters()[0].value.writable());
  testing::expect_same_experts(*src, *dst);
}

// Regression: a load without assign into parameters that still borrow an earlier checkpoint
// cloned the borrowed bytes before overwriting them, copying every byte twice.
TEST(LoadCopies, LoadOverBorrowedParametersCopiesEachByteOnce) {
  for (WeightLayout to : {WeightLayout::Single, WeightLayout::PerExpert}) {
    SCOPED_TRACE(std::string(layout_name(to)));
    auto first = layer(WeightLayout::Single, 1);
    auto second = layer(WeightLayout::Single, 3);
    auto dst = layer(to, 2);
    dst->load_state_dict(first->state_dict(), LoadOptions{.assign = true});
    const StateDict sd = second->state_dict();
    const Delta d = measure([&] { dst->load_state_dict(sd); });
    EXPECT_EQ(d.copied_bytes, kWeightBytes + kBiasBytes);
    for (const Parameter& p : dst->parameters()) EXPECT_TRUE(p.value.writable()) << p.name;
    testing::expect_same_experts(*second, *dst);
    // The first checkpoint, borrowed until now, still holds its own values.
    EXPECT_FALSE(first->expert_weight(0).bit_equal(dst->expert_weight(0)));
  }
}

}  // namespace
}  // namespace grouplin
