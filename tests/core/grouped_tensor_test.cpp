// GroupedTensor: N members in one allocation, 64-byte aligned, zero-copy member views,
// build-from-members copying each member once.
#include "grouplin/grouped_tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/storage_stats.hpp"
#include "grouplin/error.hpp"

namespace grouplin {
namespace {

template <class F>
void expect_error(F&& f, ErrorCode code) {
  try {
    f();
    ADD_FAILURE() << "expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(error_code_name(e.code()), error_code_name(code)) << e.what();
  }
}

// Checks the layout invariants every group must have: one storage, aligned offsets, members
// inside the storage, no two members overlapping, shapes as requested.
void expect_valid_layout(const GroupedTensor& g, const std::vector<Shape>& shapes, DType dtype) {
  ASSERT_EQ(g.num_members(), static_cast<int64_t>(shapes.size()));
  EXPECT_EQ(g.dtype(), dtype);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(g.storage()->data()) % kStorageAlignment, 0u);
  size_t prev_end = 0;
  for (int64_t i = 0; i < g.num_members(); ++i) {
    SCOPED_TRACE("member " + std::to_string(i));
    Tensor m = g.member(i);
    EXPECT_EQ(m.shape(), shapes[static_cast<size_t>(i)]);
    EXPECT_EQ(m.dtype(), dtype);
    EXPECT_EQ(m.storage(), g.storage());
    EXPECT_EQ(m.storage_offset(), g.member_offset(i));
    EXPECT_EQ(g.member_offset(i) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data()) % 64, 0u);
    EXPECT_GE(g.member_offset(i), prev_end);
    prev_end = g.member_offset(i) + m.nbytes();
    EXPECT_LE(prev_end, g.storage()->size());
  }
}

TEST(GroupedTensorTest, UniformOddSizedMembersArePaddedToAlignment) {
  // 3 x 5 F32 = 60 bytes per member: not a multiple of 64, so members need padding.
  const detail::StorageStats before = detail::storage_stats();
  auto g = GroupedTensor::make_uniform(7, {3, 5}, DType::F32);
  EXPECT_EQ(detail::storage_stats().allocations - before.allocations, 1u);
  expect_valid_layout(g, std::vector<Shape>(7, Shape{3, 5}), DType::F32);
  for (const Tensor& m : g.members()) {
    for (int k = 0; k < 15; ++k) EXPECT_EQ(m.data_as<float>()[k], 0.0f);
  }
  EXPECT_FALSE(g.is_stackable());
  expect_error([&] { g.stacked(); }, ErrorCode::NotStackable);
}

TEST(GroupedTensorTest, BF16OddMembersAreAlignedToo) {
  auto g = GroupedTensor::make_uniform(5, {3}, DType::BF16);  // 6 bytes each
  expect_valid_layout(g, std::vector<Shape>(5, Shape{3}), DType::BF16);
  EXPECT_FALSE(g.is_stackable());
}

TEST(GroupedTensorTest, MembersAreZeroCopyViews) {
  auto g = GroupedTensor::make_uniform(4, {3, 5}, DType::F32);
  for (int64_t i = 0; i < 4; ++i) {
    Tensor m = g.member(i);
    for (int k = 0; k < 15; ++k) m.mutable_data_as<float>()[k] = static_cast<float>(100 * i + k);
  }
  // Writes through one view are seen by a fresh view and at the member's offset in storage.
  for (int64_t i = 0; i < 4; ++i) {
    const auto* raw = reinterpret_cast<const float*>(g.storage()->data() + g.member_offset(i));
    EXPECT_EQ(raw[14], static_cast<float>(100 * i + 14));
    EXPECT_TRUE(g.member(i).same_view(g.members()[static_cast<size_t>(i)]));
  }
}

TEST(GroupedTensorTest, AlignedUniformMembersStack) {
  // 4 x 4 F32 = 64 bytes per member: back to back, exposed as one [N, 4, 4] tensor.
  auto g = GroupedTensor::make_uniform(3, {4, 4}, DType::F32);
  expect_valid_layout(g, std::vector<Shape>(3, Shape{4, 4}), DType::F32);
  ASSERT_TRUE(g.is_stackable());
  Tensor s = g.stacked();
  EXPECT_EQ(s.shape(), (Shape{3, 4, 4}));
  EXPECT_EQ(s.storage(), g.storage());
  for (int64_t i = 0; i < 3; ++i) EXPECT_TRUE(s.select(i).same_view(g.member(i)));
  g.member(2).mutable_data_as<float>()[5] = 9.0f;
  EXPECT_EQ(s.data_as<float>()[2 * 16 + 5], 9.0f);
}

TEST(GroupedTensorTest, VaryingShapes) {
  const std::vector<Shape> shapes = {{2, 3}, {5}, {0}, {7, 1}, {1, 1, 17}, {}};
  auto g = GroupedTensor::make(shapes, DType::F32);
  expect_valid_layout(g, shapes, DType::F32);
  EXPECT_FALSE(g.is_stackable());
  expect_error([&] { g.stacked(); }, ErrorCode::NotStackable);
  // Writing the whole of each member never touches another member.
  for (int64_t i = 0; i < g.num_members(); ++i) {
    Tensor m = g.member(i);
    for (int64_t k = 0; k < m.numel(); ++k) m.mutable_data_as<float>()[k] = static_cast<float>(i);
  }
  for (int64_t i = 0; i < g.num_members(); ++i) {
    Tensor m = g.member(i);
    for (int64_t k = 0; k < m.numel(); ++k) EXPECT_EQ(m.data_as<float>()[k], static_cast<float>(i));
  }
}

