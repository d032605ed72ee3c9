// Tensor and Storage: shapes, views into reference-counted storage, copies and conversions.
#include "grouplin/tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/storage_stats.hpp"
#include "grouplin/error.hpp"
#include "grouplin/storage.hpp"

namespace grouplin {
namespace {

template <class F>
void expect_error(F&& f, ErrorCode code, const std::string& needle = "") {
  try {
    f();
    ADD_FAILURE() << "expected " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(error_code_name(e.code()), error_code_name(code)) << e.what();
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.what();
  }
}

std::vector<float> iota(size_t n, float start = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

TEST(ShapeTest, NumelAndString) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(shape_numel({5, 0, 7}), 0);
  EXPECT_EQ(shape_to_string({2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(shape_to_string({}), "[]");
  expect_error([] { shape_numel({2, -1}); }, ErrorCode::InvalidArgument, "[2, -1]");
  const int64_t big = int64_t{1} << 32;
  expect_error([&] { shape_numel({big, big}); }, ErrorCode::SizeOverflow);
  // A leading zero dimension keeps the running product at zero.
  EXPECT_EQ(shape_numel({0, big, big}), 0);
}

TEST(TensorTest, ZerosIsZeroFilledAlignedAndWritable) {
  Tensor t = Tensor::zeros({3, 5}, DType::BF16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{3, 5}));
  EXPECT_EQ(t.rank(), 2u);
  EXPECT_EQ(t.dim(1), 5);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(t.dtype(), DType::BF16);
  EXPECT_TRUE(t.writable());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kStorageAlignment, 0u);
  for (size_t i = 0; i < t.nbytes(); ++i) EXPECT_EQ(t.data()[i], std::byte{0});
  Tensor empty = Tensor::zeros({0, 4}, DType::F32);
  EXPECT_TRUE(empty.defined());
  EXPECT_EQ(empty.nbytes(), 0u);
}

TEST(TensorTest, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_FALSE(t.writable());
  expect_error([&] { t.clone(); }, ErrorCode::UndefinedTensor);
  expect_error([&] { Tensor::zeros({1}, DType::F32).copy_from(t); }, ErrorCode::UndefinedTensor);
  expect_error([] { Tensor::view_of(nullptr, 0, {1}, DType::F32); }, ErrorCode::UndefinedTensor);
}

TEST(TensorTest, FromF32RoundsToTheTargetDType) {
  const std::vector<float> v = {1.0f / 3.0f, -2.5f, 1e-3f, 65504.0f};
  Tensor f = Tensor::from_f32({2, 2}, v);
  ASSERT_EQ(f.dtype(), DType::F32);
  EXPECT_EQ(std::memcmp(f.data(), v.data(), 16), 0);
  Tensor b = Tensor::from_f32({4}, v, DType::BF16);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(b.data_as<uint16_t>()[i], f32_to_bf16(v[i])) << i;
  }
  expect_error([&] { Tensor::from_f32({3}, v); }, ErrorCode::ShapeMismatch, "[3]");
}

// A slice of a storage knows its place in the root storage, through slices of slices and
// read-only aliases (what a checkpoint source reads a tensor's file offset from).
TEST(StorageTest, SlicesKnowTheirPlaceInTheirRoot) {
  std::shared_ptr<Storage> file = Storage::allocate(64);
  EXPECT_EQ(file->root(), file.get());
  EXPECT_EQ(file->root_offset(), 0u);
  std::shared_ptr<Storage> record = Storage::slice(file, 16, 32);
  std::shared_ptr<Storage> inner = Storage::slice(record, 8, 8);
  EXPECT_EQ(inner->root(), file.get());
  EXPECT_EQ(inner->root_offset(), 24u);
  EXPECT_EQ(inner->data(), file->data() + 24);
  EXPECT_TRUE(inner->writable());
  std::shared_ptr<Storage> alias = Storage::read_only_alias(inner);
  EXPECT_EQ(alias->root(), file.get());
  EXPECT_EQ(alias->root_offset(), 24u);
  EXPECT_FALSE(Storage::slice(alias, 0, 8)->writable());
  EXPECT_THROW(Storage::slice(record, 30, 4), Error);
  EXPECT_EQ(Storage::slice(record, 32, 0)->size(), 0u);
}

TEST(TensorTest, ViewOfChecksBoundsWithoutOverflow) {
  auto s = Storage::allocate(64);
  Tensor ok = Tensor::view_of(s, 48, {4}, DType::F32);  // bytes 48..64: exactly fits
  EXPECT_EQ(ok.storage_offset(), 48u);
  EXPECT_EQ(ok.data(), s->data() + 48);
  expect_error([&] { Tensor::view_of(s, 52, {4}, DType::F32); }, ErrorCode::OutOfBounds, "64");
  expect_error([&] { Tensor::view_of(s, 65, {0}, DType::F32); }, ErrorCode::OutOfBounds);
  // offset + nbytes would wrap around: must still be rejected.
  const size_t huge = std::numeric_limits<size_t>::max() - 8;
  expect_error([&] { Tensor::view_of(s, huge, {4}, DType::F32); }, ErrorCode::OutOfBounds);
  expect_error([&] { Tensor::view_of(s, 16, {int64_t{1} << 62}, DType::F32); },
               ErrorCode::SizeOverflow);
  EXPECT_EQ(Tensor::view_of(s, 64, {0}, DType::F32).nbytes(), 0u);
}

TEST(TensorTest, SelectIsAViewAtTheRightOffset) {
  Tensor t = Tensor::from_f32({3, 2, 2}, iota(12));
  Tensor s1 = t.select(1);
  EXPECT_EQ(s1.shape(), (Shape{2, 2}));
  EXPECT_EQ(s1.storage(), t.storage());
  EXPECT_EQ(s1.storage_offset(), 16u);
  EXPECT_EQ(s1.data_as<float>()[0], 5.0f);
  s1.mutable_data_as<float>()[3] = -1.0f;  // writes through to the parent
  EXPECT_EQ(t.data_as<float>()[7], -1.0f);
  // select of a select composes offsets.
  EXPECT_EQ(t.select(2).select(1).data_as<float>()[0], 11.0f);
  EXPECT_EQ(t.select(2).select(1).storage_offset(), 40u);
  expect_error([&] { t.select(3); }, ErrorCode::OutOfBounds, "select(3)");
  expect_error([&] { t.select(-1); }, ErrorCode::OutOfBounds);
  Tensor scalar = Tensor::zeros({}, DType::F32);
  expect_error([&] { scalar.select(0); }, ErrorCode::OutOfBounds);
}

TEST(TensorTest, RowsIsAViewOfARowRange) {
  Tensor t = Tensor::from_f32({5, 3}, iota(15), DType::BF16);
  Tensor r = t.rows(2, 2);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.storage(), t.storage());
  EXPECT_EQ(r.storage_offset(), 2u * 3u * 2u);
  EXPECT_EQ(bf16_to_f32(r.data_as<uint16_t>()[0]), 7.0f);
  EXPECT_EQ(t.rows(1, 3).rows(1, 1).storage_offset(), 2u * 3u * 2u);
  EXPECT_EQ(t.rows(5, 0).shape(), (Shape{0, 3}));
  EXPECT_EQ(t.rows(0, 5).nbytes(), t.nbytes());
  expect_error([&] { t.rows(4, 2); }, ErrorCode::OutOfBounds, "rows(4, 2)");
  expect_error([&] { t.rows(-1, 1); }, ErrorCode::OutOfBounds);
  expect_error([&] { t.rows(0, -1); }, ErrorCode::OutOfBounds);
  expect_error([&] { t.rows(6, 0); }, ErrorCode::OutOfBounds);
  expect_error([&] { t.rows(1, std::numeric_limits<int64_t>::max()); }, ErrorCode::OutOfBounds);
  Tensor none = Tensor::zeros({0, 3}, DType::F32);
  EXPECT_EQ(none.rows(0, 0).numel(), 0);
}

TEST(TensorTest, ReshapeSharesBytes) {
  Tensor t = Tensor::from_f32({2, 6}, iota(12));
  Tensor r = t.reshape({3, 4});
  EXPECT_TRUE(r.storage() == t.storage() && r.storage_offset() == t.storage_offset());
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_EQ(t.select(1).reshape({2, 3}).storage_offset(), 24u);
  expect_error([&] { t.reshape({5, 2}); }, ErrorCode::ShapeMismatch, "[5, 2]");
}

TEST(TensorTest, CloneAndToCopyIntoNewStorage) {
  Tensor t = Tensor::from_f32({2, 3}, iota(6, 0.1f));
  Tensor c = t.clone();
  EXPECT_NE(c.storage(), t.storage());
  EXPECT_TRUE(c.bit_equal(t));
  c.mutable_data_as<float>()[0] = 99.0f;
  EXPECT_EQ(t.data_as<float>()[0], 0.1f);
  // Clone of a view copies only the view's bytes.
  Tensor v = t.select(1).clone();
  EXPECT_EQ(v.storage()->size(), 12u);
  EXPECT_EQ(v.data_as<float>()[0], 3.1f);
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.shape(), t.shape());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(b.data_as<uint16_t>()[i], f32_to_bf16(t.data_as<float>()[i]));
  }
  Tensor back = b.to(DType::F32);
  EXPECT_EQ(back.data_as<float>()[2], bf16_to_f32(f32_to_bf16(2.1f)));
  // Integer tensors clone byte for byte.
  Tensor ints = Tensor::zeros({3}, DType::I64);
  ints.mutable_data_as<int64_t>()[1] = -42;
  EXPECT_TRUE(ints.clone().bit_equal(ints));
  expect_error([&] { ints.to(DType::F32); }, ErrorCode::UnsupportedConversion);
}

