// GroupedTensor: N member tensors in one allocation.
//
//   auto g = grouplin::GroupedTensor::make_uniform(8, {1024, 512}, grouplin::DType::F32);
//   grouplin::Tensor w3 = g.member(3);       // zero-copy view
//   std::vector<grouplin::Tensor> per_expert = {w3.clone(), w3.clone()};
//   auto h = grouplin::GroupedTensor::from_members(per_expert);  // one copy of each member
//
// Every member starts at a multiple of kStorageAlignment (64 bytes) from the storage start.
// Members may have different shapes but share one dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "grouplin/tensor.hpp"

namespace grouplin {

class GroupedTensor {
 public:
  GroupedTensor() = default;

  // Zero-filled group with one member per shape. Throws Error(InvalidArgument) if empty.
  static GroupedTensor make(std::span<const Shape> shapes, DType dtype);
  // Zero-filled group of n members of one shape.
  static GroupedTensor make_uniform(int64_t n, const Shape& shape, DType dtype);
  // Group holding a copy of each member (copied once, straight into place).
  // Throws Error(DTypeMismatch) if the members' dtypes differ, Error(InvalidArgument) if empty.
  static GroupedTensor from_members(std::span<const Tensor> members);

  int64_t num_members() const { return static_cast<int64_t>(offsets_.size()); }
  DType dtype() const { return dtype_; }
  // View of member i. Throws Error(OutOfBounds).
  Tensor member(int64_t i) const;
  std::vector<Tensor> members() const;
  // Byte offset of member i inside storage().
  size_t member_offset(int64_t i) const { return offsets_.at(static_cast<size_t>(i)); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // True when all members share one shape and sit back to back with no padding, so that
  // stacked() can expose them as one [N, ...] tensor.
  bool is_stackable() const;
  // The [N, ...] view of all members. Throws Error(NotStackable) unless is_stackable().
  Tensor stacked() const;

 private:
  std::shared_ptr<Storage> storage_;
  std::vector<size_t> offsets_;
  std::vector<Shape> shapes_;
  DType dtype_ = DType::F32;
};

}  // namespace grouplin