TEST(GroupedTensorTest, SameShapeDifferentSizesAreNotStackable) {
  const std::vector<Shape> shapes = {{16}, {32}};  // 64 and 128 bytes: aligned, back to back
  auto g = GroupedTensor::make(shapes, DType::F32);
  EXPECT_FALSE(g.is_stackable());
}

TEST(GroupedTensorTest, FromMembersCopiesEachMemberOnceIntoOneAllocation) {
  std::vector<Tensor> src;
  size_t total = 0;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> v(15);
    for (int k = 0; k < 15; ++k) v[static_cast<size_t>(k)] = static_cast<float>(i) + 0.01f * k;
    src.push_back(Tensor::from_f32({3, 5}, v, DType::BF16));
    total += src.back().nbytes();
  }
  const detail::StorageStats before = detail::storage_stats();
  auto g = GroupedTensor::from_members(src);
  const detail::StorageStats after = detail::storage_stats();
  EXPECT_EQ(after.allocations - before.allocations, 1u);       // no intermediate stack
  EXPECT_EQ(after.copied_bytes - before.copied_bytes, total);  // each member once
  expect_valid_layout(g, std::vector<Shape>(5, Shape{3, 5}), DType::BF16);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(g.member(i).bit_equal(src[static_cast<size_t>(i)])) << i;
    EXPECT_NE(g.member(i).storage(), src[static_cast<size_t>(i)].storage());
  }
  // The group owns its bytes: changing a source later does not change the group.
  src[1].zero();
  EXPECT_FALSE(g.member(1).bit_equal(src[1]));
}

TEST(GroupedTensorTest, FromMembersAcceptsViewsAndVaryingShapes) {
  Tensor big = Tensor::from_f32({4, 3}, std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  std::vector<Tensor> src = {big.select(2), big.rows(0, 2), big.rows(1, 0)};
  auto g = GroupedTensor::from_members(src);
  expect_valid_layout(g, {{3}, {2, 3}, {0, 3}}, DType::F32);
  EXPECT_EQ(g.member(0).data_as<float>()[0], 6.0f);
  EXPECT_EQ(g.member(1).data_as<float>()[5], 5.0f);
}

TEST(GroupedTensorTest, FromMembersRejectsBadInput) {
  expect_error([] { GroupedTensor::from_members({}); }, ErrorCode::InvalidArgument);
  std::vector<Tensor> mixed = {Tensor::zeros({2}, DType::F32), Tensor::zeros({2}, DType::BF16)};
  expect_error([&] { GroupedTensor::from_members(mixed); }, ErrorCode::DTypeMismatch);
  std::vector<Tensor> undef = {Tensor::zeros({2}, DType::F32), Tensor()};
  expect_error([&] { GroupedTensor::from_members(undef); }, ErrorCode::UndefinedTensor);
}

TEST(GroupedTensorTest, MakeRejectsBadInput) {
  expect_error([] { GroupedTensor::make({}, DType::F32); }, ErrorCode::InvalidArgument);
  expect_error([] { GroupedTensor::make_uniform(0, {2}, DType::F32); }, ErrorCode::InvalidArgument);
  expect_error([] { GroupedTensor::make_uniform(-3, {2}, DType::F32); },
               ErrorCode::InvalidArgument);
  const std::vector<Shape> negative = {{2}, {-1}};
  expect_error([&] { GroupedTensor::make(negative, DType::F32); }, ErrorCode::InvalidArgument);
  const std::vector<Shape> huge = {{1}, {int64_t{1} << 62}} /* 2^64 bytes */;
  expect_error([&] { GroupedTensor::make(huge, DType::F32); }, ErrorCode::SizeOverflow);
}

TEST(GroupedTensorTest, MemberIndexIsChecked) {
  auto g = GroupedTensor::make_uniform(3, {2}, DType::F32);
  expect_error([&] { g.member(3); }, ErrorCode::OutOfBounds);
  expect_error([&] { g.member(-1); }, ErrorCode::OutOfBounds);
  GroupedTensor none;
  EXPECT_EQ(none.num_members(), 0);
  EXPECT_FALSE(none.is_stackable());
  EXPECT_TRUE(none.members().empty());
  expect_error([&] { none.member(0); }, ErrorCode::OutOfBounds);
}

TEST(GroupedTensorTest, MemberViewsOutliveTheGroup) {
  Tensor m;
  std::weak_ptr<Storage> weak;
  {
    auto g = GroupedTensor::make_uniform(2, {3}, DType::F32);
    weak = g.storage();
    m = g.member(1);
    m.mutable_data_as<float>()[2] = 4.0f;
  }
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(m.data_as<float>()[2], 4.0f);
}

}  // namespace
}  // namespace grouplin