TEST(TensorTest, CopyFromConvertsAndCountsBytes) {
  Tensor src = Tensor::from_f32({2, 2}, iota(4, 0.5f));
  Tensor dst = Tensor::zeros({4}, DType::BF16);  // same numel, other shape is fine
  const uint64_t before = detail::storage_stats().copied_bytes;
  dst.copy_from(src);
  EXPECT_EQ(detail::storage_stats().copied_bytes - before, dst.nbytes());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bf16_to_f32(dst.data_as<uint16_t>()[i]), 0.5f + i);
  expect_error([&] { dst.copy_from(Tensor::zeros({5}, DType::F32)); }, ErrorCode::ShapeMismatch);
  expect_error([&] { Tensor::zeros({4}, DType::I32).copy_from(src); },
               ErrorCode::UnsupportedConversion);
  // Copying into a sub-view writes only that view.
  Tensor big = Tensor::zeros({3, 2}, DType::F32);
  Tensor row1 = big.select(1);
  row1.copy_from(Tensor::from_f32({2}, std::vector<float>{7.0f, 8.0f}));
  EXPECT_EQ(big.data_as<float>()[0], 0.0f);
  EXPECT_EQ(big.data_as<float>()[2], 7.0f);
  EXPECT_EQ(big.data_as<float>()[3], 8.0f);
  EXPECT_EQ(big.data_as<float>()[4], 0.0f);
}

TEST(TensorTest, ZeroClearsOnlyTheView) {
  Tensor t = Tensor::from_f32({3, 2}, iota(6));
  Tensor mid = t.select(1);
  mid.zero();
  const std::vector<float> want = {1, 2, 0, 0, 5, 6};
  EXPECT_EQ(std::memcmp(t.data(), want.data(), 24), 0);
}

TEST(TensorTest, BitEqualComparesDTypeShapeAndBits) {
  Tensor a = Tensor::from_f32({2}, std::vector<float>{0.0f, 1.0f});
  EXPECT_TRUE(a.bit_equal(a.clone()));
  EXPECT_FALSE(a.bit_equal(Tensor::from_f32({2}, std::vector<float>{-0.0f, 1.0f})));
  EXPECT_FALSE(a.bit_equal(a.reshape({1, 2})));
  EXPECT_FALSE(Tensor::zeros({2}, DType::F32).bit_equal(Tensor::zeros({4}, DType::BF16)));
  EXPECT_FALSE(Tensor::zeros({2}, DType::I32).bit_equal(Tensor::zeros({2}, DType::F32)));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor n = Tensor::from_f32({1}, std::vector<float>{nan});
  EXPECT_TRUE(n.bit_equal(n.clone()));  // bits, not IEEE equality
  EXPECT_TRUE(Tensor::zeros({0}, DType::F32).bit_equal(Tensor::zeros({0}, DType::F32)));
}

TEST(TensorTest, SameViewNeedsSameStorageOffsetAndSize) {
  Tensor t = Tensor::zeros({4, 4}, DType::F32);
  EXPECT_TRUE(t.same_view(t.reshape({16})));
  EXPECT_TRUE(t.select(2).same_view(t.rows(2, 1)));
  EXPECT_FALSE(t.select(2).same_view(t.select(1)));
  EXPECT_FALSE(t.rows(0, 2).same_view(t.rows(0, 1)));
  EXPECT_FALSE(t.same_view(t.clone()));
}

TEST(TensorTest, ViewsKeepTheirStorageAlive) {
  Tensor view;
  std::weak_ptr<Storage> weak;
  {
    Tensor t = Tensor::from_f32({4}, iota(4));
    weak = t.storage();
    view = t.rows(2, 2);
  }
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(view.data_as<float>()[1], 4.0f);
  view = Tensor();
  EXPECT_TRUE(weak.expired());
}

TEST(StorageTest, AllocateIsZeroedAlignedAndCounted) {
  const detail::StorageStats before = detail::storage_stats();
  auto s = Storage::allocate(100);
  auto empty = Storage::allocate(0);
  const detail::StorageStats after = detail::storage_stats();
  EXPECT_EQ(after.allocations - before.allocations, 2u);
  EXPECT_EQ(after.allocated_bytes - before.allocated_bytes, 100u);
  EXPECT_EQ(s->size(), 100u);
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_TRUE(s->writable());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s->data()) % kStorageAlignment, 0u);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(s->data()[i], std::byte{0});
}

// From 2 MiB on, storages start on a huge-page boundary; sizes near the address space's end are
// refused, not wrapped around.
TEST(StorageTest, LargeAllocationsAreHugePageAlignedAndSizesDoNotWrap) {
  auto big = Storage::allocate((size_t{3} << 20) + 5);
  EXPECT_EQ(big->size(), (size_t{3} << 20) + 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big->data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(big->data()[(size_t{3} << 20) + 4], std::byte{0});
  for (size_t n : {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX - (size_t{1} << 20)}) {
    expect_error([&] { Storage::allocate(n); }, ErrorCode::SizeOverflow);
  }
}

TEST(StorageTest, WrappedMemoryIsReadOnlyAndKeepsItsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f});
  std::weak_ptr<std::vector<float>> weak_owner = owner;
  auto bytes = reinterpret_cast<const std::byte*>(owner->data());
  Tensor t = Tensor::view_of(Storage::wrap(bytes, 16, owner), 4, {3}, DType::F32);
  owner.reset();
  ASSERT_FALSE(weak_owner.expired());
  EXPECT_FALSE(t.writable());
  EXPECT_EQ(t.data_as<float>()[0], 2.0f);
  expect_error([&] { t.mutable_data(); }, ErrorCode::ReadOnlyTensor);
  expect_error([&] { t.zero(); }, ErrorCode::ReadOnlyTensor);
  expect_error([&] { t.copy_from(Tensor::zeros({3}, DType::F32)); }, ErrorCode::ReadOnlyTensor);
  EXPECT_EQ(t.data_as<float>()[0], 2.0f);
  Tensor c = t.clone();  // a read-only tensor can be copied into writable memory
  EXPECT_TRUE(c.writable());
  EXPECT_TRUE(c.bit_equal(t));
  t = Tensor();
  EXPECT_TRUE(weak_owner.expired());
}

// generation() changes with every write GroupLin hands out a pointer for, and only then; never
// repeats between storages; a read-only alias reports (and marks) its source's.
TEST(StorageTest, GenerationChangesWithEveryWriteThroughGroupLin) {
  Tensor t = Tensor::zeros({4}, DType::F32);
  const Tensor other = Tensor::zeros({4}, DType::F32);
  EXPECT_NE(t.storage()->generation(), other.storage()->generation());
  uint64_t g = t.storage()->generation();
  const auto changed = [&](const char* by) {
    const uint64_t now = t.storage()->generation();
    EXPECT_NE(now, g) << by;
    g = now;
  };
  (void)t.data();
  (void)t.clone();
  EXPECT_EQ(t.storage()->generation(), g) << "reads";
  t.mutable_data();
  changed("mutable_data");
  t.select(1).copy_from(Tensor::from_f32({}, std::vector<float>{2.0f}));
  changed("copy_from into a view");
  t.zero();
  changed("zero");
  t.storage()->mark_written();
  changed("mark_written");
  const Tensor alias = t.read_only();
  EXPECT_NE(alias.storage(), t.storage());
  EXPECT_EQ(alias.storage()->generation(), g);
  t.rows(0, 2).zero();
  changed("zero of rows");
  EXPECT_EQ(alias.storage()->generation(), g) << "the alias reports its source's";
  alias.storage()->mark_written();
  changed("mark_written of the alias");
}

}  // namespace
}  // namespace grouplin
